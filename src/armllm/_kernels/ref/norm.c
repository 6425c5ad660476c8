/* ref/norm.c: portable RMSNorm with optional fused residual add. */
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

static void ref_rmsnorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_norm_job *job = ctx;
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    const float *r = x;
    if (job->residual) {
      float *res = job->residual + t * job->ldr;
      for (int64_t i = 0; i < job->d; i++) res[i] += x[i];
      r = res;
    }
    double sum_sq = 0.0; /* the reference accumulates in double */
    for (int64_t i = 0; i < job->d; i++) sum_sq += (double)r[i] * r[i];
    float scale = (float)(1.0 / sqrt(sum_sq / (double)job->d + (double)job->eps));
    for (int64_t i = 0; i < job->d; i++) out[i] = r[i] * scale * job->weight[i];
  }
}

void armllm_ref_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, float *residual,
                        int64_t ldr, const float *weight, int64_t t, int64_t d, float eps,
                        float *out, int64_t ldo) {
  armllm_norm_job job = {x, ldx, residual, ldr, weight, d, eps, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), ref_rmsnorm_rows, &job);
}

/* LayerNorm rows [t0, t1): mean and variance in double, two passes (the
 * variants' sums may run in another order: same doubles to the last bits),
 * then out = (x - m) * s * weight [+ bias] in float. */
static void ref_layernorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_layernorm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t t = t0; t < t1; t++) {
    const float *x = job->x + t * job->ldx;
    float *out = job->out + t * job->ldo;
    double sum = 0.0;
    for (int64_t i = 0; i < d; i++) sum += x[i];
    const double mean = sum / (double)d;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < d; i++) sum_sq += ((double)x[i] - mean) * ((double)x[i] - mean);
    const float m = (float)mean, s = (float)(1.0 / sqrt(sum_sq / (double)d + (double)job->eps));
    for (int64_t i = 0; i < d; i++) {
      const float v = (x[i] - m) * s * job->weight[i];
      out[i] = job->bias ? v + job->bias[i] : v;
    }
  }
}

void armllm_ref_layernorm(armllm_pool *pool, const float *x, int64_t ldx, const float *weight,
                          const float *bias, int64_t t, int64_t d, float eps, float *out,
                          int64_t ldo) {
  armllm_layernorm_job job = {x, ldx, weight, bias, d, eps, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), ref_layernorm_rows, &job);
}
