/* avx2/quant.c: int8 activation quantization (per token and group) and the
 * quantized GEMM (int8 or int4 weights, int8 activations), AVX2.
 *
 * Packed layout "nr8k4g": a 64-byte header (its first uint32: 1 when the
 * scales are stored as f16), then N cut into panels of 8 output rows (the
 * last one padded with q = 0, d = 0, o = 0); panel p is one contiguous block
 * of panel_bytes, group after group (group g covers k in [g*gl,
 * min((g+1)*gl, kpad)), gl = armllm_q_group_len(group): channelwise weights
 * are groups of ARMLLM_Q_CHANNEL_GROUP with the row's scale repeated), each
 * group its weights then its scales:
 *   bits 8: for each 4-k step of the group, 32 bytes: rows r = 0..7, each
 *           the 4 bytes q[8p + r, k .. k+4) + 128 (unsigned);  then
 *           d[8p .. 8p+8) as 8 f32.
 *   bits 4: for each 8-k step of the group, 32 bytes: byte 4r + j holds
 *           q[8p + r, k + j] in its low nibble and q[8p + r, k + 4 + j] in
 *           its high nibble (j < 4);  then d[8], then o[8]: f16 when every d
 *           and o of the matrix is exact in f16 (GGUF's, armllm's RTN ones;
 *           F16C widens them to the same floats), else f32.
 * panel_bytes = 8*kpad + 32*ng (bits 8), 4*kpad + 32*ng or 64*ng (bits 4,
 * f16 or f32 scales: f16 reads 1/6 fewer bytes at group 32); every vector
 * is 32-byte aligned when the buffer is.
 *
 * Inner products: one activation word x[k..k+4) broadcast to the 8 rows of
 * a panel meets 4 k of each row in one maddubs (unsigned weight x signed
 * activation, byte pairs summed in int16 lanes).
 *   bits 4: the nibbles are the unsigned operand as they are; products of a
 *           32-k chunk add up in int16 (<= 8 * 2*15*128 = 30720), then one
 *           madd with ones widens them to int32.
 *   bits 8: q + 128 = lo + 16 hi splits into two nibbles, each multiplied
 *           like bits 4 (two int16 sums per chunk, madd by 1 and by 16), and
 *           x.q = x.(q + 128) - 128 sum(x). This costs 4 vector ops per 32
 *           MACs, like the sign trick (sign, maddubs, madd, add) but with 2
 *           instead of 3 on the two multiply pipes; without VNNI nothing
 *           does better, so W8A8 is ~1.3x, W4A8 ~2x the MACs/cycle of f32 FMA.
 * Each group's dot product is exact in int32 (groups are at most 128 k), so
 * the float epilogue (the header's order: per group a = acc * sx,
 * t = fma(d, a, t) [, b = gsum * sx, t = fma(o, b, t)], then y = t
 * (+ bias)) runs lane-wise with the very operations of ref: every result is
 * bit-identical to ref, whatever the tile, the path or the thread count.
 * Bits 8 need each row's sum of x per group: quant_act's gsum when the
 * caller passes it, else computed here.
 *
 * Tiles are mr rows x 1 panel, the whole of K. Decode (M <= DECODE_MAX_M):
 * all rows, in passes of up to DECODE_PASS_ROWS, panel after panel, each
 * thread one contiguous run of panels (one stream, prefetched ahead in
 * software). Prefill: MR rows (4 for bits 8, 6 for bits
 * 4); items are (row block, panel chunk) pairs sized so that a row block's
 * activations and a chunk's panels stay in L2, panel-major inside.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PANEL 8         /* output rows per panel: one int32 / f32 lane each */
#define DECODE_MAX_M 8  /* rows up to this take the streaming (decode) path: a verify step's k + 1 */
#define DECODE_PASS_ROWS 4 /* rows of one decode pass over a panel */
#ifndef WQ_MR8
#define WQ_MR8 4 /* prefill tile rows, bits 8: 2 int16 accumulators a row */
#define WQ_MR4 6 /* bits 4: 1 int16 accumulator a row */
#endif
#define MAX_MR 6 /* the largest tile height, decode or prefill */
#ifndef WQ_PF_BYTES
#define WQ_PF_BYTES 4096 /* decode: software prefetch distance in the panel stream */
#endif
#define WQ_L2_BYTES (192 * 1024) /* budget for a row block's x, and a chunk's panels */
#define WQ_XSUM_CAP 4096 /* a row block's per-group sums of x (bits 8) or gsum * sx (bits 4) */
#define HEADER_BYTES 64  /* the layout's header: keeps the panels 64-byte aligned */

#include "../quant_x86.h"

/* Keeps the compiler from fusing a = acc * sx into a neighbouring add: the
 * header fixes the mul, then the fma. */
static ALWAYS_INLINE __m256 no_contract(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

/* ------------------------------------------------------- quant_act */

typedef armllm_quant_job quant_job;

static ALWAYS_INLINE __m256 load_part(const float *p, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(p);
  if (left <= 0) return _mm256_setzero_ps();
  return _mm256_maskload_ps(p, armllm_avx2_tail_mask(left));
}

/* max |x| over k elements, NaN when any is NaN (then |the last NaN|, as ref). */
static float row_amax(const float *x, int64_t k) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m0 = _mm256_setzero_ps(), m1 = m0, nan = m0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    __m256 b = _mm256_and_ps(_mm256_loadu_ps(x + i + 8), abs_mask);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  for (; i < k; i += 8) {
    __m256 a = _mm256_and_ps(load_part(x + i, k - i), abs_mask);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    m0 = _mm256_max_ps(m0, a);
  }
  if (_mm256_movemask_ps(nan)) {
    for (i = k - 1;; i--)
      if (x[i] != x[i]) return fabsf(x[i]);
  }
  m0 = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

static ALWAYS_INLINE __m256i quant8(__m256 v, __m256 s) {
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  v = _mm256_round_ps(_mm256_div_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(v, hi), lo));
}

static ALWAYS_INLINE int32_t hsum_epi32(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(h);
}

/* min(0, min x) and max(0, max x) over k elements; 0 when any is NaN. */
static int row_range(const float *x, int64_t k, float *lo, float *hi) {
  __m256 mn = _mm256_setzero_ps(), mx = mn, nan = mn;
  for (int64_t i = 0; i < k; i += 8) {
    const __m256 a = load_part(x + i, k - i); /* zeros past k: inside the range anyway */
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    mn = _mm256_min_ps(mn, a);
    mx = _mm256_max_ps(mx, a);
  }
  if (_mm256_movemask_ps(nan)) return 0;
  __m128 l = _mm_min_ps(_mm256_castps256_ps128(mn), _mm256_extractf128_ps(mn, 1));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  l = _mm_min_ps(l, _mm_movehl_ps(l, l));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  *lo = _mm_cvtss_f32(_mm_min_ss(l, _mm_shuffle_ps(l, l, 1)));
  *hi = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
  return 1;
}

/* The sum of a group's stored bytes (k1 - k0 a multiple of 32). */
static int32_t group_sum(const int8_t *q, int64_t k0, int64_t k1) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i sum = _mm256_setzero_si256();
  for (int64_t i = k0; i < k1; i += 32) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + i));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
  }
  return hsum_epi32(sum);
}

/* One asymmetric group [k0, k1) of a row, real columns [k0, kx): the header's
 * s = (hi - lo) / 254 and zero point z, xq = clamp(round(x / s) + z). */
static void quant_group_asym(const float *x, int64_t k0, int64_t kx, int64_t k1, int8_t *q,
                             float *sc, int32_t *zp, int32_t *gs) {
  float lo, hi;
  if (!row_range(x + k0, kx - k0, &lo, &hi)) /* a NaN: ref's scale bits, all zeros */
    armllm_q_range(x, k0, kx, &lo, &hi);
  if (!armllm_q_asym_group(lo, hi, q, k0, k1, sc, zp, gs)) return;
  const float s = *sc;
  const int32_t z = *zp;
  const __m256 vs = _mm256_set1_ps(s);
  const __m256i vz = _mm256_set1_epi32(z), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i lo127 = _mm256_set1_epi8(-127);
  for (int64_t i = k0; i < k1; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; j++) {
      const __m256 r = _mm256_round_ps(_mm256_div_ps(load_part(x + i + 8 * j, kx - i - 8 * j), vs),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v[j] = _mm256_add_epi32(_mm256_cvtps_epi32(r), vz);
    }
    /* saturating packs clamp to [-128, 127]; the max makes it [-127, 127] */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    b = _mm256_max_epi8(_mm256_permutevar8x32_epi32(b, order), lo127);
    _mm256_storeu_si256((__m256i *)(q + i), b);
  }
  memset(q + kx, 0, (size_t)(k1 - kx)); /* padding is 0, not z */
  if (gs) *gs = group_sum(q, k0, k1);
}

/* One row, group by group: the group's amax over its real columns, then its
 * 32-k chunks quantized (and summed) while they are in L1. */
static void quant_row(const quant_job *job, int64_t r) {
  const float *x = job->x + r * job->ldx;
  int8_t *q = job->xq + r * job->ldq;
  float *sc = job->scale + r * job->ldsc;
  int32_t *gs = job->gsum ? job->gsum + r * job->ldgs : NULL;
  const int64_t k = job->k, kpad = job->kpad, gl = job->gl;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t g = 0, k0 = 0; g < job->ng; g++, k0 += gl) {
    const int64_t k1 = k0 + gl < kpad ? k0 + gl : kpad;
    const int64_t kx = k1 < k ? k1 : k; /* > k0: every group has a real column */
    if (job->zp) {
      quant_group_asym(x, k0, kx, k1, q, sc + g, job->zp + r * job->ldzp + g, gs ? gs + g : NULL);
      continue;
    }
    const float s = row_amax(x + k0, kx - k0) / 127.0f;
    sc[g] = s;
    if (s == 0.0f || !isfinite(s)) { /* every x / s is 0 or NaN: all zeros, as ref */
      memset(q + k0, 0, (size_t)(k1 - k0));
      if (gs) gs[g] = 0;
      continue;
    }
    const __m256 vs = _mm256_set1_ps(s);
    __m256i sum = _mm256_setzero_si256();
    for (int64_t i = k0; i < k1; i += 32) {
      __m256i a = quant8(load_part(x + i, k - i), vs);
      __m256i b = quant8(load_part(x + i + 8, k - i - 8), vs);
      __m256i c = quant8(load_part(x + i + 16, k - i - 16), vs);
      __m256i d = quant8(load_part(x + i + 24, k - i - 24), vs);
      /* packs work within 128-bit lanes: the dword permute restores k order */
      __m256i v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
      v = _mm256_permutevar8x32_epi32(v, order);
      _mm256_storeu_si256((__m256i *)(q + i), v);
      if (gs) sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
    }
    if (gs) gs[g] = hsum_epi32(sum);
  }
}

static void quant_rows_task(void *ctx, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r++) quant_row(ctx, r);
}

void armllm_avx2_quant_act(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                           int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                           int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp) {
  quant_job job = armllm_quant_job_of(x, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp);
  quant_act_run(pool, m, &job, quant_rows_task);
}

/* ------------------------------------------------------------ pack */

/* The 16 scales (d, then o) of a panel's group as f16. */
static void store_scales_f16(uint8_t *dst, const float *scales) {
  _mm_store_si128((__m128i *)dst, _mm256_cvtps_ph(_mm256_loadu_ps(scales), 0));
  _mm_store_si128((__m128i *)(dst + 16), _mm256_cvtps_ph(_mm256_loadu_ps(scales + PANEL), 0));
}

ARMLLM_X86_WQ_PACKING(armllm_avx2, store_scales_f16)

/* ------------------------------------------------------------ GEMM */

static ALWAYS_INLINE __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

/* acc + maddubs(w, x) in int16, the add opaque to the compiler: left to
 * itself it re-associates a tile's accumulations into trees of temporaries
 * that spill (or, pinned with an empty asm, copies every accumulator). */
static ALWAYS_INLINE __m256i dot_add16(__m256i acc, __m256i w_u8, __m256i x_s8, int first) {
  const __m256i prod = _mm256_maddubs_epi16(w_u8, x_s8);
  if (first) return prod;
  __asm__("vpaddw %1, %0, %0" : "+x"(acc) : "x"(prod));
  return acc;
}

/* Sum of x[0 .. len), len a multiple of 32. */
static ALWAYS_INLINE int32_t sum_i8(const int8_t *x, int64_t len) {
  const __m256i flip = _mm256_set1_epi8((char)0x80), z = _mm256_setzero_si256();
  __m256i s = z;
  for (int64_t i = 0; i < len; i += 32) /* sad of x + 128 against 0: 4 sums of 8 */
    s = _mm256_add_epi64(
        s, _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + i)), flip),
                           z));
  __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
  return (int32_t)(_mm_cvtsi128_si64(h) - 128 * len);
}

/* a = acc * sx, t = fma(d, a, t) [then b = gsum * sx, t = fma(o, b, t)]
 * for one group of a tile row; t lives in memory (a stack tile) so that the
 * accumulators keep the registers; the first group starts from t = +0
 * without loading it. */
static ALWAYS_INLINE void group_epilogue(float *t, __m256i acc, __m256 d, __m256 o, float sx,
                                         const int first, const int offsets, float b) {
  __m256 v = first ? _mm256_setzero_ps() : _mm256_load_ps(t);
  const __m256 a = no_contract(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(sx)));
  v = _mm256_fmadd_ps(d, a, v);
  if (offsets) v = _mm256_fmadd_ps(o, _mm256_set1_ps(b), v);
  _mm256_store_ps(t, v);
}

/* b = (float)gsum * sx (one scalar rounding, as ref) of rows r0 .. r1, every
 * group, into out (rows ng apart): the same for every panel, so computed once
 * per row block instead of in each tile's epilogue. */
static void offset_terms(const wq_job *job, int64_t r0, int64_t r1, float *out) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t g = 0; g < job->ng; g++)
      out[(r - r0) * job->ng + g] =
          (float)job->gsum[r * job->ldgs + g] * job->scale[r * job->ldsc + g];
}

/* y = t (+ bias) for mr rows of panel p, masked to N. */
static ALWAYS_INLINE void tile_store(const int mr, const wq_job *job, const float *t, int64_t r0,
                                     int64_t p) {
  const int64_t col = p * PANEL, nv = job->n - col;
  const __m256i mask = armllm_avx2_tail_mask(nv < PANEL ? nv : PANEL);
  __m256 b = _mm256_setzero_ps();
  if (job->bias)
    b = nv >= PANEL ? _mm256_loadu_ps(job->bias + col) : _mm256_maskload_ps(job->bias + col, mask);
  for (int r = 0; r < mr; r++) {
    __m256 v = _mm256_load_ps(t + r * PANEL);
    if (job->bias) v = _mm256_add_ps(v, b);
    float *y = job->y + (r0 + r) * job->ldy + col;
    if (nv >= PANEL) _mm256_storeu_ps(y, v);
    else _mm256_maskstore_ps(y, mask, v);
  }
}

/* One 32-k chunk of 8-bit weights for mr rows: the int32 x.(q + 128) of
 * each row's 8 outputs. Bytes hold q + 128 = lo + 16 hi (nibbles); the
 * nibble products add up in int16 over the chunk (<= 8 * 3840) first. */
static ALWAYS_INLINE void chunk8(const int mr, const int pf, const int8_t *x, int64_t ldq,
                                 const uint8_t *wp, __m256i *out) {
  const __m256i nib = _mm256_set1_epi8(0x0f);
  __m256i lo16[MAX_MR], hi16[MAX_MR];
  if (pf) prefetch_ahead(wp, 256);
#pragma GCC unroll 8
  for (int s = 0; s < 8; s++) { /* 8 steps of 4 k */
    const __m256i v = _mm256_load_si256((const __m256i *)(wp + 32 * s));
    const __m256i lo = _mm256_and_si256(v, nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    for (int r = 0; r < mr; r++) {
      const __m256i xb = bcast4(x + r * ldq + 4 * s);
      lo16[r] = dot_add16(lo16[r], lo, xb, s == 0);
      hi16[r] = dot_add16(hi16[r], hi, xb, s == 0);
    }
  }
  for (int r = 0; r < mr; r++)
    out[r] = _mm256_add_epi32(_mm256_madd_epi16(lo16[r], _mm256_set1_epi16(1)),
                              _mm256_madd_epi16(hi16[r], _mm256_set1_epi16(16)));
}

/* One 32-k chunk of 4-bit weights (both nibbles are weights, of k and
 * k + 4, multiplied unsigned by the signed activations): int32 x.q. */
static ALWAYS_INLINE void chunk4(const int mr, const int pf, const int8_t *x, int64_t ldq,
                                 const uint8_t *wp, __m256i *out) {
  const __m256i nib = _mm256_set1_epi8(0x0f);
  __m256i a16[MAX_MR];
  if (pf) prefetch_ahead(wp, 128);
#pragma GCC unroll 4
  for (int s = 0; s < 4; s++) { /* 4 steps of 8 k */
    const __m256i v = _mm256_load_si256((const __m256i *)(wp + 32 * s));
    const __m256i lo = _mm256_and_si256(v, nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    for (int r = 0; r < mr; r++) {
      const int8_t *xk = x + r * ldq + 8 * s;
      a16[r] = dot_add16(dot_add16(a16[r], lo, bcast4(xk), s == 0), hi, bcast4(xk + 4), 0);
    }
  }
  for (int r = 0; r < mr; r++) out[r] = _mm256_madd_epi16(a16[r], _mm256_set1_epi16(1));
}

/* y[r0 .. r0+mr, panel p] over the whole of K, group by group: the chunks
 * of a group add up in int32, and the group's sums go to the float
 * epilogue, whose t accumulates in a stack tile. Bits 8 need each row's
 * sum of x per group: from xsum (rows ld_xsum apart) or computed here. */
static ALWAYS_INLINE void tile(const int mr, const int bits, const int pf, const wq_job *job,
                               int64_t r0, int64_t p, const int32_t *xsum, int64_t ld_xsum,
                               const float *boff) {
  const int64_t ldq = job->ldq, kpad = job->kpad, gl = job->gl;
  const int64_t chunk_bytes = bits == 8 ? 256 : 128;
  const int8_t *x = job->xq + r0 * ldq;
  const uint8_t *wp = job->w + p * job->pbytes;
  /* zeroed only to keep GCC's -Wmaybe-uninitialized quiet: every element is written
   * (acc at a group's first chunk, t at group 0) before it is read */
  float t[MAX_MR * PANEL] __attribute__((aligned(32))) = {0};
  __m256i acc[MAX_MR], part[MAX_MR];
  for (int r = 0; r < MAX_MR; r++) acc[r] = part[r] = _mm256_setzero_si256();
  for (int64_t g = 0, k0 = 0; g < job->ng; g++, k0 += gl) {
    const int64_t k1 = k0 + gl < kpad ? k0 + gl : kpad;
    int64_t kc = k0;
    for (; kc + 32 < k1; kc += 32, wp += chunk_bytes) {
      if (bits == 8) chunk8(mr, pf, x + kc, ldq, wp, part);
      else chunk4(mr, pf, x + kc, ldq, wp, part);
      for (int r = 0; r < mr; r++) acc[r] = kc == k0 ? part[r] : _mm256_add_epi32(acc[r], part[r]);
    }
    if (bits == 8) chunk8(mr, pf, x + kc, ldq, wp, part);
    else chunk4(mr, pf, x + kc, ldq, wp, part);
    wp += chunk_bytes;
    __m256 dv, ov = _mm256_setzero_ps();
    if (bits == 4 && job->f16) {
      dv = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)wp));
      ov = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(wp + 16)));
    } else {
      dv = _mm256_load_ps((const float *)wp);
      if (bits == 4) ov = _mm256_load_ps((const float *)wp + PANEL);
    }
    for (int r = 0; r < mr; r++) {
      __m256i a = kc == k0 ? part[r] : _mm256_add_epi32(acc[r], part[r]);
      const float sx = job->scale[(r0 + r) * job->ldsc + g];
      if (bits == 8) { /* x.q = x.(q + 128) - 128 sum(x) */
        const uint32_t sum = (uint32_t)(xsum ? xsum[r * ld_xsum + g]
                                             : sum_i8(x + r * ldq + k0, k1 - k0));
        a = _mm256_sub_epi32(a, _mm256_set1_epi32((int32_t)(128u * sum))); /* mod 2^32 */
        group_epilogue(t + r * PANEL, a, dv, ov, sx, g == 0, 0, 0.0f);
      } else { /* b = gsum * sx: precomputed (rows ng apart) or here */
        const float b = boff ? boff[r * job->ng + g]
                             : (float)job->gsum[(r0 + r) * job->ldgs + g] * sx;
        group_epilogue(t + r * PANEL, a, dv, ov, sx, g == 0, 1, b);
      }
    }
    wp += scale_bytes(bits, job->f16);
  }
  tile_store(mr, job, t, r0, p);
}

/* A tile of mr (1 .. MAX_MR) rows, the height made a compile-time constant. */
static ALWAYS_INLINE void tile_any(const int bits, const int pf, const wq_job *job, int64_t r0,
                                   int64_t mr, int64_t p, const int32_t *xsum, int64_t ld_xsum,
                                   const float *boff) {
  switch (mr) {
    case 1: tile(1, bits, pf, job, r0, p, xsum, ld_xsum, boff); break;
    case 2: tile(2, bits, pf, job, r0, p, xsum, ld_xsum, boff); break;
    case 3: tile(3, bits, pf, job, r0, p, xsum, ld_xsum, boff); break;
    case 4: tile(4, bits, pf, job, r0, p, xsum, ld_xsum, boff); break;
    case 5: tile(5, bits, pf, job, r0, p, xsum, ld_xsum, boff); break;
    default: tile(6, bits, pf, job, r0, p, xsum, ld_xsum, boff); break;
  }
}

/* Decode: all M (<= DECODE_MAX_M) rows of panel p: up to DECODE_PASS_ROWS in
 * one pass over its whole K; more (a speculative verify step's k + 1) in two,
 * the second reading the panel the first brought in again from L1/L2 (8 bytes a
 * column at bits 8: 64 KiB at K = 8K), so the weights come from memory once. */
static ALWAYS_INLINE void decode_panel(const int bits, const wq_job *job, int64_t p,
                                       const int32_t *xsum, int64_t ld_xsum, const float *boff) {
  const int64_t m = job->m;
  if (m <= DECODE_PASS_ROWS) {
    tile_any(bits, 1, job, 0, m, p, xsum, ld_xsum, boff);
    return;
  }
  const int64_t first = (m + 1) / 2; /* 5 -> 3 + 2, 8 -> 4 + 4: the passes as even as can be */
  tile_any(bits, 1, job, 0, first, p, xsum, ld_xsum, boff);
  tile_any(bits, 0, job, first, m - first, p, xsum ? xsum + first * ld_xsum : NULL, ld_xsum,
           boff ? boff + first * job->ng : NULL);
}
static void decode_task8(void *ctx, int64_t p0, int64_t p1) {
  const wq_job *job = ctx;
  for (int64_t p = p0; p < p1; p++) decode_panel(8, job, p, job->gsum, job->ldgs, NULL);
}
static void decode_task4(void *ctx, int64_t p0, int64_t p1) {
  const wq_job *job = ctx;
  float boff_buf[WQ_XSUM_CAP];
  const float *boff = NULL;
  if (job->m * job->ng <= WQ_XSUM_CAP && p1 - p0 > 1) {
    offset_terms(job, 0, job->m, boff_buf);
    boff = boff_buf;
  }
  for (int64_t p = p0; p < p1; p++) decode_panel(4, job, p, NULL, 0, boff);
}

/* Prefill item i: row block i / n_pc times panel chunk i % n_pc; panel by
 * panel (it stays in L2), every row tile of the block (the block stays in
 * L2), the first tile prefetching the panel stream. */
static ALWAYS_INLINE void prefill_item(const int bits, const wq_job *job, int64_t item,
                                       int32_t *xsum_buf, float *boff_buf) {
  const int mr = bits == 8 ? WQ_MR8 : WQ_MR4;
  const int64_t rb = item / job->n_pc, pc = item % job->n_pc, ng = job->ng;
  const int64_t r0 = rb * job->mb, r1 = r0 + job->mb < job->m ? r0 + job->mb : job->m;
  const int64_t p0 = pc * job->cp, p1 = p0 + job->cp < job->panels ? p0 + job->cp : job->panels;
  const int32_t *xsum = NULL;
  int64_t ldx = ng;
  if (bits == 8 && job->gsum) { /* quant_act's sums */
    xsum = job->gsum + r0 * job->ldgs;
    ldx = job->ldgs;
  } else if (bits == 8 && (r1 - r0) * ng <= WQ_XSUM_CAP) { /* the block's sums, once */
    for (int64_t r = r0; r < r1; r++)
      for (int64_t g = 0; g < ng; g++) {
        const int64_t k0 = g * job->gl, k1 = k0 + job->gl < job->kpad ? k0 + job->gl : job->kpad;
        xsum_buf[(r - r0) * ng + g] = sum_i8(job->xq + r * job->ldq + k0, k1 - k0);
      }
    xsum = xsum_buf;
  }
  const float *boff = NULL;
  if (bits == 4 && (r1 - r0) * ng <= WQ_XSUM_CAP) { /* the block's gsum * sx, once */
    offset_terms(job, r0, r1, boff_buf);
    boff = boff_buf;
  }
#define XSUM(r) (xsum ? xsum + ((r) - r0) * ldx : NULL)
#define BOFF(r) (boff ? boff + ((r) - r0) * ng : NULL)
  for (int64_t p = p0; p < p1; p++) {
    int64_t r = r0;
    if (r + mr <= r1) { /* the first tile streams the panel in: prefetch ahead */
      tile(mr, bits, 1, job, r, p, XSUM(r), ldx, BOFF(r));
      r += mr;
    }
    for (; r + mr <= r1; r += mr) tile(mr, bits, 0, job, r, p, XSUM(r), ldx, BOFF(r));
    if (r < r1) tile_any(bits, r == r0, job, r, r1 - r, p, XSUM(r), ldx, BOFF(r));
  }
#undef XSUM
#undef BOFF
}

static void prefill_task8(void *ctx, int64_t i0, int64_t i1) {
  int32_t xsum[WQ_XSUM_CAP];
  for (int64_t i = i0; i < i1; i++) prefill_item(8, ctx, i, xsum, NULL);
}
static void prefill_task4(void *ctx, int64_t i0, int64_t i1) {
  float boff[WQ_XSUM_CAP];
  for (int64_t i = i0; i < i1; i++) prefill_item(4, ctx, i, NULL, boff);
}

/* Runs a gemm_wq job (the whole call's or a column window's) on the pool. */
static void wq_run(armllm_pool *pool, wq_job *job, int bits) {
  const int64_t m = job->m, n = job->n, kpad = job->kpad;
  if (m <= DECODE_MAX_M) {
    wq_run_decode(pool, job, bits == 4 ? decode_task4 : decode_task8);
    return;
  }
  if ((double)m * (double)n * (double)kpad < 4.0e6) pool = NULL;
  const int64_t mr = bits == 8 ? WQ_MR8 : WQ_MR4;
  int64_t mb = WQ_L2_BYTES / kpad;
  if (bits == 8 && !job->gsum && mb * job->ng > WQ_XSUM_CAP) mb = WQ_XSUM_CAP / job->ng; /* on the stack */
  mb = mb / mr * mr;
  mb = mb < mr ? mr : mb;
  int64_t cp = WQ_L2_BYTES / job->pbytes;
  cp = cp < 1 ? 1 : cp;
  /* enough items for the threads: shrink the panel chunk */
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  const int64_t n_rb = (m + mb - 1) / mb;
  while (cp > 1 && n_rb * ((job->panels + cp - 1) / cp) < 4 * threads) cp--;
  job->mb = mb;
  job->cp = cp;
  job->n_pc = (job->panels + cp - 1) / cp;
  armllm_pool_run(pool, n_rb * job->n_pc, 1, bits == 4 ? prefill_task4 : prefill_task8, job);
}

void armllm_avx2_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                         const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                         const void *packed_w, int64_t n, int bits, int64_t group,
                         const float *bias, float *y, int64_t ldy) {
  wq_job job = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group, bias,
                         y, ldy);
  wq_run(pool, &job, bits);
}

void armllm_avx2_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                              const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                              const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                              int64_t n1, const float *bias, float *y, int64_t ldy) {
  wq_job job = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group, bias,
                         y, ldy);
  wq_job_window(&job, n0, n1);
  wq_run(NULL, &job, bits);
}
