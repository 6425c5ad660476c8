/* ref/gguf.c: the GGUF-block GEMM (armllm_kernels.h) in portable C, the
 * reference the other variants are checked against bit for bit.
 *
 * Packed layout "gguf-nk8": the armllm_gguf_parts header
 * (ARMLLM_GGUF_HEADER_BYTES), then v as int8 [n][k] (the decoded integer
 * values), then d as f32 [n][k/16] and o as f32 [n][k/16] (one per 16
 * columns, gguf_blocks.h: a 32-column group's twice; o 0 without offsets),
 * then D, O as f32 [n][k/256][2]. Rows of a super-block type hold their
 * integer sub-scales s and mins m in d and o (exact in f32) and each
 * block's D, O (armllm_gguf_decode_super); the other rows' D, O are 0. */
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "../gguf_blocks.h"

#define SC ARMLLM_GGUF_SCALE_COLS

static size_t v_bytes(int64_t n, int64_t k) { return ((size_t)(n * k) + 15) & ~(size_t)15; }

static int64_t total_rows(int64_t nparts, const int64_t *rows) {
  int64_t n = 0;
  for (int64_t i = 0; i < nparts; i++) n += rows[i];
  return n;
}

size_t armllm_ref_gemm_gguf_packed_len(int64_t k, int64_t nparts, const int32_t *types,
                                       const int64_t *rows) {
  (void)types;
  const int64_t n = total_rows(nparts, rows);
  return ARMLLM_GGUF_HEADER_BYTES + v_bytes(n, k) +
         2 * (size_t)(n * (k / SC + k / ARMLLM_GGUF_SUPER)) * sizeof(float);
}

void armllm_ref_gemm_gguf_pack(const uint8_t *blocks, int64_t k, int64_t nparts,
                               const int32_t *types, const int64_t *rows, void *packed) {
  const int64_t n = total_rows(nparts, rows), ns = k / SC;
  const armllm_gguf_parts parts = armllm_gguf_parts_of(nparts, types, rows);
  memset(packed, 0, ARMLLM_GGUF_HEADER_BYTES);
  memcpy(packed, &parts, sizeof parts);
  int8_t *pv = (int8_t *)packed + ARMLLM_GGUF_HEADER_BYTES;
  float *pd = (float *)((char *)pv + v_bytes(n, k)), *po = pd + n * ns, *pso = po + n * ns;
  const int64_t nsb = k / ARMLLM_GGUF_SUPER;
  memset(pso, 0, 2 * (size_t)(n * nsb) * sizeof(float));
  int64_t row = 0;
  for (int64_t p = 0; p < nparts; p++) {
    const int type = types[p], be = armllm_gguf_block_elems(type);
    const int bb = armllm_gguf_block_bytes(type);
    for (int64_t r = 0; r < rows[p]; r++, row++) {
      for (int64_t b0 = 0; b0 < k; b0 += be) {
        float *d = pd + row * ns + b0 / SC, *o = po + row * ns + b0 / SC;
        if (!armllm_gguf_is_super(type)) {
          armllm_gguf_decode_block(type, blocks + (b0 / be) * bb, pv + row * k + b0, d, o);
          continue;
        }
        int16_t sj[ARMLLM_GGUF_SUPER / SC], mj[ARMLLM_GGUF_SUPER / SC];
        float *so = pso + 2 * (row * nsb + b0 / be);
        armllm_gguf_decode_super(type, blocks + (b0 / be) * bb, pv + row * k + b0, sj, mj, so,
                                 so + 1);
        for (int j = 0; j < ARMLLM_GGUF_SUPER / SC; j++) d[j] = (float)sj[j], o[j] = (float)mj[j];
      }
      blocks += armllm_gguf_row_bytes(type, k);
    }
  }
}

typedef struct {
  const int8_t *xq;
  int64_t m, k, ldq, ldsc;
  const float *scale;
  const armllm_gguf_parts *parts;
  int64_t act_group;
  const int8_t *pv;
  const float *pd, *po, *pso;
  const float *bias;
  float *y;
  int64_t ldy;
  int64_t col0; /* the output column at y and bias[0]: a window's first */
} ref_gguf_job;

/* sum over [k0, k0 + len) of x * w (w NULL: of x), exact in int32 */
static int32_t dot_i8(const int8_t *x, const int8_t *w, int64_t k0, int64_t len) {
  int32_t acc = 0;
  for (int64_t i = k0; i < k0 + len; i++) acc += (int32_t)x[i] * (w ? (int32_t)w[i] : 1);
  return acc;
}

static void ref_gemm_gguf_cols(void *ctx, int64_t n0, int64_t n1) {
  const ref_gguf_job *job = ctx;
  const int64_t k = job->k, ns = k / SC, G = job->act_group, SB = ARMLLM_GGUF_SUPER;
  for (int64_t j = n0; j < n1; j++) {
    const int type = armllm_gguf_row_type(job->parts, j);
    const int64_t gl = armllm_gguf_group_len(type);
    const int offsets = armllm_gguf_has_offsets(type), super = armllm_gguf_is_super(type);
    const int8_t *wr = job->pv + j * k;
    const float *dj = job->pd + j * ns, *oj = job->po + j * ns, *soj = job->pso + j * 2 * (k / SB);
    for (int64_t r = 0; r < job->m; r++) {
      const int8_t *xr = job->xq + r * job->ldq;
      const float *sx = job->scale + r * job->ldsc;
      float t = 0.0f;
      if (super) { /* per super-block: s_j * acc_j and m_j * gs_j summed in int32 */
        for (int64_t b = 0; b < k / SB; b++) {
          int32_t isum = 0, msum = 0;
          for (int64_t k0 = b * SB; k0 < (b + 1) * SB; k0 += gl) {
            isum += (int32_t)dj[k0 / SC] * dot_i8(xr, wr, k0, gl);
            if (offsets) msum += (int32_t)oj[k0 / SC] * dot_i8(xr, NULL, k0, gl);
          }
          const float s = sx[b * SB / G];
          t = fmaf(soj[2 * b], (float)isum * s, t);
          if (offsets) t = fmaf(soj[2 * b + 1], (float)msum * s, t);
        }
      } else { /* per 32-element block */
        for (int64_t k0 = 0; k0 < k; k0 += gl) {
          const float s = sx[k0 / G];
          t = fmaf(dj[k0 / SC], (float)dot_i8(xr, wr, k0, gl) * s, t);
          if (offsets) t = fmaf(oj[k0 / SC], (float)dot_i8(xr, NULL, k0, gl) * s, t);
        }
      }
      float v = t;
      if (job->bias) v = v + job->bias[j - job->col0];
      job->y[r * job->ldy + j - job->col0] = v;
    }
  }
}

static ref_gguf_job ref_gguf_job_of(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                    const float *scale, int64_t ldsc, const void *packed_w,
                                    int64_t n, const float *bias, float *y, int64_t ldy) {
  const armllm_gguf_parts *parts = packed_w;
  const int8_t *pv = (const int8_t *)packed_w + ARMLLM_GGUF_HEADER_BYTES;
  const float *pd = (const float *)((const char *)pv + v_bytes(n, k));
  const ref_gguf_job job = {xq, m, k, ldq, ldsc, scale, parts, armllm_gguf_act_group(parts), pv,
                            pd, pd + n * (k / SC), pd + 2 * n * (k / SC), bias, y, ldy, 0};
  return job;
}

void armllm_ref_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                          const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                          const void *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  (void)gsum, (void)ldgs; /* the group sums are summed here, with the products */
  ref_gguf_job job = ref_gguf_job_of(xq, m, k, ldq, scale, ldsc, packed_w, n, bias, y, ldy);
  armllm_pool_run(pool, n, armllm_pool_grain(pool, n, 4, 16), ref_gemm_gguf_cols, &job);
}

void armllm_ref_gemm_gguf_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                               const float *scale, int64_t ldsc, const int32_t *gsum,
                               int64_t ldgs, const void *packed_w, int64_t n, int64_t n0,
                               int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)gsum, (void)ldgs;
  ref_gguf_job job = ref_gguf_job_of(xq, m, k, ldq, scale, ldsc, packed_w, n, bias, y, ldy);
  job.col0 = n0;
  ref_gemm_gguf_cols(&job, n0, n1);
}
