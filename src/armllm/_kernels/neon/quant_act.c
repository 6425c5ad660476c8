/* neon/quant_act.c: int8 activation quantization (per token and group,
 * symmetric or asymmetric) on Armv8 NEON, for every Arm variant.
 *
 * FMAX/FMAXV for each group's max |x| (NaN propagates, as in ref), FDIV
 * (x / s correctly rounded, as ref), FCVTNS (round to nearest even, what
 * nearbyintf does in the default rounding mode), saturating narrows and a
 * max with -127: the same bytes as ref.
 */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The sum of a group's stored bytes (k1 - k0 a multiple of 16). */
static int32_t group_sum(const int8_t *qr, int64_t k0, int64_t k1) {
  int32x4_t acc = vdupq_n_s32(0);
  for (int64_t j = k0; j < k1; j += 16) acc = vpadalq_s16(acc, vpaddlq_s8(vld1q_s8(qr + j)));
  return vaddvq_s32(acc);
}

/* One group [k0, k1) of a row, its real columns [k0, kx): scale s, the
 * bytes (padding 0) and their sum. */
static void quant_group(const float *xr, int64_t k0, int64_t kx, int64_t k1, int8_t *qr,
                        float *scale, int32_t *gs) {
  float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0;
  int64_t i = k0;
  for (; i + 8 <= kx; i += 8) { /* FMAX: a NaN stays */
    m0 = vmaxq_f32(m0, vabsq_f32(vld1q_f32(xr + i)));
    m1 = vmaxq_f32(m1, vabsq_f32(vld1q_f32(xr + i + 4)));
  }
  float amax = vmaxvq_f32(vmaxq_f32(m0, m1));
  for (; i < kx; i++) {
    const float a = fabsf(xr[i]);
    amax = (a > amax || a != a) ? a : amax;
  }
  const float s = amax / 127.0f;
  *scale = s;
  if (s == 0.0f) {
    memset(qr + k0, 0, (size_t)(k1 - k0));
    if (gs) *gs = 0;
    return;
  }
  const float32x4_t sv = vdupq_n_f32(s);
  const int8x16_t lo = vdupq_n_s8(-127);
  for (i = k0; i + 16 <= kx; i += 16) {
    int32x4_t a = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i), sv));
    int32x4_t b = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 4), sv));
    int32x4_t c = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 8), sv));
    int32x4_t d = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 12), sv));
    int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    vst1q_s8(qr + i, vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)), lo));
  }
  for (; i < kx; i++) {
    float v = nearbyintf(xr[i] / s);
    v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    qr[i] = (int8_t)(v == v ? v : 0.0f);
  }
  memset(qr + kx, 0, (size_t)(k1 - kx));
  if (gs) *gs = group_sum(qr, k0, k1); /* k1 - k0 is a multiple of 32 */
}

/* One asymmetric group: lo = min(0, min x), hi = max(0, max x) (FMIN/FMAX
 * keep a NaN; then ref's scalar walk gives the same NaN bits), s = (hi - lo)
 * / 254, z = round(-127 - lo / s), xq = clamp(round(x / s) + z, -127, 127). */
static void quant_group_asym(const float *xr, int64_t k0, int64_t kx, int64_t k1, int8_t *qr,
                             float *scale, int32_t *zp, int32_t *gs) {
  float32x4_t mn = vdupq_n_f32(0.0f), mx = mn;
  int64_t i = k0;
  for (; i + 4 <= kx; i += 4) {
    const float32x4_t v = vld1q_f32(xr + i);
    mn = vminq_f32(mn, v);
    mx = vmaxq_f32(mx, v);
  }
  float lo = vminvq_f32(mn), hi = vmaxvq_f32(mx);
  for (; i < kx; i++) {
    hi = (xr[i] > hi || xr[i] != xr[i]) ? xr[i] : hi;
    lo = (xr[i] < lo || xr[i] != xr[i]) ? xr[i] : lo;
  }
  if (lo != lo || hi != hi) armllm_q_range(xr, k0, kx, &lo, &hi); /* ref's order of NaNs */
  if (!armllm_q_asym_group(lo, hi, qr, k0, k1, scale, zp, gs)) return;
  const float s = *scale;
  const int32_t z = *zp;
  const float32x4_t sv = vdupq_n_f32(s);
  const int32x4_t zv = vdupq_n_s32(z);
  const int8x16_t lo127 = vdupq_n_s8(-127);
  for (i = k0; i + 16 <= kx; i += 16) {
    int32x4_t a = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i), sv)), zv);
    int32x4_t b = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 4), sv)), zv);
    int32x4_t c = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 8), sv)), zv);
    int32x4_t d = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 12), sv)), zv);
    int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    vst1q_s8(qr + i, vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)), lo127));
  }
  for (; i < kx; i++) {
    int32_t v = (int32_t)nearbyintf(xr[i] / s) + z; /* |x / s| <= 254 */
    qr[i] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
  }
  memset(qr + kx, 0, (size_t)(k1 - kx));
  if (gs) *gs = group_sum(qr, k0, k1);
}

typedef armllm_quant_job quant_job;

static void quant_rows(void *ctx, int64_t r0, int64_t r1) {
  const quant_job *j = ctx;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * j->ldx;
    int8_t *qr = j->xq + r * j->ldq;
    for (int64_t g = 0; g < j->ng; g++) {
      const int64_t k0 = g * j->gl, k1 = min64(k0 + j->gl, j->kpad);
      if (j->zp) {
        quant_group_asym(xr, k0, min64(k1, j->k), k1, qr, j->scale + r * j->ldsc + g,
                         j->zp + r * j->ldzp + g, j->gsum ? j->gsum + r * j->ldgs + g : NULL);
        continue;
      }
      quant_group(xr, k0, min64(k1, j->k), k1, qr, j->scale + r * j->ldsc + g,
                  j->gsum ? j->gsum + r * j->ldgs + g : NULL);
    }
  }
}

void armllm_neon_quant_act(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                           int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                           int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp) {
  quant_job job = armllm_quant_job_of(x, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp);
  armllm_pool_run(pool, m, armllm_pool_grain(pool, m, 4, 1 + 16384 / job.kpad), quant_rows, &job);
}
