/* quant_x86.h: what the quantized GEMMs of both x86 variants (avx2/quant.c,
 * avx512/quant.c) share: the packed layout's bookkeeping (panels of PANEL
 * output rows, the f16-or-f32 choice for 4-bit scales, the packer), the
 * GEMM job and its decode path (memory-bound: contiguous runs of panels per
 * thread), and how quant_act splits its rows. Static functions, so each ISA file compiles them with its own
 * flags; the including file defines PANEL, HEADER_BYTES, DECODE_MAX_M and
 * WQ_PF_BYTES first, and keeps its micro-kernels, its prefill plan and its
 * f16 store (a vector of PANEL scales) to itself. */
#ifndef ARMLLM_QUANT_X86_H
#define ARMLLM_QUANT_X86_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "armllm_kernels.h"
#include "family_jobs.h"
#include "pool.h"
#include "prefetch_x86.h"

/* ------------------------------------------------------------ layout */

static inline int64_t n_panels(int64_t n) { return (n + PANEL - 1) / PANEL; }

/* Bytes of one group's scales (and offsets) in a panel. */
static inline int64_t scale_bytes(int bits, int f16) {
  return bits == 4 ? (f16 ? 2 : 4) * 2 * PANEL : 4 * PANEL;
}

/* Bytes of one 32-k chunk of a panel's weights. */
static inline int64_t chunk_bytes(int bits) { return bits == 4 ? 16 * PANEL : 32 * PANEL; }

static inline int64_t panel_bytes(int64_t k, int bits, int64_t group, int f16) {
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  return chunk_bytes(bits) * (kpad / 32) + scale_bytes(bits, f16) * ng;
}

/* 1 when every a[i] is finite and an f16 value (NULL: none to check). */
static int exact_f16(const float *a, int64_t count) {
  if (!a) return 1;
  for (int64_t i = 0; i < count; i++) {
    if (!isfinite(a[i])) return 0;
    if (_cvtsh_ss(_cvtss_sh(a[i], _MM_FROUND_TO_NEAREST_INT)) != a[i]) return 0;
  }
  return 1;
}

/* Whether a 4-bit matrix's scales and offsets go in as f16 (8-bit: never;
 * no d given: the largest layout). */
static int scales_f16(int64_t n, int64_t k, int bits, int64_t group, const float *d,
                      const float *o) {
  const int64_t count = n * (group ? armllm_q_groups(k, group) : 1);
  return bits == 4 && d && exact_f16(d, count) && exact_f16(o, count);
}

/* The packed length (gemm_wq_packed_len). */
static inline size_t wq_packed_len(int64_t n, int64_t k, int bits, int64_t group, const float *d,
                                   const float *o) {
  const int f16 = scales_f16(n, k, bits, group, d, o);
  return (size_t)(HEADER_BYTES + n_panels(n) * panel_bytes(k, bits, group, f16));
}

/* Stores scales[0 .. 2 * PANEL) (d, then o) as f16 at dst (exact: the same
 * floats come back). */
typedef void (*wq_store_f16_fn)(uint8_t *dst, const float *scales);

/* The packer (gemm_wq_pack), the layout of the variant's file header;
 * store_f16 a constant, so the call is direct after inlining. */
static inline __attribute__((always_inline)) void wq_pack(const int8_t *q, int64_t n, int64_t k,
                                                          int bits, int64_t group, const float *d,
                                                          const float *o, void *packed,
                                                          wq_store_f16_fn store_f16) {
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  const int64_t gl = armllm_q_group_len(group);
  const int64_t ngin = group ? ng : 1; /* channelwise: one scale a row, repeated */
  const int f16 = scales_f16(n, k, bits, group, d, o);
  const int64_t step = bits == 4 ? 8 : 4; /* k per 4-byte word of each row */
  uint8_t *dst = packed;
  memset(dst, 0, HEADER_BYTES);
  *(uint32_t *)dst = (uint32_t)f16;
  dst += HEADER_BYTES;
  for (int64_t p = 0; p < n_panels(n); p++) {
    for (int64_t g = 0; g < ng; g++) {
      const int64_t k0 = g * gl, k1 = k0 + gl < kpad ? k0 + gl : kpad;
      for (int64_t ks = k0; ks < k1; ks += step)
        for (int64_t r = 0; r < PANEL; r++)
          for (int64_t j = 0; j < 4; j++) {
            const int64_t row = p * PANEL + r;
            uint8_t v = 0;
            if (row < n && ks + j < k) v = (uint8_t)q[row * k + ks + j];
            if (bits == 8) v ^= 0x80; /* q + 128: the unsigned operand */
            if (bits == 4 && row < n && ks + 4 + j < k)
              v = (uint8_t)(v | (uint8_t)q[row * k + ks + 4 + j] << 4);
            *dst++ = v;
          }
      float scales[2 * PANEL];
      for (int64_t r = 0; r < PANEL; r++) {
        const int64_t row = p * PANEL + r;
        const int64_t src = row * ngin + (group ? g : 0);
        scales[r] = row < n ? d[src] : 0.0f;
        scales[PANEL + r] = row < n && o ? o[src] : 0.0f;
      }
      if (f16) store_f16(dst, scales);
      else memcpy(dst, scales, (size_t)scale_bytes(bits, 0));
      dst += scale_bytes(bits, f16);
    }
  }
}

/* Defines prefix##_gemm_wq_packed_len and prefix##_gemm_wq_pack
 * (armllm_kernels.h) over this layout, f16 scales stored with store_f16. */
#define ARMLLM_X86_WQ_PACKING(prefix, store_f16)                                                \
  size_t prefix##_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group,             \
                                     const float *d, const float *o) {                          \
    return wq_packed_len(n, k, bits, group, d, o);                                              \
  }                                                                                             \
  void prefix##_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,    \
                             const float *d, const float *o, void *packed) {                    \
    wq_pack(q, n, k, bits, group, d, o, packed, store_f16);                                     \
  }

/* ------------------------------------------------------------ quant_act */

/* Runs task (rows [r0, r1) of job) over the m rows of a quant_act call. */
static inline void quant_act_run(armllm_pool *pool, int64_t m, armllm_quant_job *job,
                                 armllm_task_fn task) {
  const int64_t k = job->k;
  if (m * k < (1 << 16)) pool = NULL; /* a few rows: cheaper than waking workers */
  armllm_pool_run(pool, m, armllm_pool_grain(pool, m, 2, (1 << 14) / k + 1), task, job);
}

/* ------------------------------------------------------------ GEMM job */

typedef struct {
  const int8_t *xq;
  int64_t m, kpad, ldq;
  const float *scale;
  int64_t ldsc;
  const int32_t *gsum;
  int64_t ldgs;
  const uint8_t *w; /* the first panel, past the header */
  int f16;          /* 4-bit scales stored as f16 */
  int64_t n, panels, pbytes, ng, gl;
  const float *bias;
  float *y;
  int64_t ldy;
  int64_t mb, cp, n_pc; /* prefill: rows per block, panels per chunk, chunks */
  int64_t kb;           /* prefill, where the variant blocks K: groups per K block */
} wq_job;

/* The job of a gemm_wq call (the prefill plan left to the variant). */
static inline wq_job wq_job_of(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                               const float *scale, int64_t ldsc, const int32_t *gsum,
                               int64_t ldgs, const void *packed_w, int64_t n, int bits,
                               int64_t group, const float *bias, float *y, int64_t ldy) {
  const int f16 = bits == 4 && *(const uint32_t *)packed_w; /* the header */
  return (wq_job){.xq = xq,
                  .m = m,
                  .kpad = armllm_q_kpad(k),
                  .ldq = ldq,
                  .scale = scale,
                  .ldsc = ldsc,
                  .gsum = gsum,
                  .ldgs = ldgs,
                  .w = (const uint8_t *)packed_w + HEADER_BYTES,
                  .f16 = f16,
                  .n = n,
                  .panels = n_panels(n),
                  .pbytes = panel_bytes(k, bits, group, f16),
                  .ng = armllm_q_groups(k, group),
                  .gl = armllm_q_group_len(group),
                  .bias = bias,
                  .y = y,
                  .ldy = ldy};
}

/* The job narrowed to the columns [n0, n1) (gemm_wq_cols: n0 on a panel; y
 * and bias the window's): the matrix from n0's panel on, cut at n1. */
static inline void wq_job_window(wq_job *job, int64_t n0, int64_t n1) {
  job->w += n0 / PANEL * job->pbytes;
  job->n = n1 - n0;
  job->panels = n_panels(job->n);
}

/* Decode (M <= DECODE_MAX_M): memory-bound, so contiguous runs of panels per
 * thread; small ones stay serial. */
static inline void wq_run_decode(armllm_pool *pool, wq_job *job, armllm_task_fn task) {
  if ((double)job->panels * (double)job->pbytes < 64.0 * 1024) pool = NULL;
  armllm_pool_run(pool, job->panels, armllm_pool_grain(pool, job->panels, 4, 4), task, job);
}

/* Decode streams each panel once from memory: ask for the lines WQ_PF_BYTES
 * ahead of the `len` bytes about to be read (AVX2: its 8-row panels' groups
 * are not whole lines, and prefetch_piece's spread over them measured 5-8%
 * slower on Zen 5; AVX-512 spreads, see prefetch_x86.h). */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *w, int len) {
  for (int i = 0; i < len; i += PREFETCH_LINE)
    _mm_prefetch((const char *)w + WQ_PF_BYTES + i, _MM_HINT_T0);
}

#endif /* ARMLLM_QUANT_X86_H */
