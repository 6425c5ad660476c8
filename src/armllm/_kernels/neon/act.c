/* neon/act.c: SiLU(gate) * up on a fused [T, 2*inter] gate/up buffer.
 *
 * exp is the shared vector exp (bit-identical to ref); the division
 * g / (1 + e) uses FRECPE with two Newton-Raphson steps (FRECPS) instead of
 * FDIV, which on Neoverse cores is unpipelined on one pipe (about 10 cycles
 * per 4 lanes) and would dominate. Relative error a few ulp (<< 1e-5).
 * Special cases follow IEEE division: 1 + e = inf gives -0 / NaN as g / inf.
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

#define ACT_BLOCK 2048 /* columns per work item: decode rows split across threads too */

static void neon_silu_mul_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_act_job *job = ctx;
  const int64_t inter = job->inter, nb = (inter + ACT_BLOCK - 1) / ACT_BLOCK;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t t = it / nb, j0 = (it % nb) * ACT_BLOCK;
    const int64_t j1 = inter - j0 < ACT_BLOCK ? inter : j0 + ACT_BLOCK;
    const float *g = job->gate_up + t * job->ldg;
    const float *u = g + inter;
    float *o = job->out + t * job->ldo;
    int64_t j = j0;
    for (; j + 8 <= j1; j += 8) { /* two chains per iteration */
      float32x4_t a = silu_mul4(vld1q_f32(g + j), vld1q_f32(u + j));
      float32x4_t b = silu_mul4(vld1q_f32(g + j + 4), vld1q_f32(u + j + 4));
      vst1q_f32(o + j, a);
      vst1q_f32(o + j + 4, b);
    }
    for (; j + 4 <= j1; j += 4) vst1q_f32(o + j, silu_mul4(vld1q_f32(g + j), vld1q_f32(u + j)));
    if (j < j1) {
      float tg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      int64_t r = j1 - j;
      memcpy(tg, g + j, (size_t)r * sizeof *tg);
      memcpy(tu, u + j, (size_t)r * sizeof *tu);
      vst1q_f32(tg, silu_mul4(vld1q_f32(tg), vld1q_f32(tu)));
      memcpy(o + j, tg, (size_t)r * sizeof *tg);
    }
  }
}

void armllm_neon_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                          int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  /* Items are (row, block of ACT_BLOCK columns); out may alias gate_up, and
   * each item reads and writes only its own columns. About 3 cycles per
   * element: chunks of >= 8K elements are worth a thread. */
  const int64_t nb = (inter + ACT_BLOCK - 1) / ACT_BLOCK, items = t * nb;
  const int64_t per_item = inter < ACT_BLOCK ? inter : ACT_BLOCK;
  const int64_t min_items = (8192 + per_item - 1) / per_item;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 2, min_items), neon_silu_mul_items,
                  &job);
}
