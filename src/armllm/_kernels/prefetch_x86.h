/* prefetch_x86.h: the software prefetch of the x86 decode kernels' weight
 * streams (gguf_x86.h's and quant_x86.h's kernels). */
#ifndef ARMLLM_PREFETCH_X86_H
#define ARMLLM_PREFETCH_X86_H

#include <immintrin.h>
#include <stdint.h>

#define PREFETCH_LINE 64 /* bytes a prefetch brings in */

/* A packed span of a panel stream (a chunk or a group: its weights, then its
 * scales) is read in n pieces of work (its groups or 32-column chunks), and
 * each piece asks for its share of the span's lines, dist bytes ahead: every
 * line of the stream, the scales' included, in address order, spread evenly
 * over the work. Asking for each piece's own weight bytes only left the
 * scales' lines to demand misses: on Zen 5 the decode kernels streamed at
 * 0.75-0.88 of the read probe that way and 0.90-0.95 spread (AVX-512, one and
 * two threads, gguf Q4_K and Q6_K, w8 and w4); a whole span at its first
 * piece was slower, and any request out of address order far slower (0.4).
 * Piece j asks for its own lines (per or per + 1 of them) and then, where it
 * has only per, for its last one again: every piece issues per + 1
 * prefetches, a loop of constant length (cold as fast as with a trip count
 * that varies; hot, L2-resident Q4_K decode 7% slower than with the weight
 * bytes alone, Q5_K and Q6_K unchanged). */
typedef struct {
  int64_t per, extra; /* the span's lines: per * n + extra (extra < n pieces have per + 1) */
} prefetch_spread;

static inline __attribute__((always_inline)) prefetch_spread prefetch_spread_of(int64_t bytes,
                                                                                int64_t n) {
  const int64_t lines = (bytes + PREFETCH_LINE - 1) / PREFETCH_LINE;
  return (prefetch_spread){lines / n, lines % n};
}

/* Piece j's lines of the span at span, dist bytes ahead. */
static inline __attribute__((always_inline)) void prefetch_piece(prefetch_spread s,
                                                                 const uint8_t *span, int64_t j,
                                                                 int64_t dist) {
  const char *p = (const char *)span + dist +
                  (j * s.per + (j < s.extra ? j : s.extra)) * PREFETCH_LINE;
  for (int64_t l = 0; l < s.per; l++) _mm_prefetch(p + l * PREFETCH_LINE, _MM_HINT_T0);
  _mm_prefetch(p + (s.per - (j >= s.extra)) * PREFETCH_LINE, _MM_HINT_T0);
}

#endif /* ARMLLM_PREFETCH_X86_H */
