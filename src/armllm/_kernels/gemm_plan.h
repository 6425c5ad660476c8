/* gemm_plan.h: the GEMM drivers' shared part: the fields every float GEMM
 * job starts with, how a GEMM is cut into pool items, and the loops that
 * walk those items, calling a variant's micro-kernels (the Arm variants:
 * neon and neon_mmla gemm, the quantized GEMM of quant_arm.c).
 *
 * Decode (M <= ARMLLM_GEMM_DECODE_MAX_M): items are groups of `group`
 * column tiles, all M rows at once. Prefill: items are (N chunk of cp
 * column tiles) x (M tile of mr rows), N chunk major, so that the items a
 * thread claims in a row share one B block; cp shrinks until there are
 * about 4 items per thread. Chunks below min_chunk_macs of work stay on one
 * thread.
 *
 * The loops take the micro-kernels as function pointers; the drivers pass
 * constants, so after inlining the calls are direct. */
#ifndef ARMLLM_GEMM_PLAN_H
#define ARMLLM_GEMM_PLAN_H

#include <stdint.h>
#include <string.h>

#include "pool.h"

#define ARMLLM_ITEMS_PER_THREAD 4 /* enough to even out uneven chunks, few enough to share B */
#define ARMLLM_GEMM_DECODE_MAX_M 4 /* M above this takes the prefill tiles */
#define ARMLLM_EDGE_TILE_FLOATS 256 /* the largest tile (rows x columns) of any driver */
#define ARMLLM_EDGE_TILE_COLS 64    /* the widest tile */

/* The arguments of a float GEMM call (armllm_kernels.h), the first fields
 * of every float GEMM job, in the order of their positional initializers. */
#define ARMLLM_GEMM_JOB_ARGS \
  const float *x;            \
  int64_t m, k, ldx;         \
  const void *w;             \
  int64_t n;                 \
  const float *bias;         \
  float *y;                  \
  int64_t ldy

typedef struct {
  int64_t items, grain;
  int64_t n_mt, cp; /* prefill only: M tiles, column tiles per N chunk */
} armllm_gemm_plan;

static inline armllm_gemm_plan armllm_plan_decode(const armllm_pool *pool, int64_t m, int64_t k,
                                                  int64_t n_tiles, int64_t nc, int64_t group,
                                                  int64_t min_chunk_macs) {
  armllm_gemm_plan plan = {0, 0, 0, 0};
  plan.items = (n_tiles + group - 1) / group;
  const int64_t macs = m * k * nc * group;
  plan.grain = armllm_pool_grain(pool, plan.items, ARMLLM_ITEMS_PER_THREAD,
                                 (min_chunk_macs + macs - 1) / macs);
  return plan;
}

static inline armllm_gemm_plan armllm_plan_prefill(const armllm_pool *pool, int64_t m, int64_t k,
                                                   int64_t n_tiles, int64_t mr, int64_t nc,
                                                   int64_t cp_max, int64_t min_chunk_macs) {
  armllm_gemm_plan plan;
  plan.n_mt = (m + mr - 1) / mr;
  const int64_t want_nc =
      (ARMLLM_ITEMS_PER_THREAD * armllm_pool_threads(pool) + plan.n_mt - 1) / plan.n_mt;
  const int64_t cp = (n_tiles + want_nc - 1) / want_nc;
  plan.cp = cp < 1 ? 1 : (cp > cp_max ? cp_max : cp);
  plan.items = (n_tiles + plan.cp - 1) / plan.cp * plan.n_mt;
  const int64_t macs = mr * nc * plan.cp * k;
  plan.grain = armllm_pool_grain(pool, plan.items, ARMLLM_ITEMS_PER_THREAD,
                                 (min_chunk_macs + macs - 1) / macs);
  return plan;
}

/* A GEMM's output cut into tiles: what the item loops below walk. */
typedef struct {
  int64_t m, n;           /* rows of x, columns of y */
  int64_t mr, nc;         /* a tile's rows and columns */
  int64_t n_tiles;        /* column tiles, ceil(n / nc) */
  int64_t ksteps, kstep;  /* K in the driver's units (k, k groups, blocks), per K block */
  int64_t n_mt, cp;       /* set by armllm_gemm_run: M tiles, column tiles per item */
  float *y;
  int64_t ldy;
  const float *bias;
} armllm_tile_grid;

/* Prepares the rows [m0, m0 + mr) of the K block [kb, kb + kc) (packs or
 * gathers them into the thread's scratch). */
typedef void (*armllm_tile_rows_fn)(const void *job, void *scratch, int64_t m0, int64_t kb,
                                    int64_t kc);
/* Column tile t of those rows over the K block onto y (row stride ldy):
 * from +0 when first, else onto y; bias (last K block only) added. */
typedef void (*armllm_tile_fn)(const void *job, void *scratch, int64_t t, int64_t kb,
                               int64_t kc, float *y, int64_t ldy, int first, const float *bias);

#define ARMLLM_ZERO_ROW_FLOATS 512 /* the longest K block a packer reads */
static const float armllm_zero_row[ARMLLM_ZERO_ROW_FLOATS];

/* The rows of an M tile as a packer reads them (K blocks of at most
 * ARMLLM_ZERO_ROW_FLOATS): rp[r] = row m0 + r of x from column kb, or a
 * row of zeros past row m. */
static inline void armllm_tile_rows_at(const float *x, int64_t ldx, int64_t m, int64_t m0,
                                       int64_t kb, int mr, const float **rp) {
  for (int r = 0; r < mr; r++) rp[r] = m0 + r < m ? x + (m0 + r) * ldx + kb : armllm_zero_row;
}

/* Prefill (or quantized decode) items [i0, i1) of the grid: for each K
 * block, each M tile's rows are prepared once for the column tiles of its
 * N chunk. An edge tile (mv x nv of mr x nc) runs through a zeroed stack
 * tile: the valid part of y (when accumulating onto an earlier K block)
 * and of the bias in, the valid part out; the rest is never stored. */
static inline __attribute__((always_inline)) void armllm_gemm_tiles(
    const armllm_tile_grid *g, const void *job, void *scratch, int64_t i0, int64_t i1,
    armllm_tile_rows_fn rows, armllm_tile_fn tile) {
  for (int64_t i = i0; i < i1;) {
    const int64_t chunk = i / g->n_mt, mt0 = i % g->n_mt;
    const int64_t mt1 = mt0 + (i1 - i) < g->n_mt ? mt0 + (i1 - i) : g->n_mt;
    const int64_t ta = chunk * g->cp, tz = ta + g->cp < g->n_tiles ? ta + g->cp : g->n_tiles;
    for (int64_t kb = 0; kb < g->ksteps; kb += g->kstep) {
      const int64_t kc = g->ksteps - kb < g->kstep ? g->ksteps - kb : g->kstep;
      const int first = kb == 0, last = kb + kc == g->ksteps;
      for (int64_t mt = mt0; mt < mt1; mt++) {
        const int64_t m0 = mt * g->mr, mv = g->m - m0 < g->mr ? g->m - m0 : g->mr;
        rows(job, scratch, m0, kb, kc);
        for (int64_t t = ta; t < tz; t++) {
          const int64_t n0 = t * g->nc, nv = g->n - n0 < g->nc ? g->n - n0 : g->nc;
          const float *bias = last && g->bias ? g->bias + n0 : NULL;
          float *yt = g->y + m0 * g->ldy + n0;
          if (mv == g->mr && nv == g->nc) {
            tile(job, scratch, t, kb, kc, yt, g->ldy, first, bias);
            continue;
          }
          float et[ARMLLM_EDGE_TILE_FLOATS] __attribute__((aligned(64)));
          float eb[ARMLLM_EDGE_TILE_COLS] __attribute__((aligned(64)));
          memset(et, 0, (size_t)(g->mr * g->nc) * sizeof *et);
          memset(eb, 0, (size_t)g->nc * sizeof *eb);
          if (!first)
            for (int64_t r = 0; r < mv; r++)
              memcpy(et + r * g->nc, yt + r * g->ldy, (size_t)nv * sizeof *et);
          if (bias) memcpy(eb, bias, (size_t)nv * sizeof *eb);
          tile(job, scratch, t, kb, kc, et, g->nc, first, bias ? eb : NULL);
          for (int64_t r = 0; r < mv; r++)
            memcpy(yt + r * g->ldy, et + r * g->nc, (size_t)nv * sizeof *et);
        }
      }
    }
    i += mt1 - mt0;
  }
}

/* A decode micro-kernel: y[0..m) (+ bias) = x[0..m) times the panels of w
 * from p0 (the float GEMM call's arguments, with n the columns of y). */
typedef void (*armllm_decode_fn)(const float *x, int64_t ldx, int64_t k, const void *w,
                                 int64_t p0, const float *bias, float *y, int64_t ldy, int64_t n);

/* Decode items [g0, g1), groups of gp panels: a whole group runs `group`,
 * the short last one `single` panel by panel (x .. n: the call's). */
static inline __attribute__((always_inline)) void armllm_decode_groups(
    int64_t g0, int64_t g1, int64_t gp, int64_t n_panels, armllm_decode_fn group,
    armllm_decode_fn single, const float *x, int64_t ldx, int64_t k, const void *w,
    const float *bias, float *y, int64_t ldy, int64_t n) {
  for (int64_t g = g0; g < g1; g++) {
    const int64_t p0 = g * gp;
    if (p0 + gp <= n_panels) {
      group(x, ldx, k, w, p0, bias, y, ldy, n);
    } else {
      for (int64_t p = p0; p < n_panels; p++) single(x, ldx, k, w, p, bias, y, ldy, n);
    }
  }
}

/* Plans and runs a GEMM job on its grid: decode items of `decode_group`
 * column tiles (task `decode`; one M tile of all rows) when M is small,
 * else prefill items (task `prefill`) of at most cp_max column tiles. */
static inline void armllm_gemm_run(armllm_pool *pool, void *job, armllm_tile_grid *g, int64_t k,
                                   int64_t decode_group, int64_t cp_max, int64_t min_chunk_macs,
                                   armllm_task_fn decode, armllm_task_fn prefill) {
  if (g->m <= ARMLLM_GEMM_DECODE_MAX_M) {
    const armllm_gemm_plan plan =
        armllm_plan_decode(pool, g->m, k, g->n_tiles, g->nc, decode_group, min_chunk_macs);
    g->n_mt = 1;
    g->cp = decode_group;
    armllm_pool_run(pool, plan.items, plan.grain, decode, job);
    return;
  }
  const armllm_gemm_plan plan =
      armllm_plan_prefill(pool, g->m, k, g->n_tiles, g->mr, g->nc, cp_max, min_chunk_macs);
  g->n_mt = plan.n_mt;
  g->cp = plan.cp;
  armllm_pool_run(pool, plan.items, plan.grain, prefill, job);
}

#endif /* ARMLLM_GEMM_PLAN_H */
