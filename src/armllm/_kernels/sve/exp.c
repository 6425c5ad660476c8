/* sve/exp.c: the shared exp approximation over an array (vexp_sve.h). */
#include "../armllm_kernels.h"
#include "vexp_sve.h"

void armllm_sve_exp(const float *x, float *y, int64_t n) {
  const int64_t vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  int64_t i = 0;
  for (; i + 2 * vl <= n; i += 2 * vl) { /* two independent chains per iteration */
    svfloat32_t a = svld1_f32(pt, x + i), b = svld1_f32(pt, x + i + vl);
    svst1_f32(pt, y + i, armllm_sve_vexp(pt, a));
    svst1_f32(pt, y + i + vl, armllm_sve_vexp(pt, b));
  }
  for (; i < n; i += vl) {
    svbool_t pg = svwhilelt_b32_s64(i, n);
    svst1_f32(pg, y + i, armllm_sve_vexp(pg, svld1_f32(pg, x + i)));
  }
}
