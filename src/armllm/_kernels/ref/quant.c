/* ref/quant.c: per-token int8 activation quantization and the quantized
 * (int8 / int4 weight, int8 activation) GEMM, portable C: the reference the
 * other variants are checked against bit for bit.
 *
 * Packed layout "nk8": q as int8 [n][kpad] (int4 values one per byte), then
 * at the next 16-byte boundary d as f32 [n][ng], then o as f32 [n][ng]
 * (zeros when the weights have no offsets). */
#include <math.h>

#include "../armllm_kernels.h"

static size_t q_bytes(int64_t n, int64_t k) {
  return ((size_t)(n * armllm_q_kpad(k)) + 15) & ~(size_t)15;
}

void armllm_ref_quant_act(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          int64_t group, int8_t *xq, int64_t ldq, float *scale, int32_t *gsum,
                          int64_t ldgs) {
  (void)pool;
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  const int64_t gl = group ? group : kpad;
  for (int64_t r = 0; r < m; r++) {
    const float *xr = x + r * ldx;
    int8_t *qr = xq + r * ldq;
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++) {
      const float a = fabsf(xr[i]);
      amax = (a > amax || a != a) ? a : amax; /* NaN wins */
    }
    const float s = amax / 127.0f;
    for (int64_t i = 0; i < k; i++) {
      float v = s != 0.0f ? nearbyintf(xr[i] / s) : 0.0f;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      qr[i] = (int8_t)(v == v ? v : 0.0f);
    }
    for (int64_t i = k; i < kpad; i++) qr[i] = 0;
    scale[r] = s;
    if (gsum)
      for (int64_t g = 0; g < ng; g++) {
        const int64_t k1 = (g + 1) * gl < kpad ? (g + 1) * gl : kpad;
        int32_t acc = 0;
        for (int64_t i = g * gl; i < k1; i++) acc += qr[i];
        gsum[r * ldgs + g] = acc;
      }
  }
}

size_t armllm_ref_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group) {
  (void)bits;
  return q_bytes(n, k) + 2 * (size_t)(n * armllm_q_groups(k, group)) * sizeof(float);
}

void armllm_ref_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                             const float *d, const float *o, void *packed) {
  (void)bits;
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  int8_t *pq = packed;
  for (int64_t j = 0; j < n; j++) {
    memcpy(pq + j * kpad, q + j * k, (size_t)k);
    memset(pq + j * kpad + k, 0, (size_t)(kpad - k));
  }
  float *pd = (float *)((char *)packed + q_bytes(n, k)), *po = pd + n * ng;
  memcpy(pd, d, (size_t)(n * ng) * sizeof(float));
  if (o) memcpy(po, o, (size_t)(n * ng) * sizeof(float));
  else memset(po, 0, (size_t)(n * ng) * sizeof(float));
}

typedef struct {
  const int8_t *xq;
  int64_t m, kpad, ldq, ng, gl, ldgs;
  const float *scale;
  const int32_t *gsum;
  const int8_t *pq;
  const float *pd, *po;
  int offsets;
  const float *bias;
  float *y;
  int64_t ldy;
} ref_wq_job;

static void ref_gemm_wq_cols(void *ctx, int64_t n0, int64_t n1) {
  const ref_wq_job *job = ctx;
  const int64_t kpad = job->kpad, ng = job->ng, gl = job->gl;
  for (int64_t r = 0; r < job->m; r++) {
    const int8_t *xr = job->xq + r * job->ldq;
    for (int64_t j = n0; j < n1; j++) {
      const int8_t *wr = job->pq + j * kpad;
      float t = 0.0f;
      for (int64_t g = 0; g < ng; g++) {
        const int64_t k1 = (g + 1) * gl < kpad ? (g + 1) * gl : kpad;
        int32_t acc = 0;
        for (int64_t i = g * gl; i < k1; i++) acc += (int32_t)xr[i] * (int32_t)wr[i];
        t = fmaf(job->pd[j * ng + g], (float)acc, t);
        if (job->offsets) t = fmaf(job->po[j * ng + g], (float)job->gsum[r * job->ldgs + g], t);
      }
      float v = t * job->scale[r];
      if (job->bias) v = v + job->bias[j];
      job->y[r * job->ldy + j] = v;
    }
  }
}

void armllm_ref_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) {
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  const float *pd = (const float *)((const char *)packed_w + q_bytes(n, k));
  ref_wq_job job = {xq, m, kpad, ldq, ng, group ? group : kpad, ldgs, scale, gsum, packed_w,
                    pd, pd + n * ng, bits == 4, bias, y, ldy};
  armllm_pool_run(pool, n, armllm_pool_grain(pool, n, 4, 16), ref_gemm_wq_cols, &job);
}
