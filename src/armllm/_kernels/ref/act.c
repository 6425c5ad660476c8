/* ref/act.c: portable act(gate) * up on a fused [T, 2*inter] gate/up buffer:
 * SiLU (SwiGLU) and GELU with the tanh approximation (GeGLU), both g / (1 +
 * exp(-z)) * u with z = g or gelu's 2w (family_jobs.h). */
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "../vexp.h"

/* Rows [t0, t1): z = g (gelu 0) or gelu's 2w (gelu 1); the flag is a constant in
 * each caller, so the compiler drops the branch. */
static inline void ref_act_rows(const armllm_act_job *job, int64_t t0, int64_t t1, int gelu) {
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate_up + t * job->ldg;
    const float *u = g + job->inter;
    float *out = job->out + t * job->ldo;
    for (int64_t j = 0; j < job->inter; j++) {
      float gj = g[j], uj = u[j], z = gj;
      if (gelu) z = fmaf(gj * gj * ARMLLM_GELU_CUBIC, gj, gj) * ARMLLM_GELU_TWO_K;
      out[j] = gj / (1.0f + armllm_exp_scalar(-z)) * uj;
    }
  }
}

static void ref_silu_mul_rows(void *ctx, int64_t t0, int64_t t1) { ref_act_rows(ctx, t0, t1, 0); }

static void ref_gelu_tanh_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  ref_act_rows(ctx, t0, t1, 1);
}

void armllm_ref_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                         int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), ref_silu_mul_rows, &job);
}

void armllm_ref_gelu_tanh_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                              int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), ref_gelu_tanh_mul_rows, &job);
}

/* Exact GELU: x/2 * erfc(-x / sqrt(2)) in double (libm), rounded once. erfc
 * rather than 1 + erf keeps the small values of negative x (1 + erf cancels).
 * x below -CLAMP is -CLAMP (y rounds to -0 there): -inf gives -0, not NaN. */
static void ref_gelu_span(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const double v = x[i] < -ARMLLM_GELU_CLAMP ? -ARMLLM_GELU_CLAMP : x[i];
    y[i] = (float)(0.5 * v * erfc(-v * 0.70710678118654752440)); /* 1 / sqrt(2) */
  }
}

static void ref_gelu_chunks(void *ctx, int64_t c0, int64_t c1) {
  armllm_gelu_chunks(ctx, c0, c1, ref_gelu_span);
}

void armllm_ref_gelu(armllm_pool *pool, const float *x, float *y, int64_t n) {
  armllm_gelu_run(pool, x, y, n, ref_gelu_chunks);
}
