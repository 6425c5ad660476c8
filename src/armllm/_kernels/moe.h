/* moe.h: the parts of a mixture-of-experts layer around its expert GEMMs
 * (which are the GEMM slots' own): routing, grouping rows by expert, GPT-OSS's
 * clamped SwiGLU, and the weighted add of an expert's output rows. Portable C
 * for every ISA: per token they touch E router logits and a few rows, noise
 * next to the expert GEMMs' weight reads. */
#ifndef ARMLLM_MOE_H
#define ARMLLM_MOE_H

#include <stdint.h>

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

/* out[row[i]] += w[i] * y[i] for n rows of d columns. */
void armllm_moe_accumulate(const float *y, int64_t ldy, int64_t n, int64_t d,
                           const int32_t *row, const float *w, float *out, int64_t ldo);

#endif /* ARMLLM_MOE_H */
