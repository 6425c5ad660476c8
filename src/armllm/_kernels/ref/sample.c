/* ref/sample.c: the sampler's vectorizable passes (armllm_kernels.h), one
 * element at a time: the definition the vector variants reproduce. */
#include <math.h>

#include "../armllm_kernels.h"
#include "../vexp.h"

int64_t armllm_ref_sample_argmax(const float *x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; i++) /* NaN is skipped; ties keep the first */
    if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
  return best;
}

int64_t armllm_ref_sample_find_above(const float *x, int64_t n, float t) {
  for (int64_t i = 0; i < n; i++)
    if (x[i] > t) return i;
  return n;
}

/* Block b's lanes of v[0..n) (zeros past n) under the floor, summed as the
 * fixed tree. */
static float block_sum(const float *v, int64_t n, int64_t b, float keep_min) {
  float w[ARMLLM_SAMPLE_BLOCK];
  for (int j = 0; j < ARMLLM_SAMPLE_BLOCK; j++) {
    const int64_t i = b * ARMLLM_SAMPLE_BLOCK + j;
    w[j] = i < n && v[i] >= keep_min ? v[i] : 0.0f;
  }
  for (int half = ARMLLM_SAMPLE_BLOCK / 2; half >= 1; half /= 2)
    for (int j = 0; j < half; j++) w[j] = w[j] + w[j + half];
  return w[0];
}

double armllm_ref_sample_block_sums(const float *e, int64_t n, float keep_min, float *sums) {
  double total = 0.0;
  const int64_t blocks = (n + ARMLLM_SAMPLE_BLOCK - 1) / ARMLLM_SAMPLE_BLOCK;
  for (int64_t b = 0; b < blocks; b++) {
    sums[b] = block_sum(e, n, b, keep_min);
    total += sums[b];
  }
  return total;
}

double armllm_ref_sample_exp(const float *x, float *e, int64_t n, float m, float inv_t,
                             float keep_min, float *sums) {
  for (int64_t i = 0; i < n; i++) {
    const float d = (x[i] - m) * inv_t;
    e[i] = d >= ARMLLM_SAMPLE_D_MIN ? armllm_exp_scalar(d) : 0.0f;
  }
  return armllm_ref_sample_block_sums(e, n, keep_min, sums);
}

int64_t armllm_ref_sample_collect(const float *e, const int32_t *ids, int64_t n, float keep_min,
                                  float *out_e, int32_t *out_id) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; i++)
    if (e[i] >= keep_min && e[i] > 0.0f) {
      out_e[count] = e[i];
      out_id[count++] = ids ? ids[i] : (int32_t)i;
    }
  return count;
}
