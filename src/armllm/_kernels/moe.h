/* moe.h: a mixture-of-experts layer's MLP after its router GEMM, portable C
 * above the kernel slots (every ISA runs it; the GEMMs are the slots' own
 * column windows): routing, grouping rows by expert, each token's activations
 * quantized once, every active expert's gate/up -> activation -> down as two
 * pool jobs, and the weighted sum accumulated into the output in place. Its
 * parts (routing, grouping, GPT-OSS's clamped SwiGLU, the weighted add) touch
 * E router logits and a few rows per token: noise next to the experts'
 * weight reads. */
#ifndef ARMLLM_MOE_H
#define ARMLLM_MOE_H

#include <stdint.h>

#include "armllm_kernels.h"

/* Routing of `rows` tokens (transformers' rule): for row r of logits (ldl
 * apart, E experts), p = softmax(logits[r]); ids[r*k + j] = the j-th largest p
 * (ties: the lower expert id, as torch.topk; NaNs never win), weights[r*k + j]
 * = its p, divided by the k weights' sum when renormalize (Mixtral,
 * norm_topk_prob, GPT-OSS's softmax over the top-k logits). taken: E bytes of
 * scratch. */
void armllm_moe_route(const float *logits, int64_t ldl, int64_t rows, int64_t experts,
                      int64_t k, int renormalize, int32_t *ids, float *weights,
                      uint8_t *taken);

/* Counting sort of the rows*k (row, slot) pairs by expert: counts[e] pairs go
 * to expert e, at [start[e], start[e] + counts[e]) of pair_row / pair_weight,
 * rows ascending within an expert (start: E + 1 entries). */
void armllm_moe_group(const int32_t *ids, const float *weights, int64_t rows, int64_t k,
                      int64_t experts, int32_t *counts, int32_t *start, int32_t *pair_row,
                      float *pair_weight);

/* GPT-OSS's expert activation of t rows of a fused [gate | up] (inter each):
 * g = min(gate, limit), u = clamp(up, -limit, limit),
 * out = g * sigmoid(alpha * g) * (u + 1) = g / (1 + exp(-alpha g)) * (u + 1). */
void armllm_swiglu_clamped(const float *gate_up, int64_t ldg, int64_t t, int64_t inter,
                           float alpha, float limit, float *out, int64_t ldo);

/* out[row[i]] += w[i] * y[i] for n rows of d columns (row NULL: out[i]). */
void armllm_moe_accumulate(const float *y, int64_t ldy, int64_t n, int64_t d,
                           const int32_t *row, const float *w, float *out, int64_t ldo);

/* ---------------------------------------------------------- the layer
 *
 * A sparse layer's MLP of t rows x [t, hidden] with their router logits
 * [t, experts] (the caller's router GEMM), into out [t, hidden]:
 *
 *   ids, w = armllm_moe_route(logits); pairs grouped by expert
 *   out[r] = sum over r's experts e, in ascending e, of w * down_e(act(
 *            gate_up_e(x[r]))) [+ sigmoid(x[r] . shared_gate) * the shared
 *            expert's down(silu_mul(gate_up(x[r])))]
 *
 * act: silu(gate) * up (the silu_mul slot), or clamped (GPT-OSS's
 * armllm_swiglu_clamped); the shared expert always silu_mul. Every product
 * is its GEMM slot's own bits and every output element is summed in that
 * order, from +0: the result is the same as running each expert's GEMMs on
 * its rows alone, whatever the batch, the pool or the ISA.
 *
 * A pass of up to max_tokens rows (more run in passes of even length) is:
 *   1. routing and a counting sort of the t * top_k (row, expert) pairs;
 *   2. quantized experts: each row's activations quantized once, into the
 *      pair rows' scratch after the routed pairs, then copied to each of
 *      its pairs (float experts: the rows copied);
 *   3. job 1, one pool job over (active expert, window of gate columns):
 *      the up and gate columns of the window (gemm_*_cols), their
 *      activation and, for a quantized down, its quantization (windows are
 *      whole activation groups);
 *   4. job 2, one pool job over (active expert, window of output columns):
 *      the down columns of the window for the expert's rows;
 *   5. the weighted sum in place, over windows of output columns (on the
 *      caller when small): out zeroed, then w * y of every active expert in
 *      ascending order, the shared expert last (no two windows touch one
 *      output; each output's order is fixed).
 * Items are whole expert windows: each streams one contiguous run of its
 * expert's weights, and decode at batch 1 reads each active expert's
 * weights exactly once. */

enum { ARMLLM_MOE_F32, ARMLLM_MOE_BF16, ARMLLM_MOE_WQ, ARMLLM_MOE_GGUF };

/* One linear weight of every expert, one format and shape [n, k]. Index
 * `experts` (one past the routed ones) is the shared expert's. */
typedef struct {
  int kind;                 /* ARMLLM_MOE_F32, _BF16, _WQ or _GGUF */
  int64_t n, k;
  int bits;                 /* _WQ: 8 or 4 */
  int64_t group;            /* _WQ, _GGUF: the group of its weights and activations */
  const void *const *w;     /* packed by the table's own pack */
  const float *const *bias; /* [n] each (entries may be NULL), or NULL: none */
  const float *const *corr; /* _WQ with asymmetric activations: the zero points'
                               correction weight [n, ng] (f32, packed); NULL: symmetric */
} armllm_moe_weights;

/* Quantized activations of pair rows (quant_act's outputs) and the zero
 * points' scratch of asymmetric ones. */
typedef struct {
  int8_t *xq;
  int64_t ldq;
  float *scale;
  int64_t ldsc;
  int32_t *gsum;
  int64_t ldgs;
  int32_t *zp; /* NULL: symmetric */
  int64_t ldzp;
  float *szp;  /* scale * zp */
  int64_t ldszp;
  float *corr; /* the correction's columns, as the weight's output buffer lays them */
  int64_t ldc;
} armllm_moe_act;

typedef struct {
  int64_t experts, top_k, hidden, inter;
  int renormalize, clamped;
  float alpha, limit;
  int shared;                 /* a shared expert runs on every row */
  const float *shared_gate;   /* [hidden] */
  armllm_moe_weights gate_up; /* [2 inter, hidden]: gate rows, then up rows */
  armllm_moe_weights down;    /* [hidden, inter] */
  int64_t max_tokens;         /* rows of a pass; pair buffers of pairs = max_tokens * (top_k
                                 + 1) rows: the routed pairs, then the pass's rows */
  float *gate_up_out;         /* [pairs, max(2 inter, hidden)]: gate/up windows (and a
                                 quantized down's activations, in place), then down's y */
  int64_t ldg;
  float *x_pairs;             /* float gate_up: [pairs, hidden] the pairs' rows */
  int64_t ldx;
  float *act;                 /* float down: [pairs, inter] */
  int64_t lda;
  armllm_moe_act in_q, act_q; /* quantized gate_up / down: [pairs, ...] */
  /* routing scratch: [max_tokens * top_k] ids, weights, pair_row, pair_weight;
   * [experts] taken, counts; [experts + 1] start, active; [max_tokens] shared_scale */
  int32_t *ids, *counts, *start, *pair_row, *active;
  float *weights, *pair_weight, *shared_scale;
  uint8_t *taken;
} armllm_moe_layer;

/* Checks a layer's geometry before it runs: 0, or -1 with a reason in err
 * (a GGUF expert whose parts split its gate rows, up rows or down windows
 * off a panel). */
int armllm_moe_check(const armllm_kernels *kt, const armllm_moe_layer *layer, char *err,
                     size_t err_len);

/* The MLP of t rows (see above). */
void armllm_moe_run(const armllm_kernels *kt, armllm_pool *pool, const armllm_moe_layer *layer,
                    const float *x, int64_t ldx, const float *logits, int64_t ldl, int64_t t,
                    float *out, int64_t ldo);

#endif /* ARMLLM_MOE_H */
