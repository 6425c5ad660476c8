/* attn_arm.h: the attention driver every Arm variant runs (attn_arm.c) and
 * what it asks of a variant: one per-partition kernel.
 *
 * Work item = (tile of query rows of one sequence, KV head, chunk of that KV
 * head's query heads): the tile's nq = rows * heads query vectors (<=
 * ARMLLM_ATTN_QMAX) share every K/V row loaded. Per partition of
 * ARMLLM_ATTN_PARTITION absolute key positions the variant's partial kernel
 * computes, for all nq vectors, the partition's softmax partial
 *   m = max S, l = sum E, acc = E V   (S = scale * Q K^T, E = exp(S - m),
 *                                      keys outside a vector's [lo, pos]
 *                                      weighing 0),
 * and the driver merges partitions in order with armllm_attn_merge.
 *
 * Split-KV: when the tiles are fewer than 2x the threads and scratch is
 * large enough, items become (tile, KV head, chunk, partition) writing
 * (m, l, acc) to scratch, and a second pass merges them per (row, head) in
 * partition order. Both paths run the same partial kernel on the same
 * tiles (tiles depend only on the metadata), so they return the same bits. */
#ifndef ARMLLM_ATTN_ARM_H
#define ARMLLM_ATTN_ARM_H

#include <math.h>

#include "armllm_kernels.h"
#include "attn_common.h"

#define ARMLLM_ATTN_QMAX 16 /* query vectors per tile */

/* Partition p of a tile of sequence b, KV head kvh: nq query vectors q[i]
 * seeing keys [lo[i], hi[i]); writes m[i], l[i] and accp[i * head_dim ..]
 * (m = -inf for a vector that sees none of the partition's keys). */
typedef void (*armllm_attn_partial_fn)(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                                       const float *const *q, const int64_t *lo,
                                       const int64_t *hi, int64_t p, float *m, float *l,
                                       float *accp);

/* Defines `name`, a partial kernel that runs the always-inline template
 * `impl` (the partial kernel's arguments, then the cache's armllm_kv_dtype,
 * a constant in each instance) for one cache dtype. */
#define ARMLLM_ATTN_PARTIAL(name, impl, dtype)                                                  \
  static void name(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,                   \
                   const float *const *q, const int64_t *lo, const int64_t *hi, int64_t p,      \
                   float *m, float *l, float *accp) {                                           \
    impl(a, b, kvh, nq, q, lo, hi, p, m, l, accp, dtype);                                       \
  }

/* The keys of one partition as a partial kernel reads them (on its own
 * stack: addressed from sp, its loops keep their registers): [k0, k0 + n),
 * the K/V row of each (element size esz), padded to n4, a multiple of 4, by
 * repeating the last. */
typedef struct {
  const void *kr[ARMLLM_ATTN_PARTITION], *vr[ARMLLM_ATTN_PARTITION];
  float ksc[ARMLLM_ATTN_PARTITION], vsc[ARMLLM_ATTN_PARTITION]; /* int8 caches: row scales */
  int64_t k0, n, n4;
} armllm_attn_keys;

static inline __attribute__((always_inline)) void armllm_attn_keys_of(
    armllm_attn_keys *keys, const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
    const int64_t *lo, const int64_t *hi, int64_t p, size_t esz) {
  keys->n = armllm_attn_partition_rows(a, b, kvh, nq, lo, hi, p, esz, keys->kr, keys->vr,
                                       keys->ksc, keys->vsc, &keys->k0);
  keys->n4 = (keys->n + 3) & ~(int64_t)3;
}

/* A variant's softmax numerators of one query's scores si[a0, a1) (a1 >
 * a0), in place: returns m = their max, si[j] = exp(si[j] - m), and with
 * sum, *sum = the sum of those. */
typedef float (*armllm_softmax_row_fn)(float *si, int64_t a0, int64_t a1, float *sum);

/* A partition's nq score rows s[i] (stride ARMLLM_ATTN_PARTITION; n keys
 * from k0, zero-padded to a multiple of 4) to softmax numerators: keys
 * outside query i's [lo[i], hi[i]) weigh 0; m[i], and with l the sums
 * l[i], from `row`; a query that sees none of the keys gets m = -inf (and
 * l = 0), so that the merge skips it. */
static inline __attribute__((always_inline)) void armllm_attn_softmax(
    float *s, int nq, const int64_t *lo, const int64_t *hi, int64_t k0, int64_t n, float *m,
    float *l, armllm_softmax_row_fn row) {
  const int64_t n4 = (n + 3) & ~(int64_t)3;
  for (int i = 0; i < nq; i++) {
    float *si = s + i * ARMLLM_ATTN_PARTITION;
    int64_t a0, a1;
    if (!armllm_attn_mask_scores(si, lo[i], hi[i], k0, n, n4, &a0, &a1)) {
      m[i] = -INFINITY;
      if (l) l[i] = 0.0f;
      continue;
    }
    m[i] = row(si, a0, a1, l ? &l[i] : NULL);
  }
}

/* int8 -> f32 without SCVTF (2 uops on one vector pipe of Neoverse N2, so
 * it would bound the int8 tiles): the float 1.5 * 2^23 has the bits
 * ARMLLM_I8_F32_BITS, and for |x| < 2^22 adding x to those bits as an
 * integer gives the float 1.5 * 2^23 + x (its ulp is 1); subtracting
 * ARMLLM_I8_F32_BIAS leaves x exactly. Both are plain adds, on any pipe. */
#define ARMLLM_I8_F32_BITS 0x4b400000
#define ARMLLM_I8_F32_BIAS 12582912.0f /* 1.5 * 2^23 */

/* Int8 caches: a partition's softmax numerators s[i][0, n4) (nq rows of
 * stride ARMLLM_ATTN_PARTITION) to PV weights, e * vsc[j] (the V rows'
 * scales, keys.vsc), as ref's w = e * v_scale: after the sums l, which add
 * the unscaled e. n4 is a multiple of 4 (4 lanes a step, no tail). */
static inline void armllm_attn_scale_weights(float *s, int nq, const float *vsc, int64_t n4) {
  for (int i = 0; i < nq; i++) {
    float *si = s + i * ARMLLM_ATTN_PARTITION;
    for (int64_t j = 0; j < n4; j += 4)
      for (int u = 0; u < 4; u++) si[j + u] *= vsc[j + u];
  }
}

/* The attention kernel (armllm_kernels.h) around a partial kernel. */
int64_t armllm_arm_attn_run(armllm_pool *pool, const armllm_attn_args *a,
                            armllm_attn_partial_fn partial);

#endif /* ARMLLM_ATTN_ARM_H */
