/* attn_arm.c: the varlen paged attention driver of the Arm variants (see
 * attn_arm.h): tiles of query rows x the query heads of one KV head,
 * partition-ordered merges, split-KV through scratch. Built at the Armv8.0
 * baseline (the neon library); the partial kernels carry their own ISA. */
#include <arm_neon.h>

#include "attn_arm.h"
#include "attn_common.h"

#define QMAX ARMLLM_ATTN_QMAX
#define PART ARMLLM_ATTN_PARTITION
#define MAXHD ARMLLM_ATTN_MAX_HEAD_DIM

typedef struct {
  const armllm_attn_args *a;
  armllm_attn_partial_fn partial;
  int64_t group, tr, hcs, nhc, nparts;
} attn_job;

typedef struct {
  int64_t b, row0, nrows, h0, nh, p0, p1;
  int nq;
  const float *q[QMAX];
  int64_t lo[QMAX], hi[QMAX];
} attn_tile;

/* The tile starting at row r (0 if r does not start one). */
static int tile_at(const attn_job *j, int64_t r, int64_t kvh, int64_t hc, attn_tile *t) {
  const armllm_attn_args *a = j->a;
  const int64_t b = armllm_attn_seq_of_row(a, r);
  if ((r - a->query_start[b]) % j->tr != 0) return 0;
  t->b = b;
  t->row0 = r;
  t->nrows = a->query_start[b + 1] - r < j->tr ? a->query_start[b + 1] - r : j->tr;
  t->h0 = kvh * j->group + hc * j->hcs;
  t->nh = j->group - hc * j->hcs < j->hcs ? j->group - hc * j->hcs : j->hcs;
  t->nq = (int)(t->nrows * t->nh);
  int64_t lmin = INT64_MAX, hmax = 0;
  for (int64_t i = 0; i < t->nrows; i++) {
    const int64_t pos = armllm_attn_pos(a, b, r + i), lo = armllm_attn_lo(a, pos);
    lmin = lo < lmin ? lo : lmin;
    hmax = pos + 1 > hmax ? pos + 1 : hmax;
    for (int64_t h = 0; h < t->nh; h++) {
      t->q[i * t->nh + h] = a->q + (r + i) * a->ldq + (t->h0 + h) * a->head_dim;
      t->lo[i * t->nh + h] = lo;
      t->hi[i * t->nh + h] = pos + 1;
    }
  }
  t->p0 = lmin / PART;
  t->p1 = (hmax - 1) / PART;
  return 1;
}

/* Int8 caches: the tile's queries as armllm_attn_q8 in *q8 (returned);
 * other caches: NULL. */
static const armllm_attn_q8 *tile_q8(const armllm_attn_args *a, const attn_tile *t,
                                     armllm_attn_q8 *q8) {
  if (a->cache_dtype != ARMLLM_KV_I8) return NULL;
  const int64_t hd = a->head_dim, hd16 = (hd + 15) & ~(int64_t)15;
  for (int i = 0; i < t->nq; i++) {
    uint16_t qs;
    armllm_attn_quantize_q(q8->q[i], &qs, t->q[i], hd);
    memset(q8->q[i] + hd, 0, (size_t)(hd16 - hd));
    q8->qf[i] = armllm_attn_i8_qfactor(qs, a->scale);
  }
  return q8;
}

static inline int in_part(const attn_tile *t, int i, int64_t p) {
  return t->lo[i] / PART <= p && p <= (t->hi[i] - 1) / PART;
}

static void finish(float *out, const float *acc, float l, int64_t hd) {
  const float32x4_t vl = vdupq_n_f32(l);
  int64_t d = 0;
  for (; d + 4 <= hd; d += 4) vst1q_f32(out + d, vdivq_f32(vld1q_f32(acc + d), vl));
  for (; d < hd; d++) out[d] = acc[d] / l;
}

static void attn_items(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *j = ctx;
  const armllm_attn_args *a = j->a;
  const int64_t hd = a->head_dim, per_row = a->n_kv_heads * j->nhc;
  float acc[QMAX][MAXHD] __attribute__((aligned(16)));
  float accp[QMAX * MAXHD] __attribute__((aligned(16)));
  float m[QMAX], l[QMAX];
  armllm_softmax_state st[QMAX];
  armllm_attn_q8 q8;
  for (int64_t item = i0; item < i1; item++) {
    attn_tile t;
    if (!tile_at(j, item / per_row, (item % per_row) / j->nhc, item % j->nhc, &t)) continue;
    const armllm_attn_q8 *tq8 = tile_q8(a, &t, &q8); /* once for all partitions */
    for (int i = 0; i < t.nq; i++) st[i].have = 0;
    for (int64_t p = t.p0; p <= t.p1; p++) {
      j->partial(a, t.b, (item % per_row) / j->nhc, t.nq, t.q, tq8, t.lo, t.hi, p, m, l, accp);
      for (int i = 0; i < t.nq; i++)
        if (in_part(&t, i, p)) armllm_attn_merge(&st[i], acc[i], m[i], l[i], accp + i * hd, hd);
    }
    for (int i = 0; i < t.nq; i++)
      finish(a->out + (t.row0 + i / t.nh) * a->ldo + (t.h0 + i % t.nh) * hd, acc[i],
             armllm_attn_denominator(a, &st[i], t.h0 + i % t.nh), hd);
  }
}

/* Split pass 1: items (row, KV head, chunk, partition) -> scratch partials. */
static void attn_split_items(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *j = ctx;
  const armllm_attn_args *a = j->a;
  const int64_t hd = a->head_dim, per_row = a->n_kv_heads * j->nhc * j->nparts;
  float accp[QMAX * MAXHD] __attribute__((aligned(16)));
  float m[QMAX], l[QMAX];
  armllm_attn_q8 q8;
  for (int64_t item = i0; item < i1; item++) {
    const int64_t r = item / per_row, rest = item % per_row, p = rest % j->nparts;
    const int64_t kvh = rest / j->nparts / j->nhc, hc = rest / j->nparts % j->nhc;
    attn_tile t;
    if (!tile_at(j, r, kvh, hc, &t) || p < t.p0 || p > t.p1) continue;
    j->partial(a, t.b, kvh, t.nq, t.q, tile_q8(a, &t, &q8), t.lo, t.hi, p, m, l, accp);
    for (int i = 0; i < t.nq; i++) {
      if (!in_part(&t, i, p)) continue;
      const int64_t row = t.row0 + i / t.nh, h = t.h0 + i % t.nh;
      float *dst = a->scratch + ((row * a->n_heads + h) * j->nparts + p) * (hd + 2);
      dst[0] = m[i];
      dst[1] = l[i];
      memcpy(dst + 2, accp + i * hd, (size_t)hd * sizeof(float));
    }
  }
}

/* Split pass 2: items (row, head) merge their partitions in order. */
static void attn_merge_items(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *j = ctx;
  const armllm_attn_args *a = j->a;
  const int64_t hd = a->head_dim;
  float acc[MAXHD] __attribute__((aligned(16)));
  for (int64_t item = i0; item < i1; item++) {
    const int64_t row = item / a->n_heads, h = item % a->n_heads;
    const int64_t b = armllm_attn_seq_of_row(a, row);
    const int64_t pos = armllm_attn_pos(a, b, row), lo = armllm_attn_lo(a, pos);
    armllm_softmax_state st = {0.0f, 0.0f, 0};
    for (int64_t p = lo / PART; p <= pos / PART; p++) {
      const float *src = a->scratch + ((row * a->n_heads + h) * j->nparts + p) * (hd + 2);
      armllm_attn_merge(&st, acc, src[0], src[1], src + 2, hd);
    }
    finish(a->out + row * a->ldo + h * hd, acc, armllm_attn_denominator(a, &st, h), hd);
  }
}

int64_t armllm_arm_attn_run(armllm_pool *pool, const armllm_attn_args *a,
                            armllm_attn_partial_fn partial) {
  const int64_t bad = armllm_attn_check(a);
  if (bad >= 0) return bad;
  const int64_t rows = a->query_start[a->n_seqs];
  if (rows <= 0) return -1;
  attn_job j = {a, partial, a->n_heads / a->n_kv_heads, 1, 1, 1, 1};
  j.hcs = j.group < QMAX ? j.group : QMAX;
  j.nhc = (j.group + j.hcs - 1) / j.hcs;
  j.tr = QMAX / j.hcs;
  int64_t tiles = 0, max_len = 0;
  for (int64_t b = 0; b < a->n_seqs; b++) {
    tiles += (a->query_start[b + 1] - a->query_start[b] + j.tr - 1) / j.tr;
    if (a->seq_lens[b] > max_len) max_len = a->seq_lens[b];
  }
  tiles *= a->n_kv_heads * j.nhc;
  j.nparts = (max_len + PART - 1) / PART;
  const int64_t threads = armllm_pool_threads(pool);
  if (threads > 1 && tiles < 2 * threads && j.nparts > 1 && a->scratch &&
      a->scratch_len >= armllm_attn_scratch_len(rows, a->n_heads, a->head_dim, max_len)) {
    const int64_t items = rows * a->n_kv_heads * j.nhc * j.nparts;
    armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 4, 1), attn_split_items, &j);
    const int64_t mitems = rows * a->n_heads;
    armllm_pool_run(pool, mitems, armllm_pool_grain(pool, mitems, 2, 1), attn_merge_items, &j);
    return -1;
  }
  const int64_t items = rows * a->n_kv_heads * j.nhc;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 4, 1), attn_items, &j);
  return -1;
}

