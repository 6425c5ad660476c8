/* sample_sets.c: a row's candidate sets for armllm_sample_rows
 * (sample_sets.h, sample.h step 6). Built with sample.c, without contraction.
 *
 * Top-k keeps a buffer of the largest values seen, shrunk by quickselect
 * whenever it fills, behind a threshold that a vector search skips most
 * entries under. Top-p looks only at the e above a floor whose mass already
 * passes top_p, and finds its boundary by a radix selection on their bits
 * with exact bounds on the roundings; a heap, which adds in the defining
 * order, takes the cases those bounds cannot decide, and few entries. */
#include "sample_sets.h"

#include <math.h>
#include <string.h>

#define BLOCK ARMLLM_SAMPLE_BLOCK

/* top-p: the floor tau starts at TAU_FIRST, shrinks by TAU_STEP (1e-1: on a flat
 * row, a random prompt's on SmolLM2, 1e-3 steps took 20-45k of 49k tokens to the
 * boundary search, 137 us a row against 72 with 1e-1), and is 0 below
 * TAU_MIN; a floor passes once its mass reaches top_p * total + MARGIN * total
 * (MARGIN: far above the rounding of any order of summing float e in double,
 * and above the float block trees' 4 roundings of 2^-24) */
#define TOP_P_TAU_FIRST 1e-3f
#define TOP_P_TAU_STEP 1e-1f
#define TOP_P_TAU_MIN 1e-30f
#define TOP_P_MARGIN 1e-6
/* top-p: from this many entries on, the radix selection (below it a heap is
 * as quick) */
#define TOP_P_RADIX_MIN 256
/* top-k: the buffer of the largest values seen holds TOP_K_BUFFER_FACTOR * k
 * entries, at least TOP_K_BUFFER_MIN (fewer shrinks), at most n */
#define TOP_K_BUFFER_FACTOR 4
#define TOP_K_BUFFER_MIN 1024

/* ------------------------------------------------------------ top-k */

/* The k-th largest (1 <= k <= len) of v[0..len) (no NaN), by quickselect on
 * a copy. */
static float kth_largest(const float *v, int64_t len, int64_t k, float *copy) {
  memcpy(copy, v, (size_t)len * sizeof *copy);
  int64_t lo = 0, hi = len - 1;
  const int64_t want = k - 1;
  while (lo < hi) {
    const float pivot = copy[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (copy[i] > pivot) i++;
      while (copy[j] < pivot) j--;
      if (i <= j) {
        const float t = copy[i];
        copy[i++] = copy[j];
        copy[j--] = t;
      }
    }
    if (want <= j)
      hi = j;
    else if (want >= i)
      lo = i;
    else
      break;
  }
  return copy[want];
}

/* Shrinks the list (ascending ids) to its k best (larger value, then lower
 * id), keeping the order; returns the k-th value. */
static float keep_best(float *vals, int32_t *ids, int64_t *len, int64_t k, float *copy) {
  const float kth = kth_largest(vals, *len, k, copy);
  int64_t above = 0, out = 0;
  for (int64_t j = 0; j < *len; j++) above += vals[j] > kth;
  int64_t ties = k - above; /* of the k-th value, the lowest ids */
  for (int64_t j = 0; j < *len; j++)
    if (vals[j] > kth || (vals[j] == kth && ties-- > 0)) {
      vals[out] = vals[j];
      ids[out++] = ids[j];
    }
  *len = out;
  return kth;
}

int64_t armllm_sample_top_k(const armllm_kernels *kt, const float *x, int64_t n, int64_t k,
                            float *vals, int32_t *ids, float *copy) {
  int64_t cap = k * TOP_K_BUFFER_FACTOR > TOP_K_BUFFER_MIN ? k * TOP_K_BUFFER_FACTOR
                                                           : TOP_K_BUFFER_MIN;
  cap = cap < n ? cap : n;
  int64_t len = 0, i = 0;
  for (; i < cap; i++) /* the first cap entries fill the buffer */
    if (x[i] > -INFINITY) {
      vals[len] = x[i];
      ids[len++] = (int32_t)i;
    }
  /* entries at the threshold come later than k entries at least as large:
   * only larger ones can be candidates */
  float threshold = -INFINITY;
  if (len == cap) threshold = keep_best(vals, ids, &len, k, copy);
  for (;;) {
    i += kt->sample_find_above(x + i, n - i, threshold);
    if (i >= n) break;
    vals[len] = x[i];
    ids[len] = (int32_t)i++;
    if (++len == cap) threshold = keep_best(vals, ids, &len, k, copy);
  }
  if (len > k) keep_best(vals, ids, &len, k, copy);
  return len;
}

/* ------------------------------------------------------------ top-p */

/* heap order: a first when its e is larger, or equal with a lower position */
static inline int heap_before(const float *e, int32_t a, int32_t b) {
  return e[a] > e[b] || (e[a] == e[b] && a < b);
}

static void sift_down(int32_t *heap, int64_t len, int64_t i, const float *e) {
  for (;;) {
    int64_t best = i;
    const int64_t l = 2 * i + 1, r = l + 1;
    if (l < len && heap_before(e, heap[l], heap[best])) best = l;
    if (r < len && heap_before(e, heap[r], heap[best])) best = r;
    if (best == i) return;
    const int32_t t = heap[i];
    heap[i] = heap[best];
    heap[best] = t;
    i = best;
  }
}

/* The top-p boundary of e[0..cnt) (ascending ids) by the definition: the
 * entries in order (larger e, then lower position) added in double until the
 * sum reaches target; returns the last one's position, or -1 if the sum never
 * does. heap holds cnt entries. */
static int64_t boundary_by_heap(const float *e, int64_t cnt, double target, int32_t *heap) {
  for (int64_t i = 0; i < cnt; i++) heap[i] = (int32_t)i;
  for (int64_t i = cnt / 2 - 1; i >= 0; i--) sift_down(heap, cnt, i, e);
  double sum = 0.0;
  for (int64_t left = cnt; left > 0;) {
    const int32_t top = heap[0];
    sum += e[top];
    if (sum >= target) return top;
    heap[0] = heap[--left];
    sift_down(heap, left, 0, e);
  }
  return -1;
}

/* The radix digits of a positive float's bits, most significant first: e <= 1
 * keeps the first digit below 1024. */
#define RADIX_DIGITS 3
#define RADIX_SIZE 1024
#define RADIX_COPIES 4 /* histograms, interleaved: entries of one bucket in a row
                          do not wait on each other's additions */
static const int RADIX_SHIFT[RADIX_DIGITS] = {20, 10, 0};

static inline uint32_t float_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

/* The top-p boundary as boundary_by_heap defines it, without ordering the
 * entries: for each digit in turn, the masses of the candidates' buckets (in
 * double) are walked from the largest e down to the bucket where the running
 * sum reaches target; its entries are the next digit's candidates. After the
 * last digit they hold equal e, walked in position order. Returns -1 unless
 * the running sums before and at the boundary lie further from target than
 * `margin`, a bound on the difference between any two ways of summing these
 * entries in double: then the defining sum crosses target at the same entry.
 * pos holds cnt entries. */
static int64_t boundary_by_radix(const float *e, int64_t cnt, double target, double margin,
                                 int32_t *pos) {
  double mass[RADIX_COPIES][RADIX_SIZE];
  double above = 0.0;
  int64_t len = cnt;
  for (int level = 0; level < RADIX_DIGITS; level++) {
    const int shift = RADIX_SHIFT[level];
    memset(mass, 0, sizeof mass);
    for (int64_t j = 0; j < len; j++) {
      const int64_t p = level ? pos[j] : j;
      mass[j % RADIX_COPIES][float_bits(e[p]) >> shift & (RADIX_SIZE - 1)] += e[p];
    }
    int64_t digit = RADIX_SIZE - 1;
    for (; digit >= 0; digit--) {
      double bucket = 0.0;
      for (int c = 0; c < RADIX_COPIES; c++) bucket += mass[c][digit];
      if (above + bucket >= target) break;
      above += bucket;
    }
    if (digit < 0) return -1;
    int64_t kept = 0; /* the bucket's entries, in position order (no branch) */
    for (int64_t j = 0; j < len; j++) {
      const int64_t p = level ? pos[j] : j;
      pos[kept] = (int32_t)p;
      kept += (int64_t)(float_bits(e[p]) >> shift & (RADIX_SIZE - 1)) == digit;
    }
    len = kept;
  }
  double run = above;
  for (int64_t j = 0; j < len; j++) {
    const double before = run;
    run += e[pos[j]];
    if (run >= target)
      return target - before > margin && run - target > margin ? pos[j] : -1;
  }
  return -1;
}

/* The kept e >= floor_e (and > 0) in order, into out_e / out_id, from the
 * blocks whose sum (floor keep_min <= floor_e) reaches floor_e: a sum of
 * non-negative floats is at least each of its terms, so the other blocks hold
 * none. Runs of such blocks go to sample_collect as one. */
static int64_t collect_from_blocks(const armllm_kernels *kt, const float *e,
                                   const int32_t *e_ids, int64_t len, const float *sums,
                                   float floor_e, float *out_e, int32_t *out_id) {
  const int64_t blocks = (len + BLOCK - 1) / BLOCK;
  int64_t cnt = 0;
  for (int64_t b = 0; b < blocks;) {
    if (!(sums[b] >= floor_e)) {
      b++;
      continue;
    }
    const int64_t first = b;
    while (b < blocks && sums[b] >= floor_e) b++;
    const int64_t lo = first * BLOCK, hi = b * BLOCK < len ? b * BLOCK : len;
    const int64_t got = kt->sample_collect(e + lo, e_ids ? e_ids + lo : NULL, hi - lo, floor_e,
                                           out_e + cnt, out_id + cnt);
    if (!e_ids) /* positions are the ids: the collect counted them from lo */
      for (int64_t j = cnt; j < cnt + got; j++) out_id[j] += (int32_t)lo;
    cnt += got;
  }
  return cnt;
}

int64_t armllm_sample_top_p(const armllm_kernels *kt, const float *e, const int32_t *e_ids,
                            int64_t len, float keep_min, double total, float top_p,
                            const float *sums, int32_t *work, float *out_e, int32_t *out_id) {
  const double target = (double)top_p * total;
  const double enough = target + TOP_P_MARGIN * total;
  float *mass_sums = (float *)work; /* the block sums of a mass check */
  /* the kept e >= tau (> 0: a zero adds nothing), for the first tau whose
   * mass is enough: summed over the collected list (any order of summation
   * would do), or, collecting in place, over e before a collection */
  float tau = TOP_P_TAU_FIRST;
  int64_t cnt = 0;
  for (;; tau = tau * TOP_P_TAU_STEP < TOP_P_TAU_MIN ? 0.0f : tau * TOP_P_TAU_STEP) {
    const float floor_e = tau > keep_min ? tau : keep_min;
    if (out_e == e && tau > 0.0f &&
        kt->sample_block_sums(e, len, floor_e, mass_sums) < enough)
      continue;
    cnt = collect_from_blocks(kt, e, e_ids, len, sums, floor_e, out_e, out_id);
    if (out_e == e || tau == 0.0f ||
        kt->sample_block_sums(out_e, cnt, 0.0f, mass_sums) >= enough)
      break;
  }
  /* two sums of cnt entries in double differ by at most about 2 cnt roundings
   * of total (2^-53 each); the radix walk adds RADIX_DIGITS * RADIX_SIZE *
   * RADIX_COPIES bucket sums; the margin doubles the count */
  const double margin = (double)(4 * cnt + 2 * RADIX_DIGITS * RADIX_SIZE * RADIX_COPIES) *
                        0x1p-53 * total;
  int64_t last = cnt >= TOP_P_RADIX_MIN ? boundary_by_radix(out_e, cnt, target, margin, work)
                                        : -1;
  if (last < 0) last = boundary_by_heap(out_e, cnt, target, work);
  if (last < 0) return cnt; /* never reached (rounding): every kept token stays */
  const float e_last = out_e[last];
  int64_t kept = 0; /* before the boundary in the order: larger e, or equal and not after it */
  for (int64_t p = 0; p < cnt; p++) { /* no branch: the test is a coin toss */
    const float v = out_e[p];
    out_e[kept] = v;
    out_id[kept] = out_id[p];
    kept += (v > e_last) | ((v == e_last) & (p <= last));
  }
  return kept;
}
