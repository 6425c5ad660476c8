/* neon/act.c: SiLU(gate) * up and GELU-tanh(gate) * up on a fused
 * [T, 2*inter] gate/up buffer, split into (row, block of columns) items so
 * that a decode row spreads over the pool too.
 *
 * exp is the shared vector exp (bit-identical to ref). SiLU's division
 * g / (1 + e) uses FRECPE with two Newton-Raphson steps (FRECPS) instead of
 * FDIV, which on Neoverse cores is unpipelined on one pipe (about 10 cycles
 * per 4 lanes) and would dominate: relative error a few ulp (<< 1e-5);
 * special cases follow IEEE division (1 + e = inf gives -0 / NaN as g / inf).
 * GELU-tanh keeps FDIV and ref's operations in ref's order (family_jobs.h),
 * so its results are ref's bits, as on x86.
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_neon.h"

static inline __attribute__((always_inline)) float32x4_t silu_mul4(float32x4_t g, float32x4_t u) {
  float32x4_t den = vaddq_f32(vdupq_n_f32(1.0f), armllm_vexpq_f32(vnegq_f32(g)));
  float32x4_t r = vrecpeq_f32(den);
  r = vmulq_f32(r, vrecpsq_f32(den, r));
  r = vmulq_f32(r, vrecpsq_f32(den, r));
  return vmulq_f32(vmulq_f32(g, r), u);
}

/* c = g * g * CUBIC; z = fmaf(c, g, g) * TWO_K; g / (1 + exp(-z)) * u, as ref */
static inline __attribute__((always_inline)) float32x4_t gelu_mul4(float32x4_t g, float32x4_t u) {
  float32x4_t c = vmulq_f32(vmulq_f32(g, g), vdupq_n_f32(ARMLLM_GELU_CUBIC));
  float32x4_t z = vmulq_f32(vfmaq_f32(g, c, g), vdupq_n_f32(ARMLLM_GELU_TWO_K));
  float32x4_t den = vaddq_f32(vdupq_n_f32(1.0f), armllm_vexpq_f32(vnegq_f32(z)));
  return vmulq_f32(vdivq_f32(g, den), u);
}

/* A variant's 4-lane activation times up (silu_mul4, gelu_mul4). */
typedef float32x4_t (*neon_act4_fn)(float32x4_t g, float32x4_t u);

/* op4 over n columns, two chains per iteration, the tail through a
 * zero-padded block. o may be g: each block is loaded before it is stored. */
static inline __attribute__((always_inline)) void neon_act_span(const float *g, const float *u,
                                                                float *o, int64_t n,
                                                                neon_act4_fn op4) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    float32x4_t a = op4(vld1q_f32(g + j), vld1q_f32(u + j));
    float32x4_t b = op4(vld1q_f32(g + j + 4), vld1q_f32(u + j + 4));
    vst1q_f32(o + j, a);
    vst1q_f32(o + j + 4, b);
  }
  for (; j + 4 <= n; j += 4) vst1q_f32(o + j, op4(vld1q_f32(g + j), vld1q_f32(u + j)));
  if (j < n) {
    float tg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int64_t r = n - j;
    memcpy(tg, g + j, (size_t)r * sizeof *tg);
    memcpy(tu, u + j, (size_t)r * sizeof *tu);
    vst1q_f32(tg, op4(vld1q_f32(tg), vld1q_f32(tu)));
    memcpy(o + j, tg, (size_t)r * sizeof *tg);
  }
}

static void silu_mul_span(const float *g, const float *u, float *o, int64_t n) {
  neon_act_span(g, u, o, n, silu_mul4);
}

static void gelu_mul_span(const float *g, const float *u, float *o, int64_t n) {
  neon_act_span(g, u, o, n, gelu_mul4);
}

#define ACT_BLOCK 2048 /* columns per work item: decode rows split across threads too */

/* Items [i0, i1) of an act job, item = (row, block of ACT_BLOCK columns),
 * each block with span. */
static inline __attribute__((always_inline)) void neon_act_items(const armllm_act_job *job,
                                                                 int64_t i0, int64_t i1,
                                                                 armllm_act_row_fn span) {
  const int64_t inter = job->inter, nb = (inter + ACT_BLOCK - 1) / ACT_BLOCK;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t t = it / nb, j0 = (it % nb) * ACT_BLOCK;
    const int64_t j1 = inter - j0 < ACT_BLOCK ? inter : j0 + ACT_BLOCK;
    const float *g = job->gate_up + t * job->ldg;
    span(g + j0, g + inter + j0, job->out + t * job->ldo + j0, j1 - j0);
  }
}

static void neon_silu_mul_items(void *ctx, int64_t i0, int64_t i1) {
  neon_act_items(ctx, i0, i1, silu_mul_span);
}

static void neon_gelu_tanh_mul_items(void *ctx, int64_t i0, int64_t i1) {
  neon_act_items(ctx, i0, i1, gelu_mul_span);
}

/* Runs task over the job's items. out may alias gate_up, and each item
 * reads and writes only its own columns. About 3 cycles per element (SiLU):
 * chunks of >= 8K elements are worth a thread. */
static void neon_act_run(armllm_pool *pool, armllm_act_job *job, int64_t t, armllm_task_fn task) {
  const int64_t inter = job->inter, nb = (inter + ACT_BLOCK - 1) / ACT_BLOCK, items = t * nb;
  const int64_t per_item = inter < ACT_BLOCK ? inter : ACT_BLOCK;
  const int64_t min_items = (8192 + per_item - 1) / per_item;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 2, min_items), task, job);
}

void armllm_neon_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                          int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  neon_act_run(pool, &job, t, neon_silu_mul_items);
}

void armllm_neon_gelu_tanh_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                               int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  neon_act_run(pool, &job, t, neon_gelu_tanh_mul_items);
}

/* 1 / v by FRECPE and two Newton-Raphson steps (FRECPS): a few ulp, without
 * the unpipelined FDIV (v = 1 + z/2 in [1, 6.7] here). */
static inline __attribute__((always_inline)) float32x4_t recip4(float32x4_t v) {
  float32x4_t r = vrecpeq_f32(v);
  r = vmulq_f32(r, vrecpsq_f32(v, r));
  return vmulq_f32(r, vrecpsq_f32(v, r));
}

/* Exact GELU of 4 lanes (family_jobs.h's erfc form); FMAX/FMIN propagate NaN. */
static inline __attribute__((always_inline)) float32x4_t gelu4(float32x4_t x) {
  const float32x4_t xc = vminq_f32(vdupq_n_f32(ARMLLM_GELU_CLAMP),
                                   vmaxq_f32(vdupq_n_f32(-ARMLLM_GELU_CLAMP), x));
  const float32x4_t z = vmulq_f32(vabsq_f32(xc), vdupq_n_f32(ARMLLM_SQRT1_2));
  const float32x4_t hz = vmulq_f32(z, vdupq_n_f32(0.5f));
  const float32x4_t t = recip4(vaddq_f32(hz, vdupq_n_f32(1.0f)));
  const float32x4_t u = vmulq_f32(hz, t); /* 1 - t */
  float32x4_t p = vdupq_n_f32(ARMLLM_GELU_R9);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R8), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R7), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R6), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R5), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R4), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R3), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R2), p, u);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R1), p, u);
  p = vmulq_f32(vfmaq_f32(vdupq_n_f32(ARMLLM_GELU_R0), p, u), u);
  const float32x4_t erfc = vmulq_f32(t, armllm_vexpq_f32(vfmsq_f32(p, z, z)));
  const float32x4_t hx = vmulq_f32(xc, vdupq_n_f32(0.5f));
  /* x > 0: x - x/2 erfc(z); else x/2 erfc(z) */
  return vbslq_f32(vcgtq_f32(x, vdupq_n_f32(0.0f)), vfmsq_f32(x, hx, erfc), vmulq_f32(hx, erfc));
}

static void neon_gelu_span(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) { /* two chains */
    const float32x4_t a = gelu4(vld1q_f32(x + i)), b = gelu4(vld1q_f32(x + i + 4));
    vst1q_f32(y + i, a);
    vst1q_f32(y + i + 4, b);
  }
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, gelu4(vld1q_f32(x + i)));
  if (i < n) { /* the tail through a zero-padded block */
    float tx[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(tx, x + i, (size_t)(n - i) * sizeof *tx);
    vst1q_f32(tx, gelu4(vld1q_f32(tx)));
    memcpy(y + i, tx, (size_t)(n - i) * sizeof *tx);
  }
}

static void neon_gelu_chunks(void *ctx, int64_t c0, int64_t c1) {
  armllm_gelu_chunks(ctx, c0, c1, neon_gelu_span);
}

void armllm_neon_gelu(armllm_pool *pool, const float *x, float *y, int64_t n) {
  armllm_gelu_run(pool, x, y, n, neon_gelu_chunks);
}
