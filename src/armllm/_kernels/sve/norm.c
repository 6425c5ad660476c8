/* sve/norm.c: RMSNorm with optional fused residual add.
 *
 * The sum of squares is accumulated in double like ref (f32 squares are
 * exact in double; only the summation order differs, by ~1e-16), the scale
 * is computed as in ref, and out = (r * scale) * weight in f32 as in ref.
 */
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include <arm_sve.h>
#include "vexp_sve.h" /* armllm_sve_opaque */

/* acc += even lanes^2 and odd lanes^2 of v, in double. */
static inline void sumsq_f64(svbool_t pd, svfloat32_t v, svfloat64_t *acc_e, svfloat64_t *acc_o) {
  svfloat64_t e = svcvt_f64_f32_x(pd, v);
  svfloat32_t odd = svreinterpret_f32_u64(svlsr_n_u64_x(pd, svreinterpret_u64_f32(v), 32));
  svfloat64_t o = svcvt_f64_f32_x(pd, odd);
  *acc_e = svmla_f64_x(pd, *acc_e, e, e);
  *acc_o = svmla_f64_x(pd, *acc_o, o, o);
}

static void sve_rmsnorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_norm_job *job = ctx;
  const int64_t vl = (int64_t)svcntw(), d = job->d;
  const svbool_t pt = svptrue_b32(), pd = svptrue_b64();
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const float *r = x;
    svfloat64_t a0 = svdup_n_f64(0.0), a1 = svdup_n_f64(0.0);
    svfloat64_t a2 = svdup_n_f64(0.0), a3 = svdup_n_f64(0.0);
    if (job->residual) {
      float *res = job->residual + t * job->ldr;
      for (int64_t i = 0; i < d; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, d);
        svfloat32_t v = svadd_f32_x(pg, svld1_f32(pg, res + i), svld1_f32(pg, x + i));
        svst1_f32(pg, res + i, v);
        sumsq_f64(pd, svsel_f32(pg, v, svdup_n_f32(0.0f)), &a0, &a1);
      }
      r = res;
    } else {
      int64_t i = 0;
      for (; i + 2 * vl <= d; i += 2 * vl) {
        sumsq_f64(pd, svld1_f32(pt, x + i), &a0, &a1);
        sumsq_f64(pd, svld1_f32(pt, x + i + vl), &a2, &a3);
      }
      for (; i < d; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, d);
        sumsq_f64(pd, svld1_f32(pg, x + i), &a0, &a1); /* inactive lanes load 0 */
      }
    }
    svfloat64_t acc = svadd_f64_x(pd, svadd_f64_x(pd, a0, a1), svadd_f64_x(pd, a2, a3));
    double sum_sq = svaddv_f64(pd, acc);
    float scale = (float)(1.0 / sqrt(sum_sq / (double)d + (double)job->eps));
    const svfloat32_t vs = svdup_n_f32(scale);
    for (int64_t i = 0; i < d; i += vl) {
      svbool_t pg = svwhilelt_b32_s64(i, d);
      svfloat32_t v = svmul_f32_x(pg, svld1_f32(pg, r + i), vs);
      svst1_f32(pg, out + i, svmul_f32_x(pg, v, svld1_f32(pg, job->weight + i)));
    }
  }
}

void armllm_sve_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, float *residual,
                        int64_t ldr, const float *weight, int64_t t, int64_t d, float eps,
                        float *out, int64_t ldo) {
  armllm_norm_job job = {x, ldx, residual, ldr, weight, d, eps, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), sve_rmsnorm_rows, &job);
}

/* ----------------------------------------------------------- layernorm */

/* Even and odd float lanes of v (both as doubles) into acc_e and acc_o. */
static inline void sum_f64(svbool_t pd, svfloat32_t v, svfloat64_t *acc_e, svfloat64_t *acc_o) {
  svfloat32_t odd = svreinterpret_f32_u64(svlsr_n_u64_x(pd, svreinterpret_u64_f32(v), 32));
  *acc_e = svadd_f64_x(pd, *acc_e, svcvt_f64_f32_x(pd, v));
  *acc_o = svadd_f64_x(pd, *acc_o, svcvt_f64_f32_x(pd, odd));
}

/* (e - mean)^2 and (o - mean)^2 of v's even and odd lanes into acc_e, acc_o. */
static inline void sq_dev_f64(svbool_t pd, svfloat32_t v, svfloat64_t vm, svfloat64_t *acc_e,
                              svfloat64_t *acc_o) {
  svfloat32_t odd = svreinterpret_f32_u64(svlsr_n_u64_x(pd, svreinterpret_u64_f32(v), 32));
  svfloat64_t e = svsub_f64_x(pd, svcvt_f64_f32_x(pd, v), vm);
  svfloat64_t o = svsub_f64_x(pd, svcvt_f64_f32_x(pd, odd), vm);
  *acc_e = svmla_f64_x(pd, *acc_e, e, e);
  *acc_o = svmla_f64_x(pd, *acc_o, o, o);
}

/* mean and variance of x[0, d) in double: whole vectors, then the tail. */
static void row_moments(const float *x, int64_t d, double *mean, double *var) {
  const int64_t vl = (int64_t)svcntw(), whole = d / vl * vl;
  const svbool_t pt = svptrue_b32(), pd = svptrue_b64();
  svfloat64_t a0 = svdup_n_f64(0.0), a1 = a0;
  for (int64_t i = 0; i < whole; i += vl) sum_f64(pd, svld1_f32(pt, x + i), &a0, &a1);
  double sum = svaddv_f64(pd, svadd_f64_x(pd, a0, a1));
  for (int64_t i = whole; i < d; i++) sum += x[i];
  *mean = sum / (double)d;
  const svfloat64_t vm = svdup_n_f64(*mean);
  a0 = a1 = svdup_n_f64(0.0);
  for (int64_t i = 0; i < whole; i += vl) sq_dev_f64(pd, svld1_f32(pt, x + i), vm, &a0, &a1);
  double sq = svaddv_f64(pd, svadd_f64_x(pd, a0, a1));
  for (int64_t i = whole; i < d; i++) sq += ((double)x[i] - *mean) * ((double)x[i] - *mean);
  *var = sq / (double)d;
}

static void sve_layernorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_layernorm_job *job = ctx;
  const int64_t vl = (int64_t)svcntw(), d = job->d;
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    double mean, var;
    row_moments(x, d, &mean, &var);
    const float m = (float)mean, s = (float)(1.0 / sqrt(var + (double)job->eps));
    for (int64_t i = 0; i < d; i += vl) { /* ref's float steps, unfused (out may be x) */
      const svbool_t pg = svwhilelt_b32_s64(i, d);
      svfloat32_t v = svmul_n_f32_x(pg, svsub_n_f32_x(pg, svld1_f32(pg, x + i), m), s);
      v = armllm_sve_opaque(svmul_f32_x(pg, v, svld1_f32(pg, job->weight + i)));
      if (job->bias) v = svadd_f32_x(pg, v, svld1_f32(pg, job->bias + i));
      svst1_f32(pg, out + i, v);
    }
  }
}

void armllm_sve_layernorm(armllm_pool *pool, const float *x, int64_t ldx, const float *weight,
                          const float *bias, int64_t t, int64_t d, float eps, float *out,
                          int64_t ldo) {
  armllm_layernorm_job job = {x, ldx, weight, bias, d, eps, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), sve_layernorm_rows, &job);
}
