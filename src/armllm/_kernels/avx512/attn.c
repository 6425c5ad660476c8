/* avx512/attn.c: paged KV write and varlen paged attention, AVX-512.
 *
 * The avx2 kernel's plan (avx2/attn.c) on 16-lane vectors. Work item:
 * (query row tile, KV head, chunk of its query heads). A tile is up to TILE_Q
 * query vectors: R consecutive rows of one sequence times the heads of the
 * GQA group (or a chunk of them), so every K/V row loaded is used by all of
 * them. Per partition of ARMLLM_ATTN_PARTITION keys:
 *   QK^T  register tiles of up to 4 queries x 4 keys, 16 lanes over
 *         head_dim (masked tail), one fixed reduction tree per dot product;
 *   softmax  the 16-wide exp (vexp_avx512.h), lanes fixed by key position;
 *   PV    register tiles of up to 4 queries x 64 head_dim lanes, keys in order.
 * Keys outside a query's range get weight exactly 0, and a query's dots and
 * weights do not depend on which other queries share its tile, so its
 * partial does not either. Partials meet only in armllm_attn_merge, in
 * partition order (attn_common.h).
 *
 * The driver (units, sub-tiles, the partition loop and split-KV) is
 * attn_x86.h's, shared with the other x86 variant; this file holds the
 * micro-kernels and the tile (tile_ctx, tile_partition, finish).
 *
 * bf16 caches (attention_bf16_compute "bf16"): QK^T runs on vdpbf16ps with
 * q rounded to bf16 (nearest even) and K as stored; the softmax weights stay
 * f32 and PV runs on f32 FMAs over V widened in registers (each 32 dims
 * as even and odd halves: pvb_tile).
 * Measured on the tiny model's first-token logprobs (tests/model's
 * quantize-at-load bound 0.02; f32 math reaches 0.0174): rounding q moves
 * them by at most 0.0166, rounding the weights too by 0.027, so only q is
 * rounded. Splitting the weights into bf16 hi + lo parts for vdpbf16ps PV is
 * as accurate as f32 and was no faster than the FMAs here. f32 caches: f32
 * FMAs throughout. On Zen 4 (4 queries a key, head_dim 64, rows in L1) bf16
 * QK^T takes ~15 cycles a key against its 8 vdpbf16ps, PV ~16 against 16
 * FMAs. Tried and slower: K transposed 4 rows at a time (keys in lanes, 4
 * partial sums a dot instead of 16) took ~35 cycles, its q broadcasts
 * doubling the loads per FMA. A 45-operation reduction of the 16 dots (hsum4
 * takes ~75) took bf16 QK^T from ~15 to ~13 cycles, but its other rounding
 * moved SmolLM2's bf16 logits off one of tests/model's argmax checks; hsum16
 * now reduces a tile of 3-4 queries in 45 operations along hsum4's own tree
 * (the same bits): 2-4% of decode attention in L2 (ctx 512, one thread).
 *
 * int8 caches: in integers, attn_common.h's arithmetic (attn_i8.h:
 * qk_i8_rows, pvi_rows; vpdpbusd and vpdpwssd, AVX512-VNNI). One
 * thread of Zen 4, Llama-3.2-1B's heads, blocks in one run: 12.2-13.0 ns a
 * key and KV head with the cache in L3 (4K tokens, one layer) against
 * 17.9-18.0 for the f32 FMAs over widened rows before; 15.6-15.8 against
 * 20.5-21.1 from DRAM (16 layers). The count is near Zen 4's one 512-bit
 * operation a cycle: ~13 cycles a key for QK^T (4 of transpose, 4
 * vpdpbusd, the scores), ~11 for PV (8 vpdpwssd), ~11 for the softmax and
 * the int16 weights of 4 queries.
 *
 * The softmax (attn_softmax.h) then took its exp from one vscalefps, its
 * lane masks from scalar arithmetic, and for int8 caches the weights in
 * the same pass (i8_softmax_weights): the same bits, ~6 cycles a key for
 * the 4 queries' softmax and weights where it took ~11. With the prefetch
 * running on into the next partition's first K rows (tile_rows_next),
 * int8 took 11.0-11.2 ns (L3) and 11.7-12.4 (32K tokens, 4 layers, DRAM)
 * against 11.9-12.3 and 13.3-14.5; bf16 13.6-13.8 and 17.2-17.6 against
 * 14.5-14.7 and 18.6-19.0 (the same box and method, runs alternated).
 */
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_common.h"
#include "../attn_x86_tile.h"
#include "attn_softmax.h"
#include "vexp_avx512.h"

/* ------------------------------------------------------------ kv write */

/* 16 floats to bf16 bits, nearest even, NaN kept quiet: ref's integer
 * arithmetic (vcvtneps2bf16 would flush subnormals). */
static inline __m256i bf16_round16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

static void store_bf16_row(void *dst_bytes, const float *src, int64_t n) {
  uint16_t *dst = dst_bytes;
  int64_t d = 0;
  for (; d + 16 <= n; d += 16)
    _mm256_storeu_si256((__m256i *)(dst + d), bf16_round16(_mm512_loadu_ps(src + d)));
  if (d < n) {
    const __mmask16 m = armllm_avx512_tail16(n - d);
    _mm256_mask_storeu_epi16(dst + d, m, bf16_round16(_mm512_maskz_loadu_ps(m, src + d)));
  }
}

ARMLLM_KV_WRITE_ON_CALLER(armllm_avx512_kv_write, store_bf16_row)

/* ------------------------------------------------------------ loads */

#define PART ARMLLM_ATTN_PARTITION
#define MAXD ARMLLM_ATTN_MAX_HEAD_DIM
#define TILE_Q 12 /* query vectors per tile */
#define QB 4      /* query vectors per register tile */
#define KC 32     /* keys per chunk (prefetch distance, PV blocking) */
#define QPAD 32   /* q rows padded to whole vdpbf16ps steps */

#define AINLINE static inline __attribute__((always_inline))
/* register tiles are arrays indexed by constants once these loops unroll */
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL16 _Pragma("GCC unroll 16")

/* 16 floats at p + d of an f32 row, the first n (1..16) of them (zeros
 * after). */
AINLINE __m512 load16(const void *p, int64_t d, int64_t n) {
  if (n == 16) return _mm512_loadu_ps((const float *)p + d);
  return _mm512_maskz_loadu_ps(armllm_avx512_tail16(n), (const float *)p + d);
}

/* 32 bf16 at p + x, the first n (1..32) of them (zeros after). */
AINLINE __m512i load32h(const uint16_t *p, int64_t x, int64_t n) {
  if (n == 32) return _mm512_loadu_si512(p + x);
  return _mm512_maskz_loadu_epi16((__mmask32)(((uint64_t)1 << n) - 1), p + x);
}

/* Sums of 4 vectors, each with a fixed tree whatever the other three hold. */
AINLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define FOLD(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1))
  const __m256 a8 = FOLD(a), b8 = FOLD(b), c8 = FOLD(c), d8 = FOLD(d);
#undef FOLD
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* hsum4's tree for all 16 dots of a 4 x 4 tile at once: 30 shuffles and 15
 * adds where four hsum4 take ~75 operations, every add the same pair of the
 * same values (a + b and b + a are the same float), so the same bits. Per
 * dot v (16 lanes), hsum4 adds f_i = v_i + v_{i+8}, then g_k = f_2k +
 * f_2k+1, then h_0 = g_0 + g_1 and h_1 = g_2 + g_3, then h_0 + h_1; here
 * each level adds two vectors whose lanes were shuffled into line, two
 * dots' sums to a vector at the first level and 16 at the last. Lane 4r + c
 * of the result is acc[r][c]'s dot (4 x 128-bit blocks: one query each). */
AINLINE __m512 hsum16(__m512 acc[QB][4]) {
  /* f: [f(q0 kc) | f(q1 kc)] and [f(q2 kc) | f(q3 kc)], the low 8 lanes plus the high 8 */
  __m512 f[8];
  UNROLL for (int c = 0; c < 4; c++)
    UNROLL for (int h = 0; h < 2; h++) {
      const __m512 a = acc[2 * h][c], b = acc[2 * h + 1][c];
      f[4 * h + c] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    }
  /* g: neighbouring lanes of two f vectors (keys c, c + 1) */
  __m512 g[4];
  UNROLL for (int i = 0; i < 4; i++)
    g[i] = _mm512_add_ps(_mm512_shuffle_ps(f[2 * i], f[2 * i + 1], 0x88),
                         _mm512_shuffle_ps(f[2 * i], f[2 * i + 1], 0xdd));
  /* h: neighbouring lanes again (keys 0-3 of two queries per vector) */
  __m512 hv[2];
  UNROLL for (int i = 0; i < 2; i++)
    hv[i] = _mm512_add_ps(_mm512_shuffle_ps(g[2 * i], g[2 * i + 1], 0x88),
                          _mm512_shuffle_ps(g[2 * i], g[2 * i + 1], 0xdd));
  /* h_0 + h_1: neighbouring 128-bit blocks */
  return _mm512_add_ps(_mm512_shuffle_f32x4(hv[0], hv[1], 0x88),
                       _mm512_shuffle_f32x4(hv[0], hv[1], 0xdd));
}

/* ------------------------------------------------------------ QK^T tile */

/* acc[r][c] += q_r[x..x+16) * k_c[x..x+n) (n in 1..16; zeros past n), f32
 * K. */
AINLINE void qk_step(const int NQ, const float *const *q, const void *const *k, int64_t x,
                     int64_t n, __m512 acc[QB][4]) {
  __m512 kv[4];
  UNROLL for (int c = 0; c < 4; c++) kv[c] = load16(k[c], x, n);
  UNROLL for (int r = 0; r < NQ; r++) {
    const __m512 qv = _mm512_loadu_ps(q[r] + x);
    UNROLL for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
  }
}

/* ------------------------------------------------------------ PV tile */

/* c[r][x..x+16*NV) += sum_{j<nj} e[r][j] * v_j[x..), f32 V rows, NQ (1..4)
 * queries, NV (1..4) vectors of 16 from x, the last with n (1..16)
 * elements; keys in order. */
AINLINE void pv_tile(const int NQ, const int NV, float *const *c,
                     const float *const *e,
                     const void *const *vp, int64_t nj, int64_t x, int64_t n,
                     const void *const *pf, int64_t npf, int64_t pfbytes) {
  __m512 acc[QB][4];
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_loadu_ps(c[r] + x + 16 * v);
  for (int64_t j = 0; j < nj; j++) {
    if (j < npf) attn_prefetch_row(pf[j], pfbytes);
    __m512 vv[4];
    UNROLL for (int v = 0; v < NV; v++)
      vv[v] = v < NV - 1 || n == 16 ? load16(vp[j], x + 16 * v, 16)
                                    : load16(vp[j], x + 16 * v, n);
    UNROLL for (int r = 0; r < NQ; r++) {
      const __m512 w = _mm512_set1_ps(e[r][j]);
      UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(w, vv[v], acc[r][v]);
    }
  }
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < NV; v++) _mm512_storeu_ps(c[r] + x + 16 * v, acc[r][v]);
}

/* pv_tile on bf16 V rows, NB (1..2) blocks of 32 dims from x, the last with
 * n (1..32): one 64-byte load per block gives its even dims (a 16-bit shift
 * left) and its odd dims (the high halves masked), two ALU operations and no
 * shuffle per 32 dims. c holds each block as [even 16 | odd 16] (see
 * unpermute_accp); every dim gets the same FMAs in the same key order as
 * pv_tile on the widened rows. */
AINLINE void pvb_tile(const int NQ, const int NB, float *const *c, const float *const *e,
                      const void *const *vp, int64_t nj, int64_t x, int64_t n,
                      const void *const *pf, int64_t npf, int64_t pfbytes) {
  const __m512i high = _mm512_set1_epi32((int32_t)0xffff0000);
  __m512 acc[QB][4]; /* [r][2 * block + (0: even, 1: odd)] */
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm512_loadu_ps(c[r] + x + 16 * v);
  for (int64_t j = 0; j < nj; j++) {
    if (j < npf) attn_prefetch_row(pf[j], pfbytes);
    __m512 vv[4];
    UNROLL for (int b = 0; b < NB; b++) {
      const __m512i raw = load32h(vp[j], x + 32 * b, b < NB - 1 ? 32 : n);
      vv[2 * b] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      vv[2 * b + 1] = _mm512_castsi512_ps(_mm512_and_si512(raw, high));
    }
    UNROLL for (int r = 0; r < NQ; r++) {
      const __m512 w = _mm512_set1_ps(e[r][j]);
      UNROLL for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm512_fmadd_ps(w, vv[v], acc[r][v]);
    }
  }
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < 2 * NB; v++) _mm512_storeu_ps(c[r] + x + 16 * v, acc[r][v]);
}

/* accp blocks of 32 dims from [even | odd] order (pvb_tile) to dim order. */
static void unpermute_accp(float *acc, int64_t hdp) {
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t x = 0; x < hdp; x += 32) {
    const __m512 ev = _mm512_loadu_ps(acc + x), od = _mm512_loadu_ps(acc + x + 16);
    _mm512_storeu_ps(acc + x, _mm512_permutex2var_ps(ev, first, od));
    _mm512_storeu_ps(acc + x + 16, _mm512_permutex2var_ps(ev, second, od));
  }
}

/* acc rows c[0..nq) (padded to a multiple of 32) += weights e[0..nq) times V
 * rows vp[0..nj) of cache dtype kv (f32, or bf16 with the result in
 * pvb_tile's order), all of head_dim. */
static void pv_rows(float *const *c, const float *const *e, int nq, const void *const *vp,
                    int64_t nj, int64_t hd, int kv, const void *const *pf, int64_t npf,
                    int64_t pfbytes) {
  for (int64_t x = 0; x < hd; x += 64, npf = 0) {
    const int64_t left = hd - x;
    if (kv == ARMLLM_KV_BF16) {
      const int64_t nb = left >= 64 ? 2 : (left + 31) / 32;
      const int64_t n = left >= 64 ? 32 : left - 32 * (nb - 1);
#define PVB_CASE(NQ, NB) \
  case (NQ) * 4 + (NB): pvb_tile(NQ, NB, c, e, vp, nj, x, n, pf, npf, pfbytes); break;
      switch (nq * 4 + (int)nb) {
        PVB_CASE(1, 1) PVB_CASE(1, 2) PVB_CASE(2, 1) PVB_CASE(2, 2)
        PVB_CASE(3, 1) PVB_CASE(3, 2) PVB_CASE(4, 1) PVB_CASE(4, 2)
      }
#undef PVB_CASE
      continue;
    }
    const int64_t nv = left >= 64 ? 4 : (left + 15) / 16;
    const int64_t n = left >= 64 ? 16 : left - 16 * (nv - 1);
#define PV_CASE(NQ, NV) \
  case (NQ) * 8 + (NV): pv_tile(NQ, NV, c, e, vp, nj, x, n, pf, npf, pfbytes); break;
    switch (nq * 8 + (int)nv) {
      PV_CASE(1, 1) PV_CASE(1, 2) PV_CASE(1, 3) PV_CASE(1, 4)
      PV_CASE(2, 1) PV_CASE(2, 2) PV_CASE(2, 3) PV_CASE(2, 4)
      PV_CASE(3, 1) PV_CASE(3, 2) PV_CASE(3, 3) PV_CASE(3, 4)
      PV_CASE(4, 1) PV_CASE(4, 2) PV_CASE(4, 3) PV_CASE(4, 4)
    }
#undef PV_CASE
  }
}

/* --------------------------------------------- QK^T on bf16 caches
 *
 * vdpbf16ps c += a.lo * b.lo + a.hi * b.hi per 32-bit lane (pairs of bf16):
 * q rounded to bf16 once per tile times the K rows as stored, 32 dims per
 * instruction, f32 accumulation. Only q is rounded: the softmax weights stay
 * f32 and PV runs on f32 FMAs (rounding them to bf16 too moved the tiny
 * model's logprobs past tests/model's bound; rounding q did not). */

static inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

/* acc[r][c] += q_r[x..x+32) . k_c[x..x+n) in pairs (zeros past n). */
AINLINE void qkh_step(const int NQ, const uint16_t *const *q, const void *const *k, int64_t x,
                      int64_t n, __m512 acc[QB][4]) {
  __m512i kv[4];
  UNROLL for (int c = 0; c < 4; c++) kv[c] = load32h(k[c], x, n);
  UNROLL for (int r = 0; r < NQ; r++) {
    const __m512i qv = _mm512_loadu_si512(q[r] + x);
    UNROLL for (int c = 0; c < 4; c++)
      acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(qv), as_bh(kv[c]));
  }
}

/* Dots of NQ (1..4) query rows q[r] with 4 key rows k[0..4), times scale,
 * into s[r * lds + c] for the first m (1..4) keys (a masked store: no copy
 * through memory): f32 q rows zero-padded to a multiple of 16 and f32 K
 * (qk_step), or bf16 q rows zero-padded to a multiple of 32 and bf16 K
 * (KV == ARMLLM_KV_BF16, qkh_step). Spare keys repeat real ones (their results are dropped): every
 * dot is the same operations whatever the neighbours. */
AINLINE void qk_tile(const int NQ, const int KV, const void *const *q, const void *const *k,
                     int64_t hd, float scale, float *s, int64_t lds, __mmask8 m) {
  __m512 acc[QB][4];
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
  int64_t x = 0;
  if (KV == ARMLLM_KV_BF16) {
    const uint16_t *const *qh = (const uint16_t *const *)q;
    for (; x + 32 <= hd; x += 32) qkh_step(NQ, qh, k, x, 32, acc);
    if (x < hd) qkh_step(NQ, qh, k, x, hd - x, acc);
  } else {
    const float *const *qf = (const float *const *)q;
    for (; x + 16 <= hd; x += 16) qk_step(NQ, qf, k, x, 16, acc);
    if (x < hd) qk_step(NQ, qf, k, x, hd - x, acc);
  }
  if (NQ >= 3) { /* hsum16 costs what three hsum4 do */
    UNROLL for (int r = NQ; r < QB; r++)
      UNROLL for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const __m512 d = _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(scale));
    _mm_mask_storeu_ps(s, m, _mm512_castps512_ps128(d));
    _mm_mask_storeu_ps(s + lds, m, _mm512_extractf32x4_ps(d, 1));
    _mm_mask_storeu_ps(s + 2 * lds, m, _mm512_extractf32x4_ps(d, 2));
    if (NQ == 4) _mm_mask_storeu_ps(s + 3 * lds, m, _mm512_extractf32x4_ps(d, 3));
    return;
  }
  const __m128 sc = _mm_set1_ps(scale);
  UNROLL for (int r = 0; r < NQ; r++)
    _mm_mask_storeu_ps(s + r * lds, m,
                       _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc));
}

/* s[r*lds + j] = scale * q_r . k_j for nq (1..4) queries and keys j < nj
 * of cache dtype kv: f32 q rows and f32 K, or bf16 q rows and bf16 K. */
static void qk_rows(const void *const *q, int nq, const void *const *kp, int64_t nj, int64_t hd,
                    int kv, float scale, float *s, int64_t lds, const void *const *pf,
                    int64_t npf, int64_t pfbytes) {
  for (int64_t j = 0; j < nj; j += 4) {
    for (int64_t u = j; u < j + 4 && u < npf; u++) attn_prefetch_row(pf[u], pfbytes);
    const int64_t m = nj - j < 4 ? nj - j : 4;
    const void *k[4] = {kp[j], kp[j + (m > 1)], kp[j + (m > 2) * 2], kp[j + (m > 3) * 3]};
    const __mmask8 mask = (__mmask8)((1u << m) - 1);
#define QK_CASE(NQ)                                                                    \
  case NQ:                                                                             \
    if (kv == ARMLLM_KV_BF16) qk_tile(NQ, ARMLLM_KV_BF16, q, k, hd, scale, s + j, lds, mask); \
    else qk_tile(NQ, ARMLLM_KV_F32, q, k, hd, scale, s + j, lds, mask);                \
    break;
    switch (nq) {
      QK_CASE(1)
      QK_CASE(2)
      QK_CASE(3)
      QK_CASE(4)
    }
#undef QK_CASE
  }
}

#include "attn_i8.h" /* int8 caches: QK^T, PV and weights in integers */

/* ------------------------------------------------------------ tiles */

/* One sub-tile: rows [r0, r1) of sequence b, query heads [h0, h1) of KV
 * head kvh. Query i = (row r0 + i / nh, head h0 + i % nh). */
typedef struct {
  ARMLLM_X86_TILE_FIELDS           /* q zero-padded to a multiple of 32 */
  uint16_t q16[TILE_Q][MAXD];      /* bf16 caches: q rounded to bf16 (vcvtneps2bf16) */
  float s[TILE_Q][PART];           /* scores, then weights */
  /* int8 caches (attn_common.h): q quantized (zero-padded to a multiple of 64), its
   * score factor and -128 * sum(q8) (qki_tile's start), the weights as int16 (as s),
   * their scales, and PV's int32 sums (pvi_tile's order) */
  int8_t q8[TILE_Q][MAXD] __attribute__((aligned(64)));
  float qf[TILE_Q];
  int32_t qcorr[TILE_Q];
  int16_t w16[TILE_Q][PART + 2];   /* + 2: an odd last key's pair */
  float ws[TILE_Q];
  int32_t acci[TILE_Q][MAXD] __attribute__((aligned(64)));
} tile_ctx;

#include "../attn_x86.h"

/* bf16 caches: q16[i], q rounded to bf16 for vdpbf16ps; int8 caches: q8[i]
 * and its factors (attn_common.h). */
static inline void tile_q_extra(tile_ctx *t, int64_t i) {
  if (t->a->cache_dtype == ARMLLM_KV_BF16)
    for (int64_t d = 0; d < t->hdp; d += 16)
      _mm256_storeu_si256((__m256i *)(t->q16[i] + d),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(t->q[i] + d)));
  if (t->a->cache_dtype == ARMLLM_KV_I8) {
    uint16_t qs;
    memset(t->q8[i], 0, sizeof t->q8[i]);
    armllm_kv_quantize_row(t->q8[i], &qs, t->q[i], t->hd);
    t->qf[i] = armllm_attn_i8_qfactor(qs, t->a->scale);
    int32_t sum = 0;
    for (int64_t d = 0; d < t->hd; d++) sum += t->q8[i][d];
    t->qcorr[i] = -128 * sum; /* vpdpbusd's K is offset by 128 */
  }
}

/* Softmax weights of query i over the partition's scores s[u0..u1). */
static void tile_softmax(tile_ctx *t, int64_t i, int64_t pbase, int64_t u0, int64_t u1) {
  t->valid[i] = attn_softmax16(t->s[i], t->lo[i], t->pos[i], pbase, u0, u1, &t->mp[i], &t->lp[i]);
}

/* tile_partition on an int8 cache, in integers (qk_i8_rows, pvi_rows). */
static void tile_partition_i8(tile_ctx *t, int64_t p) {
  const int64_t nq = t->nq, hd = t->hd, pbase = p * PART;
  const int64_t k0 = pbase > t->lo_u ? pbase : t->lo_u;
  const int64_t k1 = pbase + PART < t->pos_u + 1 ? pbase + PART : t->pos_u + 1;
  const int64_t ks = k0 - pbase, hd64 = (hd + 63) & ~(int64_t)63;

  tile_rows(t, k0, k1);
  tile_rows_next(t, p, I8_PF);
  tile_prefetch(t, 0, I8_PF);
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *pf;
    const int64_t npf = i8_pf(t, jc - k0, nj, &pf);
    qk_i8_rows((const int8_t(*)[MAXD])t->q8, t->qcorr, t->qf, nq, hd, t->rows + (jc - k0), nj,
               t->ksc + (jc - k0), &t->s[0][jc - pbase], PART, pf, npf, hd);
  }

  const int64_t u0 = ks & ~(int64_t)15, u1 = k1 - pbase;
  for (int64_t i = 0; i < nq; i++)
    t->valid[i] = i8_softmax_weights(t->s[i], t->lo[i], t->pos[i], pbase, u0, u1, ks, t->vsc,
                                      t->w16[i], &t->mp[i], &t->lp[i], &t->ws[i]);

  for (int64_t i = 0; i < nq; i++) memset(t->acci[i], 0, (size_t)hd64 * sizeof(int32_t));
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC, js = jc - pbase;
    const void *const *vp = t->rows + t->nrows + (jc - k0), *const *pf;
    const int64_t npf = i8_pf(t, t->nrows + jc - k0, nj, &pf);
    for (int64_t i = 0; i < nq; i += QB) {
      const int mq = nq - i < QB ? (int)(nq - i) : QB;
      int32_t *c[QB];
      const int16_t *w[QB];
      for (int r = 0; r < mq; r++) c[r] = t->acci[i + r], w[r] = t->w16[i + r] + js;
      pvi_rows(c, w, mq, vp, nj, hd, pf, i == 0 ? npf : 0, hd);
    }
  }
  for (int64_t i = 0; i < nq; i++)
    if (t->valid[i]) unpermute_acci(t->accp[i], t->acci[i], hd64, t->ws[i]);
}

/* The partial (mp, lp, accp) of every query of the tile over partition p:
 * keys [max(lo, p*PART), min(pos + 1, (p + 1)*PART)) of each query. */
static void tile_partition(tile_ctx *t, int64_t p) {
  if (t->a->cache_dtype == ARMLLM_KV_I8) {
    tile_partition_i8(t, p);
    return;
  }
  const armllm_attn_args *a = t->a;
  const int64_t nq = t->nq, hd = t->hd, hdp = t->hdp, pbase = p * PART;
  const int64_t k0 = pbase > t->lo_u ? pbase : t->lo_u;
  const int64_t k1 = pbase + PART < t->pos_u + 1 ? pbase + PART : t->pos_u + 1;
  const int kv = a->cache_dtype, bf16 = kv == ARMLLM_KV_BF16;
  const int64_t pfbytes = hd * (int64_t)armllm_kv_esz(kv), ks = k0 - pbase;

  /* scores s[i][j - pbase], j in [k0, k1) */
  tile_rows(t, k0, k1);
  tile_rows_next(t, p, KC);
  tile_prefetch(t, 0, KC);
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *kp = t->rows + (jc - k0);
    const void *const *pf;
    const int64_t npf = tile_pf(t, jc - k0, nj, &pf); /* spread over the first block */
    for (int64_t i = 0; i < nq; i += QB) {
      const int mq = nq - i < QB ? (int)(nq - i) : QB;
      const int64_t r[QB] = {i, i + (mq > 1), i + 2 * (mq > 2), i + 3 * (mq > 3)};
      const void *q[QB];
      for (int u = 0; u < QB; u++)
        q[u] = bf16 ? (const void *)t->q16[r[u]] : (const void *)t->q[r[u]];
      qk_rows(q, mq, kp, nj, hd, kv, a->scale, &t->s[i][jc - pbase], PART, pf,
              i == 0 ? npf : 0, pfbytes);
    }
  }

  const int64_t u0 = ks & ~(int64_t)15, u1 = k1 - pbase;
  for (int64_t i = 0; i < nq; i++) tile_softmax(t, i, pbase, u0, u1);

  /* accp[i] = sum_j e[i][j] v_j, keys in order */
  for (int64_t i = 0; i < nq; i++) memset(t->accp[i], 0, (size_t)hdp * sizeof(float));
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC, js = jc - pbase;
    const void *const *vp = t->rows + t->nrows + (jc - k0), *const *pf;
    const int64_t npf = tile_pf(t, t->nrows + jc - k0, nj, &pf);
    for (int64_t i = 0; i < nq; i += QB) {
      const int mq = nq - i < QB ? (int)(nq - i) : QB;
      float *c[QB];
      const float *e[QB];
      for (int r = 0; r < mq; r++) c[r] = t->accp[i + r], e[r] = t->s[i + r] + js;
      pv_rows(c, e, mq, vp, nj, hd, kv, pf, i == 0 ? npf : 0, pfbytes);
    }
  }
  if (bf16)
    for (int64_t i = 0; i < nq; i++) unpermute_accp(t->accp[i], hdp);
}

static void finish(float *out, const float *acc, float l, int64_t hd) {
  attn_finish16(out, acc, l, hd);
}

int64_t armllm_avx512_attention(armllm_pool *pool, const armllm_attn_args *args) {
  return armllm_x86_attention(pool, args);
}
