/* neon/rope.c: rotary position embedding, neox (split halves) and gpt-j
 * (interleaved pairs, LD2/ST2) styles.
 *
 * a*cos - b*sin and b*cos + a*sin are computed with the same separate
 * roundings as ref (the products are kept opaque so GCC does not contract
 * them into FMLA/FMLS), so results are bit-identical to ref.
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_neon.h" /* ARMLLM_NEON_OPAQUE */

#define ROPE_MIN_CHUNK 16384 /* elements: less is not worth a thread */

static inline __attribute__((always_inline)) void rot4(float32x4_t *a, float32x4_t *b,
                                                       float32x4_t c, float32x4_t s) {
  float32x4_t ac = vmulq_f32(*a, c), bs = vmulq_f32(*b, s);
  float32x4_t bc = vmulq_f32(*b, c), as = vmulq_f32(*a, s);
  ARMLLM_NEON_OPAQUE(ac);
  ARMLLM_NEON_OPAQUE(bs);
  ARMLLM_NEON_OPAQUE(bc);
  ARMLLM_NEON_OPAQUE(as);
  *a = vsubq_f32(ac, bs);
  *b = vaddq_f32(bc, as);
}

static void rope_neox_head(float *v, const float *cs, int64_t half) {
  const float *sn = cs + half;
  int64_t i = 0;
  for (; i + 4 <= half; i += 4) {
    float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + half + i);
    rot4(&a, &b, vld1q_f32(cs + i), vld1q_f32(sn + i));
    vst1q_f32(v + i, a);
    vst1q_f32(v + half + i, b);
  }
  if (i < half) { /* 1..3 pairs left */
    float ta[4] = {0}, tb[4] = {0}, tc[4] = {0}, ts[4] = {0};
    size_t r = (size_t)(half - i) * sizeof(float);
    memcpy(ta, v + i, r);
    memcpy(tb, v + half + i, r);
    memcpy(tc, cs + i, r);
    memcpy(ts, sn + i, r);
    float32x4_t a = vld1q_f32(ta), b = vld1q_f32(tb);
    rot4(&a, &b, vld1q_f32(tc), vld1q_f32(ts));
    vst1q_f32(ta, a);
    vst1q_f32(tb, b);
    memcpy(v + i, ta, r);
    memcpy(v + half + i, tb, r);
  }
}

static void rope_gptj_head(float *v, const float *cs, int64_t half) {
  const float *sn = cs + half;
  int64_t i = 0;
  for (; i + 4 <= half; i += 4) {
    float32x4x2_t ab = vld2q_f32(v + 2 * i);
    rot4(&ab.val[0], &ab.val[1], vld1q_f32(cs + i), vld1q_f32(sn + i));
    vst2q_f32(v + 2 * i, ab);
  }
  if (i < half) {
    float tv[8] = {0}, tc[4] = {0}, ts[4] = {0};
    size_t r = (size_t)(half - i) * sizeof(float);
    memcpy(tv, v + 2 * i, 2 * r);
    memcpy(tc, cs + i, r);
    memcpy(ts, sn + i, r);
    float32x4x2_t ab = vld2q_f32(tv);
    rot4(&ab.val[0], &ab.val[1], vld1q_f32(tc), vld1q_f32(ts));
    vst2q_f32(tv, ab);
    memcpy(v + 2 * i, tv, 2 * r);
  }
}

ARMLLM_ROPE_KERNEL(armllm_neon_rope, rope_neox_head, rope_gptj_head, ROPE_MIN_CHUNK)
