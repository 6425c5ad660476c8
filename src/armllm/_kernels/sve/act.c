/* sve/act.c: SiLU(gate) * up on a fused [T, 2*inter] gate/up buffer.
 *
 * out = g / (1 + exp(-g)) * u with the shared vector exp (vexp_sve.h): the
 * same operations in the same order as ref, so results are bit-identical.
 */
#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_sve.h"

static inline svfloat32_t silu_mul_vec(svbool_t pg, svfloat32_t g, svfloat32_t u) {
  svfloat32_t e = armllm_sve_opaque(armllm_sve_vexp(pg, svneg_f32_x(pg, g)));
  svfloat32_t d = svadd_n_f32_x(pg, e, 1.0f);
  return svmul_f32_x(pg, svdiv_f32_x(pg, g, d), u);
}

static void sve_silu_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_act_job *job = ctx;
  const int64_t vl = (int64_t)svcntw(), n = job->inter;
  const svbool_t pt = svptrue_b32();
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate_up + t * job->ldg;
    const float *u = g + n;
    float *out = job->out + t * job->ldo;
    int64_t j = 0;
    for (; j + 2 * vl <= n; j += 2 * vl) { /* loads precede stores: out may equal gate_up */
      svfloat32_t g0 = svld1_f32(pt, g + j), g1 = svld1_f32(pt, g + j + vl);
      svfloat32_t u0 = svld1_f32(pt, u + j), u1 = svld1_f32(pt, u + j + vl);
      svfloat32_t o0 = silu_mul_vec(pt, g0, u0), o1 = silu_mul_vec(pt, g1, u1);
      svst1_f32(pt, out + j, o0);
      svst1_f32(pt, out + j + vl, o1);
    }
    for (; j < n; j += vl) {
      svbool_t pg = svwhilelt_b32_s64(j, n);
      svfloat32_t o = silu_mul_vec(pg, svld1_f32(pg, g + j), svld1_f32(pg, u + j));
      svst1_f32(pg, out + j, o);
    }
  }
}

void armllm_sve_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                         int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), sve_silu_mul_rows, &job);
}
