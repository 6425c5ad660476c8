/* sample.h: turning logits rows into tokens, every row of an engine step in
 * one call on the pool (sample.c), and the structured-output mask.
 *
 * armllm_sample_rows(kt, pool, b) samples rows 0..b->rows-1. Row r's n
 * logits x = b->row[r] are the row's own: the call uses the row as scratch
 * and leaves it unspecified, unless keep_row[r] is nonzero: then only steps
 * 1, 1b, 2, 4 and 4b write it (the draw works in the worker's scratch), so a
 * row without a mask, bad words, bias, penalties and DRY is left as it was. Every ISA variant
 * gives ref's bits (tokens, logprobs and the slots' e and block sums),
 * whatever the thread count and the order threads claim rows in. Per row r, with its column entries:
 *
 *  1. mask (mask_row[r] >= 0): x[i] = -inf where bit i % 32 of
 *     masks[mask_row[r] * mask_ld + i / 32] is 0 (llguidance's bitmask;
 *     armllm_mask_logits).
 *  1b. bad words (bad_words[r] a sequence list, below; vLLM's): for each of
 *     its sequences s of len tokens, x[s[len - 1]] = -inf when len is 1 or
 *     the output (history[r][prompt_len[r]..history_len[r])) ends with
 *     s[0..len - 1).
 *  2. logit bias: x[bias_ids[r][j]] += bias_values[r][j] for j < bias_len[r],
 *     in list order (float adds; an id may repeat).
 *  3. raw log-probabilities (num_logprobs[r] >= 0), of x now: M = the
 *     largest non-NaN x (-inf if none); T = the block sum (below) with floor
 *     0 of e_i = (x_i - M) >= -80 ? exp(x_i - M) : 0 (the shared exp, vexp.h;
 *     NaN x gives 0); lse = (double)M + log(T) (double); logprob(i) =
 *     (float)((double)x_i - lse). A row without a finite maximum (all -inf
 *     or NaN, or a +inf) gets NaN log-probabilities, as IEEE arithmetic
 *     gives. top_ids/top_logprobs[r][0..k), k = num_logprobs[r] <= 20: the k
 *     largest x in descending order, ties to the lower id, NaN ranked below
 *     -inf; entries [k, 20) are -1 and NaN. logprob[r] is the sampled
 *     token's, of its x at this step (before the penalties); NaN when
 *     num_logprobs[r] < 0.
 *  4. penalties (HF / OpenAI, in this order per id): for each distinct id of
 *     history[r][0..history_len[r]), when repetition_penalty != 1:
 *     x = x > 0 ? x / rp : x * rp (float); then for each distinct id of
 *     history[r][prompt_len[r]..history_len[r]) occurring c times there,
 *     when presence or frequency != 0: x -= presence + frequency * (float)c
 *     (float, unfused).
 *  4b. DRY (llama.cpp's "don't repeat yourself"; on when dry_multiplier[r]
 *     > 0 and dry_last_n[r] != 0): the window w[0..W) is the last W ids of
 *     history[r][0..history_len[r]), prompt and output, W = history_len[r]
 *     when dry_last_n[r] is -1, else min(history_len[r], dry_last_n[r]);
 *     A = dry_allowed_length[r]; nothing happens when W <= A.
 *     - breakers (dry_breakers[r], a sequence list sorted by (head, length),
 *       or NULL: none): for i = 0, 1, ..., W - 1 (w[W-1-i], i tokens from the
 *       end) the first i where some breaker s (len <= i + 1 tokens) has
 *       s[0] = w[W-1-i] and s[1..len) = w[W-i..W-i+len-1) gives
 *       L = i - (the longest such len - 1); L = W if there is none. Nothing
 *       happens when L < A.
 *     - for each position j < W - 1, its repeat r_j = min(L, the largest l <=
 *       j + 1 with w[j-l+1..j] = w[W-l..W-1]) (a suffix of the window that
 *       ends at j too; found with the Z-algorithm, O(W)); every j with r_j >=
 *       A proposes token w[j + 1] with length r_j, and each proposed token t
 *       takes its largest length R_t.
 *     - each proposed t that is not a one-token breaker (a breaker of len 1
 *       with s[0] = t) gets x[t] = x[t] - (float)((double)dry_multiplier *
 *       pow((double)dry_base, (double)E)) (float subtraction; the C library's
 *       pow), E = R_t - A, at most X when X > 0: X = (int)(88.7228391 /
 *       log((double)dry_base)) (the C library's log, as llama.cpp bounds it
 *       below float overflow) for dry_base > 1.000001f, else 0 (no bound).
 *  5. greedy (temperature 0): the lowest id of the largest non-NaN x; 0
 *     when every x is NaN.
 *  6. random (temperature > 0): u = armllm_sample_uniform(seed[r],
 *     stream[r], counter[r]).
 *     - candidates C: with 0 < top_k < n the top_k largest x (ties at the
 *       k-th value to the lower ids), else every token. Only the members of C
 *       whose e (below) is > 0 can be drawn, so which -inf or NaN tokens C
 *       holds never matters.
 *     - m = the largest non-NaN x (C holds it). If m is not finite (all
 *       -inf or NaN, or a +inf), the token is step 5's.
 *     - inv_t = (float)(1.0 / temperature), at most FLT_MAX; d_i = (x_i - m)
 *       * inv_t (two float operations, unfused); e_i = d_i >= -80 ?
 *       exp(d_i) : 0 (the shared exp; e of the maximum is exactly 1; NaN and
 *       -inf x give 0).
 *     - kept: e_i >= min_p (every token when min_p is 0; e_max = 1 is kept,
 *       so this is p_i >= min_p * p_max).
 *     - total: the block sum (below) with floor min_p of the candidates' e:
 *       over the vocabulary when every token is a candidate; else over the
 *       list C, its entries in ascending id standing at places 0, 1, ...
 *     - top_p < 1: the kept set becomes the smallest set of the highest kept
 *       e (ties to the lower id) whose sum, added in that order in double,
 *       reaches (>=) (double)top_p * total; every kept token if none does
 *       (rounding). It is a list like C (ascending id), and total becomes
 *       its block sum. (Found without sorting the vocabulary: for tau = 1e-3,
 *       1e-4, ... (float, x 1e-1 a step) the mass of the kept e >= tau (their
 *       block sum as a list) is compared with top_p * total + 1e-6 * total, a
 *       margin above the rounding of any order of summation, until it passes
 *       or tau < 1e-30, then tau = 0; only the e >= tau are looked at, by a
 *       radix selection on their bits that knows the bound of the roundings
 *       of its own sums and leaves a case too close to call to a heap, which
 *       adds in the defining order. The result does not depend on tau, on
 *       how the masses are summed, or on the method.)
 *     - XTC (llama.cpp's "exclude top choices"; on when xtc_probability[r] >
 *       0 and xtc_threshold[r] <= 0.5): with its own draw u_x =
 *       armllm_sample_uniform(seed[r], stream[r] + ARMLLM_SAMPLE_XTC_STREAM,
 *       counter[r]), when u_x < (double)xtc_probability[r]: the kept tokens
 *       (of the vocabulary or the list, e > 0) whose probability e / total
 *       reaches the threshold, (double)e >= (double)xtc_threshold[r] * total,
 *       are removed (their e set to 0) but the least probable of them (the
 *       highest id among equal e), when there are at least two; then total
 *       is the block sum again. The probabilities are those the draw uses
 *       (after temperature, top-k, min-p and top-p), as llama.cpp's default
 *       chain compares the probabilities its top-k/top-p/min-p used. Greedy
 *       rows and step 6's greedy fall-back have no XTC.
 *     - draw: target = u * total (double). The block sums (of the vocabulary
 *       or of the list) are added in double in block order up to the first
 *       block where the running sum exceeds target; inside that block the
 *       running sum continues over its kept e in order to the first > target,
 *       else the block's last kept entry with e > 0; no block exceeds target
 *       (rounding): the last kept entry with e > 0.
 *  7. token[r] = the token.
 *
 * Block sum of values v[0..n) with floor f: blocks of ARMLLM_SAMPLE_BLOCK
 * (16) consecutive entries, the last padded with zeros; block b's lanes are
 * w_j = v[16b + j] >= f ? v[16b + j] : 0 and its sum is the fixed float tree
 * s8_j = w_j + w_{j+8} (j < 8), s4_j = s8_j + s8_{j+4} (j < 4),
 * s2_j = s4_j + s4_{j+2} (j < 2), s = s2_0 + s2_1; the block sums are added
 * in double in block order, from 0. (The sample_exp and sample_block_sums
 * slots, armllm_kernels.h.)
 *
 * Uniform draw: armllm_sample_uniform(seed, stream, counter) in [0, 1):
 * mix(z) = splitmix64's finalizer (z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
 * z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31), key = mix(seed ^
 * mix(stream + 0x9e3779b97f4a7c15)), x = mix(key + (counter + 1) *
 * 0x9e3779b97f4a7c15) (uint64, wrapping), u = (x >> 11) * 2^-53. (The
 * engine: seed = the request's or a random one, stream = the completion's
 * index, counter = the output position the row produces: a seed's tokens do
 * not depend on batching, speculation or preemption.)
 *
 * Sequence list (bad words, DRY breakers): int32 [S, o_0, ..., o_{S-1}, ...]:
 * S sequences, sequence j at offset o_j as [len (>= 1), its len ids].
 *
 * The caller checks the columns (temperature in [0, 100], top_p in (0, 1],
 * min_p in [0, 1], top_k >= -1, num_logprobs in [-1, 20], repetition_penalty
 * > 0, every id in [0, n), 0 <= prompt_len <= history_len, mask_row a row of
 * masks or -1, dry_multiplier finite >= 0, dry_base finite >= 1,
 * dry_allowed_length >= 0, dry_last_n >= -1, xtc_probability and
 * xtc_threshold in [0, 1], well-formed sequence lists, every DRY window W <=
 * dry_window) and gives scratch of `slots` * armllm_sample_rows_slot_bytes(n)
 * bytes, 64-byte aligned and zeroed before its first use (the call leaves it
 * as it needs it), and dry_scratch of `slots` * armllm_sample_dry_bytes(
 * dry_window) bytes (4-byte aligned; any contents). A NULL column of the
 * bad words, DRY or XTC means the step is off for every row. Rows are shared
 * out dynamically: min(slots, pool threads, rows) workers, each with its own
 * slot, claim rows with a fetch-add.
 */
#ifndef ARMLLM_SAMPLE_H
#define ARMLLM_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "armllm_kernels.h"

#define ARMLLM_SAMPLE_MAX_LOGPROBS 20
/* added to a row's stream for its XTC draw: apart from the engine's streams
 * (a completion's index, below 2^32, plus 0 to 3 << 32: engine/sampler.py,
 * engine/spec/verify.py) */
#define ARMLLM_SAMPLE_XTC_STREAM (UINT64_C(4) << 32)

typedef struct {
  int64_t rows, n;  /* rows to sample, logits per row (the vocabulary) */
  float *const *row; /* [rows] each row's n logits: read, then used as scratch */
  /* sampling parameters, one entry a row */
  const float *temperature, *top_p, *min_p;
  const float *repetition_penalty, *presence_penalty, *frequency_penalty;
  const int32_t *top_k, *num_logprobs;
  const uint64_t *seed, *stream, *counter;
  /* the ids the penalties look at: prompt then output; NULL rows have length 0 */
  const int32_t *const *history;
  const int64_t *history_len, *prompt_len;
  const int32_t *const *bias_ids; /* [rows] bias_len[r] ids and values each */
  const float *const *bias_values;
  const int64_t *bias_len;
  const uint32_t *masks; /* mask rows of mask_ld words; mask_row[r] -1: none */
  int64_t mask_ld;
  const int32_t *mask_row;
  const int8_t *keep_row; /* nonzero: the draw leaves the row as it is (NULL: none) */
  const int32_t *const *bad_words; /* [rows] a sequence list or NULL (step 1b) */
  /* DRY (step 4b): dry_last_n -1 is the whole history, 0 off */
  const float *dry_multiplier, *dry_base;
  const int32_t *dry_allowed_length;
  const int64_t *dry_last_n;
  const int32_t *const *dry_breakers; /* [rows] a sorted sequence list or NULL */
  const float *xtc_probability, *xtc_threshold; /* XTC (step 6) */
  void *dry_scratch;  /* slots * armllm_sample_dry_bytes(dry_window) bytes */
  int64_t dry_window; /* the largest DRY window W a row may have */
  /* outputs */
  int32_t *token;
  float *logprob;
  int32_t *top_ids;     /* [rows, ARMLLM_SAMPLE_MAX_LOGPROBS] */
  float *top_logprobs;  /* [rows, ARMLLM_SAMPLE_MAX_LOGPROBS] */
  void *scratch;        /* slots * armllm_sample_rows_slot_bytes(n) bytes */
  int64_t slots;
} armllm_sample_batch;

/* Bytes of one worker's scratch for rows of n logits. */
size_t armllm_sample_rows_slot_bytes(int64_t n);

/* Bytes of one worker's DRY scratch for windows of up to `window` ids. */
size_t armllm_sample_dry_bytes(int64_t window);

void armllm_sample_rows(const armllm_kernels *kt, armllm_pool *pool,
                        const armllm_sample_batch *b);

double armllm_sample_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

/* armllm_mask_logits: a structured output's token mask applied to one logits
 *   row: row[i] = -inf where bit i % 32 of words[i / 32] is 0 (llguidance's
 *   bitmask layout: bit j of word w is token 32 w + j); the other entries are
 *   untouched. words holds ceil(n / 32) entries. */
void armllm_mask_logits(float *row, int64_t n, const uint32_t *words);

#endif /* ARMLLM_SAMPLE_H */
