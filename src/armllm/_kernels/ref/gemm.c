/* ref/gemm.c: portable GEMM, the correctness reference.
 *
 * Packed layout "nk": W[N, K] row-major, unchanged. Each output is one
 * sequential fused multiply-add chain over k, so the result of an element
 * does not depend on M, on the thread count or on its neighbours.
 */
#include <math.h>

#include "../armllm_kernels.h"

size_t armllm_ref_gemm_f32_packed_len(int64_t n, int64_t k) { return (size_t)(n * k); }
size_t armllm_ref_gemm_bf16_packed_len(int64_t n, int64_t k) { return (size_t)(n * k); }

void armllm_ref_gemm_f32_pack(const float *w, int64_t n, int64_t k, float *packed) {
  memcpy(packed, w, (size_t)(n * k) * sizeof *w);
}

void armllm_ref_gemm_bf16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
  memcpy(packed, w, (size_t)(n * k) * sizeof *w);
}

typedef struct {
  const float *x;
  int64_t m, k, ldx;
  const void *w;
  const float *bias;
  float *y;
  int64_t ldy;
} ref_gemm_job;

static void ref_gemm_f32_cols(void *ctx, int64_t n0, int64_t n1) {
  const ref_gemm_job *job = ctx;
  const float *w = job->w;
  for (int64_t i = 0; i < job->m; i++) {
    const float *xr = job->x + i * job->ldx;
    for (int64_t j = n0; j < n1; j++) {
      const float *wr = w + j * job->k;
      float acc = 0.0f;
      for (int64_t p = 0; p < job->k; p++) acc = fmaf(xr[p], wr[p], acc);
      job->y[i * job->ldy + j] = job->bias ? acc + job->bias[j] : acc;
    }
  }
}

static void ref_gemm_bf16_cols(void *ctx, int64_t n0, int64_t n1) {
  const ref_gemm_job *job = ctx;
  const uint16_t *w = job->w;
  for (int64_t i = 0; i < job->m; i++) {
    const float *xr = job->x + i * job->ldx;
    for (int64_t j = n0; j < n1; j++) {
      const uint16_t *wr = w + j * job->k;
      float acc = 0.0f;
      for (int64_t p = 0; p < job->k; p++) acc = fmaf(xr[p], armllm_bf16_to_f32(wr[p]), acc);
      job->y[i * job->ldy + j] = job->bias ? acc + job->bias[j] : acc;
    }
  }
}

void armllm_ref_gemm_f32(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                         const float *packed_w, int64_t n, const float *bias, float *y,
                         int64_t ldy) {
  ref_gemm_job job = {x, m, k, ldx, packed_w, bias, y, ldy};
  armllm_pool_run(pool, n, armllm_pool_grain(pool, n, 4, 16), ref_gemm_f32_cols, &job);
}

void armllm_ref_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          const uint16_t *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  ref_gemm_job job = {x, m, k, ldx, packed_w, bias, y, ldy};
  armllm_pool_run(pool, n, armllm_pool_grain(pool, n, 4, 16), ref_gemm_bf16_cols, &job);
}

void armllm_ref_gemm_f32_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                              const float *packed_w, int64_t n, int64_t n0, int64_t n1,
                              const float *bias, float *y, int64_t ldy) {
  (void)n;
  ref_gemm_job job = {x, m, k, ldx, packed_w + n0 * k, bias, y, ldy};
  ref_gemm_f32_cols(&job, 0, n1 - n0);
}

void armllm_ref_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                               const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                               const float *bias, float *y, int64_t ldy) {
  (void)n;
  ref_gemm_job job = {x, m, k, ldx, packed_w + n0 * k, bias, y, ldy};
  ref_gemm_bf16_cols(&job, 0, n1 - n0);
}
