/* attn_x86.h: the attention driver both x86 variants (avx2/attn.c,
 * avx512/attn.c) run around their own micro-kernels: work partitioning over
 * (query row tile, KV head, head chunk) units, the walk over a tile's
 * sub-tiles, the partition loop with its in-order merge, and the split-KV
 * path (partials to scratch, then a merge per (row, head) in partition
 * order: the same bits as the unsplit path). Static functions, so each ISA
 * file compiles them with its own flags.
 *
 * The including file defines, before including it: TILE_Q (query vectors per
 * tile), KC (keys per chunk: the prefetch distance), QPAD (q rows are
 * zero-padded to a multiple of it: its micro-kernels' step over head_dim)
 * and tile_ctx, a struct that starts with ARMLLM_X86_TILE_FIELDS
 * (attn_x86_tile.h: the sub-tile set up by tile_init, each query's key
 * range and q row, tile_partition's results, tile_rows' K and V rows and
 * int8 scales), and, after including it, the three functions declared
 * below. int8 caches: the variants compute in integers (attn_common.h), with
 * each row's scale from tile_rows on its key's scores and weights. */
#ifndef ARMLLM_ATTN_X86_H
#define ARMLLM_ATTN_X86_H

#include <immintrin.h>
#include <string.h>

#include "armllm_kernels.h"
#include "attn_common.h"

#ifndef PART
#define PART ARMLLM_ATTN_PARTITION
#endif
#ifndef MAXD
#define MAXD ARMLLM_ATTN_MAX_HEAD_DIM
#endif

/* ------------------------------------------------ what the variant supplies */

/* Whatever the variant keeps of query i besides t->q[i] (set up already),
 * once per sub-tile. */
static void tile_q_extra(tile_ctx *t, int64_t i);
/* The partial (mp, lp, accp, valid) of every query of the tile over
 * partition p. */
static void tile_partition(tile_ctx *t, int64_t p);
/* out[0..hd) = acc / l: the one final division both paths use. */
static void finish(float *out, const float *acc, float l, int64_t hd);

/* ------------------------------------------------ sub-tiles */

/* Sets up the sub-tile: rows [r0, r1) of sequence b, query heads [h0, h0 +
 * nh) of KV head kvh (their positions, key ranges and padded q rows). */
static void tile_init(tile_ctx *t, const armllm_attn_args *a, int64_t b, int64_t kvh, int64_t r0,
                      int64_t r1, int64_t h0, int64_t nh) {
  t->a = a;
  t->b = b;
  t->kvh = kvh;
  t->r0 = r0;
  t->r1 = r1;
  t->h0 = h0;
  t->nh = nh;
  t->nq = (r1 - r0) * nh;
  t->hd = a->head_dim;
  t->hdp = (a->head_dim + QPAD - 1) & ~(int64_t)(QPAD - 1);
  for (int64_t i = 0; i < t->nq; i++) {
    const int64_t row = r0 + i / nh, h = h0 + i % nh;
    t->pos[i] = armllm_attn_pos(a, b, row);
    t->lo[i] = armllm_attn_lo(a, t->pos[i]);
    const float *src = a->q + row * a->ldq + h * t->hd;
    memcpy(t->q[i], src, (size_t)t->hd * sizeof(float));
    for (int64_t d = t->hd; d < t->hdp; d++) t->q[i][d] = 0.0f;
    tile_q_extra(t, i);
  }
  t->lo_u = t->lo[0];
  t->pos_u = t->pos[t->nq - 1];
}

/* The cache row of key j (in block blk of the sequence) of the sub-tile's
 * KV head: its K/V rows' index, and its scales'. */
static inline int64_t tile_cache_row(const tile_ctx *t, int64_t blk, int64_t j) {
  const armllm_attn_args *a = t->a;
  const int64_t id = a->block_table[t->b * a->max_blocks + blk];
  return armllm_kv_row(id, t->kvh, j % a->block_size, a->num_blocks, a->block_size);
}

/* n bf16 scales from src as floats into dst (a loop the compiler widens). */
static inline void scales_to_f32(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = armllm_bf16_to_f32(src[i]);
}

/* int8 caches: the scales of keys [k0, k1) into t->ksc, t->vsc, a run of
 * side-by-side scales per block. */
static void tile_scales(tile_ctx *t, int64_t k0, int64_t k1) {
  const armllm_attn_args *a = t->a;
  const int64_t bs = a->block_size;
  for (int64_t j = k0; j < k1;) {
    const int64_t blk = j / bs, end = (blk + 1) * bs < k1 ? (blk + 1) * bs : k1;
    const int64_t row = tile_cache_row(t, blk, j);
    scales_to_f32(t->ksc + (j - k0), a->k_scale + row, end - j);
    scales_to_f32(t->vsc + (j - k0), a->v_scale + row, end - j);
    j = end;
  }
}

/* Row pointers of keys [k0, k1) into t->rows (K, then V), and for int8
 * caches their scales (tile_scales). The scales' lines are prefetched here
 * and read in a loop of their own: read along with the row pointers, the
 * partition's ~16 runs of scales (each in another block) missed a few at a
 * time, and int8 decode attention at 32K tokens took 8-9% longer (Zen 4,
 * 1 and 2 threads). */
static void tile_rows(tile_ctx *t, int64_t k0, int64_t k1) {
  const armllm_attn_args *a = t->a;
  const int64_t row_bytes = a->head_dim * (int64_t)armllm_kv_esz(a->cache_dtype);
  const int i8 = a->cache_dtype == ARMLLM_KV_I8;
  const char *kbase = a->k_cache, *vbase = a->v_cache;
  const int64_t bs = a->block_size, n = k1 - k0;
  for (int64_t j = k0; j < k1;) {
    const int64_t blk = j / bs, end = (blk + 1) * bs < k1 ? (blk + 1) * bs : k1;
    const int64_t row = tile_cache_row(t, blk, j);
    if (i8) {
      attn_prefetch_row(a->k_scale + row, (end - j) * (int64_t)sizeof *a->k_scale);
      attn_prefetch_row(a->v_scale + row, (end - j) * (int64_t)sizeof *a->v_scale);
    }
    const char *kp = kbase + row * row_bytes, *vp = vbase + row * row_bytes;
    for (; j < end; j++, kp += row_bytes, vp += row_bytes) {
      t->rows[j - k0] = kp;
      t->rows[n + j - k0] = vp;
    }
  }
  t->nrows = n;
  t->nnext = 0;
  if (i8) tile_scales(t, k0, k1);
}

/* Prefetches rows [s0, s1) of t->rows. */
static inline void tile_prefetch(const tile_ctx *t, int64_t s0, int64_t s1) {
  const int64_t bytes = t->hd * (int64_t)armllm_kv_esz(t->a->cache_dtype);
  if (s1 > 2 * t->nrows) s1 = 2 * t->nrows;
  for (int64_t s = s0; s < s1; s++) attn_prefetch_row(t->rows[s], bytes);
}

/* Appends to t->rows the first n (<= ARMLLM_ATTN_PF_NEXT) K rows of the
 * partition after p that the tile reads (t->nnext of them), so that the
 * prefetch running ahead of the rows in use (tile_pf, i8_pf) goes on from
 * the partition's last V rows into the next one's first K rows, one row a
 * key: without them each partition's first rows are fetched only as it
 * starts, too late to arrive. */
static inline void tile_rows_next(tile_ctx *t, int64_t p, int64_t n) {
  const armllm_attn_args *a = t->a;
  const int64_t row_bytes = t->hd * (int64_t)armllm_kv_esz(a->cache_dtype);
  const int64_t bs = a->block_size, k0 = (p + 1) * PART, last = t->pos_u + 1;
  const int64_t k1 = k0 + n < last ? k0 + n : last;
  const void **out = t->rows + 2 * t->nrows;
  for (int64_t j = k0; j < k1;) {
    const int64_t blk = j / bs, end = (blk + 1) * bs < k1 ? (blk + 1) * bs : k1;
    const char *kp = (const char *)a->k_cache + tile_cache_row(t, blk, j) * row_bytes;
    for (; j < end; j++, kp += row_bytes) *out++ = kp;
  }
  t->nnext = k1 > k0 ? k1 - k0 : 0;
}

/* Rows of t->rows to prefetch while working on the chunk of nj rows at
 * `at`: the next chunk's (K rows run on into V rows, and those into the
 * next partition's first K rows: tile_rows_next). */
static inline int64_t tile_pf(const tile_ctx *t, int64_t at, int64_t nj, const void *const **pf) {
  int64_t s = at + KC, end = 2 * t->nrows + t->nnext;
  if (s > end) s = end;
  *pf = t->rows + s;
  return end - s < nj ? end - s : nj;
}

/* int8 caches: rows prefetched ahead of the one in use (tile_pf's KC is 32).
 * On Zen 4 (one thread, Llama-3.2-1B's heads, 16 layers' caches at 4K
 * tokens, 8 at 16K) 64 took 16.2 and 14.8 ns a key and head, 32 took 17.7
 * and 16.8, 128 16.6 and 15.7: an int8 row is half a bf16 row's bytes. */
#define I8_PF 64
_Static_assert(I8_PF <= ARMLLM_ATTN_PF_NEXT && KC <= ARMLLM_ATTN_PF_NEXT,
               "tile_rows_next appends at most ARMLLM_ATTN_PF_NEXT rows");

/* tile_pf at a distance of I8_PF rows. */
static inline int64_t i8_pf(const tile_ctx *t, int64_t at, int64_t nj, const void *const **pf) {
  int64_t s = at + I8_PF, end = 2 * t->nrows + t->nnext;
  if (s > end) s = end;
  *pf = t->rows + s;
  return end - s < nj ? end - s : nj;
}

/* ------------------------------------------------ driver */

typedef struct {
  const armllm_attn_args *a;
  int64_t group;  /* query heads per KV head */
  int64_t hc;     /* query heads per chunk */
  int64_t nhc;    /* chunks per KV head */
  int64_t R;      /* rows per tile */
  int64_t ntiles; /* ceil(rows / R) */
  int64_t parts;  /* partitions per row, at most (split) */
  int64_t units;  /* ntiles * n_kv_heads * nhc */
} attn_job;

/* The one merge and the one final division both paths use. */
static __attribute__((noinline)) void merge_partial(armllm_softmax_state *st, float *acc,
                                                    float mp, float lp, const float *accp,
                                                    int64_t hd) {
  armllm_attn_merge(st, acc, mp, lp, accp, hd);
}


/* Unit u -> its tile, KV head and head chunk; walks the tile's sub-tiles
 * (one per sequence it touches), calling fn on each. */
typedef void (*subtile_fn)(const attn_job *job, tile_ctx *t, int64_t p);

static void run_unit(const attn_job *job, int64_t u, int64_t p, subtile_fn fn, tile_ctx *t) {
  const armllm_attn_args *a = job->a;
  const int64_t c = u % job->nhc, kvh = (u / job->nhc) % a->n_kv_heads;
  /* largest tiles (latest rows: longest causal ranges) first */
  const int64_t tile = job->ntiles - 1 - u / (job->nhc * a->n_kv_heads);
  const int64_t rows = a->query_start[a->n_seqs];
  const int64_t h0 = kvh * job->group + c * job->hc;
  const int64_t h1 = h0 + job->hc < (kvh + 1) * job->group ? h0 + job->hc : (kvh + 1) * job->group;
  int64_t r = tile * job->R;
  const int64_t rend = r + job->R < rows ? r + job->R : rows;
  while (r < rend) {
    const int64_t b = armllm_attn_seq_of_row(a, r);
    const int64_t r1 = a->query_start[b + 1] < rend ? a->query_start[b + 1] : rend;
    tile_init(t, a, b, kvh, r, r1, h0, h1 - h0);
    fn(job, t, p);
    r = r1;
  }
}

/* Unsplit: every partition of the sub-tile, merged as it comes. */
static void subtile_full(const attn_job *job, tile_ctx *t, int64_t p_unused) {
  (void)p_unused;
  const armllm_attn_args *a = job->a;
  float acc[TILE_Q][MAXD];
  armllm_softmax_state st[TILE_Q];
  for (int64_t i = 0; i < t->nq; i++) st[i] = (armllm_softmax_state){0.0f, 0.0f, 0};
  for (int64_t p = t->lo_u / PART; p <= t->pos_u / PART; p++) {
    tile_partition(t, p);
    for (int64_t i = 0; i < t->nq; i++)
      if (t->valid[i]) merge_partial(&st[i], acc[i], t->mp[i], t->lp[i], t->accp[i], t->hd);
  }
  for (int64_t i = 0; i < t->nq; i++) {
    const int64_t row = t->r0 + i / t->nh, h = t->h0 + i % t->nh;
    finish(a->out + row * a->ldo + h * t->hd, acc[i], armllm_attn_denominator(a, &st[i], h),
           t->hd);
  }
}

/* Split: partition p of the sub-tile (if it has keys there) into scratch. */
static void subtile_part(const attn_job *job, tile_ctx *t, int64_t p) {
  const armllm_attn_args *a = job->a;
  if (p < t->lo_u / PART || p > t->pos_u / PART) return;
  tile_partition(t, p);
  const int64_t stride = t->hd + 2;
  for (int64_t i = 0; i < t->nq; i++) {
    if (!t->valid[i]) continue;
    const int64_t row = t->r0 + i / t->nh, h = t->h0 + i % t->nh;
    float *dst = a->scratch + ((row * a->n_heads + h) * job->parts + p) * stride;
    dst[0] = t->mp[i];
    dst[1] = t->lp[i];
    memcpy(dst + 2, t->accp[i], (size_t)t->hd * sizeof(float));
  }
}

static void units_full(void *ctx, int64_t u0, int64_t u1) {
  const attn_job *job = ctx;
  tile_ctx t;
  for (int64_t u = u0; u < u1; u++) run_unit(job, u, 0, subtile_full, &t);
}

static void units_part(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *job = ctx;
  tile_ctx t;
  for (int64_t i = i0; i < i1; i++) run_unit(job, i / job->parts, i % job->parts, subtile_part, &t);
}

/* Split, second pass: (row, head) items merge their partitions in order. */
static void merge_rows(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *job = ctx;
  const armllm_attn_args *a = job->a;
  const int64_t hd = a->head_dim, stride = hd + 2;
  float acc[MAXD];
  for (int64_t item = i0; item < i1; item++) {
    const int64_t row = item / a->n_heads, h = item % a->n_heads;
    const int64_t b = armllm_attn_seq_of_row(a, row);
    const int64_t pos = armllm_attn_pos(a, b, row), lo = armllm_attn_lo(a, pos);
    const float *src = a->scratch + (row * a->n_heads + h) * job->parts * stride;
    armllm_softmax_state st = {0.0f, 0.0f, 0};
    for (int64_t p = lo / PART; p <= pos / PART; p++) {
      const float *part = src + p * stride;
      merge_partial(&st, acc, part[0], part[1], part + 2, hd);
    }
    finish(a->out + row * a->ldo + h * hd, acc, armllm_attn_denominator(a, &st, h), hd);
  }
}

/* The variant's attention entry point: check, plan the units, then the
 * unsplit or the split-KV path. */
static inline __attribute__((always_inline)) int64_t armllm_x86_attention(
    armllm_pool *pool, const armllm_attn_args *args) {
  const int64_t bad = armllm_attn_check(args);
  if (bad >= 0) return bad;
  const armllm_attn_args *a = args;
  const int64_t rows = a->query_start[a->n_seqs];
  if (rows <= 0) return -1;
  attn_job job;
  job.a = a;
  job.group = a->n_heads / a->n_kv_heads;
  job.nhc = (job.group + TILE_Q - 1) / TILE_Q;
  job.hc = (job.group + job.nhc - 1) / job.nhc;
  int64_t max_q = 0, max_len = 0;
  for (int64_t b = 0; b < a->n_seqs; b++) {
    const int64_t ql = a->query_start[b + 1] - a->query_start[b];
    if (ql > max_q) max_q = ql;
    if (ql > 0 && a->seq_lens[b] > max_len) max_len = a->seq_lens[b];
  }
  job.R = TILE_Q / job.hc;
  if (job.R > max_q) job.R = max_q;
  if (job.R < 1) job.R = 1;
  job.ntiles = (rows + job.R - 1) / job.R;
  job.units = job.ntiles * a->n_kv_heads * job.nhc;
  job.parts = (max_len + PART - 1) / PART;

  const int threads = armllm_pool_threads(pool);
  const size_t need = (size_t)(rows * a->n_heads * job.parts * (a->head_dim + 2));
  const int split = pool && threads > 1 && a->scratch && a->scratch_len >= need &&
                    job.parts > 1 && job.units < 4 * (int64_t)threads;
  if (!split) {
    armllm_pool_run(pool, job.units, armllm_pool_grain(pool, job.units, 4, 1), units_full, &job);
  } else {
    const int64_t items = job.units * job.parts;
    armllm_pool_run(pool, items, 1, units_part, &job);
    const int64_t m = rows * a->n_heads;
    armllm_pool_run(pool, m, armllm_pool_grain(pool, m, 2, 1), merge_rows, &job);
  }
  return -1;
}

#endif /* ARMLLM_ATTN_X86_H */
