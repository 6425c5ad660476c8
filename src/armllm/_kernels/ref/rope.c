/* ref/rope.c: portable rotary position embedding (neox and gpt-j pairing). */
#include "../armllm_kernels.h"
#include "../family_jobs.h"

/* Pair i of a head: (v[ia], v[ib]) rotated by cos c, sin s. */
static inline void rotate(float *v, int64_t ia, int64_t ib, float c, float s) {
  const float a = v[ia], b = v[ib];
  v[ia] = a * c - b * s;
  v[ib] = b * c + a * s;
}

static void rope_neox_head(float *v, const float *cs, int64_t half) {
  for (int64_t i = 0; i < half; i++) rotate(v, i, i + half, cs[i], cs[half + i]);
}

static void rope_gptj_head(float *v, const float *cs, int64_t half) {
  for (int64_t i = 0; i < half; i++) rotate(v, 2 * i, 2 * i + 1, cs[i], cs[half + i]);
}

ARMLLM_ROPE_KERNEL(armllm_ref_rope, rope_neox_head, rope_gptj_head, 1) /* any row: its own chunk */
