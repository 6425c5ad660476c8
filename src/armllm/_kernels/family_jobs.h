/* family_jobs.h: the pool-task arguments of the element-wise kernel families
 * (norm, rope, act, embed, activation quantization), the same for every ISA,
 * and the range checks those kernels run before they touch anything. */
#ifndef ARMLLM_FAMILY_JOBS_H
#define ARMLLM_FAMILY_JOBS_H

#include <stdint.h>

typedef struct {
  const float *x;
  int64_t ldx;
  float *residual; /* NULL: no fused residual add */
  int64_t ldr;
  const float *weight;
  int64_t d;
  float eps;
  float *out;
  int64_t ldo;
} armllm_norm_job;

/* quant_act's arguments (armllm_kernels.h), K's padding and groups worked out. */
typedef struct {
  const float *x;
  int64_t k, ldx, kpad, gl, ng; /* gl: group length, ng: groups a row */
  int8_t *xq;
  int64_t ldq;
  float *scale;
  int64_t ldsc;
  int32_t *gsum; /* NULL: no sums */
  int64_t ldgs;
  int32_t *zp; /* NULL: symmetric */
  int64_t ldzp;
} armllm_quant_job;

typedef struct {
  float *x;
  int64_t n_heads, head_dim, ldx;
  const int32_t *positions;
  const float *cos_sin;
  int64_t rot_dim;
  int style;
} armllm_rope_job;

typedef struct {
  const float *gate_up;
  int64_t ldg, inter;
  float *out;
  int64_t ldo;
} armllm_act_job;

typedef struct {
  const int32_t *ids;
  const void *table; /* float or uint16_t (bf16) rows of d */
  int64_t d;
  float *out;
  int64_t ldo;
} armllm_embed_job;

/* The first i with v[i] outside [0, limit), or -1. */
static inline int64_t armllm_first_out_of_range(const int32_t *v, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++)
    if (v[i] < 0 || v[i] >= limit) return i;
  return -1;
}

#endif /* ARMLLM_FAMILY_JOBS_H */
