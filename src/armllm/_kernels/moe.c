/* moe.c: a mixture-of-experts layer's MLP (moe.h): routing, grouping,
 * activation and accumulation, and the two pool jobs that run every active
 * expert's GEMM column windows. */
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family_jobs.h"
#include "gguf_blocks.h"

void armllm_moe_route(const float *logits, int64_t ldl, int64_t rows, int64_t experts,
                      int64_t k, int renormalize, int32_t *ids, float *weights,
                      uint8_t *taken) {
  for (int64_t r = 0; r < rows; r++) {
    const float *l = logits + r * ldl;
    float m = -INFINITY; /* NaNs are skipped here and never win below */
    for (int64_t e = 0; e < experts; e++)
      if (l[e] > m) m = l[e];
    float sum = 0.0f;
    for (int64_t e = 0; e < experts; e++) sum += expf(l[e] - m);
    memset(taken, 0, (size_t)experts);
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; e++) {
        if (taken[e]) continue;
        /* the first untaken id, replaced only by a strictly larger logit (ties
         * go to the lower id) or when it is NaN (NaN loses to any number) */
        if (best < 0 || l[e] > l[best] || l[best] != l[best]) best = e;
      }
      taken[best] = 1;
      const float p = expf(l[best] - m) / sum;
      ids[r * k + j] = (int32_t)best;
      weights[r * k + j] = p;
      top_sum += p;
    }
    if (renormalize)
      for (int64_t j = 0; j < k; j++) weights[r * k + j] /= top_sum;
  }
}

void armllm_moe_group(const int32_t *ids, const float *weights, int64_t rows, int64_t k,
                      int64_t experts, int32_t *counts, int32_t *start, int32_t *pair_row,
                      float *pair_weight) {
  memset(counts, 0, sizeof *counts * (size_t)experts);
  for (int64_t i = 0; i < rows * k; i++) counts[ids[i]]++;
  start[0] = 0;
  for (int64_t e = 0; e < experts; e++) start[e + 1] = start[e] + counts[e];
  /* a second pass placing each pair at its expert's next free slot; `next`
   * borrows counts and restores it */
  for (int64_t e = 0; e < experts; e++) counts[e] = start[e];
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < k; j++) {
      const int32_t at = counts[ids[r * k + j]]++;
      pair_row[at] = (int32_t)r;
      pair_weight[at] = weights[r * k + j];
    }
  for (int64_t e = 0; e < experts; e++) counts[e] -= start[e];
}

void armllm_swiglu_clamped(const float *gate_up, int64_t ldg, int64_t t, int64_t inter,
                           float alpha, float limit, float *out, int64_t ldo) {
  for (int64_t r = 0; r < t; r++) {
    const float *gate = gate_up + r * ldg, *up = gate + inter;
    float *o = out + r * ldo;
    for (int64_t i = 0; i < inter; i++) {
      const float g = gate[i] < limit ? gate[i] : limit;
      const float u = up[i] < -limit ? -limit : (up[i] > limit ? limit : up[i]);
      o[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
  }
}

void armllm_moe_accumulate(const float *y, int64_t ldy, int64_t n, int64_t d,
                           const int32_t *row, const float *w, float *out, int64_t ldo) {
  for (int64_t i = 0; i < n; i++) {
    const float *yi = y + i * ldy;
    float *oi = out + (row ? (int64_t)row[i] : i) * ldo;
    const float wi = w[i];
    for (int64_t c = 0; c < d; c++) oi[c] += wi * yi[c];
  }
}

/* ---------------------------------------------------------- the layer */

#define MOE_ITEMS_PER_THREAD 4 /* items of a job per thread: evens out uneven progress */
#define MOE_MIN_WINDOW 32      /* the narrowest window a plan cuts (but the panel's) */
#define MOE_GATHER_SERIAL (1 << 16) /* bytes of pair rows a prepass copies on the caller */
#define MOE_SUM_SERIAL (1 << 17)    /* products of the weighted sum below which it stays serial */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }
static int64_t lcm64(int64_t a, int64_t b) { return a / gcd64(a, b) * b; }

static int quantized(const armllm_moe_weights *w) {
  return w->kind == ARMLLM_MOE_WQ || w->kind == ARMLLM_MOE_GGUF;
}

/* Columns a window of w may start on: its packed panels (and, with the zero
 * points' correction, the f32 panels of the correction weight's too). */
static int64_t panel_of(const armllm_kernels *kt, const armllm_moe_weights *w) {
  switch (w->kind) {
  case ARMLLM_MOE_F32: return kt->gemm_f32_panel;
  case ARMLLM_MOE_BF16: return kt->gemm_bf16_panel;
  case ARMLLM_MOE_WQ:
    return w->corr ? lcm64(kt->gemm_wq_panel, kt->gemm_f32_panel) : kt->gemm_wq_panel;
  default: return kt->gemm_gguf_panel;
  }
}

/* The first column of the part of expert e's matrix that holds column col
 * (GGUF blocks come in row parts; the other formats are one). */
static int64_t part_start(const armllm_moe_weights *w, int64_t e, int64_t col) {
  if (w->kind != ARMLLM_MOE_GGUF) return 0;
  const armllm_gguf_parts *parts = w->w[e];
  int64_t start = 0;
  for (int i = 0; i < parts->nparts && col >= start + parts->rows[i]; i++) start += parts->rows[i];
  return start;
}

/* The packed panel column col falls in: where its window starts. */
static int64_t panel_start(const armllm_moe_weights *w, int64_t e, int64_t col, int64_t panel) {
  const int64_t start = part_start(w, e, col);
  return start + (col - start) / panel * panel;
}

int armllm_moe_check(const armllm_kernels *kt, const armllm_moe_layer *L, char *err,
                     size_t err_len) {
  const int64_t n = L->experts + (L->shared ? 1 : 0);
  for (int64_t e = 0; e < n; e++) {
    if (L->gate_up.kind == ARMLLM_MOE_GGUF) {
      const armllm_gguf_parts *parts = L->gate_up.w[e];
      int64_t start = 0;
      for (int i = 0; i + 1 < parts->nparts; i++) {
        start += parts->rows[i];
        if (start != L->inter) {
          snprintf(err, err_len, "expert %lld's gate_up has a part boundary at row %lld: "
                   "only gate | up (%lld) is supported", (long long)e, (long long)start,
                   (long long)L->inter);
          return -1;
        }
      }
    }
    if (L->down.kind == ARMLLM_MOE_GGUF) {
      const armllm_gguf_parts *parts = L->down.w[e];
      int64_t start = 0;
      for (int i = 0; i + 1 < parts->nparts; i++) {
        start += parts->rows[i];
        if (start % panel_of(kt, &L->down)) {
          snprintf(err, err_len, "expert %lld's down has a part boundary off a panel (row "
                   "%lld)", (long long)e, (long long)start);
          return -1;
        }
      }
    }
  }
  return 0;
}

/* One pass's plan and state, the context of its pool jobs. */
typedef struct {
  const armllm_kernels *kt;
  const armllm_moe_layer *L;
  const float *x; /* the pass's rows */
  int64_t ldx;
  float *out;
  int64_t ldo;
  int64_t t, pairs;          /* rows, routed pairs (t * top_k) */
  int64_t n_active;          /* experts with rows, ascending, then the shared one */
  int64_t w1, nw1, up_panel; /* job 1: gate window, windows per expert, up's start panel */
  int64_t w2, nw2;           /* job 2: output window, windows per expert */
} moe_pass;

/* Expert e's pair rows: [*r0, *r0 + *m). */
static void rows_of(const moe_pass *ps, int64_t e, int64_t *r0, int64_t *m) {
  const armllm_moe_layer *L = ps->L;
  if (e == L->experts) { /* the shared expert: every row, after the routed pairs */
    *r0 = ps->pairs;
    *m = ps->t;
  } else {
    *r0 = L->start[e];
    *m = L->counts[e];
  }
}

/* y[0 .. m) = columns [n0, n1) of expert e's GEMM w on the pair rows r0 ..
 * r0 + m (float inputs: x), y and corr the window's (corr: the correction's
 * columns of an asymmetric w, laid out as y's). */
static void gemm_window(const armllm_kernels *kt, const armllm_moe_weights *w,
                        const armllm_moe_act *q, int64_t e, const float *x, int64_t ldx,
                        int64_t r0, int64_t m, int64_t n0, int64_t n1, float *y, int64_t ldy,
                        float *corr) {
  const float *bias = w->bias && w->bias[e] ? w->bias[e] + n0 : NULL;
  switch (w->kind) {
  case ARMLLM_MOE_F32:
    kt->gemm_f32_cols(x, m, w->k, ldx, w->w[e], w->n, n0, n1, bias, y, ldy);
    return;
  case ARMLLM_MOE_BF16:
    kt->gemm_bf16_cols(x, m, w->k, ldx, w->w[e], w->n, n0, n1, bias, y, ldy);
    return;
  case ARMLLM_MOE_GGUF:
    kt->gemm_gguf_cols(q->xq + r0 * q->ldq, m, w->k, q->ldq, q->scale + r0 * q->ldsc, q->ldsc,
                       q->gsum ? q->gsum + r0 * q->ldgs : NULL, q->ldgs, w->w[e], w->n, n0, n1,
                       bias, y, ldy);
    return;
  default:
    kt->gemm_wq_cols(q->xq + r0 * q->ldq, m, w->k, q->ldq, q->scale + r0 * q->ldsc, q->ldsc,
                     q->gsum ? q->gsum + r0 * q->ldgs : NULL, q->ldgs, w->w[e], w->n, w->bits,
                     w->group, n0, n1, bias, y, ldy);
    if (w->corr) { /* y -= (scale * zp) @ C.T, as a whole linear takes it off */
      const int64_t ng = armllm_q_groups(w->k, w->group);
      kt->gemm_f32_cols(q->szp + r0 * q->ldszp, m, ng, q->ldszp, w->corr[e], w->n, n0, n1, NULL,
                        corr, q->ldc);
      for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n1 - n0; j++)
          y[r * ldy + j] = y[r * ldy + j] - corr[r * q->ldc + j];
    }
  }
}

/* scale * zp of rows [r0, r1) and groups [g0, g1) (asymmetric activations). */
static void scaled_zp(const armllm_moe_act *q, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t g = g0; g < g1; g++)
      q->szp[r * q->ldszp + g] = (float)q->zp[r * q->ldzp + g] * q->scale[r * q->ldsc + g];
}

/* Job 1's item: expert a's window wi of gate columns, its up columns, the
 * activation, and a quantized down's quantization of it. */
static void job1_task(void *ctx, int64_t i0, int64_t i1) {
  const moe_pass *ps = ctx;
  const armllm_moe_layer *L = ps->L;
  const armllm_kernels *kt = ps->kt;
  const armllm_moe_weights *gu = &L->gate_up;
  for (int64_t i = i0; i < i1; i++) {
    const int64_t e = L->active[i / ps->nw1], wi = i % ps->nw1;
    int64_t r0, m;
    rows_of(ps, e, &r0, &m);
    const int64_t j0 = wi * ps->w1, j1 = min64(L->inter, j0 + ps->w1), c = j1 - j0;
    const int shared = e == L->experts;
    const float *x = shared ? ps->x : L->x_pairs ? L->x_pairs + r0 * L->ldx : NULL;
    const int64_t ldx = shared ? ps->ldx : L->ldx;
    /* the window's [gate | up] columns: up first, from its packed panel's
     * start, which may lie up to a panel before inter + j0 (inter off a
     * panel): those columns land on the window's last gate columns, which
     * the gate GEMM then writes */
    float *g = L->gate_up_out + r0 * L->ldg + 2 * j0;
    float *gc = L->in_q.corr ? L->in_q.corr + r0 * L->in_q.ldc + 2 * j0 : NULL;
    const int64_t u0 = panel_start(gu, e, L->inter + j0, ps->up_panel), lead = L->inter + j0 - u0;
    gemm_window(kt, gu, &L->in_q, e, x, ldx, r0, m, u0, L->inter + j1, g + c - lead, L->ldg,
                gc ? gc + c - lead : NULL);
    gemm_window(kt, gu, &L->in_q, e, x, ldx, r0, m, j0, j1, g, L->ldg, gc);
    /* act(gate) * up: a quantized down takes it in place and quantizes it (the
     * window is whole groups), a float one reads it from act */
    float *a = quantized(&L->down) ? g : L->act + r0 * L->lda + j0;
    const int64_t lda = quantized(&L->down) ? L->ldg : L->lda;
    if (L->clamped && !shared) armllm_swiglu_clamped(g, L->ldg, m, c, L->alpha, L->limit, a, lda);
    else kt->silu_mul(NULL, g, L->ldg, m, c, a, lda);
    if (!quantized(&L->down)) continue;
    const armllm_moe_act *q = &L->act_q;
    const int64_t g0 = j0 / armllm_q_group_len(L->down.group);
    kt->quant_act(NULL, a, m, c, lda, L->down.group, q->xq + r0 * q->ldq + j0, q->ldq,
                  q->scale + r0 * q->ldsc + g0, q->ldsc,
                  q->gsum ? q->gsum + r0 * q->ldgs + g0 : NULL, q->ldgs,
                  q->zp ? q->zp + r0 * q->ldzp + g0 : NULL, q->ldzp);
    if (q->zp) scaled_zp(q, r0, r0 + m, g0, g0 + armllm_q_groups(c, L->down.group));
  }
}

/* Job 2's item: expert a's down on output window wi, into its pair rows' y
 * (gate_up_out, whose job-1 contents a quantized down no longer needs). */
static void job2_task(void *ctx, int64_t i0, int64_t i1) {
  const moe_pass *ps = ctx;
  const armllm_moe_layer *L = ps->L;
  for (int64_t i = i0; i < i1; i++) {
    const int64_t e = L->active[i / ps->nw2], wi = i % ps->nw2;
    const int64_t h0 = wi * ps->w2, h1 = min64(L->hidden, h0 + ps->w2);
    int64_t r0, m;
    rows_of(ps, e, &r0, &m);
    gemm_window(ps->kt, &L->down, &L->act_q, e, L->act ? L->act + r0 * L->lda : NULL, L->lda, r0,
                m, h0, h1, L->gate_up_out + r0 * L->ldg + h0, L->ldg,
                L->act_q.corr ? L->act_q.corr + r0 * L->act_q.ldc + h0 : NULL);
  }
}

/* The weighted sum of output columns [c0, c1): zeroed, then each active
 * expert's y rows added in ascending order, the shared expert last. */
static void sum_task(void *ctx, int64_t c0, int64_t c1) {
  const moe_pass *ps = ctx;
  const armllm_moe_layer *L = ps->L;
  for (int64_t r = 0; r < ps->t; r++)
    memset(ps->out + r * ps->ldo + c0, 0, (size_t)(c1 - c0) * sizeof(float));
  for (int64_t a = 0; a < ps->n_active; a++) {
    const int64_t e = L->active[a];
    int64_t r0, m;
    rows_of(ps, e, &r0, &m);
    const float *y = L->gate_up_out + r0 * L->ldg + c0;
    if (e < L->experts)
      armllm_moe_accumulate(y, L->ldg, m, c1 - c0, L->pair_row + r0, L->pair_weight + r0,
                            ps->out + c0, ps->ldo);
    else
      armllm_moe_accumulate(y, L->ldg, m, c1 - c0, NULL, L->shared_scale, ps->out + c0, ps->ldo);
  }
}

/* Copies pair rows [p0, p1) from their rows: the quantized activations (row
 * pairs + row of the scratch) or the float rows of x. */
static void gather_task(void *ctx, int64_t p0, int64_t p1) {
  const moe_pass *ps = ctx;
  const armllm_moe_layer *L = ps->L;
  const armllm_moe_act *q = &L->in_q;
  const int64_t k = L->hidden, ng = armllm_q_groups(k, L->gate_up.group);
  for (int64_t p = p0; p < p1; p++) {
    const int64_t row = L->pair_row[p];
    if (!quantized(&L->gate_up)) {
      memcpy(L->x_pairs + p * L->ldx, ps->x + row * ps->ldx, (size_t)k * sizeof(float));
      continue;
    }
    const int64_t src = ps->pairs + row;
    memcpy(q->xq + p * q->ldq, q->xq + src * q->ldq, (size_t)armllm_q_kpad(k));
    memcpy(q->scale + p * q->ldsc, q->scale + src * q->ldsc, (size_t)ng * sizeof(float));
    if (q->gsum)
      memcpy(q->gsum + p * q->ldgs, q->gsum + src * q->ldgs, (size_t)ng * sizeof(int32_t));
    if (q->zp) {
      memcpy(q->zp + p * q->ldzp, q->zp + src * q->ldzp, (size_t)ng * sizeof(int32_t));
      memcpy(q->szp + p * q->ldszp, q->szp + src * q->ldszp, (size_t)ng * sizeof(float));
    }
  }
}

/* The window width of a job over `cols` columns and `experts` experts: about
 * MOE_ITEMS_PER_THREAD items per thread, whole multiples of align. */
static int64_t window_of(const armllm_pool *pool, int64_t cols, int64_t experts, int64_t align) {
  const int64_t items = MOE_ITEMS_PER_THREAD * armllm_pool_threads(pool);
  const int64_t w = max64((cols * experts + items - 1) / items, MOE_MIN_WINDOW);
  return min64(round_up(w, align), round_up(cols, align));
}

static void moe_pass_run(const armllm_kernels *kt, armllm_pool *pool, const armllm_moe_layer *L,
                         const float *x, int64_t ldx, const float *logits, int64_t ldl, int64_t t,
                         float *out, int64_t ldo) {
  const int64_t k = L->top_k, E = L->experts;
  moe_pass ps = {kt, L, x, ldx, out, ldo, t, t * k, 0, 0, 0, 0, 0, 0};
  armllm_moe_route(logits, ldl, t, E, k, L->renormalize, L->ids, L->weights, L->taken);
  armllm_moe_group(L->ids, L->weights, t, k, E, L->counts, L->start, L->pair_row,
                   L->pair_weight);
  for (int64_t e = 0; e < E; e++)
    if (L->counts[e]) L->active[ps.n_active++] = (int32_t)e;
  if (L->shared) {
    L->active[ps.n_active++] = (int32_t)E;
    for (int64_t r = 0; r < t; r++) {
      float dot = 0;
      for (int64_t j = 0; j < L->hidden; j++) dot = dot + x[r * ldx + j] * L->shared_gate[j];
      L->shared_scale[r] = (float)(1.0 / (1.0 + (double)expf(-dot)));
    }
  }
  /* each row's activations once: quantized into the rows after the pairs
   * (the shared expert reads them there), then copied to each of its pairs */
  const armllm_moe_act *q = &L->in_q;
  const int64_t group = L->gate_up.group, ng = armllm_q_groups(L->hidden, group);
  if (quantized(&L->gate_up)) {
    const int64_t r0 = ps.pairs;
    kt->quant_act(pool, x, t, L->hidden, ldx, group, q->xq + r0 * q->ldq, q->ldq,
                  q->scale + r0 * q->ldsc, q->ldsc, q->gsum ? q->gsum + r0 * q->ldgs : NULL,
                  q->ldgs, q->zp ? q->zp + r0 * q->ldzp : NULL, q->ldzp);
    if (q->zp) scaled_zp(q, r0, r0 + t, 0, ng);
  }
  const int64_t row_bytes = quantized(&L->gate_up) ? armllm_q_kpad(L->hidden) : 4 * L->hidden;
  armllm_pool *gather_pool = ps.pairs * row_bytes < MOE_GATHER_SERIAL ? NULL : pool;
  armllm_pool_run(gather_pool, ps.pairs, armllm_pool_grain(gather_pool, ps.pairs, 2, 1),
                  gather_task, &ps);
  /* job 1: windows of whole packed panels and, for a quantized down, whole
   * activation groups */
  int64_t align1 = panel_of(kt, &L->gate_up);
  if (quantized(&L->down)) align1 = lcm64(align1, armllm_q_group_len(L->down.group));
  ps.up_panel = panel_of(kt, &L->gate_up);
  ps.w1 = window_of(pool, L->inter, ps.n_active, align1);
  ps.nw1 = (L->inter + ps.w1 - 1) / ps.w1;
  armllm_pool_run(pool, ps.n_active * ps.nw1, 1, job1_task, &ps);
  /* job 2, then the sum in place (columns apart: each output's order is fixed) */
  ps.w2 = window_of(pool, L->hidden, ps.n_active, panel_of(kt, &L->down));
  ps.nw2 = (L->hidden + ps.w2 - 1) / ps.w2;
  armllm_pool_run(pool, ps.n_active * ps.nw2, 1, job2_task, &ps);
  armllm_pool *sum_pool = (ps.pairs + t) * L->hidden < MOE_SUM_SERIAL ? NULL : pool;
  armllm_pool_run(sum_pool, L->hidden, armllm_pool_grain(sum_pool, L->hidden, 2, 64), sum_task,
                  &ps);
}

void armllm_moe_run(const armllm_kernels *kt, armllm_pool *pool, const armllm_moe_layer *layer,
                    const float *x, int64_t ldx, const float *logits, int64_t ldl, int64_t t,
                    float *out, int64_t ldo) {
  /* passes of even length: a short last pass would read every expert again for a few rows */
  const int64_t passes = (t + layer->max_tokens - 1) / layer->max_tokens;
  const int64_t rows = (t + passes - 1) / passes;
  for (int64_t r0 = 0; r0 < t; r0 += rows) {
    const int64_t n = min64(rows, t - r0);
    moe_pass_run(kt, pool, layer, x + r0 * ldx, ldx, logits + r0 * ldl, ldl, n, out + r0 * ldo,
                 ldo);
  }
}
