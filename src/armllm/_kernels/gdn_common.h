/* gdn_common.h: what every Gated DeltaNet variant shares (armllm_kernels.h):
 * the metadata check, the per-row gates (g, beta), the conv's task driver
 * (history, tap rows, state update) around a variant's channel-row code, and
 * the rule's task driver (sequence, v head: whole chunks, then single tokens)
 * around a variant's chunk and token steps. */
#ifndef ARMLLM_GDN_COMMON_H
#define ARMLLM_GDN_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "armllm_kernels.h"
#include "pool.h"
#include "vexp.h"

/* -1, or the first sequence whose metadata is bad (armllm_kernels.h). */
static inline int64_t armllm_gdn_check(const int32_t *query_start, const int32_t *seq_lens,
                                       const int32_t *state_slots, int64_t n_seqs,
                                       int64_t num_slots) {
  if (n_seqs > 0 && query_start[0] != 0) return 0;
  for (int64_t b = 0; b < n_seqs; b++) {
    const int64_t q_len = (int64_t)query_start[b + 1] - query_start[b];
    if (q_len < 0 || q_len > seq_lens[b]) return b;
    if (q_len > 0 && (state_slots[b] < 0 || state_slots[b] >= num_slots)) return b;
  }
  return -1;
}

/* The silu every GDN kernel uses: v / (1 + exp(-v)), the shared exp. */
static inline float armllm_gdn_silu(float v) { return v / (1.0f + armllm_exp_scalar(-v)); }

/* A row's decay g = a_neg * softplus(a + dt_bias) (torch's softplus: x > 20 is x)
 * and beta = sigmoid(b): scalars, the same code in every variant. */
static inline void armllm_gdn_gates(float a, float b, float a_neg, float dt_bias, float *g,
                                    float *beta) {
  const float x = a + dt_bias;
  *g = a_neg * (x > 20.0f ? x : log1pf(armllm_exp_scalar(x)));
  *beta = 1.0f / (1.0f + armllm_exp_scalar(-b));
}

/* The factor that l2-normalizes a row whose sum of squares (in double) is
 * sum_sq, times `scale` (q: 1/sqrt(dk); k: 1): one rounding. */
static inline float armllm_gdn_l2_scale(double sum_sq, double scale) {
  return (float)(scale / sqrt(sum_sq + 1e-6));
}

/* ------------------------------------------------------------------ conv */

#define ARMLLM_GDN_CONV_CHANNELS 256 /* channels per task */

/* A variant's output row: y[c] = silu(sum_j wt[j*ARMLLM_GDN_CONV_CHANNELS + c] * src[j][c])
 * for c < nc, the sum in tap order, products rounded (no FMA). */
typedef void (*armllm_gdn_conv_row_fn)(const float *const *src, const float *wt, int64_t kernel,
                                       int64_t nc, float *y);

/* A variant's weight transpose: wt[j*ARMLLM_GDN_CONV_CHANNELS + c] = w[c*kernel + j]
 * for c < nc, j < kernel. */
typedef void (*armllm_gdn_conv_weights_fn)(const float *w, int64_t kernel, int64_t nc,
                                           float *wt);

static inline void armllm_gdn_conv_weights_scalar(const float *w, int64_t kernel, int64_t nc,
                                                  float *wt) {
  for (int64_t c = 0; c < nc; c++)
    for (int64_t j = 0; j < kernel; j++) wt[j * ARMLLM_GDN_CONV_CHANNELS + c] = w[c * kernel + j];
}

/* Task `item` = (sequence, channel chunk) of a conv: its rows, then its slot. */
static inline __attribute__((always_inline)) void armllm_gdn_conv_task(
    const armllm_gdn_conv_args *a, int64_t item, armllm_gdn_conv_weights_fn weights,
    armllm_gdn_conv_row_fn row) {
  enum { CH = ARMLLM_GDN_CONV_CHANNELS, MAXK = ARMLLM_GDN_MAX_KERNEL };
  const int64_t chunks = (a->channels + CH - 1) / CH;
  const int64_t b = item / chunks, c0 = item % chunks * CH;
  const int64_t nc = a->channels - c0 < CH ? a->channels - c0 : CH;
  const int64_t row0 = a->query_start[b], q_len = a->query_start[b + 1] - row0;
  if (q_len == 0) return;
  const int64_t kernel = a->kernel, hist_len = kernel - 1;
  float *slot = a->state + (int64_t)a->state_slots[b] * hist_len * a->channels + c0;
  float hist[(MAXK - 1) * CH]; /* the inputs before the rows, oldest first */
  float wt[MAXK * CH];         /* weight[c0 + c, j] at wt[j*CH + c] */
  const int fresh = a->seq_lens[b] == q_len;
  for (int64_t e = 0; e < hist_len; e++) {
    if (fresh) memset(hist + e * CH, 0, (size_t)nc * sizeof(float));
    else memcpy(hist + e * CH, slot + e * a->channels, (size_t)nc * sizeof(float));
  }
  weights(a->weight + c0 * kernel, kernel, nc, wt);
  const float *src[MAXK];
  for (int64_t i = 0; i < q_len; i++) {
    for (int64_t j = 0; j < kernel; j++) { /* input i - hist_len + j */
      const int64_t li = i - hist_len + j;
      src[j] = li < 0 ? hist + (li + hist_len) * CH : a->x + (row0 + li) * a->ldx + c0;
    }
    row(src, wt, kernel, nc, a->y + (row0 + i) * a->ldy + c0);
  }
  for (int64_t e = 0; e < hist_len; e++) { /* the last kernel-1 inputs */
    const int64_t li = q_len - hist_len + e;
    const float *from = li < 0 ? hist + (li + hist_len) * CH : a->x + (row0 + li) * a->ldx + c0;
    memcpy(slot + e * a->channels, from, (size_t)nc * sizeof(float));
  }
}

/* Defines `name`, a gdn_conv kernel over tasks armllm_gdn_conv_task(weights, row);
 * calls of fewer than 16384 outputs stay on the calling thread. */
#define ARMLLM_GDN_CONV_KERNEL(name, weights, row)                                                \
  static void name##_tasks(void *ctx, int64_t i0, int64_t i1) {                                 \
    for (int64_t i = i0; i < i1; i++) armllm_gdn_conv_task(ctx, i, weights, row);               \
  }                                                                                             \
  int64_t name(armllm_pool *pool, const armllm_gdn_conv_args *a) {                              \
    const int64_t bad = armllm_gdn_check(a->query_start, a->seq_lens, a->state_slots,           \
                                         a->n_seqs, a->num_slots);                              \
    if (bad >= 0) return bad;                                                                   \
    const int64_t chunks = (a->channels + ARMLLM_GDN_CONV_CHANNELS - 1) /                       \
                           ARMLLM_GDN_CONV_CHANNELS;                                            \
    const int64_t items = a->n_seqs * chunks;                                                   \
    if (a->n_seqs > 0 && a->query_start[a->n_seqs] * a->channels < 16384) pool = NULL;          \
    armllm_pool_run(pool, items, 1, name##_tasks, (void *)a);                                   \
    return -1;                                                                                  \
  }

/* ------------------------------------------------------------------ rule */

/* One task's head: sequence b's v head h over its rows, state S [dk, dv]. */
typedef struct {
  const armllm_gdn_args *a;
  int64_t h, kh;  /* v head, and the k head it reads */
  float a_neg, dt_bias;
  double q_scale; /* 1/sqrt(dk) */
  float *S;
  int zero; /* S is zero (a fresh sequence's first chunk): a chunk may skip its products
               with S, and must write all of S */
} armllm_gdn_head;

static inline const float *armllm_gdn_q(const armllm_gdn_head *hd, int64_t r) {
  return hd->a->q + r * hd->a->ldqkv + hd->kh * hd->a->dk;
}
static inline const float *armllm_gdn_k(const armllm_gdn_head *hd, int64_t r) {
  return hd->a->k + r * hd->a->ldqkv + hd->kh * hd->a->dk;
}
static inline const float *armllm_gdn_v(const armllm_gdn_head *hd, int64_t r) {
  return hd->a->v + r * hd->a->ldqkv + hd->h * hd->a->dv;
}
static inline float *armllm_gdn_o(const armllm_gdn_head *hd, int64_t r) {
  return hd->a->out + r * hd->a->ldo + hd->h * hd->a->dv;
}
static inline void armllm_gdn_row_gates(const armllm_gdn_head *hd, int64_t r, float *g,
                                        float *beta) {
  const armllm_gdn_args *a = hd->a;
  armllm_gdn_gates(a->a[r * a->ldab + hd->h], a->b[r * a->ldab + hd->h], hd->a_neg, hd->dt_bias,
                   g, beta);
}

/* A variant's steps: the chunked form over rows [r0, r0 + ARMLLM_GDN_CHUNK), and
 * the recurrence over one row. */
typedef void (*armllm_gdn_chunk_fn)(const armllm_gdn_head *hd, int64_t r0);
typedef void (*armllm_gdn_token_fn)(const armllm_gdn_head *hd, int64_t r);

/* Task `item` = (sequence, v head): whole chunks, then the rest row by row. */
static inline __attribute__((always_inline)) void armllm_gdn_rule_task(
    const armllm_gdn_args *a, int64_t item, armllm_gdn_chunk_fn chunk, armllm_gdn_token_fn token) {
  const int64_t b = item / a->n_v_heads, h = item % a->n_v_heads;
  const int64_t row0 = a->query_start[b], q_len = a->query_start[b + 1] - row0;
  if (q_len == 0) return;
  const int64_t group = a->n_v_heads / a->n_k_heads;
  armllm_gdn_head hd = {a, h, a->v_tiled ? h % a->n_k_heads : h / group, a->a_neg[h],
                        a->dt_bias[h], 1.0 / sqrt((double)a->dk),
                        a->state + ((int64_t)a->state_slots[b] * a->n_v_heads + h) * a->dk * a->dv,
                        a->seq_lens[b] == q_len};
  if (hd.zero && q_len < ARMLLM_GDN_CHUNK)
    memset(hd.S, 0, (size_t)(a->dk * a->dv) * sizeof(float));
  int64_t r = row0;
  for (; r + ARMLLM_GDN_CHUNK <= row0 + q_len; r += ARMLLM_GDN_CHUNK) {
    chunk(&hd, r);
    hd.zero = 0;
  }
  for (; r < row0 + q_len; r++) token(&hd, r);
}

/* The floating-point mode a rule task runs in. The vector variants flush
 * subnormals to zero (x86 MXCSR FTZ + DAZ, restored after the task): strong
 * decays underflow (e^G in a chunk, e^g S in a token), and subnormal operands
 * cost ~100x in microcode assists; what flushes is below 2^-126 (FLT_MIN), far
 * below any tolerance. ref keeps IEEE subnormals. */
static inline unsigned armllm_gdn_ieee_enter(void) { return 0; }
static inline void armllm_gdn_ieee_leave(unsigned saved) { (void)saved; }
#if defined(__x86_64__)
#include <xmmintrin.h>
static inline unsigned armllm_gdn_ftz_enter(void) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u); /* FTZ (bit 15), DAZ (bit 6) */
  return saved;
}
static inline void armllm_gdn_ftz_leave(unsigned saved) { _mm_setcsr(saved); }
#endif

/* Defines `name`, a gdn_rule kernel: the check, then one task per (sequence, v
 * head), each in the floating-point mode `mode` (armllm_gdn_<mode>_enter/leave). */
#define ARMLLM_GDN_RULE_KERNEL(name, chunk, token, mode)                                         \
  static void name##_tasks(void *ctx, int64_t i0, int64_t i1) {                                 \
    const unsigned saved = armllm_gdn_##mode##_enter();                                         \
    for (int64_t i = i0; i < i1; i++) armllm_gdn_rule_task(ctx, i, chunk, token);               \
    armllm_gdn_##mode##_leave(saved);                                                           \
  }                                                                                             \
  int64_t name(armllm_pool *pool, const armllm_gdn_args *a) {                                   \
    const int64_t bad = armllm_gdn_check(a->query_start, a->seq_lens, a->state_slots,           \
                                         a->n_seqs, a->num_slots);                              \
    if (bad >= 0) return bad;                                                                   \
    armllm_pool_run(pool, a->n_seqs * a->n_v_heads, 1, name##_tasks, (void *)a);                \
    return -1;                                                                                  \
  }

/* Rows [t0, t1) x heads as items t*heads + h, for the gated norm. */
typedef struct {
  const float *x;
  int64_t ldx;
  const float *z;
  int64_t ldz;
  const float *weight;
  int64_t heads, d;
  float eps;
  float *out;
  int64_t ldo;
} armllm_gated_norm_job;

typedef struct {
  const float *gate;
  int64_t ldg, n;
  float *x;
  int64_t ldx;
} armllm_sigmoid_mul_job;

#endif /* ARMLLM_GDN_COMMON_H */
