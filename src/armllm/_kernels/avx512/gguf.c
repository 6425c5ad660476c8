/* avx512/gguf.c: the GGUF-block GEMM (armllm_kernels.h) with AVX512_VNNI's
 * vpdpbusd: the weights stay at their stored bit width in memory and are
 * unpacked to unsigned bytes u = v + bias in registers (decode) or one
 * 256-column chunk of a panel at a time into L1, for every row tile to reuse
 * (prefill).
 *
 * Packed layout "gguf-nr16c256": the armllm_gguf_parts header (64 bytes),
 * then each part's panels of 16 output rows (the last padded with zeros),
 * each panel its chunks of 256 columns (a 32-element type's last chunk may
 * have fewer 32-column groups: ngr <= 8), each chunk padded to 64 bytes:
 *   values, group after group (a "vector" is 64 bytes: byte 4r + j belongs
 *   to row r of the panel; "column c" is column c of the 32-column group;
 *   u = v + bias, bias 8 for Q4_0, 16 Q5_0, 4 Q3_K, 32 Q6_K, 128 Q8_0,
 *   IQ4 and MXFP4 (whose u is the code book index here), else 0):
 *     nibbles (Q4_*, IQ4_*, MXFP4, low 4 bits of Q5_*, Q6_K): 4 vectors, vector i
 *       byte 4r + j: u of column 8i + j in the low nibble, 8i + 4 + j high;
 *     Q5_*: the nibbles, then 1 vector: byte 4r + j bit s = bit 4 of u at
 *       column 4s + j;
 *     Q8_0: 8 vectors, vector s byte 4r + j = u at column 4s + j;
 *     Q2_K: 2 vectors, vector i byte 4r + j bits 2t, 2t+1 = u at column
 *       4(4i + t) + j;  Q3_K: the same of u & 3, then 1 vector as Q5's of
 *       bit 2 (ggml's hmask bit);  Q6_K: the nibbles, then 2 vectors as
 *       Q2_K's of u >> 4;
 *   scales (16 rows each, f16 fields copied from the file, exact):
 *     Q4_0, Q5_0, Q8_0, IQ4_NL: d f16[ngr][16];  Q4_1, Q5_1: the same, then
 *       m f16[ngr][16];
 *     Q4_K, Q5_K: d f16[16], -dmin f16[16], sc u8[8][16], m u8[8][16];
 *     Q2_K: d f16[16], -dmin f16[16], the file's scale bytes u8[16][16];
 *     Q3_K: d f16[16], sc - 32 i8[16][16];  Q6_K: d f16[16], sc i8[16][16];
 *     IQ4_XS: d f16[16], ls - 32 i8[8][16];  MXFP4: e8m0 e u8[ngr][16].
 * Per row that is the file's bytes or within 6% (Q2_K, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, IQ4_NL: the same; Q4_K 148/144, Q5_K 180/176, Q3_K 116/110,
 * Q6_K 212/210, IQ4_XS 140/136 bytes per 256 columns).
 *
 * Each group's sum x.v is vpdpbusd(u, x) started from -bias * sum(x) (the
 * group's gsum, or x's 16-column sums: gguf_sums16), exact in int32; the
 * prefill tiles of Q3_K and Q6_K start from 0 and take their bias term off
 * once a super-block instead (lin_terms). A
 * 32-element block's float epilogue follows (its f16 d, m); a super-block
 * type's group sums are multiplied by their integer sub-scales (vpmulld)
 * into the block's isum, its mins' msum is a dpwssd of min pairs by x's sum
 * pairs (4 for Q4_K's and Q5_K's 32-column mins, 8 for Q2_K's: gguf_lin_pairs),
 * and one float epilogue per 256 columns follows. The float epilogue
 * is the header's, lane-wise: every result is ref's.
 *
 * Plans: decode (M <= GGUF_DECODE_MAX_M = 8) streams the panels, each thread
 * a contiguous run cut into GGUF_DECODE_STREAMS runs read in lockstep
 * (prefetched ahead), each group unpacked into registers and met by every row
 * of a pass at once (one pass of up to 4 rows, t in registers over the whole
 * of K; two passes over each L1-resident chunk above: gguf_x86.h's
 * decode_panels); prefill cuts M into row blocks of up to
 * MB_MAX rows and N into chunks of panels, and for each panel pair
 * (same part) and 256-column chunk unpacks once and runs every row tile of
 * MR rows x 2 panels over it (t waits in a stack buffer between chunks).
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../cpu.h"
#include "../gguf_blocks.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PANEL 16 /* output rows per panel: one int32 / f32 lane each */
#define MR 6     /* prefill tile rows: 2 * 6 * 2 accumulators and t, 24 of the 32 zmm */
#define MAX_NC 2 /* panels per tile */
#define MB_MAX 258 /* rows per prefill block (a multiple of MR): its t on the stack */
_Static_assert(MB_MAX % MR == 0, "row blocks are whole tiles");
#define ITEMS_PER_THREAD 4 /* prefill items a thread: evens out uneven progress */
#define PF_BYTES 2048      /* prefill: software prefetch distance in the panel stream */
#define DECODE_PF_BYTES 4096 /* decode: the same in each stream (1B chain, Xeon: 2 KiB 7-15% slower;
                                Zen 5: 2 KiB slower, 8 KiB no faster) */
/* panels a decode thread reads at once: on the 1B Q4_K_M chain at M 1, a Xeon
 * read 14% faster with 2 than with 1 (4: 18%); Zen 5 30-40% slower with 4
 * than with 2, and 2 as fast as 1; Zen 4 4-5% faster with 1, which it takes
 * (armllm_x86_decode_streams, cpu.h) */
#define GGUF_DECODE_STREAMS 2
#define GGUF_DECODE_ONE_STREAM() (armllm_x86_decode_streams() == 1)
#define GGUF_VF __m512
#define GGUF_VF_ZERO _mm512_setzero_ps
#define TBUF_LD (MAX_NC * PANEL)

#include "../gguf_x86.h"

static ALWAYS_INLINE __m512 no_contract(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

/* ------------------------------------------------------------ unpacking */

/* A chunk of a panel as the tiles read it: u[8 gi + s] the unsigned bytes of
 * group gi, step s (columns 4s .. 4s+4 of each row, vpdpbusd's operand), and
 * a 32-element type's d, o of block gi. */
typedef struct {
  __m512i u[GGUF_CHUNK_GROUPS * GGUF_STEPS];
  float d[GGUF_CHUNK_GROUPS][PANEL];
  float o[GGUF_CHUNK_GROUPS][PANEL];
  /* super-block types: each 16 columns' integer sub-scale, the int16 pairs
   * a dpwssd by x's sum pairs turns into the block's linear term (the mins'
   * min_pair32 or min_pair; Q3_K's and Q6_K's sub-scales, for their bias:
   * lin_terms), gguf_lin_pairs of them, the block's D and O */
  __m512i s32[2 * GGUF_CHUNK_GROUPS];
  __m512i pairs[GGUF_CHUNK_GROUPS];
  __m512 sd, so;
} unpacked;

static ALWAYS_INLINE void nibbles(const uint8_t *p, __m512i *u) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int i = 0; i < 4; i++) {
    const __m512i v = _mm512_loadu_si512(p + GGUF_VEC * i);
    u[2 * i] = _mm512_and_si512(v, low4);
    u[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  }
}

/* u[s] += `bit` where bit s of the plane's byte is set. */
static ALWAYS_INLINE void add_plane1(const uint8_t *p, __m512i *u, int bit) {
  const __m512i h = _mm512_loadu_si512(p), add = _mm512_set1_epi8((char)bit);
  for (int s = 0; s < GGUF_STEPS; s++) {
    const __mmask64 set = _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << s)));
    u[s] = _mm512_mask_add_epi8(u[s], set, u[s], add);
  }
}

/* u[s] = the 2-bit field of step s (Q2_K, Q3_K's low bits). */
static ALWAYS_INLINE void plane2(const uint8_t *p, __m512i *u) {
  const __m512i low2 = _mm512_set1_epi8(3);
  for (int i = 0; i < 2; i++) {
    const __m512i h = _mm512_loadu_si512(p + GGUF_VEC * i);
    u[4 * i] = _mm512_and_si512(h, low2);
    u[4 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(h, 2), low2);
    u[4 * i + 2] = _mm512_and_si512(_mm512_srli_epi16(h, 4), low2);
    u[4 * i + 3] = _mm512_and_si512(_mm512_srli_epi16(h, 6), low2);
  }
}

/* u[s] |= the 2-bit field of step s << 4 (Q6_K's high bits). */
static ALWAYS_INLINE void or_plane2_high(const uint8_t *p, __m512i *u) {
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  for (int i = 0; i < 2; i++) {
    const __m512i h = _mm512_loadu_si512(p + GGUF_VEC * i);
    const __m512i f[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h,
                          _mm512_srli_epi16(h, 2)};
    for (int t = 0; t < 4; t++) /* 0xf8: a | (b & c) */
      u[4 * i + t] = _mm512_ternarylogic_epi32(u[4 * i + t], f[t], bits45, 0xf8);
  }
}

static ALWAYS_INLINE __m512 f16x16(const uint8_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static ALWAYS_INLINE __m512i u8x16(const uint8_t *p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static ALWAYS_INLINE __m512i s8x16(const uint8_t *p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* The integer sub-scale s of 16-column group j (0 .. 15) of a super-block
 * chunk whose scales are at sc, one per row (gguf_blocks.h's s). */
static ALWAYS_INLINE __m512i sub_scale(const int type, const uint8_t *sc, int j) {
  switch (type) {
  case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K: return u8x16(sc + (4 + j / 2) * PANEL);
  case ARMLLM_GGML_Q2_K:
    return _mm512_and_si512(u8x16(sc + (4 + j) * PANEL), _mm512_set1_epi32(15));
  case ARMLLM_GGML_IQ4_XS: return s8x16(sc + (2 + j / 2) * PANEL);
  default: return s8x16(sc + (2 + j) * PANEL); /* Q3_K, Q6_K */
  }
}

/* The min m of 16-column group j (Q2_K, Q4_K, Q5_K). */
static ALWAYS_INLINE __m512i sub_min(const int type, const uint8_t *sc, int j) {
  if (type == ARMLLM_GGML_Q2_K) return _mm512_srli_epi32(u8x16(sc + (4 + j) * PANEL), 4);
  return u8x16(sc + (12 + j / 2) * PANEL);
}

/* The int16 pair [a, b] of each lane's low halves. */
static ALWAYS_INLINE __m512i pair16(__m512i a, __m512i b) {
  return _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(b, 16));
}

/* The int16 pair [m_2i, m_2i+1] of each row: madd by x's sum pair of the
 * same two 16-column groups (gguf_xpair) gives both terms of msum. */
static ALWAYS_INLINE __m512i min_pair(const int type, const uint8_t *sc, int i) {
  return pair16(sub_min(type, sc, 2 * i), sub_min(type, sc, 2 * i + 1));
}

/* Q4_K and Q5_K (one min per 32 columns): the int16 pair [m_2i, m_2i+1] of
 * each row, two sub-blocks' mins (stored as two runs of 16 bytes, one per
 * row): dpwssd by x's 32-column sum pair (gguf_xpair32) gives both terms of
 * msum, 4 a super-block instead of min_pair's 8 */
static ALWAYS_INLINE __m512i min_pair32(const uint8_t *sc, int i) {
  const __m256i bytes = _mm256_loadu_si256((const __m256i *)(sc + (12 + 2 * i) * PANEL));
  const __m512i runs = _mm512_cvtepu8_epi16(bytes);
  const __m512i rows_interleaved =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(rows_interleaved, runs);
}

/* Q3_K and Q6_K (16-column groups, u = v + bias): the prefill tiles sum
 * u.x from 0 and take bias * sum_j s_j xs_j off the block's isum once, from
 * the sub-scales' pairs (unpack_chunk) by x's sum pairs, instead of starting
 * each group's sum at -bias * xs_j: the same integer. */
static ALWAYS_INLINE int lin_terms(const int type) {
  return type == ARMLLM_GGML_Q3_K || type == ARMLLM_GGML_Q6_K;
}

/* t + a super-block's epilogue: isum and, with offsets, msum times the
 * block's activation scale sx, by D and O. */
static ALWAYS_INLINE __m512 super_epilogue(const int offs, __m512i isum, __m512i msum, float sx,
                                           __m512 sd, __m512 so, __m512 t) {
  const __m512 vsx = _mm512_set1_ps(sx);
  t = _mm512_fmadd_ps(sd, no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), vsx)), t);
  if (offs) t = _mm512_fmadd_ps(so, no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(msum), vsx)), t);
  return t;
}

/* The unsigned bytes u[0 .. 8) of one group at p (the layout above). */
static ALWAYS_INLINE void unpack_group(const int type, const uint8_t *p, __m512i *u) {
  /* IQ4's code book + 128, in every 128-bit lane (vpshufb looks up per lane) */
  const __m512i iq4 = _mm512_broadcast_i32x4(
      _mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166,
                    (char)181, (char)197, (char)217, (char)241));
  switch (type) {
  case ARMLLM_GGML_Q8_0:
    for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm512_loadu_si512(p + GGUF_VEC * s);
    break;
  case ARMLLM_GGML_Q2_K:
    plane2(p, u);
    break;
  case ARMLLM_GGML_Q3_K:
    plane2(p, u);
    add_plane1(p + 2 * GGUF_VEC, u, 4);
    break;
  case ARMLLM_GGML_Q6_K:
    nibbles(p, u);
    or_plane2_high(p + 4 * GGUF_VEC, u);
    break;
  case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: case ARMLLM_GGML_Q5_K:
    nibbles(p, u);
    add_plane1(p + 4 * GGUF_VEC, u, 16);
    break;
  case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_IQ4_XS:
    nibbles(p, u);
    for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm512_shuffle_epi8(iq4, u[s]);
    break;
  case ARMLLM_GGML_MXFP4: {
    /* MXFP4's doubled e2m1 values + 128 */
    const __m512i book = _mm512_broadcast_i32x4(
        _mm_setr_epi8((char)128, (char)129, (char)130, (char)131, (char)132, (char)134,
                      (char)136, (char)140, (char)128, 127, 126, 125, 124, 122, 120, 116));
    nibbles(p, u);
    for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm512_shuffle_epi8(book, u[s]);
    break;
  }
  default:
    nibbles(p, u);
  }
}

/* d and o (Q4_1, Q5_1) of 32-element block gi of a chunk of ngr groups
 * whose scales are at sc: the file's f16 fields, exact. */
static ALWAYS_INLINE void group_scales(const int type, const uint8_t *sc, int64_t ngr, int64_t gi,
                                       __m512 *d, __m512 *o) {
  if (type == ARMLLM_GGML_MXFP4) { /* d = 2^(e - 128): gguf_blocks.h's armllm_mxfp4_d_bits */
    const __m512i e = u8x16(sc + PANEL * gi), one = _mm512_set1_epi32(1);
    __m512i bits = _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)),
                                 _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                                 _mm512_set1_epi32(0x7fc00000));
    *d = _mm512_castsi512_ps(bits);
    return;
  }
  *d = f16x16(sc + 2 * PANEL * gi);
  if (type == ARMLLM_GGML_Q4_1 || type == ARMLLM_GGML_Q5_1) *o = f16x16(sc + 2 * PANEL * (ngr + gi));
}

/* Unpacks a chunk of ngr groups at w for the prefill tiles. */
static ALWAYS_INLINE void unpack_chunk(const int type, const uint8_t *w, int64_t ngr,
                                       unpacked *U) {
  const int64_t gbytes = PANEL * gguf_group_row_bytes(type);
  const uint8_t *sc = w + gbytes * ngr;
  for (int64_t gi = 0; gi < ngr; gi++) unpack_group(type, w + gi * gbytes, U->u + GGUF_STEPS * gi);
  if (armllm_gguf_is_super(type)) {
    for (int j = 0; j < 2 * GGUF_CHUNK_GROUPS; j++) U->s32[j] = sub_scale(type, sc, j);
    if (gguf_lin_pairs(armllm_gguf_group_len(type), armllm_gguf_has_offsets(type)) <
        GGUF_CHUNK_GROUPS) /* Q4_K, Q5_K */
      for (int i = 0; i < GGUF_CHUNK_GROUPS / 2; i++) U->pairs[i] = min_pair32(sc, i);
    else if (armllm_gguf_has_offsets(type))
      for (int i = 0; i < GGUF_CHUNK_GROUPS; i++) U->pairs[i] = min_pair(type, sc, i);
    if (lin_terms(type))
      for (int i = 0; i < GGUF_CHUNK_GROUPS; i++)
        U->pairs[i] = pair16(U->s32[2 * i], U->s32[2 * i + 1]);
    U->sd = f16x16(sc);
    U->so = armllm_gguf_has_offsets(type) ? f16x16(sc + 2 * PANEL) : _mm512_setzero_ps();
    return;
  }
  for (int64_t gi = 0; gi < ngr; gi++) {
    __m512 d, o = _mm512_setzero_ps();
    group_scales(type, sc, ngr, gi, &d, &o);
    _mm512_store_ps(U->d[gi], d);
    _mm512_store_ps(U->o[gi], o);
  }
}

/* ------------------------------------------------------------ tiles */

/* What a tile reads besides its rows: the unpacked chunk(s) of its panels. */
typedef struct {
  const gguf_job *job;
  const int16_t *sums;    /* the row block's 16-column sums (gguf_sums16), or NULL */
  int64_t row0;           /* the row block's first row */
  int bias;
  int64_t g0, ngr;        /* the chunk's first activation group, its groups */
  const unpacked *U;      /* one per panel */
  int first, last;        /* the chunk is K's first (t from +0) / last (t to y) */
  int64_t col, ncols;     /* the tile's first output column, its columns in N */
} tile_args;

/* The 4 activation bytes at p, in every lane. */
static ALWAYS_INLINE __m512i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

/* Rows r0 .. r0+mr of nc panels over one chunk: per weight group (gl 16 or
 * 32 columns) the int32 sums from -bias * sum(x), then the group's epilogue
 * (offs: with offsets), or for a super-block type (sup) the sums times their
 * sub-scales into isum and one epilogue for the chunk (Q3_K, Q6_K: the sums
 * from 0 and their bias term once, lin_terms). t comes from +0 or
 * tbuf (rows TBUF_LD apart) and goes to tbuf or, on K's last chunk, to y
 * (+ bias, masked to N). */
static ALWAYS_INLINE void tile(const int mr, const int nc, const int gl, const int offs,
                               const int sup, const tile_args *a, int64_t r0, float *tbuf) {
  const gguf_job *job = a->job;
  const int64_t ldq = job->ldq;
  const int8_t *x = job->xq + r0 * ldq;
  const int lin = sup && gl == 16 && !offs; /* Q3_K, Q6_K: lin_terms */
  /* the group sums start at -bias * xs: not with offsets (bias 0: gguf_bias) nor lin */
  const int biased = !offs && !lin;
  __m512 t[MR][MAX_NC];
  __m512i acc[MR][MAX_NC], isum[MR][MAX_NC];
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nc; c++) {
      isum[r][c] = _mm512_setzero_si512();
      if (!sup)
        t[r][c] = a->first ? _mm512_setzero_ps() : _mm512_load_ps(tbuf + r * TBUF_LD + c * PANEL);
    }
  for (int64_t gi = 0; gi < a->ngr; gi++) {
    const int64_t g = a->g0 + gi, k0 = g * GGUF_GROUP;
    int32_t xs[MR][2]; /* sum of x over each weight group of the 32 columns */
    float sx[MR];
    for (int r = 0; r < mr; r++) {
      for (int h = 0; h < GGUF_GROUP / gl; h++)
        xs[r][h] = biased || (offs && !sup)
                       ? gguf_xsum(job, a->sums, r0 + r - a->row0, r0 + r, 2 * g + h, gl / 16)
                       : 0;
      sx[r] = gguf_sx(job, r0 + r, g);
    }
    for (int h = 0; h < GGUF_GROUP / gl; h++) {
      const int s0 = h * (gl / 4), j = 2 * (int)gi + h;
      for (int r = 0; r < mr; r++) {
        const __m512i start =
            biased ? _mm512_set1_epi32(-a->bias * xs[r][h]) : _mm512_setzero_si512();
        for (int c = 0; c < nc; c++) acc[r][c] = start;
      }
#pragma GCC unroll 8
      for (int s = s0; s < s0 + gl / 4; s++) {
        __m512i w[MAX_NC];
        for (int c = 0; c < nc; c++) w[c] = _mm512_load_si512(&a->U[c].u[GGUF_STEPS * gi + s]);
        for (int r = 0; r < mr; r++) {
          const __m512i xb = bcast4(x + r * ldq + k0 + 4 * s);
          for (int c = 0; c < nc; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], w[c], xb);
        }
      }
      if (sup) {
        for (int r = 0; r < mr; r++)
          for (int c = 0; c < nc; c++)
            isum[r][c] = _mm512_add_epi32(
                isum[r][c], _mm512_mullo_epi32(acc[r][c], _mm512_load_si512(&a->U[c].s32[j])));
        continue;
      }
      for (int r = 0; r < mr; r++) {
        const __m512 vsx = _mm512_set1_ps(sx[r]);
        const __m512 b = _mm512_set1_ps((float)xs[r][h] * sx[r]);
        for (int c = 0; c < nc; c++) {
          const __m512 av = no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][c]), vsx));
          __m512 v = _mm512_fmadd_ps(_mm512_load_ps(a->U[c].d[gi]), av, t[r][c]);
          if (offs) v = _mm512_fmadd_ps(_mm512_load_ps(a->U[c].o[gi]), b, v);
          t[r][c] = v;
        }
      }
    }
  }
  if (sup) /* the super-block's epilogue: the chunk is one block */
    for (int r = 0; r < mr; r++) {
      const int64_t rl = r0 + r - a->row0;
      __m512i xp[GGUF_CHUNK_GROUPS];
      if (offs || lin)
        for (int i = 0; i < gguf_lin_pairs(gl, offs); i++)
          xp[i] = _mm512_set1_epi32(
              gguf_lin_xpair(gl, offs, job, a->sums, rl, r0 + r, 2 * a->g0, i));
      const float sx = gguf_sx(job, r0 + r, a->g0);
      for (int c = 0; c < nc; c++) {
        __m512i lsum = _mm512_setzero_si512(); /* the mins' msum, or sum_j s_j xs_j */
        if (offs || lin)
          for (int i = 0; i < gguf_lin_pairs(gl, offs); i++)
            lsum = _mm512_dpwssd_epi32(lsum, _mm512_load_si512(&a->U[c].pairs[i]), xp[i]);
        if (lin)
          isum[r][c] = _mm512_sub_epi32(isum[r][c],
                                        _mm512_mullo_epi32(lsum, _mm512_set1_epi32(a->bias)));
        const __m512 t0 =
            a->first ? _mm512_setzero_ps() : _mm512_load_ps(tbuf + r * TBUF_LD + c * PANEL);
        t[r][c] = super_epilogue(offs, isum[r][c], lsum, sx, a->U[c].sd, a->U[c].so, t0);
      }
    }
  if (!a->last) {
    for (int r = 0; r < mr; r++)
      for (int c = 0; c < nc; c++) _mm512_store_ps(tbuf + r * TBUF_LD + c * PANEL, t[r][c]);
    return;
  }
  for (int c = 0; c < nc; c++) { /* y = t (+ bias), masked to N */
    const int64_t col = a->col + c * PANEL, nv = a->ncols - c * PANEL;
    if (nv <= 0) break;
    const __mmask16 mask = nv >= PANEL ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
    const __m512 bias =
        job->bias ? _mm512_maskz_loadu_ps(mask, job->bias + col) : _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) {
      __m512 v = t[r][c];
      if (job->bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(job->y + (r0 + r) * job->ldy + col, mask, v);
    }
  }
}

/* A tile of mr (1 .. MR) rows and nc (1, 2) panels, both made constants. */
static ALWAYS_INLINE void tile_any(const int gl, const int offs, const int sup,
                                   const tile_args *a, int64_t r0, int64_t mr, int nc,
                                   float *tbuf) {
#define TILE_NC(m)                                                                                 \
  if (nc == 2) tile(m, 2, gl, offs, sup, a, r0, tbuf);                                             \
  else tile(m, 1, gl, offs, sup, a, r0, tbuf);                                                     \
  break;
  switch (mr) {
  case 1: TILE_NC(1)
  case 2: TILE_NC(2)
  case 3: TILE_NC(3)
  case 4: TILE_NC(4)
  case 5: TILE_NC(5)
  default: TILE_NC(6)
  }
#undef TILE_NC
}

/* Rows [r0, r1) of a chunk in tiles of MR; t rows of tbuf follow the rows. */
static ALWAYS_INLINE void row_tiles(const int gl, const int offs, const int sup,
                                    const tile_args *a, int64_t r0, int64_t r1, int nc,
                                    float *tbuf) {
  for (int64_t r = r0; r < r1; r += MR) {
    const int64_t mr = r1 - r < MR ? r1 - r : MR;
    tile_any(gl, offs, sup, a, r, mr, nc, tbuf + (r - r0) * TBUF_LD);
  }
}

/* One function per kind of chunk: 32-element groups with or without
 * offsets; super-blocks of 16- or 32-column groups, with or without mins. */
#define ROWS_FN(name, gl, offs, sup)                                                               \
  static __attribute__((noinline)) void name(const tile_args *a, int64_t r0, int64_t r1, int nc,  \
                                             float *tbuf) {                                        \
    row_tiles(gl, offs, sup, a, r0, r1, nc, tbuf);                                                \
  }
ROWS_FN(rows_g32, 32, 0, 0)  /* Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 */
ROWS_FN(rows_g32o, 32, 1, 0) /* Q4_1, Q5_1 */
ROWS_FN(rows_s16, 16, 0, 1)  /* Q3_K, Q6_K */
ROWS_FN(rows_s16o, 16, 1, 1) /* Q2_K */
ROWS_FN(rows_s32, 32, 0, 1)  /* IQ4_XS */
ROWS_FN(rows_s32o, 32, 1, 1) /* Q4_K, Q5_K */
#undef ROWS_FN

/* Rows [r0, r1) of panels p .. p+nc (one part), the whole of K: chunk by
 * chunk, each unpacked once for every row tile. */
static ALWAYS_INLINE void panels_rows(const int type, const gguf_job *job, const gguf_part *part,
                                      int64_t p, int nc, int64_t r0, int64_t r1, float *tbuf,
                                      const int16_t *sums, unpacked *U) {
  const int64_t k = job->k, nch = gguf_chunks(k), lp = p - part->panel0;
  const int64_t ncols = part->rows - lp * PANEL;
  tile_args a = {.job = job, .sums = sums, .row0 = r0, .bias = gguf_bias(type), .U = U,
                 .col = part->col0 + lp * PANEL, .ncols = ncols < nc * PANEL ? ncols : nc * PANEL};
  const uint8_t *w = part->w + lp * part->pbytes;
  for (int64_t c = 0; c < nch; c++) {
    const int64_t ngr = gguf_chunk_groups(k, c), cbytes = gguf_chunk_bytes(type, ngr);
    for (int i = 0; i < nc; i++) {
      const uint8_t *wc = w + i * part->pbytes;
      for (int64_t off = 0; off < cbytes; off += PREFETCH_LINE)
        _mm_prefetch((const char *)wc + PF_BYTES + off, _MM_HINT_T0);
      unpack_chunk(type, wc, ngr, &U[i]);
    }
    w += cbytes;
    a.g0 = c * GGUF_CHUNK_GROUPS;
    a.ngr = ngr;
    a.first = c == 0;
    a.last = c == nch - 1;
    switch (type) {
    case ARMLLM_GGML_Q2_K: rows_s16o(&a, r0, r1, nc, tbuf); break;
    case ARMLLM_GGML_Q3_K: case ARMLLM_GGML_Q6_K: rows_s16(&a, r0, r1, nc, tbuf); break;
    case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K: rows_s32o(&a, r0, r1, nc, tbuf); break;
    case ARMLLM_GGML_IQ4_XS: rows_s32(&a, r0, r1, nc, tbuf); break;
    case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_1: rows_g32o(&a, r0, r1, nc, tbuf); break;
    default: rows_g32(&a, r0, r1, nc, tbuf);
    }
  }
}

/* panels_rows with the part's type made a constant. */
static void run_panels(const gguf_job *job, int64_t p, int nc, int64_t r0, int64_t r1,
                       float *tbuf, const int16_t *sums, unpacked *U) {
  const gguf_part *part = gguf_part_of(job, p);
#define TYPE_CASE(t)                                                                               \
  case t: panels_rows(t, job, part, p, nc, r0, r1, tbuf, sums, U); break;
  switch (part->type) {
  GGUF_TYPES(TYPE_CASE)
  default: break;
  }
#undef TYPE_CASE
}

/* Decode (gguf_x86.h's decode_chunk): each group unpacked into registers and
 * met by every row of the pass at once. */
static ALWAYS_INLINE void decode_chunk(const int type, const int mr, const int np, const int pass,
                                       const gguf_job *job, const uint8_t *const *w, int64_t c,
                                       int64_t r0, const int16_t *sums, gguf_decode_u *ub,
                                       gguf_decode_t tio) {
  const int gl = armllm_gguf_group_len(type), offs = armllm_gguf_has_offsets(type);
  const int bias = gguf_bias(type), sup = armllm_gguf_is_super(type);
  /* plain nibbles (the even steps low, the odd high, summed apart): the high
   * ones are used as stored, one shift a group instead of one a vector */
  const int high16 =
      type == ARMLLM_GGML_Q4_0 || type == ARMLLM_GGML_Q4_1 || type == ARMLLM_GGML_Q4_K;
  const int64_t ldq = job->ldq, ngr = gguf_chunk_groups(job->k, c);
  const int64_t gbytes = PANEL * gguf_group_row_bytes(type);
  const int8_t *x = job->xq + r0 * ldq;
  /* a super-block type's chunks are whole (K a multiple of 256): its spread a constant */
  const prefetch_spread pfs =
      sup ? prefetch_spread_of(gguf_chunk_bytes(type, GGUF_CHUNK_GROUPS), GGUF_CHUNK_GROUPS)
          : prefetch_spread_of(gguf_chunk_bytes(type, ngr), ngr);
  __m512 t[GGUF_DECODE_STREAMS][GGUF_DECODE_ROWS];
  __m512i isum[GGUF_DECODE_STREAMS][GGUF_DECODE_ROWS];
  for (int q = 0; q < np; q++)
    for (int r = 0; r < mr; r++) {
      t[q][r] = tio[q][r];
      isum[q][r] = _mm512_setzero_si512();
    }
  for (int64_t gi = 0; gi < ngr; gi++) {
    const int64_t g = c * GGUF_CHUNK_GROUPS + gi, k0 = g * GGUF_GROUP;
    int32_t xs[GGUF_DECODE_ROWS][2]; /* sum of x over each weight group of the 32 columns */
    float sx[GGUF_DECODE_ROWS];
    for (int r = 0; r < mr; r++) {
      for (int h = 0; h < GGUF_GROUP / gl; h++)
        xs[r][h] = gguf_xsum(job, sums, r0 + r, r0 + r, 2 * g + h, gl / 16);
      sx[r] = gguf_sx(job, r0 + r, g);
    }
    for (int q = 0; q < np; q++) {
      const uint8_t *wg = w[q] + gi * gbytes, *sc = w[q] + gbytes * ngr;
      uint8_t(*kept)[GGUF_VEC] = ub->u[q][gi];
      __m512i u[GGUF_STEPS];
      if (pass == GGUF_PASS_REUSE) {
        for (int s = 0; s < GGUF_STEPS; s++) u[s] = _mm512_load_si512(kept[s]);
      } else {
        if (pass != GGUF_PASS_AGAIN) prefetch_piece(pfs, w[q], gi, DECODE_PF_BYTES);
        if (high16) /* odd steps keep their high nibbles in place: 16 u */
          for (int i = 0; i < 4; i++) {
            const __m512i v = _mm512_loadu_si512(wg + GGUF_VEC * i);
            u[2 * i] = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
            u[2 * i + 1] = _mm512_and_si512(v, _mm512_set1_epi8((char)0xf0));
          }
        else
          unpack_group(type, wg, u);
        if (pass == GGUF_PASS_KEEP)
          for (int s = 0; s < GGUF_STEPS; s++) _mm512_store_si512(kept[s], u[s]);
      }
      for (int h = 0; h < GGUF_GROUP / gl; h++) {
        const int s0 = h * (gl / 4);
        __m512 d, o = _mm512_setzero_ps();
        __m512i s32 = _mm512_setzero_si512();
        if (sup) s32 = sub_scale(type, sc, 2 * (int)gi + h);
        else group_scales(type, sc, ngr, gi, &d, &o);
        for (int r = 0; r < mr; r++) {
          const int8_t *xr = x + r * ldq + k0;
          /* two chains of vpdpbusd (even and odd steps): half the latency */
          __m512i acc = _mm512_set1_epi32(-bias * xs[r][h]), acc1 = _mm512_setzero_si512();
          for (int s = s0; s < s0 + gl / 4; s += 2) {
            acc = _mm512_dpbusd_epi32(acc, u[s], bcast4(xr + 4 * s));
            acc1 = _mm512_dpbusd_epi32(acc1, u[s + 1], bcast4(xr + 4 * s + 4));
          }
          /* 16 times the odd steps' sum, a multiple of 16: the shift is exact */
          acc = _mm512_add_epi32(acc, high16 ? _mm512_srai_epi32(acc1, 4) : acc1);
          if (sup) {
            isum[q][r] = _mm512_add_epi32(isum[q][r], _mm512_mullo_epi32(acc, s32));
            continue;
          }
          const __m512 av =
              no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(sx[r])));
          t[q][r] = _mm512_fmadd_ps(d, av, t[q][r]);
          if (offs)
            t[q][r] = _mm512_fmadd_ps(o, _mm512_set1_ps((float)xs[r][h] * sx[r]), t[q][r]);
        }
      }
    }
  }
  if (sup) { /* the super-block's epilogue: the chunk is one block */
    int32_t xp[GGUF_DECODE_ROWS][GGUF_CHUNK_GROUPS]; /* x's sum pairs for the mins */
    if (offs)
      for (int r = 0; r < mr; r++)
        for (int i = 0; i < gguf_lin_pairs(gl, offs); i++)
          xp[r][i] = gguf_lin_xpair(gl, offs, job, sums, r0 + r, r0 + r, 16 * c, i);
    for (int q = 0; q < np; q++) {
      const uint8_t *sc = w[q] + gbytes * ngr;
      const __m512 sd = f16x16(sc), so = offs ? f16x16(sc + 2 * PANEL) : _mm512_setzero_ps();
      for (int r = 0; r < mr; r++) {
        __m512i msum = _mm512_setzero_si512();
        if (offs)
          for (int i = 0; i < gguf_lin_pairs(gl, offs); i++)
            msum = _mm512_dpwssd_epi32(msum, gl == 32 ? min_pair32(sc, i) : min_pair(type, sc, i),
                                       _mm512_set1_epi32(xp[r][i]));
        t[q][r] = super_epilogue(offs, isum[q][r], msum, job->scale[(r0 + r) * job->ldsc + c], sd,
                                 so, t[q][r]);
      }
    }
  }
  for (int q = 0; q < np; q++)
    for (int r = 0; r < mr; r++) tio[q][r] = t[q][r];
}

/* gguf_x86.h's decode_store. */
static ALWAYS_INLINE void decode_store(const int mr, const int np, const gguf_job *job,
                                       const gguf_part *part, int64_t p, int64_t stride,
                                       int64_t r0, gguf_decode_t t) {
  for (int q = 0; q < np; q++) {
    const int64_t lp = p + q * stride - part->panel0;
    const int64_t col = part->col0 + lp * PANEL, nv = part->rows - lp * PANEL;
    const __mmask16 mask = nv >= PANEL ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
    const __m512 bv =
        job->bias ? _mm512_maskz_loadu_ps(mask, job->bias + col) : _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) {
      __m512 v = t[q][r];
      if (job->bias) v = _mm512_add_ps(v, bv);
      _mm512_mask_storeu_ps(job->y + (r0 + r) * job->ldy + col, mask, v);
    }
  }
}

/* ------------------------------------------------------------ plans */

ARMLLM_X86_GGUF_PACKING(armllm_avx512)

/* Prefill item i: row block i / n_pc times panel chunk i % n_pc, panel pair
 * by panel pair (a lone panel where a part ends). */
static void prefill_task(void *ctx, int64_t i0, int64_t i1) {
  const gguf_job *job = ctx;
  unpacked U[MAX_NC];
  float tbuf[MB_MAX * TBUF_LD] __attribute__((aligned(64)));
  int16_t sums[GGUF_SUMS_CAP];
  for (int64_t i = i0; i < i1; i++) {
    const int64_t rb = i / job->n_pc, pc = i % job->n_pc;
    const int64_t r0 = rb * job->mb, r1 = r0 + job->mb < job->m ? r0 + job->mb : job->m;
    const int64_t p0 = pc * job->cp, p1 = p0 + job->cp < job->panels ? p0 + job->cp : job->panels;
    if (job->sums) gguf_sums16(job, r0, r1, sums);
    for (int64_t p = p0; p < p1;) {
      const gguf_part *part = gguf_part_of(job, p);
      const int nc = p + 1 < p1 && p + 1 < part->panel0 + part->panels ? 2 : 1;
      run_panels(job, p, nc, r0, r1, tbuf, job->sums ? sums : NULL, U);
      p += nc;
    }
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

void armllm_avx512_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                             int64_t ldq, const float *scale, int64_t ldsc, const int32_t *gsum,
                             int64_t ldgs, const void *packed_w, int64_t n, const float *bias,
                             float *y, int64_t ldy) {
  (void)n;
  gguf_job job = gguf_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, bias, y, ldy);
  gguf_run(pool, &job);
}

void armllm_avx512_gemm_gguf_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                  const float *scale, int64_t ldsc, const int32_t *gsum,
                                  int64_t ldgs, const void *packed_w, int64_t n, int64_t n0,
                                  int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)n;
  gguf_job job = gguf_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, bias, y, ldy);
  gguf_job_window(&job, n0, n1);
  gguf_run(NULL, &job);
}
