/* ref/gguf.c: the GGUF-block GEMM (armllm_kernels.h) in portable C, the
 * reference the other variants are checked against bit for bit.
 *
 * Packed layout "gguf-nk8": the armllm_gguf_parts header
 * (ARMLLM_GGUF_HEADER_BYTES), then v as int8 [n][k] (the decoded integer
 * values), then d as f32 [n][k/16] and o as f32 [n][k/16] (one per 16
 * columns, gguf_blocks.h: a 32-column group's twice; o 0 without offsets). */
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
  return ARMLLM_GGUF_HEADER_BYTES + v_bytes(n, k) + 2 * (size_t)(n * (k / SC)) * sizeof(float);
}

void armllm_ref_gemm_gguf_pack(const uint8_t *blocks, int64_t k, int64_t nparts,
                               const int32_t *types, const int64_t *rows, void *packed) {
  const int64_t n = total_rows(nparts, rows), ns = k / SC;
  const armllm_gguf_parts parts = armllm_gguf_parts_of(nparts, types, rows);
  memset(packed, 0, ARMLLM_GGUF_HEADER_BYTES);
  memcpy(packed, &parts, sizeof parts);
  int8_t *pv = (int8_t *)packed + ARMLLM_GGUF_HEADER_BYTES;
  float *pd = (float *)((char *)pv + v_bytes(n, k)), *po = pd + n * ns;
  int64_t row = 0;
  for (int64_t p = 0; p < nparts; p++) {
    const int type = types[p], be = armllm_gguf_block_elems(type);
    const int bb = armllm_gguf_block_bytes(type);
    for (int64_t r = 0; r < rows[p]; r++, row++) {
      for (int64_t b0 = 0; b0 < k; b0 += be) {
        armllm_gguf_decode_block(type, blocks + (b0 / be) * bb, pv + row * k + b0,
                                 pd + row * ns + b0 / SC, po + row * ns + b0 / SC);
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
  const int8_t *pv;
  const float *pd, *po;
  const float *bias;
  float *y;
  int64_t ldy;
} ref_gguf_job;

static void ref_gemm_gguf_cols(void *ctx, int64_t n0, int64_t n1) {
  const ref_gguf_job *job = ctx;
  const int64_t k = job->k, ns = k / SC, ag = ARMLLM_GGUF_ACT_GROUP;
  for (int64_t j = n0; j < n1; j++) {
    const int type = armllm_gguf_row_type(job->parts, j);
    const int64_t gl = armllm_gguf_group_len(type);
    const int offsets = armllm_gguf_has_offsets(type);
    const int8_t *wr = job->pv + j * k;
    const float *dj = job->pd + j * ns, *oj = job->po + j * ns;
    for (int64_t r = 0; r < job->m; r++) {
      const int8_t *xr = job->xq + r * job->ldq;
      const float *sx = job->scale + r * job->ldsc;
      float t = 0.0f;
      for (int64_t g = 0; g < k / ag; g++) {
        for (int64_t k0 = g * ag; k0 < (g + 1) * ag; k0 += gl) {
          int32_t acc = 0, xs = 0;
          for (int64_t i = k0; i < k0 + gl; i++) {
            acc += (int32_t)xr[i] * (int32_t)wr[i];
            xs += xr[i];
          }
          const float a = (float)acc * sx[g];
          t = fmaf(dj[k0 / SC], a, t);
          if (offsets) {
            const float b = (float)xs * sx[g];
            t = fmaf(oj[k0 / SC], b, t);
          }
        }
      }
      float v = t;
      if (job->bias) v = v + job->bias[j];
      job->y[r * job->ldy + j] = v;
    }
  }
}

void armllm_ref_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                          const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                          const void *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  const armllm_gguf_parts *parts = packed_w;
  const int8_t *pv = (const int8_t *)packed_w + ARMLLM_GGUF_HEADER_BYTES;
  const float *pd = (const float *)((const char *)pv + v_bytes(n, k));
  (void)gsum, (void)ldgs; /* the group sums are summed here, with the products */
  ref_gguf_job job = {xq, m, k, ldq, ldsc, scale, parts, pv, pd, pd + n * (k / SC), bias, y, ldy};
  armllm_pool_run(pool, n, armllm_pool_grain(pool, n, 4, 16), ref_gemm_gguf_cols, &job);
}
