/* armllm_kernels.h: the kernel ABI shared by every ISA variant.
 *
 * Every variant (ref, avx2, neon, neon_mmla, sve) implements the functions
 * below with identical signatures and semantics; `armllm_kernels` is the
 * dispatch table that names one implementation per kernel. Tables are filled
 * statically in each variant's table.c; a kernel a variant does not port
 * points at the ref (or a lower Arm level's) function and says so in `impl`.
 *
 * Conventions (all kernels):
 *   - activations are float32; bf16 data is passed as raw uint16_t bits and
 *     widened with bf16_to_f32() (exact) inside the kernel;
 *   - kernels never allocate and never touch Python; scratch, if any, lives
 *     on the stack in small fixed-size tiles;
 *   - `pool` may be NULL: the kernel then runs on the calling thread only;
 *   - results are bit-identical whatever the pool's thread count: work is
 *     partitioned over outputs, never reduced across threads;
 *   - row strides (`ld*`) are in elements, >= the row length.
 */
#ifndef ARMLLM_KERNELS_H
#define ARMLLM_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ bf16 */

static inline float armllm_bf16_to_f32(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even; NaN stays NaN (quiet bit forced). */
static inline uint16_t armllm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---------------------------------------------------------------- kernels
 *
 * GEMM  y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n])       m < M, n < N
 *   W is prepacked once by the same table's *_pack into *_packed_len(N, K)
 *   elements (layout named by *_layout; buffers of equal layout names are
 *   interchangeable between tables). x rows at x + m*ldx, y rows at
 *   y + m*ldy; bias may be NULL; y must not overlap x or W. M, N, K >= 1.
 *   Decode (small M, memory-bound) and prefill (register-tiled) paths are
 *   chosen inside. Accuracy: f32 weights, and bf16 weights widened to f32,
 *   are within 1e-5 * sum_k |x*w| of exact; variants that round activations
 *   to bf16 (BFMMLA/BFDOT, round-to-nearest-even) within 2^-8 * sum_k |x*w|.
 *
 * RMSNorm  r = x (+ residual);  out = r / sqrt(mean(r^2) + eps) * weight
 *   For each of T rows of D elements. With residual != NULL, residual is
 *   updated in place to r (fused residual add). out may equal x (same
 *   pointer and stride); out must not overlap residual.
 *
 * RoPE  rotates n_heads heads of head_dim in each of T rows of x, in place:
 *   head h of row t starts at x + t*ldx + h*head_dim; only its first rot_dim
 *   (even, <= head_dim) elements rotate. cos_sin has max_pos rows of rot_dim
 *   floats: cos[0..rot_dim/2) then sin[0..rot_dim/2), for position p at
 *   cos_sin + p*rot_dim. Pairs (a, b) -> (a*cos - b*sin, b*cos + a*sin):
 *     ARMLLM_ROPE_NEOX: a = v[i], b = v[i + rot_dim/2]
 *     ARMLLM_ROPE_GPTJ: a = v[2i], b = v[2i + 1]
 *   Returns -1, or the first row whose position is outside [0, max_pos)
 *   (then nothing was modified).
 *
 * SiLU*mul  out[t, j] = silu(g) * u, g = gate_up[t*ldg + j],
 *   u = gate_up[t*ldg + inter + j], silu(g) = g / (1 + exp(-g)).
 *   out may equal gate_up (same pointer); otherwise no overlap.
 *
 * Embed  out[t, :] = table[ids[t], :]  (bf16 tables widened to f32).
 *   Returns -1, or the first t whose id is outside [0, vocab) (then nothing
 *   was written).
 *
 * Exp  y[i] = exp(x[i]), vectorized polynomial (the one attention softmax
 *   uses); y may equal x. Relative error <= 4e-7 for normal results;
 *   results below FLT_MIN may flush to 0; +-inf, NaN and overflow behave as
 *   expf.
 */

enum { ARMLLM_ROPE_NEOX = 0, ARMLLM_ROPE_GPTJ = 1 };

typedef size_t (*armllm_packed_len_fn)(int64_t n, int64_t k);
typedef void (*armllm_pack_f32_fn)(const float *w, int64_t n, int64_t k, float *packed);
typedef void (*armllm_pack_bf16_fn)(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed);
typedef void (*armllm_gemm_f32_fn)(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                                   int64_t ldx, const float *packed_w, int64_t n,
                                   const float *bias, float *y, int64_t ldy);
typedef void (*armllm_gemm_bf16_fn)(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                                    int64_t ldx, const uint16_t *packed_w, int64_t n,
                                    const float *bias, float *y, int64_t ldy);
typedef void (*armllm_rmsnorm_fn)(armllm_pool *pool, const float *x, int64_t ldx,
                                  float *residual, int64_t ldr, const float *weight,
                                  int64_t t, int64_t d, float eps, float *out, int64_t ldo);
typedef int64_t (*armllm_rope_fn)(armllm_pool *pool, float *x, int64_t t, int64_t n_heads,
                                  int64_t head_dim, int64_t ldx, const int32_t *positions,
                                  const float *cos_sin, int64_t max_pos, int64_t rot_dim,
                                  int style);
typedef void (*armllm_silu_mul_fn)(armllm_pool *pool, const float *gate_up, int64_t ldg,
                                   int64_t t, int64_t inter, float *out, int64_t ldo);
typedef int64_t (*armllm_embed_f32_fn)(armllm_pool *pool, const int32_t *ids, int64_t t,
                                       const float *table, int64_t vocab, int64_t d,
                                       float *out, int64_t ldo);
typedef int64_t (*armllm_embed_bf16_fn)(armllm_pool *pool, const int32_t *ids, int64_t t,
                                        const uint16_t *table, int64_t vocab, int64_t d,
                                        float *out, int64_t ldo);
typedef void (*armllm_exp_fn)(const float *x, float *y, int64_t n);

/* Kernel slots, in the order `impl` lists them. */
enum {
  ARMLLM_K_GEMM_F32,
  ARMLLM_K_GEMM_BF16,
  ARMLLM_K_RMSNORM,
  ARMLLM_K_ROPE,
  ARMLLM_K_SILU_MUL,
  ARMLLM_K_EMBED,
  ARMLLM_K_EXP,
  ARMLLM_NUM_KERNELS
};

typedef struct armllm_kernels {
  const char *isa;                      /* this table's variant name */
  const char *impl[ARMLLM_NUM_KERNELS]; /* variant whose code runs for each slot */
  const char *gemm_f32_layout;          /* packed layout names, e.g. "nr16k1" */
  const char *gemm_bf16_layout;
  const char *gemm_bf16_compute;        /* "f32": weights widened; "bf16": activations rounded too */
  armllm_packed_len_fn gemm_f32_packed_len;
  armllm_pack_f32_fn gemm_f32_pack;
  armllm_gemm_f32_fn gemm_f32;
  armllm_packed_len_fn gemm_bf16_packed_len;
  armllm_pack_bf16_fn gemm_bf16_pack;
  armllm_gemm_bf16_fn gemm_bf16;
  armllm_rmsnorm_fn rmsnorm;
  armllm_rope_fn rope;
  armllm_silu_mul_fn silu_mul;
  armllm_embed_f32_fn embed_f32;
  armllm_embed_bf16_fn embed_bf16;
  armllm_exp_fn exp;
} armllm_kernels;

/* Declares one variant's kernels: ARMLLM_DECLARE_VARIANT(avx2) declares
 * armllm_avx2_gemm_f32, ... and the table armllm_kernels_avx2. */
#define ARMLLM_DECLARE_VARIANT(v)                                       \
  size_t armllm_##v##_gemm_f32_packed_len(int64_t n, int64_t k);        \
  void armllm_##v##_gemm_f32_pack(const float *w, int64_t n, int64_t k, \
                                  float *packed);                       \
  void armllm_##v##_gemm_f32(armllm_pool *pool, const float *x,         \
                             int64_t m, int64_t k, int64_t ldx,         \
                             const float *packed_w, int64_t n,          \
                             const float *bias, float *y, int64_t ldy); \
  size_t armllm_##v##_gemm_bf16_packed_len(int64_t n, int64_t k);       \
  void armllm_##v##_gemm_bf16_pack(const uint16_t *w, int64_t n,        \
                                   int64_t k, uint16_t *packed);        \
  void armllm_##v##_gemm_bf16(armllm_pool *pool, const float *x,        \
                              int64_t m, int64_t k, int64_t ldx,        \
                              const uint16_t *packed_w, int64_t n,      \
                              const float *bias, float *y, int64_t ldy);\
  void armllm_##v##_rmsnorm(armllm_pool *pool, const float *x,          \
                            int64_t ldx, float *residual, int64_t ldr,  \
                            const float *weight, int64_t t, int64_t d,  \
                            float eps, float *out, int64_t ldo);        \
  int64_t armllm_##v##_rope(armllm_pool *pool, float *x, int64_t t,     \
                            int64_t n_heads, int64_t head_dim,          \
                            int64_t ldx, const int32_t *positions,      \
                            const float *cos_sin, int64_t max_pos,      \
                            int64_t rot_dim, int style);                \
  void armllm_##v##_silu_mul(armllm_pool *pool, const float *gate_up,   \
                             int64_t ldg, int64_t t, int64_t inter,     \
                             float *out, int64_t ldo);                  \
  int64_t armllm_##v##_embed_f32(armllm_pool *pool, const int32_t *ids, \
                                 int64_t t, const float *table,         \
                                 int64_t vocab, int64_t d, float *out,  \
                                 int64_t ldo);                          \
  int64_t armllm_##v##_embed_bf16(armllm_pool *pool,                    \
                                  const int32_t *ids, int64_t t,        \
                                  const uint16_t *table, int64_t vocab, \
                                  int64_t d, float *out, int64_t ldo);  \
  void armllm_##v##_exp(const float *x, float *y, int64_t n);           \
  extern const armllm_kernels armllm_kernels_##v;

/* Every variant declares the full set; a variant's table.c defines only the
 * table, and its kernel files define only the kernels it ports. */
ARMLLM_DECLARE_VARIANT(ref)
ARMLLM_DECLARE_VARIANT(avx2)
ARMLLM_DECLARE_VARIANT(neon)
ARMLLM_DECLARE_VARIANT(neon_mmla)
ARMLLM_DECLARE_VARIANT(sve)

#ifdef __cplusplus
}
#endif
#endif /* ARMLLM_KERNELS_H */
