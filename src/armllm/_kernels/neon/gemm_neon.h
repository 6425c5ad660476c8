/* neon/gemm_neon.h: what the NEON GEMM micro-kernels (neon/gemm.c,
 * neon_mmla/gemm.c) share: the store of a decode tile's output row. */
#ifndef ARMLLM_GEMM_NEON_H
#define ARMLLM_GEMM_NEON_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

/* Defines name(y, c0, c1, c2, bias, nv): stores one output row of NV (2 or
 * 3) vectors c0, c1, c2 (4 columns each; c2 unused for 2) at y, + bias,
 * its first nv columns only (nv < 4*NV goes through a stack row). A macro
 * so that the stack rows are NV vectors long; the vectors come by value:
 * through a pointer GCC allocates the callers' accumulators differently. */
#define ARMLLM_NEON_STORE_ROW(name, NV)                                                        \
  static inline __attribute__((always_inline)) void name(float *y, float32x4_t c0,             \
                                                         float32x4_t c1, float32x4_t c2,       \
                                                         const float *bias, int64_t nv) {      \
    if (nv == 4 * (NV)) {                                                                      \
      if (bias) {                                                                              \
        c0 = vaddq_f32(c0, vld1q_f32(bias));                                                   \
        c1 = vaddq_f32(c1, vld1q_f32(bias + 4));                                               \
        if ((NV) > 2) c2 = vaddq_f32(c2, vld1q_f32(bias + 8));                                 \
      }                                                                                        \
      vst1q_f32(y, c0);                                                                        \
      vst1q_f32(y + 4, c1);                                                                    \
      if ((NV) > 2) vst1q_f32(y + 8, c2);                                                      \
      return;                                                                                  \
    }                                                                                          \
    float t[4 * (NV)];                                                                         \
    if (bias) {                                                                                \
      float tb[4 * (NV)] = {0};                                                                \
      memcpy(tb, bias, (size_t)nv * sizeof *tb);                                               \
      c0 = vaddq_f32(c0, vld1q_f32(tb));                                                       \
      c1 = vaddq_f32(c1, vld1q_f32(tb + 4));                                                   \
      if ((NV) > 2) c2 = vaddq_f32(c2, vld1q_f32(tb + 8));                                     \
    }                                                                                          \
    vst1q_f32(t, c0);                                                                          \
    vst1q_f32(t + 4, c1);                                                                      \
    if ((NV) > 2) vst1q_f32(t + 8, c2);                                                        \
    memcpy(y, t, (size_t)nv * sizeof *t);                                                      \
  }

#endif /* ARMLLM_GEMM_NEON_H */
