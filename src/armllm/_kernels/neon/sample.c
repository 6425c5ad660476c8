/* neon/sample.c: the sampler's vectorizable passes (armllm_kernels.h) on
 * 4-lane registers, with ref's bits: the shared exp (vexp_neon.h, as it is on
 * [-80, 0]), and the block tree with its first two levels as sums of a
 * block's four registers, the last two for four blocks at once. The sve
 * variant's exp pass uses the block sums here. */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "vexp_neon.h"

#define BLOCK ARMLLM_SAMPLE_BLOCK
/* e is summed a chunk at a time, right after its exp: the in-order double
 * additions of one chunk's sums overlap the next chunk's exp */
#define CHUNK (ARMLLM_SAMPLE_BLOCK * ARMLLM_SAMPLE_BLOCK)

int64_t armllm_neon_sample_argmax(const float *x, int64_t n) {
  /* per lane the first largest value (strictly larger replaces it: NaN never
   * does, nor -inf, whose rows the scalar scan below settles) */
  float32x4_t val[4];
  uint32x4_t idx[4], at[4];
  const uint32x4_t step = vdupq_n_u32(16);
  for (int q = 0; q < 4; q++) {
    val[q] = vdupq_n_f32(-INFINITY);
    idx[q] = vdupq_n_u32(UINT32_MAX);
    const uint32_t first[4] = {4 * q, 4 * q + 1, 4 * q + 2, 4 * q + 3};
    at[q] = vld1q_u32(first);
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) /* four chains */
    for (int q = 0; q < 4; q++) {
      const float32x4_t v = vld1q_f32(x + i + 4 * q);
      const uint32x4_t gt = vcgtq_f32(v, val[q]);
      val[q] = vbslq_f32(gt, v, val[q]);
      idx[q] = vbslq_u32(gt, at[q], idx[q]);
      at[q] = vaddq_u32(at[q], step);
    }
  float best_val = -INFINITY;
  uint32_t best_idx = UINT32_MAX; /* lanes never updated hold -inf: never chosen */
  for (int q = 0; q < 4; q++) {
    float v[4];
    uint32_t k[4];
    vst1q_f32(v, val[q]);
    vst1q_u32(k, idx[q]);
    for (int l = 0; l < 4; l++)
      if (k[l] != UINT32_MAX && (v[l] > best_val || (v[l] == best_val && k[l] < best_idx))) {
        best_val = v[l];
        best_idx = k[l];
      }
  }
  for (; i < n; i++) /* the tail comes after every lane's entries */
    if (x[i] > best_val) {
      best_val = x[i];
      best_idx = (uint32_t)i;
    }
  if (best_idx != UINT32_MAX) return best_idx;
  for (int64_t j = 0; j < n; j++) /* no value above -inf: the first that is not NaN */
    if (x[j] == x[j]) return j;
  return -1;
}

int64_t armllm_neon_sample_find_above(const float *x, int64_t n, float t) {
  const float32x4_t tv = vdupq_n_f32(t);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint32x4_t any = vorrq_u32(vorrq_u32(vcgtq_f32(vld1q_f32(x + i), tv),
                                               vcgtq_f32(vld1q_f32(x + i + 4), tv)),
                                     vorrq_u32(vcgtq_f32(vld1q_f32(x + i + 8), tv),
                                               vcgtq_f32(vld1q_f32(x + i + 12), tv)));
    if (vmaxvq_u32(any)) break;
  }
  for (; i < n; i++)
    if (x[i] > t) return i;
  return n;
}

static inline float32x4_t floored(float32x4_t v, float32x4_t floor_v) {
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), vcgeq_f32(v, floor_v)));
}

/* s4 of the block of 16 at e (all below n): (j, j+8), then (j, j+4). */
static inline float32x4_t block_s4(const float *e, float32x4_t floor_v) {
  const float32x4_t w0 = floored(vld1q_f32(e), floor_v), w1 = floored(vld1q_f32(e + 4), floor_v);
  const float32x4_t w2 = floored(vld1q_f32(e + 8), floor_v);
  const float32x4_t w3 = floored(vld1q_f32(e + 12), floor_v);
  return vaddq_f32(vaddq_f32(w0, w2), vaddq_f32(w1, w3));
}

/* s2 of two blocks from their s4: lanes (0, 2) and (1, 3) of each. */
static inline float32x4_t two_s2(float32x4_t a, float32x4_t b) {
  const float64x2_t a64 = vreinterpretq_f64_f32(a), b64 = vreinterpretq_f64_f32(b);
  return vaddq_f32(vreinterpretq_f32_f64(vzip1q_f64(a64, b64)),
                   vreinterpretq_f32_f64(vzip2q_f64(a64, b64)));
}

/* The sums of four whole blocks at e, in block order: s = s2_0 + s2_1. */
static inline float32x4_t four_trees(const float *e, float32x4_t floor_v) {
  return vpaddq_f32(two_s2(block_s4(e, floor_v), block_s4(e + BLOCK, floor_v)),
                    two_s2(block_s4(e + 2 * BLOCK, floor_v), block_s4(e + 3 * BLOCK, floor_v)));
}

static inline float block_tree(const float *e, float32x4_t floor_v) {
  const float32x4_t s4 = block_s4(e, floor_v);
  return vpadds_f32(vadd_f32(vget_low_f32(s4), vget_high_f32(s4)));
}

/* The block sums of e[0..n) into sums, added to total in block order. */
static double add_block_sums(const float *e, int64_t n, float32x4_t floor_v, float *sums,
                             double total) {
  int64_t i = 0, b = 0;
  for (; i + 4 * BLOCK <= n; i += 4 * BLOCK, b += 4) {
    vst1q_f32(sums + b, four_trees(e + i, floor_v));
    for (int j = 0; j < 4; j++) total += sums[b + j];
  }
  for (; i + BLOCK <= n; i += BLOCK, b++) {
    sums[b] = block_tree(e + i, floor_v);
    total += sums[b];
  }
  if (i < n) { /* the last block, through a zero-padded copy */
    float t[BLOCK] = {0};
    memcpy(t, e + i, (size_t)(n - i) * sizeof *t);
    sums[b] = block_tree(t, floor_v);
    total += sums[b];
  }
  return total;
}

double armllm_neon_sample_block_sums(const float *e, int64_t n, float keep_min, float *sums) {
  return add_block_sums(e, n, vdupq_n_f32(keep_min), sums, 0.0);
}

static inline float32x4_t e_of(float32x4_t x, float32x4_t m_v, float32x4_t inv_t_v,
                               float32x4_t d_min) {
  const float32x4_t d = vmulq_f32(vsubq_f32(x, m_v), inv_t_v);
  return vreinterpretq_f32_u32(
      vandq_u32(vreinterpretq_u32_f32(armllm_exp_nonpositive_neon(d)), vcgeq_f32(d, d_min)));
}

double armllm_neon_sample_exp(const float *x, float *e, int64_t n, float m, float inv_t,
                              float keep_min, float *sums) {
  const float32x4_t m_v = vdupq_n_f32(m), inv_t_v = vdupq_n_f32(inv_t);
  const float32x4_t d_min = vdupq_n_f32(ARMLLM_SAMPLE_D_MIN), floor_v = vdupq_n_f32(keep_min);
  double total = 0.0;
  for (int64_t c = 0; c < n; c += CHUNK) {
    const int64_t end = c + CHUNK < n ? c + CHUNK : n;
    int64_t i = c;
    for (; i + 16 <= end; i += 16) { /* four chains */
      const float32x4_t a = e_of(vld1q_f32(x + i), m_v, inv_t_v, d_min);
      const float32x4_t b = e_of(vld1q_f32(x + i + 4), m_v, inv_t_v, d_min);
      const float32x4_t cc = e_of(vld1q_f32(x + i + 8), m_v, inv_t_v, d_min);
      const float32x4_t d = e_of(vld1q_f32(x + i + 12), m_v, inv_t_v, d_min);
      vst1q_f32(e + i, a);
      vst1q_f32(e + i + 4, b);
      vst1q_f32(e + i + 8, cc);
      vst1q_f32(e + i + 12, d);
    }
    if (i < end) { /* 1..15 left: through a copy */
      float t[BLOCK] = {0};
      const int64_t left = end - i;
      memcpy(t, x + i, (size_t)left * sizeof *t);
      for (int q = 0; q < 4; q++)
        vst1q_f32(t + 4 * q, e_of(vld1q_f32(t + 4 * q), m_v, inv_t_v, d_min));
      memcpy(e + i, t, (size_t)left * sizeof *t);
    }
    total = add_block_sums(e + c, end - c, floor_v, sums + c / BLOCK, total);
  }
  return total;
}

int64_t armllm_neon_sample_collect(const float *e, const int32_t *ids, int64_t n,
                                   float keep_min, float *out_e, int32_t *out_id) {
  /* a vector test skips the groups of 16 with nothing to take; the others go
   * entry by entry */
  const float32x4_t floor_v = vdupq_n_f32(keep_min), zero = vdupq_n_f32(0.0f);
  int64_t count = 0, i = 0;
  for (; i < n; i += BLOCK) {
    if (i + BLOCK <= n) {
      uint32x4_t any = vdupq_n_u32(0);
      for (int q = 0; q < 4; q++) {
        const float32x4_t v = vld1q_f32(e + i + 4 * q);
        any = vorrq_u32(any, vandq_u32(vcgeq_f32(v, floor_v), vcgtq_f32(v, zero)));
      }
      if (!vmaxvq_u32(any)) continue;
    }
    const int64_t end = i + BLOCK < n ? i + BLOCK : n;
    for (int64_t j = i; j < end; j++)
      if (e[j] >= keep_min && e[j] > 0.0f) {
        out_e[count] = e[j];
        out_id[count++] = ids ? ids[j] : (int32_t)j;
      }
  }
  return count;
}
