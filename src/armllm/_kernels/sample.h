/* sample.h: choosing a random token from one logits row (portable C, the
 * same on every ISA: a row is read a few times, never sorted). Greedy choice
 * is numpy's argmax (vectorized for the machine it runs on).
 *
 * armllm_sample: a random token under temperature, top-k, min-p and top-p,
 *   for one uniform draw u in [0, 1), defined as this float64 computation:
 *     x = row / temperature; C = the top_k largest x (0 < top_k < n; ties at
 *     the k-th value go to the lower ids), or every token; C in ascending id;
 *     p = exp(x - max x over C), p /= sum p (over C);
 *     keep = p >= min_p * max p (min_p > 0), and (top_p < 1) the smallest set
 *     of the highest p (ties: lower id first) whose sum, added up in that
 *     order, reaches top_p;
 *     cdf = the running sum over C of (keep ? p : 0); the token is the C entry
 *     of the first cdf > u * cdf[last] (the last entry if none).
 *   Tokens with x more than ARMLLM_SAMPLE_EXP_CUT below the maximum count as
 *   p = 0 (their exp is below 1e-34: summed over any vocabulary, below the
 *   rounding of the sum); exp is sample.c's own, within 1 ulp of libm's and
 *   vectorized. `scratch` holds armllm_sample_scratch_bytes(n)
 *   bytes, 8-byte aligned. Returns the token id.
 */
#ifndef ARMLLM_SAMPLE_H
#define ARMLLM_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#define ARMLLM_SAMPLE_EXP_CUT 80.0

size_t armllm_sample_scratch_bytes(int64_t n);

/* armllm_mask_logits: a structured output's token mask applied to one logits
 *   row: row[i] = -inf where bit i % 32 of words[i / 32] is 0 (llguidance's
 *   bitmask layout: bit j of word w is token 32 w + j); the other entries are
 *   untouched. words holds ceil(n / 32) entries. */
void armllm_mask_logits(float *row, int64_t n, const uint32_t *words);

int64_t armllm_sample(const float *row, int64_t n, double temperature, int64_t top_k,
                      double top_p, double min_p, double u, void *scratch);

#endif /* ARMLLM_SAMPLE_H */
