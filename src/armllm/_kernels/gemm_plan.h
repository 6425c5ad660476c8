/* gemm_plan.h: how a GEMM is cut into pool items, and the edge-tile copies,
 * shared by the GEMM drivers that use them (neon, neon_mmla).
 *
 * Decode: items are groups of `group` panels. Prefill: items are
 * (N chunk of cp panels) x (M tile of mr rows), N chunk major, so that the
 * items a thread claims in a row share one B block; cp shrinks until there
 * are about 4 items per thread. Chunks below min_chunk_macs of work stay
 * on one thread.
 */
#ifndef ARMLLM_GEMM_PLAN_H
#define ARMLLM_GEMM_PLAN_H

#include <stdint.h>
#include <string.h>

#include "pool.h"

#define ARMLLM_ITEMS_PER_THREAD 4 /* enough to even out uneven chunks, few enough to share B */

typedef struct {
  int64_t items, grain;
  int64_t n_mt, cp; /* prefill only: M tiles, panels per N chunk */
} armllm_gemm_plan;

static inline armllm_gemm_plan armllm_plan_decode(const armllm_pool *pool, int64_t m, int64_t k,
                                                  int64_t n_panels, int64_t nr, int64_t group,
                                                  int64_t min_chunk_macs) {
  armllm_gemm_plan plan = {0, 0, 0, 0};
  plan.items = (n_panels + group - 1) / group;
  const int64_t macs = m * k * nr * group;
  plan.grain = armllm_pool_grain(pool, plan.items, ARMLLM_ITEMS_PER_THREAD,
                                 (min_chunk_macs + macs - 1) / macs);
  return plan;
}

static inline armllm_gemm_plan armllm_plan_prefill(const armllm_pool *pool, int64_t m, int64_t k,
                                                   int64_t n_panels, int64_t mr, int64_t nr,
                                                   int64_t cp_max, int64_t min_chunk_macs) {
  armllm_gemm_plan plan;
  plan.n_mt = (m + mr - 1) / mr;
  const int64_t want_nc =
      (ARMLLM_ITEMS_PER_THREAD * armllm_pool_threads(pool) + plan.n_mt - 1) / plan.n_mt;
  const int64_t cp = (n_panels + want_nc - 1) / want_nc;
  plan.cp = cp < 1 ? 1 : (cp > cp_max ? cp_max : cp);
  plan.items = (n_panels + plan.cp - 1) / plan.cp * plan.n_mt;
  const int64_t macs = mr * nr * plan.cp * k;
  plan.grain = armllm_pool_grain(pool, plan.items, ARMLLM_ITEMS_PER_THREAD,
                                 (min_chunk_macs + macs - 1) / macs);
  return plan;
}

/* An edge tile (mv x nv of an mr x nr tile) runs through a zeroed stack tile
 * t of row stride nr: load the valid part of y (when accumulating onto an
 * earlier K block) and of the bias, run the kernel on t, store back. */
static inline void armllm_edge_tile_load(float *t, float *tb, int64_t nr, const float *y,
                                         int64_t ldy, int64_t mv, int64_t nv, int first,
                                         const float *bias) {
  if (!first)
    for (int64_t r = 0; r < mv; r++) memcpy(t + r * nr, y + r * ldy, (size_t)nv * sizeof *t);
  if (bias) memcpy(tb, bias, (size_t)nv * sizeof *tb);
}

static inline void armllm_edge_tile_store(const float *t, int64_t nr, float *y, int64_t ldy,
                                          int64_t mv, int64_t nv) {
  for (int64_t r = 0; r < mv; r++) memcpy(y + r * ldy, t + r * nr, (size_t)nv * sizeof *t);
}

#endif /* ARMLLM_GEMM_PLAN_H */
