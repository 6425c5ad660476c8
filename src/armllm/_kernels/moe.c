/* moe.c: routing, grouping, activation and accumulation of a mixture-of-
 * experts layer (moe.h). */
#include "moe.h"

#include <math.h>
#include <string.h>

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
    float *oi = out + (int64_t)row[i] * ldo;
    const float wi = w[i];
    for (int64_t c = 0; c < d; c++) oi[c] += wi * yi[c];
  }
}
