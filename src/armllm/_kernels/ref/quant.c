/* ref/quant.c: int8 activation quantization (per token and group) and the
 * quantized (int8 / int4 weight, int8 activation) GEMM, portable C: the
 * reference the other variants are checked against bit for bit.
 *
 * Packed layout "nk8": q as int8 [n][kpad] (int4 values one per byte), then
 * at the next 16-byte boundary d as f32 [n][ng], then o as f32 [n][ng]
 * (zeros when the weights have no offsets); channelwise scales are repeated
 * over the row's groups. */
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

static size_t q_bytes(int64_t n, int64_t k) {
  return ((size_t)(n * armllm_q_kpad(k)) + 15) & ~(size_t)15;
}

/* One group's scale (and zero point): the header's rules, NaN winning every max/min. */
static float ref_group_scale(const float *x, int64_t k0, int64_t kx, int asym, int32_t *z) {
  float amax = 0.0f, lo = 0.0f, hi = 0.0f;
  for (int64_t i = k0; i < kx; i++) {
    const float v = x[i], a = fabsf(v);
    amax = (a > amax || a != a) ? a : amax;
    hi = (v > hi || v != v) ? v : hi;
    lo = (v < lo || v != v) ? v : lo;
  }
  *z = 0;
  if (!asym) return amax / 127.0f;
  return armllm_q_asym_scale(lo, hi, z);
}

static void ref_quant_rows(const armllm_quant_job *j, int64_t r0, int64_t r1) {
  const int64_t k = j->k, kpad = j->kpad, ng = j->ng, gl = j->gl, ldq = j->ldq;
  const int64_t ldsc = j->ldsc, ldgs = j->ldgs, ldzp = j->ldzp;
  const float *x = j->x;
  int8_t *xq = j->xq;
  float *scale = j->scale;
  int32_t *gsum = j->gsum, *zp = j->zp;
  const int64_t ldx = j->ldx;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = x + r * ldx;
    int8_t *qr = xq + r * ldq;
    for (int64_t g = 0; g < ng; g++) {
      const int64_t k0 = g * gl, k1 = (g + 1) * gl < kpad ? (g + 1) * gl : kpad;
      const int64_t kx = k1 < k ? k1 : k; /* the group's real columns */
      int32_t z;
      const float s = ref_group_scale(xr, k0, kx, zp != NULL, &z);
      const int zero = s == 0.0f || !isfinite(s);
      int32_t acc = 0;
      for (int64_t i = k0; i < kx; i++) {
        float v = zero ? 0.0f : nearbyintf(xr[i] / s);
        v = v == v ? v : 0.0f;
        if (v > 255.0f) v = 255.0f; /* keeps the int conversion defined; clamped below */
        if (v < -255.0f) v = -255.0f;
        int32_t iv = (int32_t)v + z;
        iv = iv > 127 ? 127 : (iv < -127 ? -127 : iv);
        qr[i] = (int8_t)iv;
        acc += qr[i];
      }
      for (int64_t i = kx; i < k1; i++) qr[i] = 0;
      scale[r * ldsc + g] = s;
      if (gsum) gsum[r * ldgs + g] = acc;
      if (zp) zp[r * ldzp + g] = z;
    }
  }
}

static void ref_quant_task(void *ctx, int64_t r0, int64_t r1) {
  const armllm_quant_job *j = ctx;
  ref_quant_rows(j, r0, r1);
}

void armllm_ref_quant_act(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                          int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp) {
  armllm_quant_job job =
      armllm_quant_job_of(x, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp);
  armllm_pool_run(pool, m, armllm_pool_grain(pool, m, 4, 4), ref_quant_task, &job);
}

size_t armllm_ref_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group,
                                     const float *d, const float *o) {
  (void)d, (void)o; /* f32 scales whatever their values */
  (void)bits;
  return q_bytes(n, k) + 2 * (size_t)(n * armllm_q_groups(k, group)) * sizeof(float);
}

void armllm_ref_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                             const float *d, const float *o, void *packed) {
  (void)bits;
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  const int64_t ngin = group ? ng : 1; /* scales given per row when channelwise */
  int8_t *pq = packed;
  for (int64_t j = 0; j < n; j++) {
    memcpy(pq + j * kpad, q + j * k, (size_t)k);
    memset(pq + j * kpad + k, 0, (size_t)(kpad - k));
  }
  float *pd = (float *)((char *)packed + q_bytes(n, k)), *po = pd + n * ng;
  for (int64_t j = 0; j < n; j++)
    for (int64_t g = 0; g < ng; g++) {
      const int64_t src = j * ngin + (group ? g : 0);
      pd[j * ng + g] = d[src];
      po[j * ng + g] = o ? o[src] : 0.0f;
    }
}

typedef struct {
  const int8_t *xq;
  int64_t m, kpad, ldq, ng, gl, ldsc, ldgs;
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
    const float *sx = job->scale + r * job->ldsc;
    for (int64_t j = n0; j < n1; j++) {
      const int8_t *wr = job->pq + j * kpad;
      float t = 0.0f;
      for (int64_t g = 0; g < ng; g++) {
        const int64_t k1 = (g + 1) * gl < kpad ? (g + 1) * gl : kpad;
        int32_t acc = 0;
        for (int64_t i = g * gl; i < k1; i++) acc += (int32_t)xr[i] * (int32_t)wr[i];
        const float a = (float)acc * sx[g];
        t = fmaf(job->pd[j * ng + g], a, t);
        if (job->offsets) {
          const float b = (float)job->gsum[r * job->ldgs + g] * sx[g];
          t = fmaf(job->po[j * ng + g], b, t);
        }
      }
      float v = t;
      if (job->bias) v = v + job->bias[j];
      job->y[r * job->ldy + j] = v;
    }
  }
}

static ref_wq_job ref_wq_job_of(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                const float *scale, int64_t ldsc, const int32_t *gsum,
                                int64_t ldgs, const void *packed_w, int64_t n, int bits,
                                int64_t group, const float *bias, float *y, int64_t ldy) {
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  const float *pd = (const float *)((const char *)packed_w + q_bytes(n, k));
  const ref_wq_job job = {xq, m, kpad, ldq, ng, armllm_q_group_len(group), ldsc, ldgs, scale,
                          gsum, packed_w, pd, pd + n * ng, bits == 4, bias, y, ldy};
  return job;
}

void armllm_ref_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) {
  ref_wq_job job = ref_wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group,
                                 bias, y, ldy);
  armllm_pool_run(pool, n, armllm_pool_grain(pool, n, 4, 16), ref_gemm_wq_cols, &job);
}

void armllm_ref_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                             const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                             const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                             int64_t n1, const float *bias, float *y, int64_t ldy) {
  ref_wq_job job = ref_wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group,
                                 bias, y, ldy);
  job.pq += n0 * job.kpad; /* the window's rows of q, d and o */
  job.pd += n0 * job.ng;
  job.po += n0 * job.ng;
  ref_gemm_wq_cols(&job, 0, n1 - n0);
}
