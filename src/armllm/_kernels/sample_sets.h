/* sample_sets.h: a row's candidate sets for armllm_sample_rows (sample.h
 * step 6), sample_sets.c. Lists are in ascending id; e is every entry's
 * sample_exp value.
 *
 * armllm_sample_top_k: the top k values of x[0..n) (0 < k < n; ties at the
 *   k-th value to the lower ids) other than -inf and NaN, with their ids, into
 *   vals / ids; returns their count (k, or fewer if x has fewer). vals and
 *   ids hold n entries; copy n floats of scratch.
 *
 * armllm_sample_top_p: the top-p set of the kept e[0..len) (floor keep_min;
 *   their block sum `total`, block by block in sums, as sample_exp leaves
 *   them): the smallest set of the highest (ties to the lower position)
 *   whose sum, in that order in double, reaches (double)top_p * total, or
 *   every kept e > 0 if none does; into out_e / out_id (returns its size).
 *   e_ids[p] is position p's id (NULL: p). out_e may be e and out_id e_ids;
 *   both hold len + ARMLLM_SAMPLE_BLOCK entries. work: len int32 of scratch.
 */
#ifndef ARMLLM_SAMPLE_SETS_H
#define ARMLLM_SAMPLE_SETS_H

#include <stdint.h>

#include "armllm_kernels.h"

int64_t armllm_sample_top_k(const armllm_kernels *kt, const float *x, int64_t n, int64_t k,
                            float *vals, int32_t *ids, float *copy);

int64_t armllm_sample_top_p(const armllm_kernels *kt, const float *e, const int32_t *e_ids,
                            int64_t len, float keep_min, double total, float top_p,
                            const float *sums, int32_t *work, float *out_e, int32_t *out_id);

#endif /* ARMLLM_SAMPLE_SETS_H */
