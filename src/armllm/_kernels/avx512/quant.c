/* avx512/quant.c: the quantized GEMM (int8 or int4 weights, int8
 * activations) with AVX512_VNNI's vpdpbusd, and the symmetric activation
 * quantizer over 16 lanes (~1.3x avx2's; it is bound by its correctly
 * rounded divisions; asymmetric activations run avx2's).
 *
 * Packed layout "nr16k4g": a 64-byte header (its first uint32: 1 when the
 * scales are stored as f16), then N cut into panels of 16 output rows (the
 * last one padded with q = 0, d = 0, o = 0); panel p is one contiguous block
 * of panel_bytes, group after group (group g covers k in [g*gl,
 * min((g+1)*gl, kpad)), gl = armllm_q_group_len(group): channelwise weights
 * are groups of ARMLLM_Q_CHANNEL_GROUP with the row's scale repeated), each
 * group its weights then its scales:
 *   bits 8: for each 4-k step of the group, 64 bytes: rows r = 0..15, each
 *           the 4 bytes q[16p + r, k .. k+4) + 128 (unsigned);  then
 *           d[16p .. 16p+16) as 16 f32.
 *   bits 4: for each 8-k step of the group, 64 bytes: byte 4r + j holds
 *           q[16p + r, k + j] in its low nibble and q[16p + r, k + 4 + j] in
 *           its high nibble (j < 4);  then d[16], then o[16]: f16 when every
 *           d and o of the matrix is exact in f16 (GGUF's, armllm's RTN ones:
 *           widened to the same floats), else f32.
 * panel_bytes = 16*kpad + 64*ng (bits 8), 8*kpad + 64*ng or 128*ng (bits 4,
 * f16 or f32 scales); every vector is 64-byte aligned when the buffer is.
 *
 * Inner products: vpdpbusd multiplies an unsigned byte operand (a register:
 * the weights) by a signed one (the activation word x[k..k+4), broadcast
 * from memory to the 16 lanes) and adds the 4 products of each lane to its
 * int32 accumulator, exactly (no saturation: |sum| <= 128 * 127 * 255).
 *   bits 4: the nibbles are the unsigned operand as they are (no correction).
 *   bits 8: the weights are stored as q + 128, and x.q = x.(q + 128) -
 *           128 sum(x): each group's accumulators start at -128 sum(x) of
 *           their row (quant_act's gsum, or computed here), so the
 *           correction costs no vector operation.
 * Each group's int32 sum is exact, so the float epilogue (the header's order:
 * per group a = acc * sx, t = fma(d, a, t) [, b = gsum * sx, t = fma(o, b, t)],
 * then y = t (+ bias)) runs lane-wise with the very operations of ref: every
 * result is bit-identical to ref, whatever the tile, path or thread count.
 *
 * Tiles are mr rows x nc panels (nc <= 2: 32 columns) over a run of groups,
 * with both the int32 accumulators and the float sums t in registers
 * (2 * mr * nc of the 32 zmm). Decode (M <= DECODE_MAX_M): all rows, in
 * passes of up to DECODE_PASS_ROWS, over DECODE_STREAMS panels at a time and
 * the whole of K, each thread its own run of panels (software-prefetched
 * ahead). Prefill: WQ_MR rows x 2 panels;
 * items are (row block of up to WQ_MB_MAX rows, panel chunk) pairs, about
 * WQ_ITEMS_PER_THREAD a thread; inside, panel pair by panel pair, K is cut
 * into blocks of whole groups whose weights fit half of L1d, and every row
 * tile of the block runs over one K block before the next (t waits in a
 * stack buffer between K blocks): the weights come from memory once per row
 * block and from L1 for every tile after the first.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../cpu.h"
#include "../family_jobs.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PANEL 16       /* output rows per panel: one int32 / f32 lane each */
#define MAX_NC 2       /* panels per prefill tile */
#define DECODE_STREAMS 2 /* panels a decode tile reads at once (M <= 2; 1 on some CPUs:
                           armllm_x86_decode_streams), far apart: 1B chain, Xeon,
                           M 1: w8 +12%, w4 +17% over one panel at a time with 4; Zen 5: a 1B
                           Q8_0 token 8-9% faster with 2 than with 4 */
#define DECODE_MAX_M 8 /* rows up to this take the streaming (decode) path: a verify step's k + 1 */
#define DECODE_PASS_ROWS 4 /* rows of one decode pass over the panels (2 * 4 * 2 zmm of acc and t) */
#ifndef WQ_MR
/* prefill tile rows: 2 * 6 * 2 accumulators and t, 24 of the 32 zmm (4 rows x
 * 3 panels, fewer broadcasts per vpdpbusd, measured no faster on Zen 4) */
#define WQ_MR 6
#endif
#define MAX_MR 6 /* the largest tile height, decode or prefill */
#ifndef WQ_PF_BYTES
#define WQ_PF_BYTES 4096 /* decode: software prefetch distance in each panel stream (1B shapes,
                            M = 1, Zen 5: 4 KiB 3-7% faster than 2 KiB, 1 KiB slower; with only
                            the weight bytes asked for, a Xeon with AMX ran 1-2 KiB 12% faster) */
#endif
#ifndef WQ_L1_BYTES
#define WQ_L1_BYTES (16 * 1024) /* a panel pair's K block: half of L1d */
#endif
#define WQ_MB_MAX 258 /* rows per prefill block (a multiple of WQ_MR): its t on the stack */
_Static_assert(WQ_MB_MAX % WQ_MR == 0, "row blocks are whole tiles: tbuf holds any of them");
#define WQ_ITEMS_PER_THREAD 4 /* prefill items a thread: evens out uneven progress */
#define WQ_ROW_TERMS_CAP 4096 /* a row block's per-group terms on the stack (16 KiB) */
#define HEADER_BYTES 64       /* the layout's header: keeps the panels 64-byte aligned */

#include "../quant_x86.h"

/* Keeps the compiler from fusing a = acc * sx into a neighbouring add: the
 * header fixes the mul, then the fma. */
static ALWAYS_INLINE __m512 no_contract(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

/* ------------------------------------------------------- quant_act */

/* x[i .. i+16) masked to the `left` elements before K (zeros past it). */
static ALWAYS_INLINE __m512 load_part(const float *x, int64_t left) {
  if (left >= 16) return _mm512_loadu_ps(x);
  if (left <= 0) return _mm512_setzero_ps();
  return _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), x);
}

/* max |x| over k elements, as ref: NaN when any is NaN (|the last NaN|). */
static float group_amax(const float *x, int64_t k) {
  __m512 m0 = _mm512_setzero_ps(), m1 = m0;
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    const __m512 b = _mm512_abs_ps(_mm512_loadu_ps(x + i + 16));
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  for (; i < k; i += 16) {
    const __m512 a = _mm512_abs_ps(load_part(x + i, k - i));
    nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, a);
  }
  if (nan)
    for (i = k - 1;; i--)
      if (x[i] != x[i]) return fabsf(x[i]);
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

/* One row, group by group (symmetric): the group's amax over its real
 * columns, then its 16-k pieces quantized (and summed) while in L1. */
static void quant_row(const armllm_quant_job *job, int64_t r) {
  const float *x = job->x + r * job->ldx;
  int8_t *q = job->xq + r * job->ldq;
  float *sc = job->scale + r * job->ldsc;
  int32_t *gs = job->gsum ? job->gsum + r * job->ldgs : NULL;
  const int64_t k = job->k, kpad = job->kpad, gl = job->gl;
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  for (int64_t g = 0, k0 = 0; g < job->ng; g++, k0 += gl) {
    const int64_t k1 = k0 + gl < kpad ? k0 + gl : kpad;
    const int64_t kx = k1 < k ? k1 : k; /* > k0: every group has a real column */
    const float s = group_amax(x + k0, kx - k0) / 127.0f;
    sc[g] = s;
    if (s == 0.0f || !isfinite(s)) { /* every x / s is 0 or NaN: all zeros, as ref */
      memset(q + k0, 0, (size_t)(k1 - k0));
      if (gs) gs[g] = 0;
      continue;
    }
    const __m512 vs = _mm512_set1_ps(s);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = k0; i < k1; i += 16) { /* k1 - k0 is a multiple of 32 */
      __m512 v = _mm512_roundscale_ps(_mm512_div_ps(load_part(x + i, k - i), vs),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i iv = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(v, hi), lo));
      _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(iv));
      sum = _mm512_add_epi32(sum, iv);
    }
    if (gs) gs[g] = _mm512_reduce_add_epi32(sum);
  }
}

static void quant_rows_task(void *ctx, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r++) quant_row(ctx, r);
}

void armllm_avx512_quant_act(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                             int64_t ldx, int64_t group, int8_t *xq, int64_t ldq, float *scale,
                             int64_t ldsc, int32_t *gsum, int64_t ldgs, int32_t *zp,
                             int64_t ldzp) {
  if (zp) { /* asymmetric: avx2's (bound by the same divisions) */
    armllm_avx2_quant_act(pool, x, m, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp);
    return;
  }
  armllm_quant_job job =
      armllm_quant_job_of(x, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp);
  quant_act_run(pool, m, &job, quant_rows_task);
}

/* ------------------------------------------------------------ pack */

/* The 32 scales (d, then o) of a panel's group as f16. */
static void store_scales_f16(uint8_t *dst, const float *scales) {
  _mm256_store_si256((__m256i *)dst, _mm512_cvtps_ph(_mm512_loadu_ps(scales), 0));
  _mm256_store_si256((__m256i *)(dst + 32), _mm512_cvtps_ph(_mm512_loadu_ps(scales + PANEL), 0));
}

ARMLLM_X86_WQ_PACKING(armllm_avx512, store_scales_f16)

/* ------------------------------------------------------------ GEMM */

/* The 4 activation bytes at p, in every lane (one broadcast load). */
static ALWAYS_INLINE __m512i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

/* Sum of x[0 .. len). */
static int32_t sum_i8(const int8_t *x, int64_t len) {
  const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
  __m512i s = zero;
  for (int64_t i = 0; i < len; i += 64) { /* sad of x + 128 against 0: 8 sums of 8 */
    const __mmask64 in = len - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (len - i)) - 1;
    const __m512i v =
        _mm512_maskz_mov_epi8(in, _mm512_xor_si512(_mm512_maskz_loadu_epi8(in, x + i), flip));
    s = _mm512_add_epi64(s, _mm512_sad_epu8(v, zero));
  }
  return (int32_t)(_mm512_reduce_add_epi64(s) - 128 * len);
}

/* A row's per-group term of the epilogue, rows r0 .. r1 into out (rows ng
 * apart): bits 8 the accumulators' start -128 sum(x) (int32), bits 4 the
 * offset term b = (float)gsum * sx (one scalar rounding, as ref). The same
 * for every panel: computed once per row block. */
static void row_terms(const wq_job *job, const int bits, int64_t r0, int64_t r1, void *out) {
  const int64_t ng = job->ng;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t g = 0; g < ng; g++) {
      const int64_t i = (r - r0) * ng + g;
      if (bits == 4) {
        ((float *)out)[i] = (float)job->gsum[r * job->ldgs + g] * job->scale[r * job->ldsc + g];
      } else {
        const int64_t k0 = g * job->gl, k1 = k0 + job->gl < job->kpad ? k0 + job->gl : job->kpad;
        const int32_t s =
            job->gsum ? job->gsum[r * job->ldgs + g] : sum_i8(job->xq + r * job->ldq + k0, k1 - k0);
        ((int32_t *)out)[i] = (int32_t)(0u - 128u * (uint32_t)s);
      }
    }
}

/* Bytes of a panel before group g (every group before the last is whole). */
static inline int64_t group_offset(const wq_job *job, const int bits, int64_t g) {
  return g * (job->gl / 32 * chunk_bytes(bits) + scale_bytes(bits, job->f16));
}

/* y[r0 .. r0+mr, panels p .. p+nc] over groups [g0, g1): the chunks of a
 * group accumulate in int32, then the group's float epilogue updates t.
 * t starts at +0 (g0 = 0) or from tbuf (rows TBUF_LD floats apart, the
 * panels' 16 columns side by side) and ends in y (g1 = ng, masked to N, +
 * bias) or in tbuf. Per-row group terms (row_terms) come from `terms` (rows
 * ng apart) or, with NULL, are computed here. */
#define TBUF_LD (MAX_NC * PANEL)
static ALWAYS_INLINE void tile(const int mr, const int nc, const int bits, const int pf,
                               const wq_job *job, int64_t r0, int64_t p, int64_t ps,
                               const void *terms, int64_t g0, int64_t g1, float *tbuf) {
  const int64_t ldq = job->ldq, kpad = job->kpad, gl = job->gl, ng = job->ng;
  const int64_t pb = ps * job->pbytes; /* from one of the tile's panels to the next */
  const int8_t *x = job->xq + r0 * ldq;
  const uint8_t *wp = job->w + p * job->pbytes + group_offset(job, bits, g0);
  const __m512i nib = _mm512_set1_epi8(0x0f);
  __m512 t[MAX_MR][DECODE_STREAMS];
  __m512i acc[MAX_MR][DECODE_STREAMS];
  for (int r = 0; r < mr; r++) /* ref's t starts at +0 */
    for (int c = 0; c < nc; c++)
      t[r][c] = g0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(tbuf + r * TBUF_LD + c * PANEL);
  for (int64_t g = g0, k0 = g0 * gl; g < g1; g++, k0 += gl) {
    const int64_t k1 = k0 + gl < kpad ? k0 + gl : kpad;
    for (int r = 0; r < mr; r++) {
      __m512i start = _mm512_setzero_si512();
      if (bits == 8) {
        int32_t c;
        if (terms) {
          c = ((const int32_t *)terms)[r * ng + g];
        } else {
          const int32_t s = job->gsum ? job->gsum[(r0 + r) * job->ldgs + g]
                                      : sum_i8(x + r * ldq + k0, k1 - k0);
          c = (int32_t)(0u - 128u * (uint32_t)s);
        }
        start = _mm512_set1_epi32(c);
      }
      for (int c = 0; c < nc; c++) acc[r][c] = start;
    }
    const uint8_t *wg = wp; /* the group's span: its chunks, then its scales */
    const int64_t nch = (k1 - k0 + 31) / 32;
    const prefetch_spread pfs =
        prefetch_spread_of(nch * chunk_bytes(bits) + scale_bytes(bits, job->f16), nch);
    for (int64_t kc = k0; kc < k1; kc += 32, wp += chunk_bytes(bits)) {
      if (pf)
        for (int c = 0; c < nc; c++) prefetch_piece(pfs, wg + c * pb, (kc - k0) / 32, WQ_PF_BYTES);
      if (bits == 8) {
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) { /* 8 steps of 4 k */
          __m512i w[DECODE_STREAMS];
          for (int c = 0; c < nc; c++) w[c] = _mm512_load_si512(wp + c * pb + 64 * s);
          for (int r = 0; r < mr; r++) {
            const __m512i xb = bcast4(x + r * ldq + kc + 4 * s);
            for (int c = 0; c < nc; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], w[c], xb);
          }
        }
      } else {
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) { /* 4 steps of 8 k: low nibbles k .. k+4, high k+4 .. k+8 */
          __m512i lo[DECODE_STREAMS], hi[DECODE_STREAMS];
          for (int c = 0; c < nc; c++) {
            const __m512i v = _mm512_load_si512(wp + c * pb + 64 * s);
            lo[c] = _mm512_and_si512(v, nib);
            hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
          }
          for (int r = 0; r < mr; r++) {
            const __m512i xl = bcast4(x + r * ldq + kc + 8 * s);
            const __m512i xh = bcast4(x + r * ldq + kc + 8 * s + 4);
            for (int c = 0; c < nc; c++) {
              acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], lo[c], xl);
              acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], hi[c], xh);
            }
          }
        }
      }
    }
    __m512 dv[DECODE_STREAMS], ov[DECODE_STREAMS];
    for (int c = 0; c < nc; c++) {
      const uint8_t *sp = wp + c * pb;
      if (bits == 4 && job->f16) {
        dv[c] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sp));
        ov[c] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sp + 32)));
      } else {
        dv[c] = _mm512_load_ps(sp);
        ov[c] = bits == 4 ? _mm512_load_ps((const float *)sp + PANEL) : _mm512_setzero_ps();
      }
    }
    for (int r = 0; r < mr; r++) {
      const float sx = job->scale[(r0 + r) * job->ldsc + g];
      float b = 0.0f;
      if (bits == 4)
        b = terms ? ((const float *)terms)[r * ng + g]
                  : (float)job->gsum[(r0 + r) * job->ldgs + g] * sx;
      for (int c = 0; c < nc; c++) {
        const __m512 a = no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][c]),
                                                   _mm512_set1_ps(sx)));
        __m512 v = _mm512_fmadd_ps(dv[c], a, t[r][c]);
        if (bits == 4) v = _mm512_fmadd_ps(ov[c], _mm512_set1_ps(b), v);
        t[r][c] = v;
      }
    }
    wp += scale_bytes(bits, job->f16);
  }
  if (g1 < ng) { /* K continues in a later call */
    for (int r = 0; r < mr; r++)
      for (int c = 0; c < nc; c++) _mm512_store_ps(tbuf + r * TBUF_LD + c * PANEL, t[r][c]);
    return;
  }
  /* y = t (+ bias), masked to N */
  for (int c = 0; c < nc; c++) {
    const int64_t col = (p + c * ps) * PANEL, nv = job->n - col;
    const __mmask16 mask = nv >= PANEL ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
    const __m512 bias = job->bias ? _mm512_maskz_loadu_ps(mask, job->bias + col)
                                  : _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) {
      __m512 v = t[r][c];
      if (job->bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(job->y + (r0 + r) * job->ldy + col, mask, v);
    }
  }
}

/* A tile of mr (1 .. MAX_MR) rows, the height made a compile-time constant. */
static ALWAYS_INLINE void tile_rows(const int nc, const int bits, const int pf, const wq_job *job,
                                    int64_t r0, int64_t mr, int64_t p, int64_t ps,
                                    const void *terms, int64_t g0, int64_t g1, float *tbuf) {
  switch (mr) {
    case 1: tile(1, nc, bits, pf, job, r0, p, ps, terms, g0, g1, tbuf); break;
    case 2: tile(2, nc, bits, pf, job, r0, p, ps, terms, g0, g1, tbuf); break;
    case 3: tile(3, nc, bits, pf, job, r0, p, ps, terms, g0, g1, tbuf); break;
    case 4: tile(4, nc, bits, pf, job, r0, p, ps, terms, g0, g1, tbuf); break;
    case 5: tile(5, nc, bits, pf, job, r0, p, ps, terms, g0, g1, tbuf); break;
    default: tile(6, nc, bits, pf, job, r0, p, ps, terms, g0, g1, tbuf); break;
  }
}

/* mr rows (1 .. MAX_MR) of panels p (and p + 1 when nc = 2), the panel count a constant. */
static ALWAYS_INLINE void tile_any(const int64_t nc, const int bits, const int pf,
                                   const wq_job *job, int64_t r0, int64_t mr, int64_t p,
                                   const void *terms, int64_t g0, int64_t g1, float *tbuf) {
  if (nc == 2) tile_rows(2, bits, pf, job, r0, mr, p, 1, terms, g0, g1, tbuf);
  else tile_rows(1, bits, pf, job, r0, mr, p, 1, terms, g0, g1, tbuf);
}

/* Rows r0 .. r0 + mr (mr <= DECODE_PASS_ROWS) of a decode tile: nc panels p,
 * p + ps, .., the whole of K; pf: prefetch the panels ahead (the pass that
 * streams them in). */
static ALWAYS_INLINE void decode_pass(const int nc, const int bits, const int pf,
                                      const wq_job *job, int64_t r0, int64_t mr, int64_t p,
                                      int64_t ps, const void *terms) {
  if (terms) terms = (const int32_t *)terms + r0 * job->ng; /* int32 or float: 4 bytes */
  switch (mr) {
    case 1: tile(1, nc, bits, pf, job, r0, p, ps, terms, 0, job->ng, NULL); break;
    case 2: tile(2, nc, bits, pf, job, r0, p, ps, terms, 0, job->ng, NULL); break;
    case 3: tile(3, nc, bits, pf, job, r0, p, ps, terms, 0, job->ng, NULL); break;
    default: tile(4, nc, bits, pf, job, r0, p, ps, terms, 0, job->ng, NULL); break;
  }
}

/* A decode tile: all M (<= DECODE_MAX_M) rows of nc panels p, p + ps, .., the
 * whole of K: up to DECODE_PASS_ROWS rows in one pass over the panels; more
 * (a speculative verify step's k + 1) in two, the second reading the panels
 * the first brought in again from L2 (a panel pair's whole K: 32 bytes a
 * column at bits 8, at most 512 KiB up to K = 16K), so the weights come from
 * memory once whatever M is. */
static ALWAYS_INLINE void decode_tile(const int nc, const int bits, const wq_job *job, int64_t p,
                                      int64_t ps, const void *terms) {
  const int64_t m = job->m;
  if (m <= DECODE_PASS_ROWS) {
    decode_pass(nc, bits, 1, job, 0, m, p, ps, terms);
    return;
  }
  const int64_t first = (m + 1) / 2; /* 5 -> 3 + 2, 8 -> 4 + 4: the passes as even as can be */
  decode_pass(nc, bits, 1, job, 0, first, p, ps, terms);
  decode_pass(nc, bits, 0, job, first, m - first, p, ps, terms);
}

/* Decode items: panels [p0, p1), all M rows, the whole of K: cut into
 * DECODE_STREAMS equal runs read in lockstep (one hardware-prefetch stream
 * each, as the read probe reads), the rest one panel at a time; or all one
 * panel at a time where the CPU reads faster so (armllm_x86_decode_streams). */
static ALWAYS_INLINE void decode_task(const int bits, void *ctx, int64_t p0, int64_t p1) {
  const wq_job *job = ctx;
  union {
    int32_t i[WQ_ROW_TERMS_CAP];
    float f[WQ_ROW_TERMS_CAP];
  } buf;
  const void *terms = NULL;
  if (job->m * job->ng <= WQ_ROW_TERMS_CAP) {
    row_terms(job, bits, 0, job->m, &buf);
    terms = &buf;
  }
  const int64_t len = armllm_x86_decode_streams() == 1 ? 0 : (p1 - p0) / DECODE_STREAMS;
  for (int64_t i = 0; i < len; i++) decode_tile(DECODE_STREAMS, bits, job, p0 + i, len, terms);
  for (int64_t p = p0 + DECODE_STREAMS * len; p < p1; p++) decode_tile(1, bits, job, p, 1, terms);
}
static void decode_task8(void *ctx, int64_t i0, int64_t i1) { decode_task(8, ctx, i0, i1); }
static void decode_task4(void *ctx, int64_t i0, int64_t i1) { decode_task(4, ctx, i0, i1); }

/* Prefill item i: row block i / n_pc times panel chunk i % n_pc. Panel pair
 * by panel pair, K block by K block (kb groups: the pair's weights of a
 * block stay in L1), every row tile of the block, the first tile prefetching
 * the panel stream; t waits in tbuf between K blocks. */
static ALWAYS_INLINE void prefill_item(const int bits, const wq_job *job, int64_t item, void *buf,
                                       float *tbuf) {
  const int64_t rb = item / job->n_pc, pc = item % job->n_pc, ng = job->ng, kb = job->kb;
  const int64_t r0 = rb * job->mb, r1 = r0 + job->mb < job->m ? r0 + job->mb : job->m;
  const int64_t p0 = pc * job->cp, p1 = p0 + job->cp < job->panels ? p0 + job->cp : job->panels;
  const char *terms = NULL;
  if ((r1 - r0) * ng <= WQ_ROW_TERMS_CAP) {
    row_terms(job, bits, r0, r1, buf);
    terms = buf;
  }
  const int64_t tbytes = 4 * ng; /* a row's terms */
#define TERMS(r) (terms ? terms + ((r) - r0) * tbytes : NULL)
#define TBUF(r) (tbuf + ((r) - r0) * TBUF_LD)
  for (int64_t p = p0; p < p1; p += 2) {
    const int64_t nc = p + 2 <= p1 ? 2 : 1;
    for (int64_t g0 = 0; g0 < ng; g0 += kb) {
      const int64_t g1 = g0 + kb < ng ? g0 + kb : ng;
      int64_t r = r0;
      if (r + WQ_MR <= r1) { /* the first tile streams the panels in: prefetch ahead */
        tile_any(nc, bits, 1, job, r, WQ_MR, p, TERMS(r), g0, g1, TBUF(r));
        r += WQ_MR;
      }
      for (; r + WQ_MR <= r1; r += WQ_MR)
        tile_any(nc, bits, 0, job, r, WQ_MR, p, TERMS(r), g0, g1, TBUF(r));
      if (r < r1) {
        if (r == r0) tile_any(nc, bits, 1, job, r, r1 - r, p, TERMS(r), g0, g1, TBUF(r));
        else tile_any(nc, bits, 0, job, r, r1 - r, p, TERMS(r), g0, g1, TBUF(r));
      }
    }
  }
#undef TERMS
#undef TBUF
}

static void prefill_task8(void *ctx, int64_t i0, int64_t i1) {
  int32_t buf[WQ_ROW_TERMS_CAP];
  float tbuf[WQ_MB_MAX * TBUF_LD] __attribute__((aligned(64)));
  for (int64_t i = i0; i < i1; i++) prefill_item(8, ctx, i, buf, tbuf);
}
static void prefill_task4(void *ctx, int64_t i0, int64_t i1) {
  float buf[WQ_ROW_TERMS_CAP];
  float tbuf[WQ_MB_MAX * TBUF_LD] __attribute__((aligned(64)));
  for (int64_t i = i0; i < i1; i++) prefill_item(4, ctx, i, buf, tbuf);
}

/* Runs a gemm_wq job (the whole call's or a column window's) on the pool. */
static void wq_run(armllm_pool *pool, wq_job *job, int bits) {
  const int64_t m = job->m, n = job->n, kpad = job->kpad;
  if (m <= DECODE_MAX_M) {
    wq_run_decode(pool, job, bits == 4 ? decode_task4 : decode_task8);
    return;
  }
  if ((double)m * (double)n * (double)kpad < 4.0e6) pool = NULL;
  /* a K block of a panel pair in L1: whole groups, at least one */
  job->kb = WQ_L1_BYTES / (MAX_NC * group_offset(job, bits, 1));
  job->kb = job->kb < 1 ? 1 : job->kb;
  /* Row blocks as tall as the stack's t buffer allows, evenly cut: every
   * block streams the whole weight from memory once. */
  const int64_t n_rb = (m + WQ_MB_MAX - 1) / WQ_MB_MAX;
  const int64_t mb = ((m + n_rb - 1) / n_rb + WQ_MR - 1) / WQ_MR * WQ_MR;
  /* about ITEMS_PER_THREAD items a thread: chunks of an even number of panels */
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t n_pc = (WQ_ITEMS_PER_THREAD * threads + n_rb - 1) / n_rb;
  const int64_t pairs = (job->panels + 1) / 2;
  n_pc = n_pc > pairs ? pairs : n_pc;
  const int64_t cp = 2 * ((pairs + n_pc - 1) / n_pc);
  job->mb = mb;
  job->cp = cp;
  job->n_pc = (job->panels + cp - 1) / cp;
  armllm_pool_run(pool, n_rb * job->n_pc, 1, bits == 4 ? prefill_task4 : prefill_task8, job);
}

void armllm_avx512_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                           int64_t ldq, const float *scale, int64_t ldsc, const int32_t *gsum,
                           int64_t ldgs, const void *packed_w, int64_t n, int bits, int64_t group,
                           const float *bias, float *y, int64_t ldy) {
  wq_job job = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group, bias,
                         y, ldy);
  wq_run(pool, &job, bits);
}

void armllm_avx512_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                                const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                                int64_t n1, const float *bias, float *y, int64_t ldy) {
  wq_job job = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group, bias,
                         y, ldy);
  wq_job_window(&job, n0, n1);
  wq_run(NULL, &job, bits);
}
