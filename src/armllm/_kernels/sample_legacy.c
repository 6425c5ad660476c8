/* sample_legacy.c: armllm_sample, the one-row random token choice that
 * sampling.py calls until it moves to armllm_sample_rows (sample.h's legacy
 * section; both go then).
 *
 * The candidates' probabilities are computed once; top-k is a selection
 * (quickselect of the k-th value, then one pass in id order), top-p a binary
 * heap popped only until the kept mass reaches top_p: at the usual settings a
 * few dozen pops, never a sort of the vocabulary. */
#include "sample.h"

#include <math.h>
#include <string.h>

size_t armllm_sample_scratch_bytes(int64_t n) {
  /* probabilities (double), candidate ids, heap (int32), kept flags (uint8) */
  return (size_t)n * (sizeof(double) + 2 * sizeof(int32_t) + 1);
}

/* The k-th largest (1-based) of v[0..n) by quickselect; v is reordered. */
static float kth_largest(float *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1, want = k - 1;
  while (lo < hi) {
    const float pivot = v[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (v[i] > pivot) i++;
      while (v[j] < pivot) j--;
      if (i <= j) {
        const float t = v[i];
        v[i] = v[j];
        v[j] = t;
        i++;
        j--;
      }
    }
    if (want <= j)
      hi = j;
    else if (want >= i)
      lo = i;
    else
      return v[want];
  }
  return v[want];
}

/* no-trapping-math (FP exceptions are never looked at here; no result changes)
 * lets GCC vectorize the exp loop's selects; both functions carry it, so that
 * one inlines into the other. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_TRAPPING_MATH __attribute__((optimize("no-trapping-math")))
#else
#define NO_TRAPPING_MATH
#endif

/* top-p heaps only the tokens of p >= tau (see armllm_sample); tau starts at
 * pmax * TOP_P_FLOOR_STEP and shrinks by that factor. TOP_P_MARGIN: far above
 * the rounding of a sum of probabilities in another order (~n * 2^-53). */
#define TOP_P_FLOOR_STEP 1e-3
#define TOP_P_MARGIN 1e-9

/* exp(d) for d in [-ARMLLM_SAMPLE_EXP_CUT, 0], within 2 ulp: 2^k * e^r with
 * k = round(d / ln 2) (the 1.5 * 2^52 addition rounds), r = d - k ln 2 in two
 * parts (|r| <= ln 2 / 2), e^r by its Taylor series to r^13 (the next term is
 * below 5e-18). No calls and no branches, so the loop over a vocabulary
 * vectorizes; 2^k is built in the exponent bits (k >= -116: no subnormals). */
NO_TRAPPING_MATH static inline double exp_nonpositive(double d) {
  const double shifter = 0x1.8p52, log2e = 0x1.71547652b82fep0;
  const double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
  const double t = d * log2e + shifter, kd = t - shifter;
  const double r = (d - kd * ln2_hi) - kd * ln2_lo;
  double e = 1.0 / 6227020800.0; /* 1/13! */
  e = e * r + 1.0 / 479001600.0;
  e = e * r + 1.0 / 39916800.0;
  e = e * r + 1.0 / 3628800.0;
  e = e * r + 1.0 / 362880.0;
  e = e * r + 1.0 / 40320.0;
  e = e * r + 1.0 / 5040.0;
  e = e * r + 1.0 / 720.0;
  e = e * r + 1.0 / 120.0;
  e = e * r + 1.0 / 24.0;
  e = e * r + 1.0 / 6.0;
  e = e * r + 0.5;
  e = e * r + 1.0;
  e = e * r + 1.0;
  int64_t t_bits, shifter_bits; /* k itself sits in t's low mantissa bits */
  memcpy(&t_bits, &t, sizeof t_bits);
  memcpy(&shifter_bits, &shifter, sizeof shifter_bits);
  const int64_t bits = (t_bits - shifter_bits + 1023) << 52;
  double scale;
  memcpy(&scale, &bits, sizeof scale);
  return e * scale;
}

/* Heap order: a before b when its probability is higher, or equal with a lower id. */
static inline int before(const double *p, const int32_t *ids, int32_t a, int32_t b) {
  return p[a] > p[b] || (p[a] == p[b] && ids[a] < ids[b]);
}

static void sift_down(int32_t *heap, int64_t len, int64_t i, const double *p, const int32_t *ids) {
  for (;;) {
    int64_t best = i, l = 2 * i + 1, r = l + 1;
    if (l < len && before(p, ids, heap[l], heap[best])) best = l;
    if (r < len && before(p, ids, heap[r], heap[best])) best = r;
    if (best == i) return;
    const int32_t t = heap[i];
    heap[i] = heap[best];
    heap[best] = t;
    i = best;
  }
}

NO_TRAPPING_MATH
int64_t armllm_sample(const float *row, int64_t n, double temperature, int64_t top_k,
                      double top_p, double min_p, double u, void *scratch) {
  double *p = scratch;
  int32_t *ids = (int32_t *)(p + n), *heap = ids + n;
  uint8_t *keep = (uint8_t *)(heap + n);
  int64_t c = n; /* candidates, in ascending id (all of them: ids[j] = j) */
  float row_max = row[0];
  for (int64_t i = 1; i < n; i++) row_max = row[i] > row_max ? row[i] : row_max;
  if (top_k > 0 && top_k < n) {
    /* x = row / temperature keeps the order of row (a float's double quotient by a
       positive number is monotonic and keeps distinct floats distinct): select on row */
    float *v = (float *)heap; /* heap and keep are free until top-p */
    memcpy(v, row, (size_t)n * sizeof(float));
    const float kth = kth_largest(v, n, top_k);
    int64_t above = 0;
    for (int64_t i = 0; i < n; i++) above += row[i] > kth;
    int64_t ties = top_k - above; /* of the k-th value, the lowest ids */
    c = 0;
    for (int64_t i = 0; i < n && c < top_k; i++)
      if (row[i] > kth || (row[i] == kth && ties-- > 0)) ids[c++] = (int32_t)i;
    if (c == 0) /* NaN logits: the first k (the result is as undefined as numpy's) */
      for (; c < top_k; c++) ids[c] = (int32_t)c;
    for (int64_t j = 0; j < c; j++) p[j] = (double)row[ids[j]] / temperature;
  } else {
    for (int64_t i = 0; i < n; i++) {
      ids[i] = (int32_t)i;
      p[i] = (double)row[i] / temperature;
    }
  }
  /* the largest x: row's maximum divided (for top-k, the maximum is a candidate) */
  const double m = row_max == row_max ? (double)row_max / temperature : p[0];
  for (int64_t j = 0; j < c; j++) { /* vectorizes; the sum below keeps its order */
    const double d = p[j] - m, in_range = (double)(d >= -ARMLLM_SAMPLE_EXP_CUT);
    p[j] = exp_nonpositive(d >= -ARMLLM_SAMPLE_EXP_CUT ? d : 0.0) * in_range;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < c; j++) sum += p[j];
  double pmax = 0.0;
  for (int64_t j = 0; j < c; j++) {
    p[j] /= sum;
    pmax = p[j] > pmax ? p[j] : pmax;
  }
  const double floor_p = min_p > 0.0 ? min_p * pmax : -1.0;
  if (top_p < 1.0) {
    /* the heap holds only tokens that can matter (p > 0): the others come last in
       the order and their mass adds nothing */
    /* ... and of those only the ones at or above a floor tau whose tokens' mass
       already passes top_p (with a margin for the order of the additions): the
       smallest set reaching top_p lies among them. tau drops 1000-fold until it
       does (to 0: every token). */
    double tau = pmax * TOP_P_FLOOR_STEP;
    for (;;) {
      double mass = 0.0;
      for (int64_t j = 0; j < c; j++) mass += p[j] >= tau ? p[j] : 0.0;
      if (mass >= top_p + TOP_P_MARGIN || tau == 0.0) break;
      tau = tau > 1e-300 ? tau * TOP_P_FLOOR_STEP : 0.0;
    }
    int64_t len = 0;
    for (int64_t j = 0; j < c; j++) {
      keep[j] = 0;
      if (p[j] > 0.0 && p[j] >= tau) heap[len++] = (int32_t)j;
    }
    for (int64_t i = len / 2 - 1; i >= 0; i--) sift_down(heap, len, i, p, ids);
    double cum = 0.0;
    while (len > 0) {
      const int32_t top = heap[0];
      keep[top] = 1;
      cum += p[top];
      if (cum >= top_p) break;
      heap[0] = heap[--len];
      sift_down(heap, len, 0, p, ids);
    }
    if (len == 0) /* never reached top_p (rounding): every token stays */
      for (int64_t j = 0; j < c; j++) keep[j] = 1;
    for (int64_t j = 0; j < c; j++) keep[j] = keep[j] && p[j] >= floor_p;
  } else {
    for (int64_t j = 0; j < c; j++) keep[j] = p[j] >= floor_p;
  }
  double total = 0.0;
  for (int64_t j = 0; j < c; j++) total += keep[j] ? p[j] : 0.0;
  const double target = u * total;
  double cdf = 0.0;
  for (int64_t j = 0; j < c; j++) {
    cdf += keep[j] ? p[j] : 0.0;
    if (cdf > target) return ids[j];
  }
  return ids[c - 1];
}
