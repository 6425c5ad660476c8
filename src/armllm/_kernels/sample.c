/* sample.c: armllm_sample_rows (sample.h defines its result), the uniform
 * draw and the structured-output mask. Portable C around the kernel table's
 * vectorizable passes (sample_argmax, sample_find_above, sample_exp,
 * sample_block_sums, sample_collect); built with -ffp-contract=off, so every
 * float and double operation is the one written.
 *
 * A row reads its logits a few times and never sorts them: greedy is an
 * argmax pass, top-k and top-p are selections (sample_sets.c), the draw
 * walks block sums. Bad words, DRY and XTC are sample_words.c's. */
#define _GNU_SOURCE /* sync.h: syscall, clock_gettime */
#include "sample.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "sample_sets.h"
#include "sample_words.h"
#include "sync.h"

#define BLOCK ARMLLM_SAMPLE_BLOCK
#define TOP_N ARMLLM_SAMPLE_MAX_LOGPROBS

/* ------------------------------------------------------------ scratch */

/* One worker's arrays (armllm_sample_rows_slot_bytes). */
typedef struct {
  int32_t *mark; /* [n] 0 between rows; in a row, +-(1 + j) for an id the penalties
                    touch, j its entry in raw and count (- once applied) */
  float *raw;    /* [n] the touched ids' values before the penalties */
  float *vals;   /* [n] e of the row, or a list's values (then e) */
  int32_t *ids;  /* [n] a list's ids */
  int32_t *work; /* [n] penalty counts, then a quickselect copy (float), or a heap */
  float *sums;   /* [blocks] block sums */
  int32_t *longest; /* [n] 0 between rows: DRY's lengths a token proposes */
  int32_t *repeat;  /* [dry_window] DRY's repeats (the slot's part of dry_scratch) */
} slot_t;

static int64_t blocks_of(int64_t n) { return (n + BLOCK - 1) / BLOCK; }

/* an array of len 4-byte entries (and a block of slack), in whole cache lines */
static size_t array_bytes(int64_t len) {
  const size_t line = 64;
  return ((size_t)(len + BLOCK) * 4 + line - 1) / line * line;
}

size_t armllm_sample_rows_slot_bytes(int64_t n) {
  return 6 * array_bytes(n) + array_bytes(blocks_of(n));
}

size_t armllm_sample_dry_bytes(int64_t window) { return array_bytes(window); }

static slot_t slot_at(const armllm_sample_batch *b, int64_t i) {
  const int64_t n = b->n;
  char *p = (char *)b->scratch + (size_t)i * armllm_sample_rows_slot_bytes(n);
  slot_t s;
  s.mark = (int32_t *)p;
  s.raw = (float *)(p += array_bytes(n));
  s.vals = (float *)(p += array_bytes(n));
  s.ids = (int32_t *)(p += array_bytes(n));
  s.work = (int32_t *)(p += array_bytes(n));
  s.longest = (int32_t *)(p += array_bytes(n));
  s.sums = (float *)(p + array_bytes(n));
  s.repeat = b->dry_scratch ? (int32_t *)((char *)b->dry_scratch
                                          + (size_t)i * armllm_sample_dry_bytes(b->dry_window))
                            : NULL;
  return s;
}

/* ------------------------------------------------------- log-probabilities */

/* a ranks above b: a larger value, NaN below every number, ties to the lower id */
static inline int ranks_above(float av, int64_t aid, float bv, int64_t bid) {
  if (av != av) return bv != bv && aid < bid;
  if (bv != bv) return 1;
  return av > bv || (av == bv && aid < bid);
}

/* Puts (v, id) into the list of the best `len` (<= k) entries, best first,
 * dropping the last when full. */
static void insert_ranked(float v, int64_t id, int32_t *ids, float *values, int64_t *len,
                          int64_t k) {
  int64_t j = *len < k ? (*len)++ : k - 1;
  for (; j > 0 && ranks_above(v, id, values[j - 1], ids[j - 1]); j--) {
    values[j] = values[j - 1];
    ids[j] = ids[j - 1];
  }
  values[j] = v;
  ids[j] = (int32_t)id;
}

/* The k (1..TOP_N) highest-ranked entries of x, best first, into ids/values. */
static int64_t top_entries(const armllm_kernels *kt, const float *x, int64_t n, int64_t k,
                           int32_t *ids, float *values) {
  int64_t len = 0, i = 0;
  for (; i < n && len < k; i++) insert_ranked(x[i], i, ids, values, &len, k);
  while (i < n) {
    const float worst = values[k - 1];
    if (worst == worst) /* a later entry ranks above only when larger: skip the rest */
      i += kt->sample_find_above(x + i, n - i, worst);
    else if (!ranks_above(x[i], i, worst, ids[k - 1])) { /* NaN kept: any number enters */
      i++;
      continue;
    }
    if (i < n) insert_ranked(x[i], i, ids, values, &len, k);
    i++;
  }
  return len;
}

/* ------------------------------------------------------------ penalties */

/* Row r's penalties on x (sample.h step 4); the touched ids keep their raw
 * values in s->raw and a negative mark. Returns how many ids it touched. */
static int64_t apply_penalties(const armllm_sample_batch *b, int64_t r, float *x, slot_t *s) {
  const float rp = b->repetition_penalty[r];
  const float presence = b->presence_penalty[r], frequency = b->frequency_penalty[r];
  const int repeat = rp != 1.0f, add = presence != 0.0f || frequency != 0.0f;
  const int32_t *hist = b->history ? b->history[r] : NULL;
  const int64_t len = hist ? b->history_len[r] : 0, prompt = b->prompt_len[r];
  if (!(repeat || add) || len == 0) return 0;
  const int64_t from = repeat ? 0 : prompt;
  int32_t *count = s->work;
  int64_t touched = 0;
  for (int64_t i = from; i < len; i++) {
    int32_t j = s->mark[hist[i]];
    if (j == 0) {
      s->raw[touched] = x[hist[i]];
      count[touched] = 0;
      j = s->mark[hist[i]] = (int32_t)++touched;
    }
    if (i >= prompt) count[j - 1]++;
  }
  for (int64_t i = from; i < len; i++) {
    const int32_t j = s->mark[hist[i]];
    if (j <= 0) continue; /* applied already */
    float v = s->raw[j - 1];
    if (repeat) v = v > 0.0f ? v / rp : v * rp;
    if (add && count[j - 1] > 0) v -= presence + frequency * (float)count[j - 1];
    x[hist[i]] = v;
    s->mark[hist[i]] = -j;
  }
  return touched;
}

/* x[t] as it was before the penalties (x itself unchanged since them). */
static float raw_value(const float *x, int64_t t, const slot_t *s) {
  return s->mark[t] != 0 ? s->raw[-s->mark[t] - 1] : x[t];
}

static void clear_marks(const armllm_sample_batch *b, int64_t r, slot_t *s) {
  const int32_t *hist = b->history ? b->history[r] : NULL;
  const int64_t len = hist ? b->history_len[r] : 0;
  for (int64_t i = 0; i < len; i++) s->mark[hist[i]] = 0;
}

/* ------------------------------------------------------------ draws */

/* Inside block blk of e[0..n): the running sum from `run` over its kept e in
 * position order to the first > target, else its last kept position with
 * e > 0 (-1 if none). */
static int64_t draw_in_block(const float *e, int64_t n, int64_t blk, float keep_min,
                             double run, double target) {
  const int64_t end = (blk + 1) * BLOCK < n ? (blk + 1) * BLOCK : n;
  int64_t last = -1;
  for (int64_t i = blk * BLOCK; i < end; i++) {
    if (!(e[i] >= keep_min && e[i] > 0.0f)) continue;
    run += e[i];
    last = i;
    if (run > target) return i;
  }
  return last;
}

/* The position drawn for u from e[0..n) and its block sums under keep_min
 * (of total `total`): the walk over the block sums, then inside a block. */
static int64_t draw_blocks(const float *e, int64_t n, const float *sums, float keep_min,
                           double total, double u) {
  const double target = u * total;
  const int64_t blocks = blocks_of(n);
  double run = 0.0;
  for (int64_t blk = 0; blk < blocks; blk++) {
    const double next = run + sums[blk];
    if (next > target) return draw_in_block(e, n, blk, keep_min, run, target);
    run = next;
  }
  for (int64_t blk = blocks - 1; blk >= 0; blk--) /* rounding: the last kept token */
    if (sums[blk] > 0.0f) return draw_in_block(e, n, blk, keep_min, 0.0, INFINITY);
  return 0; /* no kept e > 0: m not finite, handled before */
}

/* The pass of the log-probabilities over a row: the exp at temperature 1
 * (e in s->vals, floor-0 block sums in s->sums) and its total. */
typedef struct {
  int64_t first_max; /* the row's argmax (sample_argmax) */
  int e_ready;       /* x is unchanged since the pass: its e are there */
  double total;
} raw_pass;

/* Whether row r's XTC is on and its own draw says it applies (sample.h step 6). */
static int xtc_draws(const armllm_sample_batch *b, int64_t r) {
  if (!b->xtc_probability || !(b->xtc_probability[r] > 0.0f) || b->xtc_threshold[r] > 0.5f)
    return 0;
  const double u = armllm_sample_uniform(b->seed[r], b->stream[r] + ARMLLM_SAMPLE_XTC_STREAM,
                                         b->counter[r]);
  return u < (double)b->xtc_probability[r];
}

/* Row r's token from its penalized x (sample.h steps 5 and 6). keep_x: write
 * e to s->vals, not over x; raw: the log-probabilities' pass, when they were
 * asked for. */
static int64_t choose_token(const armllm_kernels *kt, const armllm_sample_batch *b, int64_t r,
                            float *x, slot_t *s, int keep_x, const raw_pass *raw) {
  const int64_t n = b->n;
  const float temperature = b->temperature[r];
  const int64_t first_max = raw->first_max;
  if (first_max < 0) return 0; /* every x NaN */
  const float m = x[first_max];
  if (!(temperature > 0.0f) || !isfinite(m)) return first_max;
  float inv_t = (float)(1.0 / (double)temperature);
  if (inv_t > FLT_MAX) inv_t = FLT_MAX;
  const float min_p = b->min_p[r], top_p = b->top_p[r];
  const int64_t top_k = b->top_k[r];
  const double u = armllm_sample_uniform(b->seed[r], b->stream[r], b->counter[r]);
  float *e = keep_x ? s->vals : x;
  const int32_t *e_ids = NULL; /* e's ids: NULL, positions */
  int64_t len = n;
  if (top_k > 0 && top_k < n) {
    len = armllm_sample_top_k(kt, x, n, top_k, s->vals, s->ids, (float *)s->work);
    e = s->vals;
    e_ids = s->ids;
  }
  double total;
  if (raw->e_ready && !e_ids && inv_t == 1.0f) /* the same e: (x - m) * 1 */
    total = min_p > 0.0f ? kt->sample_block_sums(e, n, min_p, s->sums) : raw->total;
  else
    total = kt->sample_exp(e_ids ? e : x, e, len, m, inv_t, min_p, s->sums);
  if (top_p < 1.0f) { /* a list, drawn over its own block sums */
    len = armllm_sample_top_p(kt, e, e_ids, len, min_p, total, top_p, s->sums, s->work, s->vals,
                              s->ids);
    e = s->vals;
    e_ids = s->ids;
    total = kt->sample_block_sums(e, len, min_p, s->sums);
  }
  if (xtc_draws(b, r) && armllm_sample_xtc(e, len, min_p, total, b->xtc_threshold[r]))
    total = kt->sample_block_sums(e, len, min_p, s->sums);
  const int64_t at = draw_blocks(e, len, s->sums, min_p, total, u);
  return e_ids ? e_ids[at] : at;
}

/* ------------------------------------------------------------ a row */

static void sample_row(const armllm_kernels *kt, const armllm_sample_batch *b, int64_t r,
                       slot_t *s) {
  const int64_t n = b->n;
  float *x = b->row[r];
  if (b->mask_row && b->mask_row[r] >= 0)
    armllm_mask_logits(x, n, b->masks + (int64_t)b->mask_row[r] * b->mask_ld);
  const int32_t *hist = b->history ? b->history[r] : NULL;
  const int64_t hist_len = hist ? b->history_len[r] : 0;
  if (b->bad_words && b->bad_words[r])
    armllm_sample_ban_words(x, b->bad_words[r], hist, hist_len, b->prompt_len[r]);
  if (b->bias_len && b->bias_len[r] > 0) {
    const int32_t *ids = b->bias_ids[r];
    const float *values = b->bias_values[r];
    for (int64_t j = 0; j < b->bias_len[r]; j++) x[ids[j]] += values[j];
  }
  const int32_t n_top = b->num_logprobs[r];
  int32_t *top_ids = b->top_ids + r * TOP_N;
  float *top_lp = b->top_logprobs + r * TOP_N;
  for (int j = 0; j < TOP_N; j++) {
    top_ids[j] = -1;
    top_lp[j] = NAN;
  }
  raw_pass raw = {kt->sample_argmax(x, n), 0, NAN};
  double lse = NAN; /* M + log of the block sum (floor 0) of exp(x - M), M the largest x */
  if (n_top >= 0) {
    const float m = raw.first_max < 0 ? -INFINITY : x[raw.first_max];
    raw.total = kt->sample_exp(x, s->vals, n, m, 1.0f, 0.0f, s->sums);
    raw.e_ready = 1;
    lse = (double)m + log(raw.total);
  }
  if (n_top > 0) {
    float values[TOP_N];
    const int64_t got = top_entries(kt, x, n, n_top < TOP_N ? n_top : TOP_N, top_ids, values);
    for (int64_t j = 0; j < got; j++) top_lp[j] = (float)((double)values[j] - lse);
  }
  int64_t touched = apply_penalties(b, r, x, s);
  const int dry = b->dry_multiplier && b->dry_multiplier[r] > 0.0f && b->dry_last_n[r] != 0;
  int edited = touched > 0;
  if (dry && hist_len > 0) {
    const armllm_dry_params p = {b->dry_multiplier[r], b->dry_base[r], b->dry_allowed_length[r],
                                 b->dry_last_n[r], b->dry_breakers ? b->dry_breakers[r] : NULL};
    const int64_t before = touched;
    touched = armllm_sample_dry(x, &p, hist, hist_len, s->repeat, s->longest, s->mark, s->raw,
                                touched);
    edited |= touched > before;
  }
  if (edited) {
    raw.first_max = kt->sample_argmax(x, n);
    raw.e_ready = 0;
  }
  const int keep_x = n_top >= 0 || (b->keep_row && b->keep_row[r]);
  const int64_t token = choose_token(kt, b, r, x, s, keep_x, &raw);
  b->token[r] = (int32_t)token;
  b->logprob[r] = n_top >= 0 ? (float)((double)raw_value(x, token, s) - lse) : NAN;
  if (touched) clear_marks(b, r, s);
}

typedef struct {
  const armllm_kernels *kt;
  const armllm_sample_batch *b;
  int64_t next_row; /* claimed with a fetch-add */
} rows_job;

/* Items are workers: worker w uses slot w and takes rows until none is left. */
static void rows_task(void *ctx, int64_t begin, int64_t end) {
  rows_job *job = ctx;
  for (int64_t w = begin; w < end; w++) {
    slot_t s = slot_at(job->b, w);
    for (;;) {
      const int64_t r = sync_fetch_add(&job->next_row, 1);
      if (r >= job->b->rows) break;
      sample_row(job->kt, job->b, r, &s);
    }
  }
}

void armllm_sample_rows(const armllm_kernels *kt, armllm_pool *pool,
                        const armllm_sample_batch *b) {
  if (b->rows <= 0) return;
  sync_detect_atomics();
  int64_t workers = pool ? armllm_pool_threads(pool) : 1;
  workers = workers < b->slots ? workers : b->slots;
  workers = workers < b->rows ? workers : b->rows;
  rows_job job = {kt, b, 0};
  if (workers <= 1)
    rows_task(&job, 0, 1);
  else
    armllm_pool_run(pool, workers, 1, rows_task, &job);
}

/* ------------------------------------------------------------ uniform draw */

#define GOLDEN_GAMMA UINT64_C(0x9e3779b97f4a7c15) /* splitmix64's increment */

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
  z ^= z >> 30;
  z *= UINT64_C(0xbf58476d1ce4e5b9);
  z ^= z >> 27;
  z *= UINT64_C(0x94d049bb133111eb);
  z ^= z >> 31;
  return z;
}

double armllm_sample_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
  const uint64_t key = mix64(seed ^ mix64(stream + GOLDEN_GAMMA));
  const uint64_t x = mix64(key + (counter + 1) * GOLDEN_GAMMA);
  return (double)(x >> 11) * 0x1p-53; /* the top 53 bits: exact in a double */
}

/* ------------------------------------------------------------ the mask */

/* bit j of a mask word, as a lane constant the select below vectorizes over */
static const uint32_t MASK_BIT[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};
#define NEG_INF_BITS UINT32_C(0xff800000) /* -inf, IEEE-754 single */

void armllm_mask_logits(float *row, int64_t n, const uint32_t *words) {
  const int64_t full = n / 32;
  for (int64_t w = 0; w < full; w++) {
    const uint32_t bits = words[w];
    if (bits == UINT32_MAX) continue; /* a structured mask is mostly whole words */
    uint32_t r[32];
    memcpy(r, row + 32 * w, sizeof r);
    for (int j = 0; j < 32; j++) { /* a blend per lane on the bits: vectorizes */
      const uint32_t keep = 0u - (uint32_t)((bits & MASK_BIT[j]) != 0);
      r[j] = (r[j] & keep) | (NEG_INF_BITS & ~keep);
    }
    memcpy(row + 32 * w, r, sizeof r);
  }
  for (int64_t i = 32 * full; i < n; i++)
    if (!(words[full] >> (i - 32 * full) & 1u)) row[i] = -INFINITY;
}
