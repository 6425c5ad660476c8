/* sve/sample.c: the sampler's exp pass with the SVE exp (vexp_sve.h's, as it
 * is on [-80, 0]), any vector length: e over the whole row first, then neon's
 * block sums over it (the fixed 16-lane tree as NEON groups it, whatever the
 * vector length; e is still in cache). The other sampling slots are neon's
 * (table.c). */
#include <arm_sve.h>

#include "../armllm_kernels.h"
#include "vexp_sve.h"

/* The shared exp (armllm_sve_vexp) for d in [-80, 0], where its clamp and NaN
 * pass-through change nothing and its two-step scaling by 2^n equals one
 * (every product is a normal float, so both are exact): the same operations
 * otherwise, so the same bits. Other lanes give unspecified values. */
static inline svfloat32_t exp_nonpositive(svbool_t pg, svfloat32_t d) {
  svfloat32_t n = svmad_n_f32_x(pg, d, svdup_n_f32(ARMLLM_EXP_LOG2E), ARMLLM_EXP_ROUND);
  n = svsub_n_f32_x(pg, n, ARMLLM_EXP_ROUND);
  svfloat32_t r = svmla_n_f32_x(pg, d, n, -ARMLLM_EXP_LN2_HI);
  r = svmla_n_f32_x(pg, r, n, ARMLLM_EXP_LN2_LO);
  svfloat32_t p = svmad_n_f32_x(pg, svdup_n_f32(ARMLLM_EXP_P0), r, ARMLLM_EXP_P1);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P2);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P3);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P4);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P5);
  p = svmla_f32_x(pg, r, p, svmul_f32_x(pg, r, r));
  p = svadd_n_f32_x(pg, p, 1.0f);
  const svint32_t scale = svlsl_n_s32_x(pg, svadd_n_s32_x(pg, svcvt_s32_f32_x(pg, n), 127), 23);
  return svmul_f32_x(pg, p, svreinterpret_f32_s32(scale));
}

double armllm_sve_sample_exp(const float *x, float *e, int64_t n, float m, float inv_t,
                             float keep_min, float *sums) {
  const int64_t vl = (int64_t)svcntw();
  for (int64_t i = 0; i < n; i += vl) {
    const svbool_t pg = svwhilelt_b32_s64(i, n);
    const svfloat32_t d = svmul_n_f32_x(pg, svsub_n_f32_x(pg, svld1_f32(pg, x + i), m), inv_t);
    const svbool_t in = svcmpge_n_f32(pg, d, ARMLLM_SAMPLE_D_MIN);
    svst1_f32(pg, e + i, svsel_f32(in, exp_nonpositive(pg, d), svdup_n_f32(0.0f)));
  }
  return armllm_neon_sample_block_sums(e, n, keep_min, sums);
}
