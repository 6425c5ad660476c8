/* sample_argmax.h: the sample_argmax slot's walk over a row (the x86
 * variants'): each span's largest value, and the first span whose maximum
 * beats every earlier one's holds the row's first maximum, so only that span
 * is read again. A variant gives its span maximum (NaN never wins: -inf for a
 * span of -inf and NaN) and its first-equal scan as static functions; the
 * calls inline. */
#ifndef ARMLLM_SAMPLE_ARGMAX_H
#define ARMLLM_SAMPLE_ARGMAX_H

#include <math.h>
#include <stdint.h>

#define ARMLLM_ARGMAX_SPAN 1024 /* floats: 4 KB, read again from L1 */

/* The lowest index of the largest non-NaN x; a maximum of -inf (no span beats
 * the start) is the first x that is not NaN; -1 if every x is NaN. */
static inline int64_t armllm_argmax_by_spans(const float *x, int64_t n,
                                             float (*span_max)(const float *, int64_t),
                                             int64_t (*first_equal)(const float *, int64_t,
                                                                    float)) {
  float best = -INFINITY;
  int64_t best_at = -1;
  for (int64_t s = 0; s < n; s += ARMLLM_ARGMAX_SPAN) {
    const int64_t len = n - s < ARMLLM_ARGMAX_SPAN ? n - s : ARMLLM_ARGMAX_SPAN;
    const float m = span_max(x + s, len);
    if (m > best) {
      best = m;
      best_at = s;
    }
  }
  if (best_at < 0) return first_equal(x, n, -INFINITY);
  const int64_t len = n - best_at < ARMLLM_ARGMAX_SPAN ? n - best_at : ARMLLM_ARGMAX_SPAN;
  return best_at + first_equal(x + best_at, len, best);
}

#endif /* ARMLLM_SAMPLE_ARGMAX_H */
