/* avx2/gguf.c: the GGUF-block GEMM (armllm_kernels.h) with AVX2's maddubs:
 * the weights stay at their stored bit width in memory and are unpacked to
 * bytes in registers (decode) or a 256-column chunk of a panel at a time
 * into L1, for every row tile to reuse (prefill).
 *
 * Packed layout "gguf-nr8c256": avx512/gguf.c's "gguf-nr16c256" with panels
 * of 8 output rows: a vector is 32 bytes (byte 4r + j belongs to row r of
 * the panel), the scales come 8 to a row set (d f16[8], sc u8[8][8], ...),
 * and each chunk is padded to 32 bytes. Per row that is the file's bytes or
 * within 6% (Q4_K 148/144, Q5_K 180/176, Q3_K 116/110, Q6_K 212/210, IQ4_XS
 * 140/136 per 256 columns; the 32-element types as stored).
 *
 * Inner products: maddubs multiplies unsigned weight bytes by the signed
 * activation word x[k..k+4) broadcast to the 8 rows and adds pairs in int16;
 * madd with ones widens to int32.
 *   Types whose u = v + bias is at most 63 (all but Q8_0, IQ4, MXFP4): the
 *   products of a run of steps add up in int16 before one madd (runs of
 *   chain_steps: 8 steps of u <= 15, 4 of u <= 31, 2 of u <= 63, so that
 *   |sum| <= steps * 2 * umax * 127 < 2^15), and each group starts from
 *   -bias * sum(x), as on avx512.
 *   Q8_0, IQ4 and MXFP4 (|v| <= 128): the sign trick, maddubs(|v|, sign(x, v))
 *   (|pair| <= 2 * 128 * 127 < 2^15), on v itself: no bias.
 * Each group's int32 sum is exact and the float epilogue is the header's,
 * lane-wise: every result is ref's, whatever the tile, plan or thread count.
 * Super-block types (the K-quants, IQ4_XS): the int16 products of a run go
 * through madd by the group's sub-scale (each lane's [s, s]) instead of by
 * ones, so the super-block's isum = sum_j s_j * (sum u x) builds up in int32
 * with no float step; the types' linear term L = sum_j c_j * xs_j (c the
 * mins, or s where a bias is taken off: isum - bias * L) is 8 madds of
 * coefficient pairs by x's 16-column sum pairs per super-block and row; one
 * float epilogue per 256 columns.
 *
 * Plans: as avx512/gguf.c's (decode unpacks into registers, prefill a chunk
 * at a time into L1 for every row tile), with tiles of MR rows x 1 panel.
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../gguf_blocks.h"
#include "vexp_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PANEL 8    /* output rows per panel: one int32 / f32 lane each */
#define MR 4       /* prefill tile rows: 4 accumulators and 4 t of the 16 ymm */
#define MB_MAX 256 /* rows per prefill block (a multiple of MR): its t on the stack */
_Static_assert(MB_MAX % MR == 0, "row blocks are whole tiles");
#define ITEMS_PER_THREAD 4 /* prefill items a thread: evens out uneven progress */
#define PF_BYTES 4096      /* decode: software prefetch distance in each panel stream */
#define GGUF_DECODE_STREAMS 2 /* panels a decode thread reads at once: 2 * 4 t of the 16 ymm */
#define GGUF_DECODE_ONE_STREAM() 0 /* two on every CPU measured (not yet an AVX2-only one) */
#define GGUF_VF __m256
#define GGUF_VF_ZERO _mm256_setzero_ps
#define TBUF_LD PANEL

#include "../gguf_x86.h"

static ALWAYS_INLINE __m256 no_contract(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

/* ------------------------------------------------------------ unpacking */

/* A chunk of a panel as the tiles read it: u[8 gi + s] the bytes of group gi,
 * step s (columns 4s .. 4s+4 of each row: u = v + bias, or v itself for the
 * sign-trick types), and a 32-element type's d, o of block gi. */
typedef struct {
  __m256i u[GGUF_CHUNK_GROUPS * GGUF_STEPS];
  float d[GGUF_CHUNK_GROUPS][PANEL];
  float o[GGUF_CHUNK_GROUPS][PANEL];
  /* super-block types: each 16 columns' sub-scale as int16 pairs [s, s], the
   * linear term's coefficient pairs (lin_pair), the block's D and O */
  __m256i s16[2 * GGUF_CHUNK_GROUPS];
  __m256i lin[GGUF_CHUNK_GROUPS];
  __m256 sd, so;
} unpacked;

/* Q8_0, IQ4 and MXFP4: signed values (up to 128 in magnitude), multiplied with
 * the sign trick. */
static inline int signed_type(int type) {
  return type == ARMLLM_GGML_Q8_0 || type == ARMLLM_GGML_IQ4_NL || type == ARMLLM_GGML_IQ4_XS ||
         type == ARMLLM_GGML_MXFP4;
}

static ALWAYS_INLINE __m256i load(const uint8_t *p) {
  return _mm256_loadu_si256((const __m256i *)p);
}

static ALWAYS_INLINE void nibbles(const uint8_t *p, __m256i *u) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int i = 0; i < 4; i++) {
    const __m256i v = load(p + GGUF_VEC * i);
    u[2 * i] = _mm256_and_si256(v, low4);
    u[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  }
}

/* u[s] |= bit s of the plane's byte, moved to bit `pos` (the shifts stay
 * inside each byte: pos - s >= 0 left, s - pos <= 7 - pos right). */
static ALWAYS_INLINE void or_plane1(const uint8_t *p, __m256i *u, const int pos) {
  const __m256i h = load(p), bit = _mm256_set1_epi8((char)(1 << pos));
  for (int s = 0; s < GGUF_STEPS; s++) {
    const __m256i m = s <= pos ? _mm256_slli_epi16(h, pos - s) : _mm256_srli_epi16(h, s - pos);
    u[s] = _mm256_or_si256(u[s], _mm256_and_si256(m, bit));
  }
}

/* u[s] = the 2-bit field of step s (Q2_K, Q3_K's low bits). */
static ALWAYS_INLINE void plane2(const uint8_t *p, __m256i *u) {
  const __m256i low2 = _mm256_set1_epi8(3);
  for (int i = 0; i < 2; i++) {
    const __m256i h = load(p + GGUF_VEC * i);
    u[4 * i] = _mm256_and_si256(h, low2);
    u[4 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(h, 2), low2);
    u[4 * i + 2] = _mm256_and_si256(_mm256_srli_epi16(h, 4), low2);
    u[4 * i + 3] = _mm256_and_si256(_mm256_srli_epi16(h, 6), low2);
  }
}

/* u[s] |= the 2-bit field of step s << 4 (Q6_K's high bits). */
static ALWAYS_INLINE void or_plane2_high(const uint8_t *p, __m256i *u) {
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  for (int i = 0; i < 2; i++) {
    const __m256i h = load(p + GGUF_VEC * i);
    const __m256i f[4] = {_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2), h,
                          _mm256_srli_epi16(h, 2)};
    for (int t = 0; t < 4; t++)
      u[4 * i + t] = _mm256_or_si256(u[4 * i + t], _mm256_and_si256(f[t], bits45));
  }
}

static ALWAYS_INLINE __m256 f16x8(const uint8_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static ALWAYS_INLINE __m256i u8x8(const uint8_t *p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static ALWAYS_INLINE __m256i s8x8(const uint8_t *p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* ------------------------------------------------- super-block scales */

/* Each lane's int32 (in int16 range) as the int16 pair [v, v]: madd by it
 * multiplies both of a lane's int16 products by v. */
static ALWAYS_INLINE __m256i dup16(__m256i v) {
  const __m256i lo16 = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  return _mm256_shuffle_epi8(v, lo16);
}

/* The integer sub-scale s of 16-column group j (0 .. 15) of a super-block
 * chunk whose scales are at sc, one per row (gguf_blocks.h's s). */
static ALWAYS_INLINE __m256i sub_scale(const int type, const uint8_t *sc, int j) {
  switch (type) {
  case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K: return u8x8(sc + (4 + j / 2) * PANEL);
  case ARMLLM_GGML_Q2_K: return _mm256_and_si256(u8x8(sc + (4 + j) * PANEL), _mm256_set1_epi32(15));
  case ARMLLM_GGML_IQ4_XS: return s8x8(sc + (2 + j / 2) * PANEL);
  default: return s8x8(sc + (2 + j) * PANEL); /* Q3_K, Q6_K */
  }
}

/* The pairs of a super-block's linear term of this type (gguf_lin_pairs). */
static ALWAYS_INLINE int lin_pairs(const int type) {
  return gguf_lin_pairs(armllm_gguf_group_len(type), armllm_gguf_has_offsets(type));
}

/* The int16 pair [c_2i, c_2i+1] of each row, c the coefficient of group j's
 * x sum in the linear term (gguf_lin_pairs' groups): the min m (offsets'
 * types), else s (the biased types: isum - bias * L). madd by x's sum pair of
 * the same two groups (xpair) gives both terms. */
static ALWAYS_INLINE __m256i lin_pair(const int type, const uint8_t *sc, int i) {
  /* one byte per group and row: groups 2i, 2i + 1 are 16 bytes at run0 + 2i,
   * interleaved into the pairs */
  const int run0 = type == ARMLLM_GGML_Q2_K ? 4 : lin_pairs(type) < GGUF_CHUNK_GROUPS ? 12 : 2;
  const __m128i v = _mm_loadu_si128((const __m128i *)(sc + (run0 + 2 * i) * PANEL));
  const __m128i pairs = _mm_unpacklo_epi8(v, _mm_srli_si128(v, 8));
  if (type == ARMLLM_GGML_Q2_K) /* the min is the byte's high nibble */
    return _mm256_srli_epi16(_mm256_cvtepu8_epi16(pairs), 4);
  if (lin_pairs(type) < GGUF_CHUNK_GROUPS) return _mm256_cvtepu8_epi16(pairs); /* the mins */
  return _mm256_cvtepi8_epi16(pairs); /* Q3_K's sc - 32, Q6_K's sc */
}

/* A super-block type with a linear term: offsets, or a bias to take off. */
static inline int super_lin(int type) {
  return armllm_gguf_has_offsets(type) || (!signed_type(type) && gguf_bias(type));
}

/* The bytes u[0 .. 8) of one group at p (the layout above). */
static ALWAYS_INLINE void unpack_group(const int type, const uint8_t *p, __m256i *u) {
  /* IQ4's code book, in both 128-bit lanes (vpshufb looks up per lane) */
  const __m256i iq4 = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
  switch (type) {
  case ARMLLM_GGML_Q8_0: /* stored v + 128: v back */
    for (int s = 0; s < GGUF_STEPS; s++)
      u[s] = _mm256_xor_si256(load(p + GGUF_VEC * s), _mm256_set1_epi8((char)0x80));
    break;
  case ARMLLM_GGML_Q2_K:
    plane2(p, u);
    break;
  case ARMLLM_GGML_Q3_K:
    plane2(p, u);
    or_plane1(p + 2 * GGUF_VEC, u, 2);
    break;
  case ARMLLM_GGML_Q6_K:
    nibbles(p, u);
    or_plane2_high(p + 4 * GGUF_VEC, u);
    break;
  case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: case ARMLLM_GGML_Q5_K:
    nibbles(p, u);
    or_plane1(p + 4 * GGUF_VEC, u, 4);
    break;
  case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_IQ4_XS:
    nibbles(p, u);
    for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm256_shuffle_epi8(iq4, u[s]);
    break;
  case ARMLLM_GGML_MXFP4: {
    const __m256i book = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    nibbles(p, u);
    for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm256_shuffle_epi8(book, u[s]);
    break;
  }
  default:
    nibbles(p, u);
  }
}

/* d and o (Q4_1, Q5_1) of 32-element block gi of a chunk of ngr groups
 * whose scales are at sc: the file's f16 fields, exact. */
static ALWAYS_INLINE void group_scales(const int type, const uint8_t *sc, int64_t ngr, int64_t gi,
                                       __m256 *d, __m256 *o) {
  if (type == ARMLLM_GGML_MXFP4) { /* d = 2^(e - 128): gguf_blocks.h's armllm_mxfp4_d_bits */
    const __m256i e = u8x8(sc + PANEL * gi);
    __m256i bits = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    bits = _mm256_blendv_epi8(bits, _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e),
                              _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e));
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000),
                              _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
    *d = _mm256_castsi256_ps(bits);
    return;
  }
  *d = f16x8(sc + 2 * PANEL * gi);
  if (type == ARMLLM_GGML_Q4_1 || type == ARMLLM_GGML_Q5_1) *o = f16x8(sc + 2 * PANEL * (ngr + gi));
}

/* Unpacks a chunk of ngr groups at w for the prefill tiles. */
static ALWAYS_INLINE void unpack_chunk(const int type, const uint8_t *w, int64_t ngr,
                                       unpacked *U) {
  const int64_t gbytes = PANEL * gguf_group_row_bytes(type);
  const uint8_t *sc = w + gbytes * ngr;
  for (int64_t gi = 0; gi < ngr; gi++) unpack_group(type, w + gi * gbytes, U->u + GGUF_STEPS * gi);
  if (armllm_gguf_is_super(type)) {
    for (int j = 0; j < 2 * GGUF_CHUNK_GROUPS; j++) U->s16[j] = dup16(sub_scale(type, sc, j));
    if (super_lin(type))
      for (int i = 0; i < lin_pairs(type); i++) U->lin[i] = lin_pair(type, sc, i);
    U->sd = f16x8(sc);
    U->so = armllm_gguf_has_offsets(type) ? f16x8(sc + 2 * PANEL) : _mm256_setzero_ps();
    return;
  }
  for (int64_t gi = 0; gi < ngr; gi++) {
    __m256 d, o = _mm256_setzero_ps();
    group_scales(type, sc, ngr, gi, &d, &o);
    _mm256_store_ps(U->d[gi], d);
    _mm256_store_ps(U->o[gi], o);
  }
}

/* ------------------------------------------------------------ tiles */

/* What a tile reads besides its rows: the unpacked chunk of its panel. */
typedef struct {
  const gguf_job *job;
  const int16_t *sums;    /* the row block's 16-column sums (gguf_sums16), or NULL */
  int64_t row0;           /* the row block's first row */
  int bias;
  int64_t g0, ngr;        /* the chunk's first activation group, its groups */
  const unpacked *U;
  int first, last;        /* the chunk is K's first (t from +0) / last (t to y) */
  int64_t col, ncols;     /* the panel's first output column, its columns in N */
} tile_args;

static ALWAYS_INLINE __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

/* Steps whose maddubs sums add up exactly in int16 (the largest u of the
 * type: 2 * umax * 127 per step, under 2^15 in all). */
static inline int chain_steps(int type) {
  switch (type) {
  case ARMLLM_GGML_Q6_K: return 2;                                                 /* u <= 63 */
  case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: case ARMLLM_GGML_Q5_K: return 4; /* u <= 31 */
  default: return 8;                                                               /* u <= 15 */
  }
}

/* acc + the products of n steps from u (n * 2 * umax * 127 < 2^15: the int16 sums are exact). */
static ALWAYS_INLINE __m256i dot_run(__m256i acc, const __m256i *u, const int n,
                                     const int8_t *xk) {
  __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(u), bcast4(xk));
  for (int i = 1; i < n; i++)
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_load_si256(u + i), bcast4(xk + 4 * i)));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* acc + the 4 products of one step of signed v (wabs = |v|): the sign trick. */
static ALWAYS_INLINE __m256i dot_sign(__m256i acc, __m256i w, __m256i wabs, const int8_t *xk) {
  const __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast4(xk), w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* t of rows r0 .. r0+mr: to tbuf (rows TBUF_LD apart) or, on K's last chunk,
 * to y (+ bias, masked to N). */
static ALWAYS_INLINE void tile_out(const int mr, const tile_args *a, int64_t r0, float *tbuf,
                                   const __m256 *t) {
  const gguf_job *job = a->job;
  if (!a->last) {
    for (int r = 0; r < mr; r++) _mm256_store_ps(tbuf + r * TBUF_LD, t[r]);
    return;
  }
  const __m256i mask = armllm_avx2_tail_mask(a->ncols < PANEL ? a->ncols : PANEL);
  const __m256 bias =
      job->bias ? _mm256_maskload_ps(job->bias + a->col, mask) : _mm256_setzero_ps();
  for (int r = 0; r < mr; r++) {
    __m256 v = t[r];
    if (job->bias) v = _mm256_add_ps(v, bias);
    _mm256_maskstore_ps(job->y + (r0 + r) * job->ldy + a->col, mask, v);
  }
}

/* Rows r0 .. r0+mr of the panel over one chunk of a 32-element type: per
 * group the int32 sum, then its epilogue (offs: with offsets; sgn: the
 * sign-trick types; run: the int16 chain, chain_steps). t comes from +0 or
 * tbuf and goes on through tile_out. */
static ALWAYS_INLINE void tile(const int mr, const int offs, const int sgn, const int run,
                               const tile_args *a, int64_t r0, float *tbuf) {
  const gguf_job *job = a->job;
  const int64_t ldq = job->ldq;
  const int8_t *x = job->xq + r0 * ldq;
  __m256 t[MR];
  __m256i acc[MR];
  for (int r = 0; r < mr; r++)
    t[r] = a->first ? _mm256_setzero_ps() : _mm256_load_ps(tbuf + r * TBUF_LD);
  for (int64_t gi = 0; gi < a->ngr; gi++) {
    const int64_t g = a->g0 + gi, k0 = g * GGUF_GROUP;
    const __m256i *u = a->U->u + GGUF_STEPS * gi;
    int32_t xs[MR]; /* sum of x over the group */
    float sx[MR];
    for (int r = 0; r < mr; r++) {
      xs[r] = gguf_xsum(job, a->sums, r0 + r - a->row0, r0 + r, 2 * g, 2);
      sx[r] = gguf_sx(job, r0 + r, g);
    }
    for (int r = 0; r < mr; r++) acc[r] = _mm256_set1_epi32(sgn ? 0 : -a->bias * xs[r]);
    if (sgn) {
#pragma GCC unroll 8
      for (int s = 0; s < GGUF_STEPS; s++) {
        const __m256i w = _mm256_load_si256(&u[s]), wabs = _mm256_abs_epi8(w);
        for (int r = 0; r < mr; r++) acc[r] = dot_sign(acc[r], w, wabs, x + r * ldq + k0 + 4 * s);
      }
    } else {
      for (int s = 0; s < GGUF_STEPS; s += run)
        for (int r = 0; r < mr; r++)
          acc[r] = dot_run(acc[r], &u[s], run, x + r * ldq + k0 + 4 * s);
    }
    const __m256 dv = _mm256_load_ps(a->U->d[gi]);
    for (int r = 0; r < mr; r++) {
      const __m256 av =
          no_contract(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_set1_ps(sx[r])));
      __m256 v = _mm256_fmadd_ps(dv, av, t[r]);
      if (offs) {
        const __m256 b = _mm256_set1_ps((float)xs[r] * sx[r]);
        v = _mm256_fmadd_ps(_mm256_load_ps(a->U->o[gi]), b, v);
      }
      t[r] = v;
    }
  }
  tile_out(mr, a, r0, tbuf, t);
}

/* isum + the run of n steps from u times x at xk, madd by the sub-scale
 * pairs s16 (the int16 sums exact: chain_steps). */
static ALWAYS_INLINE __m256i sdot_run(__m256i isum, const __m256i *u, const int n,
                                      const int8_t *xk, __m256i s16) {
  __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(u), bcast4(xk));
  for (int i = 1; i < n; i++)
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_load_si256(u + i), bcast4(xk + 4 * i)));
  return _mm256_add_epi32(isum, _mm256_madd_epi16(p, s16));
}

/* isum + one step of signed v (wabs = |v|, the sign trick) times s16. */
static ALWAYS_INLINE __m256i sdot_sign(__m256i isum, __m256i w, __m256i wabs, const int8_t *xk,
                                       __m256i s16) {
  const __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast4(xk), w));
  return _mm256_add_epi32(isum, _mm256_madd_epi16(p, s16));
}

/* t + a super-block's epilogue: isum (less bias * L), and with offsets the
 * mins' msum = L, times the block's activation scale sx, by D and O. */
static ALWAYS_INLINE __m256 super_epilogue(const int offs, const int bias, __m256i isum,
                                           __m256i lin, float sx, __m256 sd, __m256 so,
                                           __m256 t) {
  if (bias) isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(lin, _mm256_set1_epi32(bias)));
  const __m256 vsx = _mm256_set1_ps(sx);
  t = _mm256_fmadd_ps(sd, no_contract(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), vsx)), t);
  if (offs) t = _mm256_fmadd_ps(so, no_contract(_mm256_mul_ps(_mm256_cvtepi32_ps(lin), vsx)), t);
  return t;
}

/* x's sum pair i of the super-block at k0 (gguf_lin_xpair), broadcast. */
static ALWAYS_INLINE __m256i xpair(const int gl, const int offs, const gguf_job *job,
                                   const int16_t *sums, int64_t rl, int64_t r, int64_t k0, int i) {
  return _mm256_set1_epi32(gguf_lin_xpair(gl, offs, job, sums, rl, r, k0 / 16, i));
}

/* Rows r0 .. r0+mr of the panel over one super-block (gl: its group
 * length; offs, sgn, run as tile's; lin: a linear term; bias: the u bias to
 * take off): isum in int32 over the whole block, one float epilogue. */
static ALWAYS_INLINE void tile_super(const int mr, const int gl, const int offs, const int sgn,
                                     const int run, const int lin, const int bias,
                                     const tile_args *a, int64_t r0, float *tbuf) {
  const gguf_job *job = a->job;
  const int64_t ldq = job->ldq, k0 = a->g0 * GGUF_GROUP;
  const int8_t *x = job->xq + r0 * ldq + k0;
  const unpacked *U = a->U;
  __m256i isum[MR];
  for (int r = 0; r < mr; r++) isum[r] = _mm256_setzero_si256();
  for (int gi = 0; gi < GGUF_CHUNK_GROUPS; gi++) {
    const __m256i *u = U->u + GGUF_STEPS * gi;
    for (int h = 0; h < GGUF_GROUP / gl; h++) {
      const int s0 = h * (gl / 4);
      const __m256i s16 = _mm256_load_si256(&U->s16[2 * gi + h]);
      if (sgn) {
#pragma GCC unroll 8
        for (int s = s0; s < s0 + gl / 4; s++) {
          const __m256i w = _mm256_load_si256(&u[s]), wabs = _mm256_abs_epi8(w);
          for (int r = 0; r < mr; r++)
            isum[r] = sdot_sign(isum[r], w, wabs, x + r * ldq + 32 * gi + 4 * s, s16);
        }
      } else {
        for (int s = s0; s < s0 + gl / 4; s += run)
          for (int r = 0; r < mr; r++)
            isum[r] = sdot_run(isum[r], &u[s], run, x + r * ldq + 32 * gi + 4 * s, s16);
      }
    }
  }
  __m256 t[MR];
  for (int r = 0; r < mr; r++) {
    const int64_t rl = r0 + r - a->row0;
    __m256i l = _mm256_setzero_si256();
    if (lin)
      for (int i = 0; i < gguf_lin_pairs(gl, offs); i++)
        l = _mm256_add_epi32(l, _mm256_madd_epi16(
                                    _mm256_load_si256(&U->lin[i]),
                                    xpair(gl, offs, job, a->sums, rl, r0 + r, k0, i)));
    const __m256 t0 = a->first ? _mm256_setzero_ps() : _mm256_load_ps(tbuf + r * TBUF_LD);
    t[r] = super_epilogue(offs, bias, isum[r], l, gguf_sx(job, r0 + r, a->g0), U->sd, U->so, t0);
  }
  tile_out(mr, a, r0, tbuf, t);
}

/* Rows [r0, r1) of a chunk of a 32-element type in tiles of MR; t rows of
 * tbuf follow the rows. */
static ALWAYS_INLINE void row_tiles(const int offs, const int sgn, const int run,
                                    const tile_args *a, int64_t r0, int64_t r1, float *tbuf) {
  int64_t r = r0;
  for (; r + MR <= r1; r += MR) tile(MR, offs, sgn, run, a, r, tbuf + (r - r0) * TBUF_LD);
  switch (r1 - r) {
  case 1: tile(1, offs, sgn, run, a, r, tbuf + (r - r0) * TBUF_LD); break;
  case 2: tile(2, offs, sgn, run, a, r, tbuf + (r - r0) * TBUF_LD); break;
  case 3: tile(3, offs, sgn, run, a, r, tbuf + (r - r0) * TBUF_LD); break;
  default: break;
  }
}

/* The same for a super-block of `type`, its constants made from the type. */
static ALWAYS_INLINE void row_tiles_super(const int type, const tile_args *a, int64_t r0,
                                          int64_t r1, float *tbuf) {
  const int gl = armllm_gguf_group_len(type), offs = armllm_gguf_has_offsets(type);
  const int sgn = signed_type(type), lin = super_lin(type), bias = sgn ? 0 : gguf_bias(type);
  const int run = chain_steps(type) < gl / 4 ? chain_steps(type) : gl / 4;
#define SUPER_TILE(m) tile_super(m, gl, offs, sgn, run, lin, bias, a, r, tbuf + (r - r0) * TBUF_LD)
  int64_t r = r0;
  for (; r + MR <= r1; r += MR) SUPER_TILE(MR);
  switch (r1 - r) {
  case 1: SUPER_TILE(1); break;
  case 2: SUPER_TILE(2); break;
  case 3: SUPER_TILE(3); break;
  default: break;
  }
#undef SUPER_TILE
}

/* One function per kind of chunk: 32-element groups with or without
 * offsets, sign trick or not, int16 chains of run steps; each super-block
 * type. */
#define ROWS_FN(name, offs, sgn, run)                                                              \
  static __attribute__((noinline)) void name(const tile_args *a, int64_t r0, int64_t r1,          \
                                             float *tbuf) {                                        \
    row_tiles(offs, sgn, run, a, r0, r1, tbuf);                                                   \
  }
ROWS_FN(rows_q4, 0, 0, 8)  /* Q4_0 */
ROWS_FN(rows_q5, 0, 0, 4)  /* Q5_0 */
ROWS_FN(rows_q4o, 1, 0, 8) /* Q4_1 */
ROWS_FN(rows_q5o, 1, 0, 4) /* Q5_1 */
ROWS_FN(rows_sgn, 0, 1, 1) /* Q8_0, IQ4_NL, MXFP4 */
#undef ROWS_FN
#define SUPER_FN(name, type)                                                                       \
  static __attribute__((noinline)) void name(const tile_args *a, int64_t r0, int64_t r1,          \
                                             float *tbuf) {                                        \
    row_tiles_super(type, a, r0, r1, tbuf);                                                       \
  }
SUPER_FN(rows_q2k, ARMLLM_GGML_Q2_K)
SUPER_FN(rows_q3k, ARMLLM_GGML_Q3_K)
SUPER_FN(rows_q4k, ARMLLM_GGML_Q4_K)
SUPER_FN(rows_q5k, ARMLLM_GGML_Q5_K)
SUPER_FN(rows_q6k, ARMLLM_GGML_Q6_K)
SUPER_FN(rows_iq4xs, ARMLLM_GGML_IQ4_XS)
#undef SUPER_FN

/* Rows [r0, r1) of panel p, the whole of K: chunk by chunk, each unpacked
 * once for every row tile. */
static ALWAYS_INLINE void panel_rows(const int type, const gguf_job *job, const gguf_part *part,
                                     int64_t p, int64_t r0, int64_t r1, float *tbuf,
                                     const int16_t *sums, unpacked *U) {
  const int64_t k = job->k, nch = gguf_chunks(k), lp = p - part->panel0;
  tile_args a = {.job = job, .sums = sums, .row0 = r0, .bias = gguf_bias(type), .U = U,
                 .col = part->col0 + lp * PANEL, .ncols = part->rows - lp * PANEL};
  const uint8_t *w = part->w + lp * part->pbytes;
  for (int64_t c = 0; c < nch; c++) {
    const int64_t ngr = gguf_chunk_groups(k, c), cbytes = gguf_chunk_bytes(type, ngr);
    for (int64_t off = 0; off < cbytes; off += PREFETCH_LINE)
      _mm_prefetch((const char *)w + PF_BYTES + off, _MM_HINT_T0);
    unpack_chunk(type, w, ngr, U);
    w += cbytes;
    a.g0 = c * GGUF_CHUNK_GROUPS;
    a.ngr = ngr;
    a.first = c == 0;
    a.last = c == nch - 1;
    switch (type) {
    case ARMLLM_GGML_Q2_K: rows_q2k(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q3_K: rows_q3k(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q4_K: rows_q4k(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q5_K: rows_q5k(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q6_K: rows_q6k(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_IQ4_XS: rows_iq4xs(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q5_0: rows_q5(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q4_1: rows_q4o(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q5_1: rows_q5o(&a, r0, r1, tbuf); break;
    case ARMLLM_GGML_Q8_0: case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_MXFP4:
      rows_sgn(&a, r0, r1, tbuf);
      break;
    default: rows_q4(&a, r0, r1, tbuf);
    }
  }
}

/* panel_rows with the part's type made a constant. */
static void run_panel(const gguf_job *job, int64_t p, int64_t r0, int64_t r1, float *tbuf,
                      const int16_t *sums, unpacked *U) {
  const gguf_part *part = gguf_part_of(job, p);
#define TYPE_CASE(t)                                                                               \
  case t: panel_rows(t, job, part, p, r0, r1, tbuf, sums, U); break;
  switch (part->type) {
  GGUF_TYPES(TYPE_CASE)
  default: break;
  }
#undef TYPE_CASE
}

/* gguf_x86.h's decode_store. */
static ALWAYS_INLINE void decode_store(const int mr, const int np, const gguf_job *job,
                                       const gguf_part *part, int64_t p, int64_t stride,
                                       int64_t r0, gguf_decode_t t) {
  for (int q = 0; q < np; q++) {
    const int64_t lp = p + q * stride - part->panel0;
    const int64_t col = part->col0 + lp * PANEL, nv = part->rows - lp * PANEL;
    const __m256i mask = armllm_avx2_tail_mask(nv < PANEL ? nv : PANEL);
    const __m256 bv =
        job->bias ? _mm256_maskload_ps(job->bias + col, mask) : _mm256_setzero_ps();
    for (int r = 0; r < mr; r++) {
      __m256 v = t[q][r];
      if (job->bias) v = _mm256_add_ps(v, bv);
      _mm256_maskstore_ps(job->y + (r0 + r) * job->ldy + col, mask, v);
    }
  }
}

/* The bytes u of group gi of a decode chunk, as `pass` says (GGUF_PASS_*):
 * unpacked from wg (prefetching ahead in the stream w) and kept, or read back
 * from kept. */
static ALWAYS_INLINE void decode_unpack(const int type, const int pass, prefetch_spread pfs,
                                        const uint8_t *w, int64_t gi, const uint8_t *wg,
                                        uint8_t kept[][GGUF_VEC], __m256i *u) {
  if (pass == GGUF_PASS_REUSE) {
    for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm256_load_si256((const __m256i *)kept[s]);
    return;
  }
  if (pass != GGUF_PASS_AGAIN) prefetch_piece(pfs, w, gi, PF_BYTES);
  unpack_group(type, wg, u);
  if (pass == GGUF_PASS_KEEP)
    for (int s = 0; s < GGUF_STEPS; s++) _mm256_store_si256((__m256i *)kept[s], u[s]);
}

/* decode_chunk of a super-block type: each row's isum in int32, then one
 * epilogue (with the linear term's 8 madds). */
static ALWAYS_INLINE void decode_super(const int type, const int mr, const int np, const int pass,
                                       const gguf_job *job, const uint8_t *const *w, int64_t c,
                                       int64_t r0, const int16_t *sums, gguf_decode_u *ub,
                                       __m256 t[][GGUF_DECODE_ROWS]) {
  const int gl = armllm_gguf_group_len(type), offs = armllm_gguf_has_offsets(type);
  const int sgn = signed_type(type), lin = super_lin(type), bias = sgn ? 0 : gguf_bias(type);
  const int run = chain_steps(type) < gl / 4 ? chain_steps(type) : gl / 4;
  const int64_t ldq = job->ldq, k0 = c * GGUF_CHUNK_COLS;
  const int64_t gbytes = PANEL * gguf_group_row_bytes(type);
  const prefetch_spread pfs =
      prefetch_spread_of(gguf_chunk_bytes(type, GGUF_CHUNK_GROUPS), GGUF_CHUNK_GROUPS);
  __m256i isum[GGUF_DECODE_STREAMS][GGUF_DECODE_ROWS];
  for (int q = 0; q < np; q++)
    for (int r = 0; r < mr; r++) isum[q][r] = _mm256_setzero_si256();
  for (int gi = 0; gi < GGUF_CHUNK_GROUPS; gi++) {
    for (int q = 0; q < np; q++) {
      const uint8_t *wg = w[q] + gi * gbytes, *sc = w[q] + gbytes * GGUF_CHUNK_GROUPS;
      __m256i u[GGUF_STEPS];
      decode_unpack(type, pass, pfs, w[q], gi, wg, ub->u[q][gi], u);
      for (int h = 0; h < GGUF_GROUP / gl; h++) {
        const int s0 = h * (gl / 4);
        const __m256i s16 = dup16(sub_scale(type, sc, 2 * gi + h));
        for (int r = 0; r < mr; r++) {
          const int8_t *xr = job->xq + (r0 + r) * ldq + k0 + 32 * gi;
          if (sgn)
            for (int s = s0; s < s0 + gl / 4; s++)
              isum[q][r] = sdot_sign(isum[q][r], u[s], _mm256_abs_epi8(u[s]), xr + 4 * s, s16);
          else
            for (int s = s0; s < s0 + gl / 4; s += run)
              isum[q][r] = sdot_run(isum[q][r], &u[s], run, xr + 4 * s, s16);
        }
      }
    }
  }
  for (int q = 0; q < np; q++) {
    const uint8_t *sc = w[q] + gbytes * GGUF_CHUNK_GROUPS;
    const __m256 sd = f16x8(sc), so = offs ? f16x8(sc + 2 * PANEL) : _mm256_setzero_ps();
    __m256i l[GGUF_DECODE_ROWS];
    for (int r = 0; r < mr; r++) l[r] = _mm256_setzero_si256();
    if (lin)
      for (int i = 0; i < lin_pairs(type); i++) {
        const __m256i cp = lin_pair(type, sc, i);
        for (int r = 0; r < mr; r++)
          l[r] = _mm256_add_epi32(
              l[r], _mm256_madd_epi16(cp, xpair(gl, offs, job, sums, r0 + r, r0 + r, k0, i)));
      }
    for (int r = 0; r < mr; r++)
      t[q][r] = super_epilogue(offs, bias, isum[q][r], l[r],
                               job->scale[(r0 + r) * job->ldsc + c], sd, so, t[q][r]);
  }
}

/* gguf_x86.h's decode_chunk: each group unpacked into registers and met by
 * every row of the pass at once. */
static ALWAYS_INLINE void decode_chunk(const int type, const int mr, const int np, const int pass,
                                       const gguf_job *job, const uint8_t *const *w, int64_t c,
                                       int64_t r0, const int16_t *sums, gguf_decode_u *ub,
                                       gguf_decode_t tio) {
  __m256 t[GGUF_DECODE_STREAMS][GGUF_DECODE_ROWS];
  for (int q = 0; q < np; q++)
    for (int r = 0; r < mr; r++) t[q][r] = tio[q][r];
  if (armllm_gguf_is_super(type)) {
    decode_super(type, mr, np, pass, job, w, c, r0, sums, ub, t);
  } else {
    const int offs = armllm_gguf_has_offsets(type);
    const int sgn = signed_type(type), bias = sgn ? 0 : gguf_bias(type);
    const int run = chain_steps(type);
    const int64_t ldq = job->ldq, ngr = gguf_chunk_groups(job->k, c);
    const int64_t gbytes = PANEL * gguf_group_row_bytes(type);
    const int8_t *x = job->xq + r0 * ldq;
    const prefetch_spread pfs = prefetch_spread_of(gguf_chunk_bytes(type, ngr), ngr);
    for (int64_t gi = 0; gi < ngr; gi++) {
      const int64_t g = c * GGUF_CHUNK_GROUPS + gi, k0 = g * GGUF_GROUP;
      int32_t xs[GGUF_DECODE_ROWS]; /* sum of x over the group */
      float sx[GGUF_DECODE_ROWS];
      for (int r = 0; r < mr; r++) {
        xs[r] = gguf_xsum(job, sums, r0 + r, r0 + r, 2 * g, 2);
        sx[r] = gguf_sx(job, r0 + r, g);
      }
      for (int q = 0; q < np; q++) {
        const uint8_t *wg = w[q] + gi * gbytes, *sc = w[q] + gbytes * ngr;
        __m256i u[GGUF_STEPS];
        decode_unpack(type, pass, pfs, w[q], gi, wg, ub->u[q][gi], u);
        __m256 d, o = _mm256_setzero_ps();
        group_scales(type, sc, ngr, gi, &d, &o);
        for (int r = 0; r < mr; r++) {
          const int8_t *xr = x + r * ldq + k0;
          __m256i acc = _mm256_set1_epi32(-bias * xs[r]);
          if (sgn)
            for (int s = 0; s < GGUF_STEPS; s++)
              acc = dot_sign(acc, u[s], _mm256_abs_epi8(u[s]), xr + 4 * s);
          else
            for (int s = 0; s < GGUF_STEPS; s += run) acc = dot_run(acc, &u[s], run, xr + 4 * s);
          const __m256 av =
              no_contract(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(sx[r])));
          t[q][r] = _mm256_fmadd_ps(d, av, t[q][r]);
          if (offs)
            t[q][r] = _mm256_fmadd_ps(o, _mm256_set1_ps((float)xs[r] * sx[r]), t[q][r]);
        }
      }
    }
  }
  for (int q = 0; q < np; q++)
    for (int r = 0; r < mr; r++) tio[q][r] = t[q][r];
}

/* ------------------------------------------------------------ plans */

ARMLLM_X86_GGUF_PACKING(armllm_avx2)

/* Prefill item i: row block i / n_pc times panel chunk i % n_pc. */
static void prefill_task(void *ctx, int64_t i0, int64_t i1) {
  const gguf_job *job = ctx;
  unpacked U;
  float tbuf[MB_MAX * TBUF_LD] __attribute__((aligned(32)));
  int16_t sums[GGUF_SUMS_CAP];
  for (int64_t i = i0; i < i1; i++) {
    const int64_t rb = i / job->n_pc, pc = i % job->n_pc;
    const int64_t r0 = rb * job->mb, r1 = r0 + job->mb < job->m ? r0 + job->mb : job->m;
    const int64_t p0 = pc * job->cp, p1 = p0 + job->cp < job->panels ? p0 + job->cp : job->panels;
    if (job->sums) gguf_sums16(job, r0, r1, sums);
    for (int64_t p = p0; p < p1; p++) run_panel(job, p, r0, r1, tbuf, job->sums ? sums : NULL, &U);
  }
}

/* Runs a gemm_gguf job (the whole call's or a column window's) on the pool. */
static void gguf_run(armllm_pool *pool, gguf_job *job) {
  if (job->m <= GGUF_DECODE_MAX_M) {
    gguf_run_decode(pool, job, gguf_decode_task);
    return;
  }
  gguf_run_prefill(pool, job, MB_MAX, MR, ITEMS_PER_THREAD, prefill_task);
}

void armllm_avx2_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                           int64_t ldq, const float *scale, int64_t ldsc, const int32_t *gsum,
                           int64_t ldgs, const void *packed_w, int64_t n, const float *bias,
                           float *y, int64_t ldy) {
  (void)n;
  gguf_job job = gguf_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, bias, y, ldy);
  gguf_run(pool, &job);
}

void armllm_avx2_gemm_gguf_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                const float *scale, int64_t ldsc, const int32_t *gsum,
                                int64_t ldgs, const void *packed_w, int64_t n, int64_t n0,
                                int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)n;
  gguf_job job = gguf_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, bias, y, ldy);
  gguf_job_window(&job, n0, n1);
  gguf_run(NULL, &job);
}
