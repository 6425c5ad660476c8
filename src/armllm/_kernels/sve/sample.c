/* sve/sample.c: the sampler's exp pass with the SVE exp (vexp_sve.h's, as it
 * is on [-80, 0]), any vector length: e over the whole row first, then neon's
 * block sums over it (the fixed 16-lane tree as NEON groups it, whatever the
 * vector length; e is still in cache). The other sampling slots are neon's
 * (table.c). */
#include <arm_sve.h>

#include "../armllm_kernels.h"
#include "vexp_sve.h"

double armllm_sve_sample_exp(const float *x, float *e, int64_t n, float m, float inv_t,
                             float keep_min, float *sums) {
  const int64_t vl = (int64_t)svcntw();
  for (int64_t i = 0; i < n; i += vl) {
    const svbool_t pg = svwhilelt_b32_s64(i, n);
    const svfloat32_t d = svmul_n_f32_x(pg, svsub_n_f32_x(pg, svld1_f32(pg, x + i), m), inv_t);
    const svbool_t in = svcmpge_n_f32(pg, d, ARMLLM_SAMPLE_D_MIN);
    svst1_f32(pg, e + i, svsel_f32(in, armllm_exp_nonpositive_sve(pg, d), svdup_n_f32(0.0f)));
  }
  return armllm_neon_sample_block_sums(e, n, keep_min, sums);
}
