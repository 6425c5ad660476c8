/* sample_words.h: the steps of armllm_sample_rows that read token sequences
 * (sample.h: 1b bad words, 4b DRY, and step 6's XTC), sample_words.c. The
 * sequence lists are sample.h's.
 *
 * armllm_sample_ban_words: step 1b on x for the history hist[0..hist_len),
 *   whose output starts at prompt_len.
 *
 * armllm_sample_dry: step 4b on x. repeat: armllm_sample_dry_bytes(W) of
 *   scratch; longest: n int32, zero on entry and on return. A token t it
 *   changes whose mark is 0 keeps its value before the change in
 *   raw[touched] and gets mark -(touched + 1), touched counting on (the
 *   penalties' bookkeeping, sample.c); returns the new touched count.
 *
 * armllm_sample_xtc: step 6's removal on e[0..len) (kept: e >= keep_min and
 *   e > 0, of block sum total); returns whether it removed any.
 */
#ifndef ARMLLM_SAMPLE_WORDS_H
#define ARMLLM_SAMPLE_WORDS_H

#include <stdint.h>

typedef struct {
  float multiplier, base;
  int64_t allowed_length, last_n;
  const int32_t *breakers; /* sorted by (head, length); NULL: none */
} armllm_dry_params;

void armllm_sample_ban_words(float *x, const int32_t *words, const int32_t *hist,
                             int64_t hist_len, int64_t prompt_len);

int64_t armllm_sample_dry(float *x, const armllm_dry_params *p, const int32_t *hist,
                          int64_t hist_len, int32_t *repeat, int32_t *longest, int32_t *mark,
                          float *raw, int64_t touched);

int armllm_sample_xtc(float *e, int64_t len, float keep_min, double total, float threshold);

#endif /* ARMLLM_SAMPLE_WORDS_H */
