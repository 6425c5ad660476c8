/* avx512/act.c: act(gate) * up on a fused [T, 2*inter] gate/up buffer, SiLU
 * (SwiGLU) and GELU-tanh (GeGLU), 16 lanes at a time with a masked tail. The
 * same operations as ref in the same order (z, exp(-z), 1 + e, g / d, * u; IEEE
 * division), so results are bit-identical. */
#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx512.h"

/* g / (1 + exp(-z)) * u */
static inline __m512 glu16(__m512 g, __m512 z, __m512 u) {
  const __m512 e = armllm_exp_avx512(_mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(z), _mm512_set1_epi32((int32_t)0x80000000u))));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
  return _mm512_mul_ps(_mm512_div_ps(g, d), u);
}

static inline __m512 silu_mul16(__m512 g, __m512 u) { return glu16(g, g, u); }

static inline __m512 gelu_mul16(__m512 g, __m512 u) {
  const __m512 c = _mm512_mul_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(ARMLLM_GELU_CUBIC));
  return glu16(g, _mm512_mul_ps(_mm512_fmadd_ps(c, g, g), _mm512_set1_ps(ARMLLM_GELU_TWO_K)), u);
}

/* A row of act(g) * u with act16, two vectors a step. out may equal g: each block
 * is loaded before it is stored, and out never runs ahead of g. */
#define ACT_ROW(name, act16)                                                                    \
  static inline void name(const float *g, const float *u, float *out, int64_t inter) {          \
    int64_t j = 0;                                                                              \
    for (; j + 32 <= inter; j += 32) {                                                          \
      __m512 a = act16(_mm512_loadu_ps(g + j), _mm512_loadu_ps(u + j));                         \
      __m512 b = act16(_mm512_loadu_ps(g + j + 16), _mm512_loadu_ps(u + j + 16));               \
      _mm512_storeu_ps(out + j, a);                                                             \
      _mm512_storeu_ps(out + j + 16, b);                                                        \
    }                                                                                           \
    for (; j + 16 <= inter; j += 16)                                                            \
      _mm512_storeu_ps(out + j, act16(_mm512_loadu_ps(g + j), _mm512_loadu_ps(u + j)));         \
    if (j < inter) {                                                                            \
      const __mmask16 m = armllm_avx512_tail16(inter - j);                                      \
      __m512 r = act16(_mm512_maskz_loadu_ps(m, g + j), _mm512_maskz_loadu_ps(m, u + j));       \
      _mm512_mask_storeu_ps(out + j, m, r);                                                     \
    }                                                                                           \
  }

ACT_ROW(silu_mul_row, silu_mul16)
ACT_ROW(gelu_mul_row, gelu_mul16)

static void avx512_silu_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_act_rows(ctx, t0, t1, silu_mul_row);
}

static void avx512_gelu_tanh_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_act_rows(ctx, t0, t1, gelu_mul_row);
}

/* one row is a few microseconds at most: small jobs stay on the caller */
#define ACT_SERIAL_ELEMS 16384

void armllm_avx512_silu_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                            int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_rows_run(pool, t, inter, ACT_SERIAL_ELEMS, avx512_silu_mul_rows, &job);
}

void armllm_avx512_gelu_tanh_mul(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                                 int64_t inter, float *out, int64_t ldo) {
  armllm_act_job job = {gate_up, ldg, inter, out, ldo};
  armllm_rows_run(pool, t, inter, ACT_SERIAL_ELEMS, avx512_gelu_tanh_mul_rows, &job);
}

/* Exact GELU of 16 lanes (family_jobs.h's erfc form). max/min return their
 * second operand for NaN, so a NaN x stays NaN through the clamp. */
static inline __m512 gelu16(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(ARMLLM_GELU_CLAMP),
                                  _mm512_max_ps(_mm512_set1_ps(-ARMLLM_GELU_CLAMP), x));
  const __m512 z = _mm512_mul_ps(_mm512_abs_ps(xc), _mm512_set1_ps(ARMLLM_SQRT1_2));
  const __m512 hz = _mm512_mul_ps(z, _mm512_set1_ps(0.5f));
  const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(hz, _mm512_set1_ps(1.0f)));
  const __m512 u = _mm512_mul_ps(hz, t); /* 1 - t */
  __m512 p = _mm512_set1_ps(ARMLLM_GELU_R9);
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R8));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R7));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R6));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R5));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R4));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R3));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R2));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R1));
  p = _mm512_mul_ps(_mm512_fmadd_ps(p, u, _mm512_set1_ps(ARMLLM_GELU_R0)), u);
  const __m512 erfc = _mm512_mul_ps(t, armllm_exp_avx512(_mm512_fnmadd_ps(z, z, p)));
  const __m512 hx = _mm512_mul_ps(xc, _mm512_set1_ps(0.5f));
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
  /* x > 0: x - x/2 erfc(z); else x/2 erfc(z) */
  return _mm512_mask_blend_ps(pos, _mm512_mul_ps(hx, erfc), _mm512_fnmadd_ps(hx, erfc, x));
}

static void avx512_gelu_span(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) { /* four chains: each is one long dependency */
    const __m512 a = gelu16(_mm512_loadu_ps(x + i)), b = gelu16(_mm512_loadu_ps(x + i + 16));
    const __m512 c = gelu16(_mm512_loadu_ps(x + i + 32)), d = gelu16(_mm512_loadu_ps(x + i + 48));
    _mm512_storeu_ps(y + i, a);
    _mm512_storeu_ps(y + i + 16, b);
    _mm512_storeu_ps(y + i + 32, c);
    _mm512_storeu_ps(y + i + 48, d);
  }
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, gelu16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = armllm_avx512_tail16(n - i);
    _mm512_mask_storeu_ps(y + i, m, gelu16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

static void avx512_gelu_chunks(void *ctx, int64_t c0, int64_t c1) {
  armllm_gelu_chunks(ctx, c0, c1, avx512_gelu_span);
}

void armllm_avx512_gelu(armllm_pool *pool, const float *x, float *y, int64_t n) {
  armllm_gelu_run(pool, x, y, n, avx512_gelu_chunks);
}
