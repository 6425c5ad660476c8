/* avx2/norm.c: RMSNorm with optional fused residual add, 8 lanes at a time.
 *
 * The residual add and the output products (r * scale * weight, in ref's
 * order) are bit-identical to ref. The sum of squares is accumulated in
 * double like ref (each r*r is exact in double), in 4 x 4 lanes, so it may
 * differ from ref's sequential double sum only in the last bits of a double.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx2.h"

static inline __m256d sq_acc(__m128 v, __m256d acc) {
  __m256d w = _mm256_cvtps_pd(v);
  return _mm256_fmadd_pd(w, w, acc); /* w*w is exact in double: same as mul + add */
}

static void avx2_rmsnorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_norm_job *job = ctx;
  const int64_t d = job->d;
  const int64_t d8 = d & ~(int64_t)7;
  const __m256i tail = armllm_avx2_tail_mask(d - d8);
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const float *r = x;
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    if (job->residual) { /* pass 1: r = residual += x, and sum r^2 */
      float *res = job->residual + t * job->ldr;
      int64_t i = 0;
      for (; i + 16 <= d; i += 16) {
        __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(res + i), _mm256_loadu_ps(x + i));
        __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(res + i + 8), _mm256_loadu_ps(x + i + 8));
        _mm256_storeu_ps(res + i, v0);
        _mm256_storeu_ps(res + i + 8, v1);
        a0 = sq_acc(_mm256_castps256_ps128(v0), a0);
        a1 = sq_acc(_mm256_extractf128_ps(v0, 1), a1);
        a2 = sq_acc(_mm256_castps256_ps128(v1), a2);
        a3 = sq_acc(_mm256_extractf128_ps(v1, 1), a3);
      }
      for (; i < d8; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(res + i), _mm256_loadu_ps(x + i));
        _mm256_storeu_ps(res + i, v);
        a0 = sq_acc(_mm256_castps256_ps128(v), a0);
        a1 = sq_acc(_mm256_extractf128_ps(v, 1), a1);
      }
      if (d8 < d) {
        __m256 v = _mm256_add_ps(_mm256_maskload_ps(res + d8, tail), _mm256_maskload_ps(x + d8, tail));
        _mm256_maskstore_ps(res + d8, tail, v);
        a0 = sq_acc(_mm256_castps256_ps128(v), a0); /* masked-off lanes are 0 */
        a1 = sq_acc(_mm256_extractf128_ps(v, 1), a1);
      }
      r = res;
    } else {
      int64_t i = 0;
      for (; i + 16 <= d; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = sq_acc(_mm256_castps256_ps128(v0), a0);
        a1 = sq_acc(_mm256_extractf128_ps(v0, 1), a1);
        a2 = sq_acc(_mm256_castps256_ps128(v1), a2);
        a3 = sq_acc(_mm256_extractf128_ps(v1, 1), a3);
      }
      for (; i < d8; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = sq_acc(_mm256_castps256_ps128(v), a0);
        a1 = sq_acc(_mm256_extractf128_ps(v, 1), a1);
      }
      if (d8 < d) {
        __m256 v = _mm256_maskload_ps(x + d8, tail);
        a0 = sq_acc(_mm256_castps256_ps128(v), a0);
        a1 = sq_acc(_mm256_extractf128_ps(v, 1), a1);
      }
    }
    __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double sum_sq = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
    float scale = (float)(1.0 / sqrt(sum_sq / (double)d + (double)job->eps));
    const __m256 vs = _mm256_set1_ps(scale);
    const float *w = job->weight;
    int64_t i = 0; /* pass 2: out = r * scale * weight (out may be x) */
    for (; i + 16 <= d; i += 16) {
      __m256 o0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(r + i), vs), _mm256_loadu_ps(w + i));
      __m256 o1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(r + i + 8), vs),
                                _mm256_loadu_ps(w + i + 8));
      _mm256_storeu_ps(out + i, o0);
      _mm256_storeu_ps(out + i + 8, o1);
    }
    for (; i < d8; i += 8)
      _mm256_storeu_ps(out + i,
                       _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(r + i), vs), _mm256_loadu_ps(w + i)));
    if (d8 < d) {
      __m256 o = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(r + d8, tail), vs),
                               _mm256_maskload_ps(w + d8, tail));
      _mm256_maskstore_ps(out + d8, tail, o);
    }
  }
}

void armllm_avx2_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, float *residual,
                         int64_t ldr, const float *weight, int64_t t, int64_t d, float eps,
                         float *out, int64_t ldo) {
  armllm_norm_job job = {x, ldx, residual, ldr, weight, d, eps, out, ldo};
  /* a few rows: not worth waking workers */
  armllm_rows_run(pool, t, d, 32768, avx2_rmsnorm_rows, &job);
}

/* ----------------------------------------------------------- layernorm */

/* x[i, i + 8) of a row of d, lanes past d loaded as 0 (*m: the valid lanes). */
static inline __m256 load8(const float *x, int64_t i, int64_t d, __m256i *m) {
  *m = armllm_avx2_tail_mask(i + 8 <= d ? 8 : d - i);
  return _mm256_maskload_ps(x + i, *m);
}

static inline double hsum4d(__m256d s) {
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

/* The mean of x[0, d) in double. */
static inline double row_mean(const float *x, int64_t d) {
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  __m256i m;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 v = load8(x, i, d, &m);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  return hsum4d(_mm256_add_pd(s0, s1)) / (double)d;
}

/* sum (x - mean)^2 over x[0, d) in double; lanes past d add 0. */
static inline double row_sq_dev(const float *x, int64_t d, double mean) {
  const __m256d vm = _mm256_set1_pd(mean);
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  __m256i m;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 v = load8(x, i, d, &m);
    /* the lane mask widened to the two halves' doubles */
    const __m256d m0 = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(m)));
    const __m256d m1 = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1)));
    const __m256d lo = _mm256_and_pd(m0, _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vm));
    const __m256d hi = _mm256_and_pd(m1, _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vm));
    s0 = _mm256_fmadd_pd(lo, lo, s0);
    s1 = _mm256_fmadd_pd(hi, hi, s1);
  }
  return hsum4d(_mm256_add_pd(s0, s1));
}

static void avx2_layernorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_layernorm_job *job = ctx;
  const int64_t d = job->d;
  __m256i m;
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const double mean = row_mean(x, d);
    const double var = row_sq_dev(x, d, mean) / (double)d;
    const __m256 vm = _mm256_set1_ps((float)mean);
    const __m256 vs = _mm256_set1_ps((float)(1.0 / sqrt(var + (double)job->eps)));
    for (int64_t i = 0; i < d; i += 8) { /* ref's float steps, unfused (out may be x) */
      __m256 v = _mm256_sub_ps(load8(x, i, d, &m), vm);
      v = _mm256_mul_ps(_mm256_mul_ps(v, vs), _mm256_maskload_ps(job->weight + i, m));
      __asm__("" : "+x"(v)); /* keeps the bias add out of an FMA */
      if (job->bias) v = _mm256_add_ps(v, _mm256_maskload_ps(job->bias + i, m));
      _mm256_maskstore_ps(out + i, m, v);
    }
  }
}

void armllm_avx2_layernorm(armllm_pool *pool, const float *x, int64_t ldx, const float *weight,
                           const float *bias, int64_t t, int64_t d, float eps, float *out,
                           int64_t ldo) {
  armllm_layernorm_job job = {x, ldx, weight, bias, d, eps, out, ldo};
  armllm_rows_run(pool, t, d, 32768, avx2_layernorm_rows, &job); /* as rmsnorm */
}
