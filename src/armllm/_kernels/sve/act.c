/* sve/act.c: SiLU(gate) * up and GELU-tanh(gate) * up on a fused
 * [T, 2*inter] gate/up buffer.
 *
 * SiLU: out = g / (1 + exp(-g)) * u; GELU-tanh: c = g * g * CUBIC,
 * z = fmaf(c, g, g) * TWO_K, out = g / (1 + exp(-z)) * u (family_jobs.h).
 * With the shared vector exp (vexp_sve.h) these are ref's operations in
 * ref's order, so results are bit-identical.
 */
#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_sve.h"

static inline svfloat32_t silu_mul_vec(svbool_t pg, svfloat32_t g, svfloat32_t u) {
  svfloat32_t e = armllm_sve_opaque(armllm_sve_vexp(pg, svneg_f32_x(pg, g)));
  svfloat32_t d = svadd_n_f32_x(pg, e, 1.0f);
  return svmul_f32_x(pg, svdiv_f32_x(pg, g, d), u);
}

static inline svfloat32_t gelu_mul_vec(svbool_t pg, svfloat32_t g, svfloat32_t u) {
  svfloat32_t c = svmul_n_f32_x(pg, svmul_f32_x(pg, g, g), ARMLLM_GELU_CUBIC);
  svfloat32_t z = svmul_n_f32_x(pg, svmla_f32_x(pg, g, c, g), ARMLLM_GELU_TWO_K); /* g + c*g */
  svfloat32_t e = armllm_sve_opaque(armllm_sve_vexp(pg, svneg_f32_x(pg, z)));
  svfloat32_t d = svadd_n_f32_x(pg, e, 1.0f);
  return svmul_f32_x(pg, svdiv_f32_x(pg, g, d), u);
}

/* A vector activation times up (silu_mul_vec, gelu_mul_vec). */
typedef svfloat32_t (*sve_act_fn)(svbool_t pg, svfloat32_t g, svfloat32_t u);

/* op over one row of n columns, two vectors per iteration, then a
 * predicated tail. Loads precede stores: out may equal g. */
static inline __attribute__((always_inline)) void sve_act_row(const float *g, const float *u,
                                                              float *out, int64_t n,
                                                              sve_act_fn op) {
  const int64_t vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  int64_t j = 0;
  for (; j + 2 * vl <= n; j += 2 * vl) {
    svfloat32_t g0 = svld1_f32(pt, g + j), g1 = svld1_f32(pt, g + j + vl);
    svfloat32_t u0 = svld1_f32(pt, u + j), u1 = svld1_f32(pt, u + j + vl);
    svfloat32_t o0 = op(pt, g0, u0), o1 = op(pt, g1, u1);
    svst1_f32(pt, out + j, o0);
    svst1_f32(pt, out + j + vl, o1);
  }
  for (; j < n; j += vl) {
    svbool_t pg = svwhilelt_b32_s64(j, n);
    svst1_f32(pg, out + j, op(pg, svld1_f32(pg, g + j), svld1_f32(pg, u + j)));
  }
}

static void silu_mul_row(const float *g, const float *u, float *out, int64_t n) {
  sve_act_row(g, u, out, n, silu_mul_vec);
}

static void gelu_mul_row(const float *g, const float *u, float *out, int64_t n) {
  sve_act_row(g, u, out, n, gelu_mul_vec);
}

static void sve_silu_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_act_rows(ctx, t0, t1, silu_mul_row);
}

static void sve_gelu_tanh_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_act_rows(ctx, t0, t1, gelu_mul_row);
}

void armllm_sve_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                         int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), sve_silu_mul_rows, &job);
}

void armllm_sve_gelu_tanh_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                              int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), sve_gelu_tanh_mul_rows, &job);
}

/* 1 / v by FRECPE and two Newton-Raphson steps (FRECPS): a few ulp, without
 * the unpipelined FDIV (v = 1 + z/2 in [1, 6.7] here). */
static inline svfloat32_t recip_vec(svbool_t pg, svfloat32_t v) {
  svfloat32_t r = svrecpe_f32(v);
  r = svmul_f32_x(pg, r, svrecps_f32(v, r));
  return svmul_f32_x(pg, r, svrecps_f32(v, r));
}

/* Exact GELU (family_jobs.h's erfc form); FMAX/FMIN propagate NaN. */
static inline svfloat32_t gelu_vec(svbool_t pg, svfloat32_t x) {
  const svfloat32_t xc =
      svmin_n_f32_x(pg, svmax_n_f32_x(pg, x, -ARMLLM_GELU_CLAMP), ARMLLM_GELU_CLAMP);
  const svfloat32_t z = svmul_n_f32_x(pg, svabs_f32_x(pg, xc), ARMLLM_SQRT1_2);
  const svfloat32_t hz = svmul_n_f32_x(pg, z, 0.5f);
  const svfloat32_t t = recip_vec(pg, svadd_n_f32_x(pg, hz, 1.0f));
  const svfloat32_t u = svmul_f32_x(pg, hz, t); /* 1 - t */
  svfloat32_t p = svmad_n_f32_x(pg, svdup_n_f32(ARMLLM_GELU_R9), u, ARMLLM_GELU_R8);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R7);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R6);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R5);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R4);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R3);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R2);
  p = svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R1);
  p = svmul_f32_x(pg, svmad_n_f32_x(pg, p, u, ARMLLM_GELU_R0), u);
  const svfloat32_t erfc = svmul_f32_x(pg, t, armllm_sve_vexp(pg, svmls_f32_x(pg, p, z, z)));
  const svfloat32_t hx = svmul_n_f32_x(pg, xc, 0.5f);
  /* x > 0: x - x/2 erfc(z); else x/2 erfc(z) */
  return svsel_f32(svcmpgt_n_f32(pg, x, 0.0f), svmls_f32_x(pg, x, hx, erfc),
                   svmul_f32_x(pg, hx, erfc));
}

static void sve_gelu_span(const float *x, float *y, int64_t n) {
  const int64_t vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  int64_t i = 0;
  for (; i + 2 * vl <= n; i += 2 * vl) { /* two chains */
    const svfloat32_t a = gelu_vec(pt, svld1_f32(pt, x + i));
    const svfloat32_t b = gelu_vec(pt, svld1_f32(pt, x + i + vl));
    svst1_f32(pt, y + i, a);
    svst1_f32(pt, y + i + vl, b);
  }
  for (; i < n; i += vl) {
    const svbool_t pg = svwhilelt_b32_s64(i, n);
    svst1_f32(pg, y + i, gelu_vec(pg, svld1_f32(pg, x + i)));
  }
}

static void sve_gelu_chunks(void *ctx, int64_t c0, int64_t c1) {
  armllm_gelu_chunks(ctx, c0, c1, sve_gelu_span);
}

void armllm_sve_gelu(armllm_pool *pool, const float *x, float *y, int64_t n) {
  armllm_gelu_run(pool, x, y, n, sve_gelu_chunks);
}
