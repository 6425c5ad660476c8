/* neon/norm.c: RMSNorm with optional fused residual add.
 *
 * Pass 1 forms r = x (+ residual), stores the residual, and accumulates
 * sum(r^2) in float64 lanes like ref (r*r is exact in double, so FMLA .2d
 * rounds exactly as ref's add; only the summation order differs). Pass 2
 * writes (r * scale) * weight with the same two roundings as ref.
 */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

static inline __attribute__((always_inline)) float64x2_t sq_acc(float64x2_t acc, float64x2_t v) {
  return vfmaq_f64(acc, v, v);
}

static void neon_rmsnorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_norm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const float *r = x;
    float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0, s2 = s0, s3 = s0;
    double tail = 0.0;
    int64_t i = 0;
    if (job->residual) {
      float *res = job->residual + t * job->ldr;
      for (; i + 8 <= d; i += 8) {
        float32x4_t a = vaddq_f32(vld1q_f32(res + i), vld1q_f32(x + i));
        float32x4_t b = vaddq_f32(vld1q_f32(res + i + 4), vld1q_f32(x + i + 4));
        vst1q_f32(res + i, a);
        vst1q_f32(res + i + 4, b);
        s0 = sq_acc(s0, vcvt_f64_f32(vget_low_f32(a)));
        s1 = sq_acc(s1, vcvt_high_f64_f32(a));
        s2 = sq_acc(s2, vcvt_f64_f32(vget_low_f32(b)));
        s3 = sq_acc(s3, vcvt_high_f64_f32(b));
      }
      for (; i < d; i++) {
        float a = res[i] + x[i];
        res[i] = a;
        tail += (double)a * a;
      }
      r = res;
    } else {
      for (; i + 8 <= d; i += 8) {
        float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
        s0 = sq_acc(s0, vcvt_f64_f32(vget_low_f32(a)));
        s1 = sq_acc(s1, vcvt_high_f64_f32(a));
        s2 = sq_acc(s2, vcvt_f64_f32(vget_low_f32(b)));
        s3 = sq_acc(s3, vcvt_high_f64_f32(b));
      }
      for (; i < d; i++)
        tail += (double)x[i] * x[i];
    }
    float64x2_t s = vaddq_f64(vaddq_f64(s0, s1), vaddq_f64(s2, s3));
    double sum_sq = vgetq_lane_f64(s, 0) + vgetq_lane_f64(s, 1) + tail;
    float scale = (float)(1.0 / sqrt(sum_sq / (double)d + (double)job->eps));
    const float32x4_t vs = vdupq_n_f32(scale);
    const float *w = job->weight;
    i = 0;
    for (; i + 8 <= d; i += 8) {
      float32x4_t a = vmulq_f32(vmulq_f32(vld1q_f32(r + i), vs), vld1q_f32(w + i));
      float32x4_t b = vmulq_f32(vmulq_f32(vld1q_f32(r + i + 4), vs), vld1q_f32(w + i + 4));
      vst1q_f32(out + i, a);
      vst1q_f32(out + i + 4, b);
    }
    for (; i < d; i++) out[i] = r[i] * scale * w[i];
  }
}

void armllm_neon_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, float *residual,
                         int64_t ldr, const float *weight, int64_t t, int64_t d, float eps,
                         float *out, int64_t ldo) {
  armllm_norm_job job = {x, ldx, residual, ldr, weight, d, eps, out, ldo};
  /* memory-bound, ~1 cycle per element: rows of >= 16K elements per chunk */
  int64_t min_rows = (16384 + d - 1) / d;
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, min_rows), neon_rmsnorm_rows, &job);
}

/* ----------------------------------------------------------- layernorm */

/* The mean of x[0, d) in double: float64x2 lanes, then the tail. */
static inline double row_mean(const float *x, int64_t d) {
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0;
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    s0 = vaddq_f64(s0, vcvt_f64_f32(vget_low_f32(v)));
    s1 = vaddq_f64(s1, vcvt_high_f64_f32(v));
  }
  double sum = vaddvq_f64(vaddq_f64(s0, s1));
  for (; i < d; i++) sum += x[i];
  return sum / (double)d;
}

/* sum (x - mean)^2 over x[0, d) in double. */
static inline double row_sq_dev(const float *x, int64_t d, double mean) {
  const float64x2_t vm = vdupq_n_f64(mean);
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0;
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    const float64x2_t lo = vsubq_f64(vcvt_f64_f32(vget_low_f32(v)), vm);
    const float64x2_t hi = vsubq_f64(vcvt_high_f64_f32(v), vm);
    s0 = vfmaq_f64(s0, lo, lo);
    s1 = vfmaq_f64(s1, hi, hi);
  }
  double sum = vaddvq_f64(vaddq_f64(s0, s1));
  for (; i < d; i++) sum += ((double)x[i] - mean) * ((double)x[i] - mean);
  return sum;
}

/* (x - m) * s * w [+ b] on 4 lanes, ref's float steps unfused. */
static inline __attribute__((always_inline)) float32x4_t layernorm4(
    float32x4_t x, float32x4_t m, float32x4_t s, float32x4_t w, const float *b4) {
  float32x4_t v = vmulq_f32(vmulq_f32(vsubq_f32(x, m), s), w);
  __asm__("" : "+w"(v)); /* keeps the bias add out of an FMLA */
  return b4 ? vaddq_f32(v, vld1q_f32(b4)) : v;
}

static void neon_layernorm_row(const armllm_layernorm_job *job, const float *x, float *out) {
  const int64_t d = job->d;
  const double mean = row_mean(x, d), var = row_sq_dev(x, d, mean) / (double)d;
  const float32x4_t vm = vdupq_n_f32((float)mean);
  const float32x4_t vs = vdupq_n_f32((float)(1.0 / sqrt(var + (double)job->eps)));
  const float *w = job->weight, *b = job->bias;
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) /* out may be x: each block loaded before it is stored */
    vst1q_f32(out + i, layernorm4(vld1q_f32(x + i), vm, vs, vld1q_f32(w + i), b ? b + i : NULL));
  if (i < d) { /* the tail through zero-padded blocks */
    float tx[4] = {0}, tw[4] = {0}, tb[4] = {0};
    const size_t bytes = (size_t)(d - i) * sizeof(float);
    memcpy(tx, x + i, bytes);
    memcpy(tw, w + i, bytes);
    if (b) memcpy(tb, b + i, bytes);
    vst1q_f32(tx, layernorm4(vld1q_f32(tx), vm, vs, vld1q_f32(tw), b ? tb : NULL));
    memcpy(out + i, tx, bytes);
  }
}

static void neon_layernorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_layernorm_job *job = ctx;
  for (int64_t t = t0; t < t1; t++)
    neon_layernorm_row(job, job->x + t * job->ldx, job->out + t * job->ldo);
}

void armllm_neon_layernorm(armllm_pool *pool, const float *x, int64_t ldx, const float *weight,
                           const float *bias, int64_t t, int64_t d, float eps, float *out,
                           int64_t ldo) {
  armllm_layernorm_job job = {x, ldx, weight, bias, d, eps, out, ldo};
  /* memory-bound, ~1 cycle per element: rows of >= 16K elements per chunk (as rmsnorm) */
  const int64_t min_rows = (16384 + d - 1) / d;
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, min_rows), neon_layernorm_rows, &job);
}
