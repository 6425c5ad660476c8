/* avx2/act.c: act(gate) * up on a fused [T, 2*inter] gate/up buffer, SiLU
 * (SwiGLU) and GELU-tanh (GeGLU), 8 lanes at a time with a masked tail. The
 * same operations as ref in the same order (z, exp(-z), 1 + e, g / d, * u; IEEE
 * division), so results are bit-identical. */
#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx2.h"

/* g / (1 + exp(-z)) * u */
static inline __m256 glu8(__m256 g, __m256 z, __m256 u) {
  const __m256 e = armllm_exp_avx2(_mm256_xor_ps(z, _mm256_set1_ps(-0.0f)));
  const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), e);
  return _mm256_mul_ps(_mm256_div_ps(g, d), u);
}

static inline __m256 silu_mul8(__m256 g, __m256 u) { return glu8(g, g, u); }

static inline __m256 gelu_mul8(__m256 g, __m256 u) {
  const __m256 c = _mm256_mul_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(ARMLLM_GELU_CUBIC));
  return glu8(g, _mm256_mul_ps(_mm256_fmadd_ps(c, g, g), _mm256_set1_ps(ARMLLM_GELU_TWO_K)), u);
}

/* A row of act(g) * u with act8, two vectors a step. out may equal g: each block
 * is loaded before it is stored, and out never runs ahead of g. */
#define ACT_ROW(name, act8)                                                                     \
  static inline void name(const float *g, const float *u, float *out, int64_t inter) {          \
    int64_t j = 0;                                                                              \
    for (; j + 16 <= inter; j += 16) {                                                          \
      __m256 a = act8(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j));                          \
      __m256 b = act8(_mm256_loadu_ps(g + j + 8), _mm256_loadu_ps(u + j + 8));                  \
      _mm256_storeu_ps(out + j, a);                                                             \
      _mm256_storeu_ps(out + j + 8, b);                                                         \
    }                                                                                           \
    for (; j + 8 <= inter; j += 8)                                                              \
      _mm256_storeu_ps(out + j, act8(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j)));          \
    if (j < inter) {                                                                            \
      __m256i m = armllm_avx2_tail_mask(inter - j);                                             \
      __m256 r = act8(_mm256_maskload_ps(g + j, m), _mm256_maskload_ps(u + j, m));              \
      _mm256_maskstore_ps(out + j, m, r);                                                       \
    }                                                                                           \
  }

ACT_ROW(silu_mul_row, silu_mul8)
ACT_ROW(gelu_mul_row, gelu_mul8)

static void avx2_silu_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_act_rows(ctx, t0, t1, silu_mul_row);
}

static void avx2_gelu_tanh_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_act_rows(ctx, t0, t1, gelu_mul_row);
}

/* one row is a few microseconds at most: small jobs stay on the caller */
#define ACT_SERIAL_ELEMS 16384

void armllm_avx2_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                          int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_rows_run(pool, t, inter, ACT_SERIAL_ELEMS, avx2_silu_mul_rows, &job);
}

void armllm_avx2_gelu_tanh_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                               int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_rows_run(pool, t, inter, ACT_SERIAL_ELEMS, avx2_gelu_tanh_mul_rows, &job);
}

/* Exact GELU of 8 lanes (family_jobs.h's erfc form). max/min return their
 * second operand for NaN, so a NaN x stays NaN through the clamp. */
static inline __m256 gelu8(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(ARMLLM_GELU_CLAMP),
                                  _mm256_max_ps(_mm256_set1_ps(-ARMLLM_GELU_CLAMP), x));
  const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), xc),
                                 _mm256_set1_ps(ARMLLM_SQRT1_2));
  const __m256 hz = _mm256_mul_ps(z, _mm256_set1_ps(0.5f));
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(hz, _mm256_set1_ps(1.0f)));
  const __m256 u = _mm256_mul_ps(hz, t); /* 1 - t */
  __m256 p = _mm256_set1_ps(ARMLLM_GELU_R9);
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R8));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R7));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R6));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R5));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R4));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R3));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R2));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R1));
  p = _mm256_mul_ps(_mm256_fmadd_ps(p, u, _mm256_set1_ps(ARMLLM_GELU_R0)), u);
  const __m256 erfc = _mm256_mul_ps(t, armllm_exp_avx2(_mm256_fnmadd_ps(z, z, p)));
  const __m256 hx = _mm256_mul_ps(xc, _mm256_set1_ps(0.5f));
  const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
  /* x > 0: x - x/2 erfc(z); else x/2 erfc(z) */
  return _mm256_blendv_ps(_mm256_mul_ps(hx, erfc), _mm256_fnmadd_ps(hx, erfc, x), pos);
}

static void avx2_gelu_span(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) { /* four chains: each is one long dependency */
    const __m256 a = gelu8(_mm256_loadu_ps(x + i)), b = gelu8(_mm256_loadu_ps(x + i + 8));
    const __m256 c = gelu8(_mm256_loadu_ps(x + i + 16)), d = gelu8(_mm256_loadu_ps(x + i + 24));
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + 8, b);
    _mm256_storeu_ps(y + i + 16, c);
    _mm256_storeu_ps(y + i + 24, d);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = armllm_avx2_tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, gelu8(_mm256_maskload_ps(x + i, m)));
  }
}

static void avx2_gelu_chunks(void *ctx, int64_t c0, int64_t c1) {
  armllm_gelu_chunks(ctx, c0, c1, avx2_gelu_span);
}

void armllm_avx2_gelu(armllm_pool *pool, const float *x, float *y, int64_t n) {
  armllm_gelu_run(pool, x, y, n, avx2_gelu_chunks);
}
