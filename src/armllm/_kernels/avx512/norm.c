/* avx512/norm.c: RMSNorm with optional fused residual add, 16 lanes at a
 * time, tails through masks.
 *
 * The residual add and the output products (r * scale * weight, in ref's
 * order) are bit-identical to ref. The sum of squares is accumulated in
 * double like ref (each r*r is exact in double), in 4 x 8 lanes, so it may
 * differ from ref's sequential double sum only in the last bits of a double.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx512.h"

/* acc0 += lo8(v)^2, acc1 += hi8(v)^2 in double (exact squares: same as mul + add) */
#define SQ_ACC(v, acc0, acc1)                                                       \
  do {                                                                              \
    const __m512d lo_ = _mm512_cvtps_pd(_mm512_castps512_ps256(v));                 \
    const __m512d hi_ = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));              \
    acc0 = _mm512_fmadd_pd(lo_, lo_, acc0);                                         \
    acc1 = _mm512_fmadd_pd(hi_, hi_, acc1);                                         \
  } while (0)

static void avx512_rmsnorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_norm_job *job = ctx;
  const int64_t d = job->d;
  const int64_t d16 = d & ~(int64_t)15;
  const __mmask16 tail = armllm_avx512_tail16(d - d16);
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const float *r = x;
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    if (job->residual) { /* pass 1: r = residual += x, and sum r^2 */
      float *res = job->residual + t * job->ldr;
      int64_t i = 0;
      for (; i + 32 <= d; i += 32) {
        __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(res + i), _mm512_loadu_ps(x + i));
        __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(res + i + 16), _mm512_loadu_ps(x + i + 16));
        _mm512_storeu_ps(res + i, v0);
        _mm512_storeu_ps(res + i + 16, v1);
        SQ_ACC(v0, a0, a1);
        SQ_ACC(v1, a2, a3);
      }
      for (; i < d16; i += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(res + i), _mm512_loadu_ps(x + i));
        _mm512_storeu_ps(res + i, v);
        SQ_ACC(v, a0, a1);
      }
      if (d16 < d) {
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, res + d16),
                                 _mm512_maskz_loadu_ps(tail, x + d16));
        _mm512_mask_storeu_ps(res + d16, tail, v);
        SQ_ACC(v, a2, a3); /* masked-off lanes are 0 */
      }
      r = res;
    } else {
      int64_t i = 0;
      for (; i + 32 <= d; i += 32) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        SQ_ACC(v0, a0, a1);
        SQ_ACC(v1, a2, a3);
      }
      for (; i < d16; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        SQ_ACC(v, a0, a1);
      }
      if (d16 < d) {
        __m512 v = _mm512_maskz_loadu_ps(tail, x + d16);
        SQ_ACC(v, a2, a3);
      }
    }
    const double sum_sq =
        _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
    const float scale = (float)(1.0 / sqrt(sum_sq / (double)d + (double)job->eps));
    const __m512 vs = _mm512_set1_ps(scale);
    const float *w = job->weight;
    int64_t i = 0; /* pass 2: out = r * scale * weight (out may be x) */
    for (; i + 32 <= d; i += 32) {
      __m512 o0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + i), vs), _mm512_loadu_ps(w + i));
      __m512 o1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + i + 16), vs),
                                _mm512_loadu_ps(w + i + 16));
      _mm512_storeu_ps(out + i, o0);
      _mm512_storeu_ps(out + i + 16, o1);
    }
    for (; i < d16; i += 16)
      _mm512_storeu_ps(out + i,
                       _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + i), vs), _mm512_loadu_ps(w + i)));
    if (d16 < d) {
      __m512 o = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail, r + d16), vs),
                               _mm512_maskz_loadu_ps(tail, w + d16));
      _mm512_mask_storeu_ps(out + d16, tail, o);
    }
  }
}

void armllm_avx512_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, float *residual,
                           int64_t ldr, const float *weight, int64_t t, int64_t d, float eps,
                           float *out, int64_t ldo) {
  armllm_norm_job job = {x, ldx, residual, ldr, weight, d, eps, out, ldo};
  /* a few rows: not worth waking workers */
  armllm_rows_run(pool, t, d, 32768, avx512_rmsnorm_rows, &job);
}

/* ----------------------------------------------------------- layernorm */

/* Lanes [i, i + 16) of a row of d: all, or the tail's. */
static inline __mmask16 lane_mask16(int64_t i, int64_t d) {
  return i + 16 <= d ? (__mmask16)0xffff : armllm_avx512_tail16(d - i);
}

/* The mean of x[0, d) in double. */
static inline double row_mean(const float *x, int64_t d) {
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (int64_t i = 0; i < d; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(lane_mask16(i, d), x + i); /* off lanes 0 */
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / (double)d;
}

/* sum (x - mean)^2 over x[0, d) in double (off lanes add 0). */
static inline double row_sq_dev(const float *x, int64_t d, double mean) {
  const __m512d vm = _mm512_set1_pd(mean);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = lane_mask16(i, d);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512d lo = _mm512_maskz_sub_pd((__mmask8)m, _mm512_cvtps_pd(_mm512_castps512_ps256(v)), vm);
    const __m512d hi =
        _mm512_maskz_sub_pd((__mmask8)(m >> 8), _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), vm);
    s0 = _mm512_fmadd_pd(lo, lo, s0);
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

static void avx512_layernorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_layernorm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const double mean = row_mean(x, d);
    const double var = row_sq_dev(x, d, mean) / (double)d;
    const __m512 vm = _mm512_set1_ps((float)mean);
    const __m512 vs = _mm512_set1_ps((float)(1.0 / sqrt(var + (double)job->eps)));
    for (int64_t i = 0; i < d; i += 16) { /* ref's float steps, unfused (out may be x) */
      const __mmask16 m = lane_mask16(i, d);
      __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm);
      v = _mm512_mul_ps(_mm512_mul_ps(v, vs), _mm512_maskz_loadu_ps(m, job->weight + i));
      __asm__("" : "+v"(v)); /* keeps the bias add out of an FMA */
      if (job->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, job->bias + i));
      _mm512_mask_storeu_ps(out + i, m, v);
    }
  }
}

void armllm_avx512_layernorm(armllm_pool *pool, const float *x, int64_t ldx, const float *weight,
                             const float *bias, int64_t t, int64_t d, float eps, float *out,
                             int64_t ldo) {
  armllm_layernorm_job job = {x, ldx, weight, bias, d, eps, out, ldo};
  armllm_rows_run(pool, t, d, 32768, avx512_layernorm_rows, &job); /* as rmsnorm */
}
