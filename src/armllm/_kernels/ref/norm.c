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
