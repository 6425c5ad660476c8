/* sample_words.c: bad words, DRY and XTC for armllm_sample_rows (sample.h
 * defines them; sample_words.h). Portable C, built with -ffp-contract=off as
 * sample.c is: every ISA variant runs this same code. */
#include "sample_words.h"

#include <math.h>

#include "sample.h"

/* sequence j of a list (sample.h): [len, ids...] */
static inline const int32_t *sequence(const int32_t *list, int64_t j) {
  return list + list[1 + j];
}

/* ------------------------------------------------------------ bad words */

void armllm_sample_ban_words(float *x, const int32_t *words, const int32_t *hist,
                             int64_t hist_len, int64_t prompt_len) {
  const int64_t output_len = hist_len - prompt_len;
  for (int64_t j = 0; j < words[0]; j++) {
    const int32_t *s = sequence(words, j);
    const int64_t prefix = s[0] - 1; /* the ids before the banned one */
    if (prefix > output_len) continue;
    int64_t i = 0;
    while (i < prefix && hist[hist_len - prefix + i] == s[1 + i]) i++;
    if (i == prefix) x[s[1 + prefix]] = -INFINITY;
  }
}

/* ------------------------------------------------------------ DRY */

/* The first sequence of a sorted list whose head is >= t (S if none). */
static int64_t first_with_head(const int32_t *list, int32_t t) {
  int64_t lo = 0, hi = list[0];
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sequence(list, mid)[1] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Whether t is a breaker of one token (the list sorts a head's shortest first). */
static int one_token_breaker(const int32_t *list, int32_t t) {
  const int64_t j = first_with_head(list, t);
  return j < list[0] && sequence(list, j)[1] == t && sequence(list, j)[0] == 1;
}

/* L of sample.h step 4b: the window's ids after its last complete breaker. */
static int64_t after_last_breaker(const int32_t *w, int64_t W, const int32_t *breakers) {
  if (!breakers) return W;
  for (int64_t i = 0; i < W; i++) {
    const int32_t head = w[W - 1 - i];
    int64_t longest = -1; /* the longest matching tail */
    for (int64_t j = first_with_head(breakers, head); j < breakers[0]; j++) {
      const int32_t *s = sequence(breakers, j);
      if (s[1] != head) break;
      const int64_t tail = s[0] - 1;
      if (tail <= longest || tail > i) continue;
      int64_t o = 0;
      while (o < tail && s[2 + o] == w[W - i + o]) o++;
      if (o == tail) longest = tail;
    }
    if (longest >= 0) return i - longest;
  }
  return W;
}

/* the window read from its end: the k-th id back */
#define BACK(k) w[W - 1 - (k)]

/* z[k] (1 <= k < W): the longest common prefix of the reversed window and
 * its k-th suffix, the Z-algorithm's: so the window's suffix that also ends
 * at position W - 1 - k. z[0] is not set. */
static void reversed_z(const int32_t *w, int64_t W, int32_t *z) {
  int64_t box_lo = 0, box_hi = 0; /* BACK[box_lo..box_hi) = BACK[0..box_hi - box_lo) */
  for (int64_t k = 1; k < W; k++) {
    int64_t len = 0;
    if (k < box_hi) {
      len = z[k - box_lo];
      if (len > box_hi - k) len = box_hi - k;
    }
    while (k + len < W && BACK(len) == BACK(k + len)) len++;
    if (k + len > box_hi) {
      box_lo = k;
      box_hi = k + len;
    }
    z[k] = (int32_t)len;
  }
}

/* the largest integer E with dry_base^E below float overflow, by llama.cpp's
 * bound: ln(FLT_MAX) / ln(base); 0 (no bound) for a base this close to 1 */
#define LOG_FLT_MAX 88.7228391
#define UNBOUNDED_BASE 1.000001f

int64_t armllm_sample_dry(float *x, const armllm_dry_params *p, const int32_t *hist,
                          int64_t hist_len, int32_t *repeat, int32_t *longest, int32_t *mark,
                          float *raw, int64_t touched) {
  const int64_t W = p->last_n < 0 || p->last_n > hist_len ? hist_len : p->last_n;
  const int64_t A = p->allowed_length;
  if (W <= A) return touched;
  const int32_t *w = hist + hist_len - W;
  const int64_t L = after_last_breaker(w, W, p->breakers);
  if (L < A) return touched;
  reversed_z(w, W, repeat);
  for (int64_t k = 1; k < W; k++) { /* position W - 1 - k proposes the id after it */
    const int64_t len = repeat[k] < L ? repeat[k] : L;
    const int32_t t = w[W - k];
    if (len >= A && longest[t] < len + 1) longest[t] = (int32_t)(len + 1);
  }
  const int64_t bound = p->base > UNBOUNDED_BASE
                            ? (int64_t)(LOG_FLT_MAX / log((double)p->base)) : 0;
  for (int64_t k = 1; k < W; k++) {
    const int32_t t = w[W - k];
    if (longest[t] == 0) continue; /* not proposed, or done */
    int64_t e = longest[t] - 1 - A;
    longest[t] = 0;
    if (p->breakers && one_token_breaker(p->breakers, t)) continue;
    if (bound > 0 && e > bound) e = bound;
    const float penalty = (float)((double)p->multiplier * pow((double)p->base, (double)e));
    if (mark[t] == 0) {
      raw[touched] = x[t];
      mark[t] = (int32_t)-(++touched);
    }
    x[t] = x[t] - penalty;
  }
  return touched;
}

/* ------------------------------------------------------------ XTC */

int armllm_sample_xtc(float *e, int64_t len, float keep_min, double total, float threshold) {
  const double bar = (double)threshold * total;
  int64_t above = 0, least = -1;
  for (int64_t i = 0; i < len; i++) {
    if (!(e[i] >= keep_min && e[i] > 0.0f && (double)e[i] >= bar)) continue;
    above++;
    if (least < 0 || e[i] <= e[least]) least = i; /* equal e: the highest id stays */
  }
  if (above < 2) return 0;
  for (int64_t i = 0; i < len; i++)
    if (i != least && e[i] >= keep_min && e[i] > 0.0f && (double)e[i] >= bar) e[i] = 0.0f;
  return 1;
}
