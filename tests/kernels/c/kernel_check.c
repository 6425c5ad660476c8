/* kernel_check.c: checks every kernel variant this CPU runs against ref.
 *
 * Built natively (x86-64: avx2) and cross-built for aarch64, where
 * tools/arm_kernel_check.sh runs it under qemu-user at several CPU levels
 * (NEON only, dotprod+LSE, BF16/I8MM, SVE at 128/256/512 bits). Prints one
 * line per (variant, kernel) with the worst error as a fraction of the
 * tolerance, checks the thread pool, the all-reduce between processes (fork),
 * the GEMMs' column windows and the mixture-of-experts layer (moe.h) against
 * the per-expert composition of the slots, and exits non-zero on any failure.
 *
 *   kernel_check [--isa NAME ...] [--quick]
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "armllm_kernels.h"
#include "comm.h"
#include "cpu.h"
#include "gguf_blocks.h"
#include "moe.h"
#include "sample.h"

static int failures;

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}
static void fill(float *p, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++) p[i] = frand() * scale;
}
static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) { fprintf(stderr, "out of memory\n"); exit(3); }
  return p;
}
/* 64-byte aligned, as the Python layer allocates packed weights */
static void *xmalloc64(size_t n) {
  void *p = aligned_alloc(64, ((n ? n : 1) + 63) / 64 * 64);
  if (!p) { fprintf(stderr, "out of memory\n"); exit(3); }
  return p;
}

typedef struct {
  const char *isa, *kernel;
  int cases;
  double worst; /* max error / tolerance; <= 1 passes */
  int bad;      /* non-finite mismatches, wrong return codes, ... */
} report;

static void report_start(report *r, const char *isa, const char *kernel) {
  memset(r, 0, sizeof *r);
  r->isa = isa;
  r->kernel = kernel;
}
static void report_value(report *r, double got, double want, double tol) {
  if (isnan(want) || isinf(want)) {
    if (!(isnan(want) ? isnan(got) : got == want)) r->bad++;
    return;
  }
  if (!isfinite(got)) { r->bad++; return; }
  double ratio = fabs(got - want) / tol;
  if (ratio > r->worst) r->worst = ratio;
}
/* What runs in a slot of v on this CPU (run-time choices included). */
static const char *impl_of(const armllm_kernels *v, int slot) {
  static char buf[64];
  return armllm_slot_impl(v, slot, buf, sizeof buf);
}

static void report_end(report *r, const char *impl) {
  int ok = r->bad == 0 && r->worst <= 1.0;
  if (!ok) failures++;
  printf("%-10s %-10s %-12s %6d  %9.3g  %s\n", r->isa, r->kernel, impl, r->cases, r->worst,
         ok ? "PASS" : "FAIL");
  fflush(stdout);
}

/* --------------------------------------------------------------- gemm */

/* One GEMM case, (m, n, k) with row strides ldx/ldy, against ref: within the
 * stated tolerance, bit-identical unless the variant rounds activations to
 * bf16 (every other one is ref's FMA chain), and nothing written past N in
 * y's rows. */
static void gemm_case(report *r, const armllm_kernels *v, armllm_pool *pool, int bf16,
                      int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, int with_bias) {
  const armllm_kernels *ref = &armllm_kernels_ref;
  const int bf16_acts = bf16 && strcmp(v->gemm_bf16_compute, "bf16") == 0;
  const double rel = bf16_acts ? 1.0 / 256 : 1e-5;
  float *x = xmalloc(sizeof(float) * (size_t)(m * ldx));
  float *w = xmalloc(sizeof(float) * (size_t)(n * k));
  uint16_t *wb = xmalloc(sizeof(uint16_t) * (size_t)(n * k));
  float *bias = xmalloc(sizeof(float) * (size_t)n);
  float *y = xmalloc(sizeof(float) * (size_t)(m * ldy));
  float *yref = xmalloc(sizeof(float) * (size_t)(m * ldy));
  fill(x, m * ldx, 2.0f);
  fill(w, n * k, 1.0f);
  fill(bias, n, 1.0f);
  for (int64_t i = 0; i < n * k; i++) {
    wb[i] = armllm_f32_to_bf16(w[i]);
    w[i] = bf16 ? armllm_bf16_to_f32(wb[i]) : w[i];
  }
  for (int64_t i = 0; i < m * ldy; i++) y[i] = yref[i] = -777.0f; /* row padding stays */
  const float *b = with_bias ? bias : NULL;
  if (bf16) {
    uint16_t *p = xmalloc(sizeof(uint16_t) * v->gemm_bf16_packed_len(n, k));
    uint16_t *pr = xmalloc(sizeof(uint16_t) * ref->gemm_bf16_packed_len(n, k));
    v->gemm_bf16_pack(wb, n, k, p);
    ref->gemm_bf16_pack(wb, n, k, pr);
    v->gemm_bf16(pool, x, m, k, ldx, p, n, b, y, ldy);
    ref->gemm_bf16(NULL, x, m, k, ldx, pr, n, b, yref, ldy);
    free(p);
    free(pr);
  } else {
    float *p = xmalloc(sizeof(float) * v->gemm_f32_packed_len(n, k));
    float *pr = xmalloc(sizeof(float) * ref->gemm_f32_packed_len(n, k));
    v->gemm_f32_pack(w, n, k, p);
    ref->gemm_f32_pack(w, n, k, pr);
    v->gemm_f32(pool, x, m, k, ldx, p, n, b, y, ldy);
    ref->gemm_f32(NULL, x, m, k, ldx, pr, n, b, yref, ldy);
    free(p);
    free(pr);
  }
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < ldy; j++) {
      if (j >= n) { /* past N: must be untouched */
        if (y[i * ldy + j] != -777.0f) r->bad++;
        continue;
      }
      double mag = with_bias ? fabs(bias[j]) : 0.0;
      for (int64_t q = 0; q < k; q++) mag += fabs((double)x[i * ldx + q] * w[j * k + q]);
      report_value(r, y[i * ldy + j], yref[i * ldy + j], rel * mag + 1e-30);
      if (!bf16_acts && memcmp(&y[i * ldy + j], &yref[i * ldy + j], sizeof(float)) != 0) r->bad++;
    }
  r->cases++;
  free(x); free(w); free(wb); free(bias); free(y); free(yref);
}

/* Tail cases: M, N, K around every tile and vector width. */
static void check_gemm(const armllm_kernels *v, armllm_pool *pool, int quick, int bf16) {
  static const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 33};
  static const int64_t ns[] = {1, 3, 15, 17, 33, 47};
  static const int64_t ks[] = {1, 3, 7, 8, 9, 31, 33, 65};
  report r;
  report_start(&r, v->isa, bf16 ? "gemm_bf16" : "gemm_f32");
  int n_ms = quick ? 6 : (int)(sizeof ms / sizeof *ms);
  for (int im = 0; im < n_ms; im++)
    for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
      for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++)
        gemm_case(&r, v, pool, bf16, ms[im], ns[in], ks[ik], ks[ik] + (int64_t)(ik & 1) * 3,
                  ns[in] + (int64_t)(in & 1) * 5, (int)((im + in + ik) & 1));
  report_end(&r, impl_of(v, bf16 ? ARMLLM_K_gemm_bf16 : ARMLLM_K_gemm_f32));
}

static void run_packed(const armllm_kernels *v, armllm_pool *pool, int bf16, const float *x,
                       int64_t rows, int64_t k, const void *packed, int64_t n, float *y) {
  if (bf16) v->gemm_bf16(pool, x, rows, k, k, packed, n, NULL, y, n);
  else v->gemm_f32(pool, x, rows, k, k, packed, n, NULL, y, n);
}

/* Bit-identical for 1 and N threads, and batch-invariant: a row's output is
 * the same whether it runs alone, in a small (decode) batch or in a large
 * (prefill) one. */
static void check_gemm_threads(const armllm_kernels *v, armllm_pool *pool, int bf16) {
  report r;
  report_start(&r, v->isa, bf16 ? "bf16_thr" : "f32_thr");
  const int64_t m = 37, n = 70, k = 45;
  float *x = xmalloc(sizeof(float) * (size_t)(m * k));
  float *w = xmalloc(sizeof(float) * (size_t)(n * k));
  uint16_t *wb = xmalloc(sizeof(uint16_t) * (size_t)(n * k));
  float *y1 = xmalloc(sizeof(float) * (size_t)(m * n));
  float *yn = xmalloc(sizeof(float) * (size_t)(m * n));
  float *yfull = xmalloc(sizeof(float) * (size_t)(m * n));
  fill(x, m * k, 1.0f);
  fill(w, n * k, 1.0f);
  for (int64_t i = 0; i < n * k; i++) wb[i] = armllm_f32_to_bf16(w[i]);
  void *packed;
  if (bf16) {
    packed = xmalloc(sizeof(uint16_t) * v->gemm_bf16_packed_len(n, k));
    v->gemm_bf16_pack(wb, n, k, packed);
  } else {
    packed = xmalloc(sizeof(float) * v->gemm_f32_packed_len(n, k));
    v->gemm_f32_pack(w, n, k, packed);
  }
  run_packed(v, pool, bf16, x, m, k, packed, n, yfull);
  for (int64_t rows = 1; rows <= m; rows += 12) { /* decode and prefill paths */
    run_packed(v, NULL, bf16, x, rows, k, packed, n, y1);
    run_packed(v, pool, bf16, x, rows, k, packed, n, yn);
    if (memcmp(y1, yn, sizeof(float) * (size_t)(rows * n)) != 0) r.bad++;
    if (memcmp(yfull, yn, sizeof(float) * (size_t)(rows * n)) != 0) r.bad++;
    r.cases++;
  }
  for (int64_t off = 0; off + 4 <= m; off += 5) /* small batches at other offsets */
    for (int64_t rows = 1; rows <= 4; rows++) {
      run_packed(v, pool, bf16, x + off * k, rows, k, packed, n, yn);
      if (memcmp(yfull + off * n, yn, sizeof(float) * (size_t)(rows * n)) != 0) r.bad++;
      r.cases++;
    }
  free(packed); free(x); free(w); free(wb); free(y1); free(yn); free(yfull);
  report_end(&r, impl_of(v, bf16 ? ARMLLM_K_gemm_bf16 : ARMLLM_K_gemm_f32));
}

/* Larger shapes: several K blocks, panel groups and row-block edges. */
static void check_gemm_blocks(const armllm_kernels *v, armllm_pool *pool, int bf16) {
  static const int64_t shapes[][3] = {{1, 129, 2100}, {2, 70, 2100}, {4, 40, 300}, {9, 129, 300}, {37, 33, 530}};
  report r;
  report_start(&r, v->isa, bf16 ? "bf16_big" : "f32_big");
  for (size_t is = 0; is < sizeof shapes / sizeof *shapes; is++)
    gemm_case(&r, v, pool, bf16, shapes[is][0], shapes[is][1], shapes[is][2], shapes[is][2] + 1,
              shapes[is][1] + 2, (int)(is & 1));
  report_end(&r, impl_of(v, bf16 ? ARMLLM_K_gemm_bf16 : ARMLLM_K_gemm_f32));
}

/* ------------------------------------------------------------ rmsnorm */

static void check_rmsnorm(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ds[] = {1, 3, 8, 15, 16, 17, 63, 100, 576};
  report r;
  report_start(&r, v->isa, "rmsnorm");
  for (size_t id = 0; id < sizeof ds / sizeof *ds; id++)
    for (int fused = 0; fused < 2; fused++)
      for (int inplace = 0; inplace < 2; inplace++) {
        int64_t t = 5, d = ds[id], ld = d + 2;
        float *x = xmalloc(sizeof(float) * (size_t)(t * ld)), *x2 = xmalloc(sizeof(float) * (size_t)(t * ld));
        float *res = xmalloc(sizeof(float) * (size_t)(t * ld)), *res2 = xmalloc(sizeof(float) * (size_t)(t * ld));
        float *wt = xmalloc(sizeof(float) * (size_t)d);
        float *out = xmalloc(sizeof(float) * (size_t)(t * ld)), *out2 = xmalloc(sizeof(float) * (size_t)(t * ld));
        fill(x, t * ld, 3.0f);
        fill(res, t * ld, 3.0f);
        fill(wt, d, 2.0f);
        memcpy(x2, x, sizeof(float) * (size_t)(t * ld));
        memcpy(res2, res, sizeof(float) * (size_t)(t * ld));
        float *o = inplace ? x : out, *o2 = inplace ? x2 : out2;
        v->rmsnorm(pool, x, ld, fused ? res : NULL, ld, wt, t, d, 1e-5f, o, ld);
        armllm_kernels_ref.rmsnorm(NULL, x2, ld, fused ? res2 : NULL, ld, wt, t, d, 1e-5f, o2, ld);
        for (int64_t i = 0; i < t; i++) {
          double row_max = 0;
          for (int64_t j = 0; j < d; j++) row_max = fmax(row_max, fabs(o2[i * ld + j]));
          for (int64_t j = 0; j < d; j++) {
            report_value(&r, o[i * ld + j], o2[i * ld + j], 2e-6 * fabs(o2[i * ld + j]) + 1e-6 * row_max + 1e-30);
            if (fused) report_value(&r, res[i * ld + j], res2[i * ld + j], 1e-30);
          }
        }
        r.cases++;
        free(x); free(x2); free(res); free(res2); free(wt); free(out); free(out2);
      }
  report_end(&r, impl_of(v, ARMLLM_K_rmsnorm));
}

/* --------------------------------------------------------------- rope */

static void check_rope(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t dims[][2] = {{2, 2}, {8, 8}, {16, 8}, {64, 64}, {64, 32}, {80, 80}, {128, 128}, {6, 4}, {34, 34}};
  report r;
  report_start(&r, v->isa, "rope");
  const int64_t max_pos = 50, t = 7, heads = 3;
  for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
    for (int style = 0; style < 2; style++) {
      int64_t hd = dims[i][0], rot = dims[i][1], ld = heads * hd + 5;
      float *cs = xmalloc(sizeof(float) * (size_t)(max_pos * rot));
      for (int64_t p = 0; p < max_pos; p++)
        for (int64_t j = 0; j < rot / 2; j++) {
          double ang = (double)p * pow(10000.0, -2.0 * (double)j / (double)rot);
          cs[p * rot + j] = (float)cos(ang);
          cs[p * rot + rot / 2 + j] = (float)sin(ang);
        }
      int32_t pos[7];
      for (int64_t j = 0; j < t; j++) pos[j] = (int32_t)((j * 7 + 3) % max_pos);
      float *x = xmalloc(sizeof(float) * (size_t)(t * ld)), *x2 = xmalloc(sizeof(float) * (size_t)(t * ld));
      fill(x, t * ld, 2.0f);
      memcpy(x2, x, sizeof(float) * (size_t)(t * ld));
      int64_t rc = v->rope(pool, x, t, heads, hd, ld, pos, cs, max_pos, rot, style);
      armllm_kernels_ref.rope(NULL, x2, t, heads, hd, ld, pos, cs, max_pos, rot, style);
      if (rc != -1) r.bad++;
      for (int64_t j = 0; j < t * ld; j++) report_value(&r, x[j], x2[j], 1e-6 * 4.0 + 1e-30);
      pos[4] = (int32_t)max_pos; /* out of range: reported, nothing modified */
      memcpy(x2, x, sizeof(float) * (size_t)(t * ld));
      if (v->rope(pool, x, t, heads, hd, ld, pos, cs, max_pos, rot, style) != 4) r.bad++;
      if (memcmp(x, x2, sizeof(float) * (size_t)(t * ld)) != 0) r.bad++;
      r.cases++;
      free(cs); free(x); free(x2);
    }
  report_end(&r, impl_of(v, ARMLLM_K_rope));
}

/* ----------------------------------------------------------- silu*mul */

static void check_silu_mul(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t inters[] = {1, 5, 8, 16, 17, 31, 64, 100, 1536};
  report r;
  report_start(&r, v->isa, "silu_mul");
  for (size_t i = 0; i < sizeof inters / sizeof *inters; i++)
    for (int inplace = 0; inplace < 2; inplace++) {
      int64_t t = 3, inter = inters[i], ldg = 2 * inter + 1;
      float *g = xmalloc(sizeof(float) * (size_t)(t * ldg)), *g2 = xmalloc(sizeof(float) * (size_t)(t * ldg));
      float *out = xmalloc(sizeof(float) * (size_t)(t * inter)), *out2 = xmalloc(sizeof(float) * (size_t)(t * inter));
      fill(g, t * ldg, 30.0f);
      if (inter > 4) { g[0] = 100.0f; g[1] = -100.0f; g[2] = NAN; g[3] = INFINITY; }
      memcpy(g2, g, sizeof(float) * (size_t)(t * ldg));
      float *o = inplace ? g : out;
      int64_t ldo = inplace ? ldg : inter;
      v->silu_mul(pool, g, ldg, t, inter, o, ldo);
      armllm_kernels_ref.silu_mul(NULL, g2, ldg, t, inter, out2, inter);
      for (int64_t a = 0; a < t; a++)
        for (int64_t b = 0; b < inter; b++) {
          double want = out2[a * inter + b];
          report_value(&r, o[a * ldo + b], want, 1e-5 * fabs(want) + 1e-37);
        }
      r.cases++;
      free(g); free(g2); free(out); free(out2);
    }
  report_end(&r, impl_of(v, ARMLLM_K_silu_mul));
}

/* ------------------------------------------------------ gelu_tanh*mul */

/* Every variant is ref's operations in ref's order (family_jobs.h): its bits,
 * -0 included; a NaN only has to be a NaN (the default NaN's sign differs
 * between ISAs). Gates span the range where exp(-z) overflows (g < -10.061:
 * out = -0 * u) and where g * g does (|g| > 1.8e19: out = g * u). */
static void check_gelu_tanh_mul(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t inters[] = {1, 3, 4, 5, 8, 16, 17, 31, 64, 100, 1536, 2049};
  static const float special[] = {100.0f, -100.0f, NAN, INFINITY, -INFINITY, 1e20f, -1e20f,
                                  -10.0f, -10.1f, 0.0f, -0.0f, 1e-30f};
  const int n_special = (int)(sizeof special / sizeof *special);
  report r;
  report_start(&r, v->isa, "gelu_tanh_mul");
  for (size_t i = 0; i < sizeof inters / sizeof *inters; i++)
    for (int inplace = 0; inplace < 2; inplace++) {
      int64_t t = 3, inter = inters[i], ldg = 2 * inter + 1;
      const size_t gb = sizeof(float) * (size_t)(t * ldg), ob = sizeof(float) * (size_t)(t * inter);
      float *g = xmalloc(gb), *g2 = xmalloc(gb), *out = xmalloc(ob), *out2 = xmalloc(ob);
      fill(g, t * ldg, 12.0f);
      for (int s = 0; s < n_special && s < inter; s++) g[ldg + s] = special[s]; /* row 1's gates */
      memcpy(g2, g, gb);
      float *o = inplace ? g : out;
      int64_t ldo = inplace ? ldg : inter;
      v->gelu_tanh_mul(pool, g, ldg, t, inter, o, ldo);
      armllm_kernels_ref.gelu_tanh_mul(NULL, g2, ldg, t, inter, out2, inter);
      for (int64_t a = 0; a < t; a++)
        for (int64_t b = 0; b < inter; b++) {
          const float got = o[a * ldo + b], want = out2[a * inter + b];
          if (isnan(want) ? !isnan(got) : memcmp(&got, &want, sizeof got) != 0) r.bad++;
        }
      if (inplace) /* the up half and the padding column are untouched */
        for (int64_t a = 0; a < t; a++) {
          const float *up = g + a * ldg + inter, *up2 = g2 + a * ldg + inter;
          if (memcmp(up, up2, sizeof(float) * (size_t)(inter + 1))) r.bad++;
        }
      r.cases++;
      free(g); free(g2); free(out); free(out2);
    }
  report_end(&r, impl_of(v, ARMLLM_K_gelu_tanh_mul));
}

/* -------------------------------------------------------------- embed */

static void check_embed(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ds[] = {1, 7, 8, 16, 33, 576};
  report r;
  report_start(&r, v->isa, "embed");
  const int64_t vocab = 11, t = 6;
  int32_t ids[6] = {3, 0, 10, 3, 7, 1};
  for (size_t i = 0; i < sizeof ds / sizeof *ds; i++)
    for (int bf16 = 0; bf16 < 2; bf16++) {
      int64_t d = ds[i], ldo = d + 3;
      float *tab = xmalloc(sizeof(float) * (size_t)(vocab * d));
      uint16_t *tabb = xmalloc(sizeof(uint16_t) * (size_t)(vocab * d));
      float *out = xmalloc(sizeof(float) * (size_t)(t * ldo)), *out2 = xmalloc(sizeof(float) * (size_t)(t * ldo));
      fill(tab, vocab * d, 5.0f);
      for (int64_t j = 0; j < vocab * d; j++) tabb[j] = armllm_f32_to_bf16(tab[j]);
      for (int64_t j = 0; j < t * ldo; j++) out[j] = out2[j] = -1.0f;
      int64_t rc = bf16 ? v->embed_bf16(pool, ids, t, tabb, vocab, d, out, ldo)
                        : v->embed_f32(pool, ids, t, tab, vocab, d, out, ldo);
      if (bf16) armllm_kernels_ref.embed_bf16(NULL, ids, t, tabb, vocab, d, out2, ldo);
      else armllm_kernels_ref.embed_f32(NULL, ids, t, tab, vocab, d, out2, ldo);
      if (rc != -1 || memcmp(out, out2, sizeof(float) * (size_t)(t * ldo)) != 0) r.bad++;
      int32_t bad_ids[3] = {1, -1, 2};
      if ((bf16 ? v->embed_bf16(pool, bad_ids, 3, tabb, vocab, d, out, ldo)
                : v->embed_f32(pool, bad_ids, 3, tab, vocab, d, out, ldo)) != 1)
        r.bad++;
      if (memcmp(out, out2, sizeof(float) * (size_t)(t * ldo)) != 0) r.bad++;
      r.cases++;
      free(tab); free(tabb); free(out); free(out2);
    }
  report_end(&r, impl_of(v, ARMLLM_K_embed_f32));
}

/* ---------------------------------------------------------------- exp */

static void check_exp(const armllm_kernels *v) {
  report r;
  report_start(&r, v->isa, "exp");
  static const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.7f, 88.72283f, 88.73f, 89.0f, 1000.0f,
                                   -87.3f, -87.34f, -100.0f, -103.9f, -104.5f, -1000.0f,
                                   INFINITY, -INFINITY, NAN, 1e-8f, -1e-8f, 0.34657359f, -0.34657359f};
  const int64_t n = 4099;
  float *x = xmalloc(sizeof(float) * (size_t)n), *y = xmalloc(sizeof(float) * (size_t)n);
  float *y2 = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t len = 1; len <= n; len = len * 3 + 1) {
    fill(x, len, 90.0f);
    for (size_t j = 0; j < sizeof specials / sizeof *specials && (int64_t)j < len; j++) x[j] = specials[j];
    v->exp(x, y, len);
    armllm_kernels_ref.exp(x, y2, len);
    for (int64_t j = 0; j < len; j++) {
      double want = y2[j];
      report_value(&r, y[j], want, 2.4e-7 * fabs(want) + 1.2e-38);
      double exact = exp((double)x[j]); /* ref itself against libm, in double */
      if (isfinite(exact) && exact < 3.4e38 && exact > 1.2e-38)
        report_value(&r, y2[j], exact, 4e-7 * exact);
    }
    v->exp(x, x, len); /* in place */
    if (memcmp(x, y, sizeof(float) * (size_t)len) != 0) r.bad++;
    r.cases++;
  }
  free(x); free(y); free(y2);
  report_end(&r, impl_of(v, ARMLLM_K_exp));
}

/* ---------------------------------------------------------- attention */

/* A batch of sequences (q_len, seq_len) of an attention case. */
typedef struct {
  const int32_t (*seqs)[2];
  int64_t n; /* <= ATTN_MAXSEQ, >= 4 (sequence 3 gets a bad block id) */
} attn_batch;
#define ATTN_MAXSEQ 8

/* Decodes, prefill chunks after cached context, a whole prompt, and contexts
 * spanning several partitions. */
static const int32_t attn_mixed[][2] = {{1, 1},   {1, 37},  {5, 5}, {3, 20},
                                        {1, 300}, {7, 530}, {2, 17}};
static const attn_batch attn_seqs = {attn_mixed, sizeof attn_mixed / sizeof *attn_mixed};

/* Decodes over up to 3 partitions: with one KV head, 4 tiles, fewer than twice
 * the pool's 3 threads, so the variants split the keys (split-KV). */
static const int32_t attn_decode[][2] = {{1, 530}, {1, 1}, {2, 300}, {1, 257}};
static const attn_batch attn_split_seqs = {attn_decode, sizeof attn_decode / sizeof *attn_decode};

/* The cache dtypes (armllm_kv_dtype: f32, bf16, int8) the checks loop over. */
#define KV_NDTYPES 3

/* An int8 cache of n rows of hd elements and its scales as the KV write
 * leaves them: elements in [-127, 127], each row's bf16 scale in (0, 1/127]
 * so that |row * scale| <= 1, and rows 3 and 4 all zero (scale 0, as an
 * all-zero input row writes). */
static void fill_i8_cache(int8_t *rows, uint16_t *scales, int64_t n, int64_t hd) {
  for (int64_t r = 0; r < n; r++) {
    const int zero = r == 3 || r == 4;
    scales[r] = zero ? 0 : armllm_f32_to_bf16((1.5f + 0.5f * frand()) / (2.0f * 127.0f));
    for (int64_t d = 0; d < hd; d++)
      rows[r * hd + d] = zero ? 0 : (int8_t)lrintf(127.0f * frand());
  }
}

/* One attention case of batch `batch` and dims (head_dim, n_heads, n_kv_heads,
 * block_size) against ref with a cache of dtype dt (armllm_kv_dtype): mode 0 causal,
 * 1 sliding window + sinks, 2 bidirectional; split-KV or not (pool and scratch, or
 * neither), the same bits. */
static void attention_case(report *r, const armllm_kernels *v, armllm_pool *pool,
                           const attn_batch *batch, const int64_t *dims, int dt, int mode) {
  const int window = mode == 1;
  const int64_t hd = dims[0], nh = dims[1], nkv = dims[2], bs = dims[3], nseq = batch->n;
  int32_t qs[ATTN_MAXSEQ + 1], lens[ATTN_MAXSEQ];
  int64_t max_blocks = 0, total_blocks = 0, max_len = 0;
  qs[0] = 0;
  for (int64_t b = 0; b < nseq; b++) {
    qs[b + 1] = qs[b] + batch->seqs[b][0];
    lens[b] = batch->seqs[b][1];
    int64_t nb = (lens[b] + bs - 1) / bs;
    if (nb > max_blocks) max_blocks = nb;
    if (lens[b] > max_len) max_len = lens[b];
    total_blocks += nb;
  }
  const int64_t rows = qs[nseq], num_blocks = total_blocks + 3;
  int32_t *table = xmalloc(sizeof(int32_t) * (size_t)(nseq * max_blocks));
  int64_t next = 0;
  for (int64_t b = 0; b < nseq; b++) /* blocks in a scrambled order */
    for (int64_t i = 0; i < max_blocks; i++)
      table[b * max_blocks + i] = i < (lens[b] + bs - 1) / bs ? (int32_t)((next++ * 7 + 3) % num_blocks) : -5;
  const size_t cache_len = (size_t)(num_blocks * nkv * bs * hd);
  float *kc = xmalloc(sizeof(float) * cache_len), *vc = xmalloc(sizeof(float) * cache_len);
  uint16_t *kb = xmalloc(sizeof(uint16_t) * cache_len), *vb = xmalloc(sizeof(uint16_t) * cache_len);
  int8_t *k8 = xmalloc(cache_len), *v8 = xmalloc(cache_len);
  const int64_t cache_rows = num_blocks * nkv * bs;
  uint16_t *ks = xmalloc(sizeof(uint16_t) * (size_t)cache_rows);
  uint16_t *vs = xmalloc(sizeof(uint16_t) * (size_t)cache_rows);
  fill(kc, (int64_t)cache_len, 1.0f);
  fill(vc, (int64_t)cache_len, 1.0f);
  for (size_t i = 0; i < cache_len; i++) {
    kb[i] = armllm_f32_to_bf16(kc[i]);
    vb[i] = armllm_f32_to_bf16(vc[i]);
  }
  fill_i8_cache(k8, ks, cache_rows, hd);
  fill_i8_cache(v8, vs, cache_rows, hd);
  const void *const kcaches[KV_NDTYPES] = {kc, kb, k8}, *const vcaches[KV_NDTYPES] = {vc, vb, v8};
  const int i8 = dt == ARMLLM_KV_I8;
  const int64_t ldq = nh * hd + 3, ldo = nh * hd + 1;
  float *q = xmalloc(sizeof(float) * (size_t)(rows * ldq));
  float *out = xmalloc(sizeof(float) * (size_t)(rows * ldo));
  float *out1 = xmalloc(sizeof(float) * (size_t)(rows * ldo));
  float *out2 = xmalloc(sizeof(float) * (size_t)(rows * ldo));
  fill(q, rows * ldq, 1.0f);
  size_t scratch_len = armllm_attn_scratch_len(rows, nh, hd, max_len);
  float *scratch = xmalloc(sizeof(float) * scratch_len);
  armllm_attn_args a = {q, ldq, kcaches[dt], vcaches[dt], dt, i8 ? ks : NULL, i8 ? vs : NULL,
                        table, max_blocks, lens, qs, nseq, nh, nkv, hd, bs,
                        num_blocks, 1.0f / sqrtf((float)hd), window ? 37 : 0, out, ldo,
                        scratch, scratch_len, NULL, mode == 2};
  /* GPT-OSS's layers: attention sinks with the window (every head's own logit) */
  static const float sinks[16] = {0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.5f, -0.5f, 1.0f,
                                  0.25f, -2.0f, 3.0f, -0.25f, 1.25f, -1.5f, 0.75f, 2.5f};
  if (window) a.sinks = sinks;
  /* |V| <= 1 (int8: |row * scale|); bf16-compute variants round q and the weights with
   * a bf16 cache (header) */
  const int bf16_math = dt == ARMLLM_KV_BF16 && !strcmp(v->attention_bf16_compute, "bf16");
  const double tol = bf16_math ? 1.0 / 32 : 4e-6;
  armllm_attn_args a1 = a, ar = a;
  a1.out = out1;
  a1.scratch = NULL;
  a1.scratch_len = 0;
  ar.out = out2;
  if (v->attention(pool, &a) != -1 || v->attention(NULL, &a1) != -1 ||
      armllm_kernels_ref.attention(NULL, &ar) != -1)
    r->bad++;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < nh * hd; j++) {
      report_value(r, out[i * ldo + j], out2[i * ldo + j], tol);
      if (out[i * ldo + j] != out1[i * ldo + j]) r->bad++; /* split or not: same bits */
    }
  /* inconsistent metadata: a block id out of range in sequence 3 */
  const int32_t saved = table[3 * max_blocks];
  table[3 * max_blocks] = (int32_t)num_blocks;
  if (v->attention(pool, &a) != 3) r->bad++;
  table[3 * max_blocks] = saved;
  r->cases++;
  free(table); free(kc); free(vc); free(kb); free(vb); free(k8); free(v8); free(ks); free(vs);
  free(q); free(out); free(out1); free(out2); free(scratch);
}

/* Every cache dtype, causal and windowed, of each (head_dim, n_heads, n_kv_heads,
 * block_size) in dims over the sequences `seqs`, reported as `name`. */
static void attention_cases(const armllm_kernels *v, armllm_pool *pool, const char *name,
                            const attn_batch *seqs, const int64_t (*dims)[4], size_t n) {
  report r;
  report_start(&r, v->isa, name);
  for (size_t di = 0; di < n; di++)
    for (int dt = 0; dt < KV_NDTYPES; dt++)
      for (int window = 0; window < 2; window++)
        attention_case(&r, v, pool, seqs, dims[di], dt, window);
  report_end(&r, impl_of(v, ARMLLM_K_attention));
}

static void check_attention(const armllm_kernels *v, armllm_pool *pool) {
  /* head_dim, n_heads, n_kv_heads, block_size; head dims 36 and 17 leave 4 and 1 past
   * the last multiple of 8 */
  static const int64_t dims[][4] = {{8, 2, 2, 16},  {64, 6, 2, 16}, {80, 3, 1, 5},
                                    {128, 4, 4, 32}, {36, 4, 2, 16}, {17, 12, 1, 7}};
  attention_cases(v, pool, "attention", &attn_seqs, dims, sizeof dims / sizeof *dims);
}

/* Decode batches that split every row's keys over threads (one KV head; GQA 3, 8,
 * whose 2-row tile has 16 queries, and 12), causal and windowed. */
static void check_attention_split(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t dims[][4] = {{80, 3, 1, 5}, {64, 8, 1, 16}, {17, 12, 1, 7}};
  attention_cases(v, pool, "attn_split", &attn_split_seqs, dims, sizeof dims / sizeof *dims);
}

/* Bidirectional (every row over all its sequence's keys), and one block a sequence
 * (block_size 600, as Whisper's cross-attention cache). */
static void check_attention_bidirectional(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t dims[][4] = {{8, 2, 2, 16}, {64, 6, 2, 16}, {80, 3, 1, 5}, {64, 6, 3, 600}};
  report r;
  report_start(&r, v->isa, "attn_bidir");
  for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
    for (int dt = 0; dt < KV_NDTYPES; dt++)
      attention_case(&r, v, pool, &attn_seqs, dims[di], dt, 2);
  report_end(&r, impl_of(v, ARMLLM_K_attention));
}

/* KV write against ref for every cache dtype: the same cache bytes (int8: rows and
 * scales; one head of row 2 all zero, scale 0), and a slot out of range reported with
 * nothing written. */
static void check_kv_write(const armllm_kernels *v, armllm_pool *pool) {
  report r;
  report_start(&r, v->isa, "kv_write");
  static const int64_t dims[][3] = {{8, 1, 16}, {64, 2, 16}, {80, 3, 5}, {128, 8, 32}};
  static const size_t esz[KV_NDTYPES] = {4, 2, 1};
  for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
    for (int dt = 0; dt < KV_NDTYPES; dt++) {
      const int64_t hd = dims[di][0], nkv = dims[di][1], bs = dims[di][2], nb = 6, t = 9;
      const int64_t ld = nkv * hd + 2;
      const size_t len = (size_t)(nb * nkv * bs * hd), bytes = len * esz[dt];
      const int64_t rows = nb * nkv * bs; /* int8: a scale each */
      const size_t sbytes = sizeof(uint16_t) * (size_t)rows;
      char *kc = xmalloc(bytes), *vc = xmalloc(bytes), *kr = xmalloc(bytes), *vr = xmalloc(bytes);
      memset(kc, 0x5a, bytes); memset(vc, 0x5a, bytes); memset(kr, 0x5a, bytes); memset(vr, 0x5a, bytes);
      uint16_t *scales = xmalloc(4 * sbytes); /* k, v, ref's k, ref's v */
      memset(scales, 0x5a, 4 * sbytes);
      uint16_t *ks = scales, *vs = ks + rows, *ksr = vs + rows, *vsr = ksr + rows;
      const int i8 = dt == ARMLLM_KV_I8;
      float *k = xmalloc(sizeof(float) * (size_t)(t * ld)), *vv = xmalloc(sizeof(float) * (size_t)(t * ld));
      fill(k, t * ld, 3.0f);
      fill(vv, t * ld, 3.0f);
      memset(k + 2 * ld, 0, sizeof(float) * (size_t)hd);
      int32_t slots[9] = {0, 5, (int32_t)(bs + 1), -1, (int32_t)(nb * bs - 1), 7, (int32_t)(3 * bs), -1, 2};
      if (v->kv_write(pool, k, ld, vv, ld, slots, t, kc, vc, dt, i8 ? ks : NULL, i8 ? vs : NULL,
                      nkv, hd, bs, nb) != -1)
        r.bad++;
      armllm_kernels_ref.kv_write(NULL, k, ld, vv, ld, slots, t, kr, vr, dt, i8 ? ksr : NULL,
                                  i8 ? vsr : NULL, nkv, hd, bs, nb);
      if (memcmp(kc, kr, bytes) || memcmp(vc, vr, bytes)) r.bad++;
      if (memcmp(ks, ksr, sbytes) || memcmp(vs, vsr, sbytes)) r.bad++;
      slots[6] = (int32_t)(nb * bs); /* out of range: reported, nothing written */
      memset(kc, 0x11, bytes);
      memset(ks, 0x11, sbytes);
      if (v->kv_write(pool, k, ld, vv, ld, slots, t, kc, vc, dt, i8 ? ks : NULL, i8 ? vs : NULL,
                      nkv, hd, bs, nb) != 6)
        r.bad++;
      for (size_t i = 0; i < bytes; i++)
        if (kc[i] != 0x11) { r.bad++; break; }
      for (int64_t i = 0; i < rows; i++)
        if (ks[i] != 0x1111) { r.bad++; break; }
      r.cases++;
      free(kc); free(vc); free(kr); free(vr); free(scales); free(k); free(vv);
    }
  report_end(&r, impl_of(v, ARMLLM_K_kv_write));
}

/* ---------------------------------------------------------- quantized */

/* Activation rows with the cases that matter for bit-exactness: ties of
 * x / s at .5 (s = 1 exactly), an all-zero row, NaN, Inf, subnormals; and,
 * scales being per group, rows whose groups differ: a zero first group, a
 * group with +-Inf (scale Inf, bytes 0) next to one with NaN, a group of
 * large values next to one of small values. */
static void fill_act(float *x, int64_t m, int64_t k, int64_t ldx, int specials) {
  fill(x, m * ldx, 3.0f);
  if (!specials) return;
  for (int64_t r = 0; r < m; r++) {
    float *xr = x + r * ldx;
    switch (r % 10) {
      case 1: /* amax 127: s = 1, halves are exact ties */
        for (int64_t i = 0; i < k; i++) xr[i] = (float)((i * 37) % 255 - 127) + (i & 1 ? 0.5f : 0.0f);
        xr[0] = 127.0f;
        break;
      case 2: memset(xr, 0, sizeof(float) * (size_t)k); break;
      case 3: xr[k / 2] = NAN; break;
      case 4: xr[k - 1] = -INFINITY; break;
      case 5:
        for (int64_t i = 0; i < k; i++) xr[i] *= 1e-39f; /* subnormal */
        break;
      case 6:
        for (int64_t i = 0; i < k; i++) xr[i] *= 1e30f;
        break;
      case 7: /* first group zero, Inf at the end */
        memset(xr, 0, sizeof(float) * (size_t)(k < 32 ? k : 32));
        xr[k - 1] = INFINITY;
        break;
      case 8: /* +Inf and -Inf in the first group, NaN in the last */
        xr[0] = INFINITY;
        if (k > 2) xr[2] = -INFINITY;
        if (k > 64) xr[k - 3] = NAN;
        break;
      case 9: /* groups of very different magnitude */
        for (int64_t i = 0; i < k; i++) xr[i] *= (i / 32) & 1 ? 1e-6f : 1e6f;
        break;
      default: break;
    }
  }
}

/* x rounded to 11 significant bits: an f16 value (for the magnitudes used here). */
static float round_f16(float x) {
  int e;
  const float m = frexpf(x, &e);
  return ldexpf(nearbyintf(m * 2048.0f) / 2048.0f, e);
}

static void check_quant_act(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ks[] = {1, 5, 16, 31, 32, 40, 100, 576, 1029};
  static const int64_t groups[] = {0, 32, 64, 128, 256}; /* 256: the K-quant GEMM's */
  report r;
  report_start(&r, v->isa, "quant_act");
  for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++)
    for (size_t ig = 0; ig < sizeof groups / sizeof *groups; ig++)
      for (int mode = 0; mode < 4; mode++) { /* bit 0: gsum, bit 1: asymmetric */
        const int with_gsum = mode & 1, asym = mode >> 1;
        const int64_t k = ks[ik], group = groups[ig], m = 9 + (int64_t)(ik % 3) * 4;
        const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
        const int64_t ldx = k + (int64_t)(ik & 1) * 3, ldq = kpad + (int64_t)(ig & 1) * 5, ldgs = ng + 2;
        const int64_t ldsc = ng + (int64_t)with_gsum * 3, ldzp = ng + 1;
        float *x = xmalloc(sizeof(float) * (size_t)(m * ldx));
        int8_t *q = xmalloc((size_t)(m * ldq)), *qr = xmalloc((size_t)(m * ldq));
        float *sc = xmalloc(sizeof(float) * (size_t)(m * ldsc));
        float *scr = xmalloc(sizeof(float) * (size_t)(m * ldsc));
        int32_t *gs = xmalloc(sizeof(int32_t) * (size_t)(m * ldgs));
        int32_t *gsr = xmalloc(sizeof(int32_t) * (size_t)(m * ldgs));
        int32_t *zp = xmalloc(sizeof(int32_t) * (size_t)(m * ldzp));
        int32_t *zpr = xmalloc(sizeof(int32_t) * (size_t)(m * ldzp));
        fill_act(x, m, k, ldx, 1);
        if (asym) /* skew some rows: all positive, all negative */
          for (int64_t i = 0; i < k; i++) {
            x[2 * ldx + i] = fabsf(x[2 * ldx + i]) + 0.5f;
            x[3 * ldx + i] = -fabsf(x[3 * ldx + i]) * 3.0f;
          }
        memset(q, 0x5a, (size_t)(m * ldq)); /* past kpad: untouched */
        memset(qr, 0x5a, (size_t)(m * ldq));
        memset(gs, 0x5a, sizeof(int32_t) * (size_t)(m * ldgs));
        memset(gsr, 0x5a, sizeof(int32_t) * (size_t)(m * ldgs));
        memset(zp, 0x5a, sizeof(int32_t) * (size_t)(m * ldzp));
        memset(zpr, 0x5a, sizeof(int32_t) * (size_t)(m * ldzp));
        memset(sc, 0x5a, sizeof(float) * (size_t)(m * ldsc)); /* past ng: untouched */
        memset(scr, 0x5a, sizeof(float) * (size_t)(m * ldsc));
        v->quant_act(pool, x, m, k, ldx, group, q, ldq, sc, ldsc, with_gsum ? gs : NULL, ldgs,
                     asym ? zp : NULL, ldzp);
        armllm_kernels_ref.quant_act(NULL, x, m, k, ldx, group, qr, ldq, scr, ldsc,
                                     with_gsum ? gsr : NULL, ldgs, asym ? zpr : NULL, ldzp);
        if (memcmp(q, qr, (size_t)(m * ldq)) || memcmp(sc, scr, sizeof(float) * (size_t)(m * ldsc)) ||
            memcmp(gs, gsr, sizeof(int32_t) * (size_t)(m * ldgs)) ||
            memcmp(zp, zpr, sizeof(int32_t) * (size_t)(m * ldzp)))
          r.bad++;
        r.cases++;
        free(x); free(q); free(qr); free(sc); free(scr); free(gs); free(gsr); free(zp); free(zpr);
      }
  report_end(&r, impl_of(v, ARMLLM_K_quant_act));
}

/* The fused RMSNorm + quantization against the table's two kernels run one
 * after the other (every output compared bit for bit, residual included). */
/* One layernorm row's tolerance scale: the double moments' mean and 1/sqrt(var + eps). */
static void row_moments(const float *x, int64_t d, double *mean, double *s) {
  double sum = 0.0, sq = 0.0;
  for (int64_t j = 0; j < d; j++) sum += x[j];
  *mean = sum / (double)d;
  for (int64_t j = 0; j < d; j++) sq += (x[j] - *mean) * (x[j] - *mean);
  *s = 1.0 / sqrt(sq / (double)d + 1e-5);
}

/* Against ref within 1e-6 (|(x - mean) s w| + |mean| s |w| + |bias|) (test_elementwise.py),
 * rows off their mean (the float mean's rounding counts), with and without bias, in place
 * (then ref's bits of out of place), padding untouched. */
static void check_layernorm(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ds[] = {1, 3, 4, 5, 8, 15, 16, 17, 33, 384, 1537};
  report r;
  report_start(&r, v->isa, "layernorm");
  for (size_t id = 0; id < sizeof ds / sizeof *ds; id++)
    for (int mode = 0; mode < 4; mode++) { /* bit 0: bias, bit 1: in place */
      const int64_t t = 4, d = ds[id], ld = d + 3;
      const size_t len = (size_t)(t * ld);
      float *x = xmalloc(sizeof(float) * len), *xi = xmalloc(sizeof(float) * len);
      float *out = xmalloc(sizeof(float) * len), *want = xmalloc(sizeof(float) * len);
      float *w = xmalloc(sizeof(float) * (size_t)d), *b = xmalloc(sizeof(float) * (size_t)d);
      fill(x, (int64_t)len, 3.0f);
      for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < d; j++) x[i * ld + j] += (float)(i * 40 - 50); /* off 0 */
      fill(w, d, 2.0f);
      fill(b, d, 1.0f);
      memcpy(xi, x, sizeof(float) * len);
      for (size_t i = 0; i < len; i++) out[i] = want[i] = -7.0f;
      const float *bias = mode & 1 ? b : NULL;
      float *o = mode & 2 ? xi : out;
      v->layernorm(pool, xi, ld, w, bias, t, d, 1e-5f, o, ld);
      armllm_kernels_ref.layernorm(NULL, x, ld, w, bias, t, d, 1e-5f, want, ld);
      for (int64_t i = 0; i < t; i++) {
        double mean, s;
        row_moments(x + i * ld, d, &mean, &s);
        for (int64_t j = 0; j < ld; j++) {
          const float got = o[i * ld + j];
          if (j >= d) { /* padding: untouched */
            if (got != (mode & 2 ? x[i * ld + j] : -7.0f)) r.bad++;
            continue;
          }
          const double mag = fabs((x[i * ld + j] - mean) * s * w[j]) + fabs(mean) * s * fabs(w[j]) +
                             (bias ? fabs(b[j]) : 0.0);
          report_value(&r, got, want[i * ld + j], 1e-6 * mag + 1e-30);
        }
      }
      r.cases++;
      free(x); free(xi); free(out); free(want); free(w); free(b);
    }
  report_end(&r, impl_of(v, ARMLLM_K_layernorm));
}

/* Exact GELU in double: x/2 erfc(-x / sqrt(2)). */
static double gelu_exact(double x) { return 0.5 * x * erfc(-x * 0.70710678118654752440); }

/* Against erfc in double within 3e-7 (1 + min(x, 0)^2) |y| + 1e-38 (test_elementwise.py)
 * over a grid of |x| <= 12, every tail length and a pooled length; the limits exact (y = x
 * from 6 up, -0 from -16 down, +-inf, NaN); in place the same bits. */
static void check_gelu(const armllm_kernels *v, armllm_pool *pool) {
  static const float specials[] = {INFINITY, -INFINITY, NAN, 6.0f, 1e30f, -16.0f, -1e30f, 0.0f};
  static const int64_t ns[] = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 40000};
  report r;
  report_start(&r, v->isa, "gelu");
  for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
    const int64_t n = ns[k];
    float *x = xmalloc(sizeof(float) * (size_t)(n + 1)), *y = xmalloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) x[i] = n > 1 ? -12.0f + 24.0f * (float)i / (float)(n - 1) : 0.5f;
    for (size_t j = 0; n == 100 && j < sizeof specials / sizeof *specials; j++) x[j] = specials[j];
    y[n] = -7.0f;
    v->gelu(pool, x, y, n);
    if (y[n] != -7.0f) r.bad++; /* nothing past n */
    for (int64_t i = 0; i < n; i++) {
      const double want = isinf(x[i]) ? (x[i] > 0 ? INFINITY : 0.0) : gelu_exact(x[i]);
      const double neg = x[i] < 0 ? (double)x[i] * x[i] : 0.0;
      report_value(&r, y[i], want, 3e-7 * (1.0 + neg) * fabs(want) + 1e-38);
      if ((x[i] >= 6.0f && y[i] != x[i]) || (x[i] <= -16.0f && (y[i] != 0.0f || !signbit(y[i]))))
        r.bad++;
    }
    v->gelu(pool, x, x, n); /* in place */
    for (int64_t i = 0; i < n; i++)
      if (memcmp(&x[i], &y[i], sizeof *x) != 0 && !(isnan(x[i]) && isnan(y[i]))) r.bad++;
    r.cases++;
    free(x); free(y);
  }
  report_end(&r, impl_of(v, ARMLLM_K_gelu));
}

static void check_rmsnorm_quant(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ds[] = {7, 64, 576, 1029, 4100};
  static const int64_t ts[] = {1, 3, 40};
  report r;
  report_start(&r, v->isa, "rmsnorm_quant");
  for (size_t id = 0; id < sizeof ds / sizeof *ds; id++)
    for (size_t it = 0; it < sizeof ts / sizeof *ts; it++)
      for (int mode = 0; mode < 4; mode++) { /* bit 0: residual, bit 1: asymmetric */
        const int64_t d = ds[id], t = ts[it], group = (int64_t)(id % 2) * 32;
        const int64_t kpad = armllm_q_kpad(d), ng = armllm_q_groups(d, group);
        const size_t nx = (size_t)(t * d), nq = (size_t)(t * kpad), ns = (size_t)(t * ng);
        float *x = xmalloc(sizeof(float) * nx), *w = xmalloc(sizeof(float) * (size_t)d);
        float *res[2] = {xmalloc(sizeof(float) * nx), xmalloc(sizeof(float) * nx)};
        float *out[2] = {xmalloc(sizeof(float) * nx), xmalloc(sizeof(float) * nx)};
        int8_t *q[2] = {xmalloc(nq), xmalloc(nq)};
        float *sc[2] = {xmalloc(sizeof(float) * ns), xmalloc(sizeof(float) * ns)};
        int32_t *gs[2] = {xmalloc(sizeof(int32_t) * ns), xmalloc(sizeof(int32_t) * ns)};
        int32_t *zp[2] = {xmalloc(sizeof(int32_t) * ns), xmalloc(sizeof(int32_t) * ns)};
        fill(x, (int64_t)nx, 2.0f);
        fill(w, d, 1.0f);
        fill(res[0], (int64_t)nx, 1.0f);
        memcpy(res[1], res[0], sizeof(float) * nx);
        float *rp[2] = {mode & 1 ? res[0] : NULL, mode & 1 ? res[1] : NULL};
        int32_t *zpp[2] = {mode & 2 ? zp[0] : NULL, mode & 2 ? zp[1] : NULL};
        memset(zp[0], 0, sizeof(int32_t) * ns);
        memset(zp[1], 0, sizeof(int32_t) * ns);
        armllm_rmsnorm_quant(v, pool, x, d, rp[0], d, w, t, d, 1e-5f, out[0], d, group, q[0],
                             kpad, sc[0], ng, gs[0], ng, zpp[0], ng);
        v->rmsnorm(pool, x, d, rp[1], d, w, t, d, 1e-5f, out[1], d);
        v->quant_act(pool, out[1], t, d, d, group, q[1], kpad, sc[1], ng, gs[1], ng, zpp[1], ng);
        if (memcmp(out[0], out[1], sizeof(float) * nx) || memcmp(q[0], q[1], nq) ||
            memcmp(sc[0], sc[1], sizeof(float) * ns) || memcmp(gs[0], gs[1], sizeof(int32_t) * ns) ||
            memcmp(zp[0], zp[1], sizeof(int32_t) * ns) ||
            ((mode & 1) && memcmp(res[0], res[1], sizeof(float) * nx)))
          r.bad++;
        r.cases++;
        free(x); free(w);
        for (int i = 0; i < 2; i++) {
          free(res[i]); free(out[i]); free(q[i]); free(sc[i]); free(gs[i]); free(zp[i]);
        }
      }
  report_end(&r, impl_of(v, ARMLLM_K_rmsnorm));
}

/* One quantized GEMM case against ref, bit for bit (memcmp of y, row
 * padding included), with the variant's pool and on one thread. x is
 * quantized by ref so that only the GEMM is under test. Channelwise
 * weights (group 0) take d, o as [n, 1]; 8-bit weights have no o, and get
 * gsum in some cases (kernels may read it). */
static void wq_case(report *r, const armllm_kernels *v, armllm_pool *pool, int64_t m, int64_t n,
                    int64_t k, int bits, int64_t group, int with_bias, int with_o) {
  const armllm_kernels *ref = &armllm_kernels_ref;
  const int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group);
  const int64_t ldx = k + 1, ldq = kpad + (m & 1) * 16, ldgs = ng + (n & 1), ldy = n + (k & 1) * 3;
  const int64_t ldsc = ng + (m & 2), ngin = group ? ng : 1;
  float *x = xmalloc(sizeof(float) * (size_t)(m * ldx));
  int8_t *xq = xmalloc((size_t)(m * ldq));
  float *scale = xmalloc(sizeof(float) * (size_t)(m * ldsc));
  int32_t *gsum = xmalloc(sizeof(int32_t) * (size_t)(m * ldgs));
  int8_t *wq = xmalloc((size_t)(n * k));
  float *d = xmalloc(sizeof(float) * (size_t)(n * ngin)), *o = xmalloc(sizeof(float) * (size_t)(n * ngin));
  float *bias = xmalloc(sizeof(float) * (size_t)n);
  float *y = xmalloc(sizeof(float) * (size_t)(m * ldy)), *y1 = xmalloc(sizeof(float) * (size_t)(m * ldy));
  float *yref = xmalloc(sizeof(float) * (size_t)(m * ldy));
  fill_act(x, m, k, ldx, m > 3);
  if (m > 8) x[8 * ldx] = NAN; /* row 8: NaN scale */
  ref->quant_act(NULL, x, m, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs, NULL, 0);
  for (int64_t i = 0; i < n * k; i++) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    const int u = (int)((rng_state >> 33) % 255);
    wq[i] = (int8_t)(bits == 4 ? u % 16 : u - 127);
  }
  if (n > 2) /* extremes: the int32 sums of a whole row at their largest */
    for (int64_t i = 0; i < k; i++) wq[i] = (int8_t)(bits == 4 ? 15 : (i & 1 ? 127 : -127));
  fill(d, n * ngin, 0.01f);
  fill(o, n * ngin, 0.1f);
  if (k % 3 != 1) /* most cases: scales exact in f16 (GGUF's kind; layouts may store f16) */
    for (int64_t i = 0; i < n * ngin; i++) {
      d[i] = round_f16(d[i]);
      o[i] = round_f16(o[i]);
    }
  if (bits == 8) with_o = 0;
  fill(bias, n, 1.0f);
  void *p = xmalloc64(v->gemm_wq_packed_len(n, k, bits, group, d, with_o ? o : NULL));
  void *pr = xmalloc64(ref->gemm_wq_packed_len(n, k, bits, group, d, with_o ? o : NULL));
  v->gemm_wq_pack(wq, n, k, bits, group, d, with_o ? o : NULL, p);
  ref->gemm_wq_pack(wq, n, k, bits, group, d, with_o ? o : NULL, pr);
  for (int64_t i = 0; i < m * ldy; i++) y[i] = y1[i] = yref[i] = -777.0f;
  const float *b = with_bias ? bias : NULL;
  const int32_t *gs = bits == 4 || (n & 2) ? gsum : NULL; /* bits 8 must not need it */
  v->gemm_wq(pool, xq, m, k, ldq, scale, ldsc, gs, ldgs, p, n, bits, group, b, y, ldy);
  v->gemm_wq(NULL, xq, m, k, ldq, scale, ldsc, gs, ldgs, p, n, bits, group, b, y1, ldy);
  ref->gemm_wq(NULL, xq, m, k, ldq, scale, ldsc, gs, ldgs, pr, n, bits, group, b, yref, ldy);
  const size_t bytes = sizeof(float) * (size_t)(m * ldy);
  if (memcmp(y, yref, bytes) || memcmp(y1, yref, bytes)) {
    if (r->bad < 3) {
      for (int64_t i = 0; i < m * ldy; i++)
        if (memcmp(&y[i], &yref[i], sizeof(float))) {
          printf("  gemm_wq M=%lld N=%lld K=%lld bits=%d group=%lld: y[%lld,%lld] = %.9g, ref %.9g\n",
                 (long long)m, (long long)n, (long long)k, bits, (long long)group,
                 (long long)(i / ldy), (long long)(i % ldy), y[i], yref[i]);
          break;
        }
    }
    r->bad++;
  }
  r->cases++;
  free(x); free(xq); free(scale); free(gsum); free(wq); free(d); free(o); free(bias);
  free(y); free(y1); free(yref); free(p); free(pr);
}

static void check_gemm_wq(const armllm_kernels *v, armllm_pool *pool, int quick) {
  /* (n, k): single columns, panel and tile edges, K = 40 (one 32-block of
   * padding), K = 576 (group 128: a last group of 64), K blocks past 1024 */
  static const int64_t shapes[][2] = {{1, 40}, {8, 32}, {9, 576}, {17, 100}, {40, 64},
                                      {70, 1100}, {130, 40}, {33, 2100}};
  static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 33, 67};
  static const int64_t groups[] = {0, 32, 64, 128};
  const int n_ms = (int)(sizeof ms / sizeof *ms);
  report r;
  report_start(&r, v->isa, "gemm_wq");
  int c = 0;
  for (int bits = 8; bits >= 4; bits -= 4)
    for (size_t ig = 0; ig < sizeof groups / sizeof *groups; ig++)
      for (size_t is = 0; is < sizeof shapes / sizeof *shapes; is++)
        for (int j = 0; j < (quick ? 1 : 3); j++, c++) {
          const int64_t n = shapes[is][0], k = shapes[is][1];
          int64_t m = ms[(c * 7 + j) % n_ms];
          if (n * k > 30000 && m > 17) m = 17; /* keep qemu time in check */
          wq_case(&r, v, pool, m, n, k, bits, groups[ig], c & 1, (c >> 1) & 1);
        }
  /* several K blocks (t kept in y between them), decode and prefill,
   * every group */
  for (int bits = 8; bits >= 4; bits -= 4)
    for (size_t ig = 0; ig < sizeof groups / sizeof *groups; ig++)
      for (int64_t m = 1; m <= 12; m += 11) wq_case(&r, v, pool, m, 33, 2100, bits, groups[ig], 1, 1);
  /* every M through the decode and prefill tiles, at K = 576 (group 128 and
   * channelwise: a last group of 64) and K = 40 (one group, part padding) */
  for (int bits = 8; bits >= 4; bits -= 4)
    for (int64_t m = 1; m <= 17; m++) {
      wq_case(&r, v, pool, m, 21, 576, bits, 128, (int)(m & 1), 1);
      if (!quick || (m & 3) == 1) {
        wq_case(&r, v, pool, m, 21, 576, bits, 0, (int)(m & 1) ^ 1, 1);
        wq_case(&r, v, pool, m, 13, 40, bits, m & 2 ? 128 : 32, 1, (int)(m & 1));
      }
    }
  report_end(&r, impl_of(v, ARMLLM_K_gemm_wq));
}

/* ---------------------------------------------------------- gemm_gguf */

static uint32_t rand_u32(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 32);
}

/* A finite f16, its magnitude from subnormal to the largest (65504). */
static uint16_t rand_f16_bits(void) {
  const uint32_t r = rand_u32();
  const uint16_t exp = (uint16_t)(r % 31); /* 31: Inf/NaN */
  return (uint16_t)((r >> 16 & 0x8000u) | exp << 10 | (r >> 5 & 0x3ffu));
}

/* The byte offsets of a block's f16 fields: d, and the second one (m,
 * dmin) of the types with offsets; -1: none. */
static void f16_fields(int type, int *d, int *second) {
  *second = -1;
  switch (type) {
  case ARMLLM_GGML_Q2_K: *d = 80; *second = 82; return;
  case ARMLLM_GGML_Q3_K: *d = 108; return;
  case ARMLLM_GGML_Q6_K: *d = 208; return;
  case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_1: case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
    *d = 0; *second = 2; return;
  default: *d = 0; return;
  }
}

/* a and b hold the same bits, or NaNs at the same places (a NaN's sign and payload
 * depend on which of two NaN operands an add returns: not part of the result). */
static int same_floats(const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (isnan(a[i]) ? !isnan(b[i]) : memcmp(&a[i], &b[i], sizeof(float))) return 0;
  return 1;
}

/* An MXFP4 e8m0 exponent: mostly around 2^-10, one in 8 an end of the range
 * (2^-128, 2^-127, 2^-126, 2^126, 2^127) or NaN (255). */
static uint8_t rand_e8m0(void) {
  static const uint8_t ends[6] = {0, 1, 2, 253, 254, 255};
  const uint32_t r = rand_u32();
  return r % 8 ? (uint8_t)(108 + (r >> 3) % 24) : ends[(r >> 3) % 6];
}

/* rows x k of type as stored: random bytes, finite f16 scales (MXFP4: its
 * e8m0 byte, rand_e8m0); row 0 of a part of >= 3 rows: every byte 0xff but
 * the scales (largest codes), row 1 every byte 0. */
static void fill_gguf_rows(uint8_t *dst, int type, int64_t rows, int64_t k) {
  const int be = armllm_gguf_block_elems(type), bb = armllm_gguf_block_bytes(type);
  int fd, fs;
  f16_fields(type, &fd, &fs);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < k / be; b++) {
      uint8_t *blk = dst + (r * (k / be) + b) * bb;
      for (int i = 0; i < bb; i++) blk[i] = (uint8_t)rand_u32();
      if (rows >= 3 && r < 2) memset(blk, r == 0 ? 0xff : 0, (size_t)bb);
      if (type == ARMLLM_GGML_MXFP4) {
        blk[0] = rand_e8m0();
        continue;
      }
      uint16_t h = rand_f16_bits();
      memcpy(blk + fd, &h, 2);
      if (fs >= 0) {
        h = rand_f16_bits();
        memcpy(blk + fs, &h, 2);
      }
    }
}

/* One GGUF-block GEMM case against ref, bit for bit (memcmp of y, row
 * padding included): the variant on `pool`, on one thread, and on pool2
 * when given; x quantized by ref (armllm_gguf_act_group's group, with gsum). */
static void gguf_case(report *r, const armllm_kernels *v, armllm_pool *pool, armllm_pool *pool2,
                      int64_t m, int64_t k, int nparts, const int32_t *types,
                      const int64_t *rows, int with_bias) {
  const armllm_kernels *ref = &armllm_kernels_ref;
  int64_t n = 0;
  size_t wbytes = 0;
  for (int p = 0; p < nparts; p++) {
    n += rows[p];
    wbytes += armllm_gguf_row_bytes(types[p], k) * (size_t)rows[p];
  }
  const armllm_gguf_parts parts = armllm_gguf_parts_of(nparts, types, rows);
  const int64_t G = armllm_gguf_act_group(&parts), ng = k / G;
  const int64_t ldx = k + 1, ldq = k + (m & 1) * 16, ldgs = ng + (n & 1), ldy = n + (k & 1) * 3 + (m & 2);
  const int64_t ldsc = ng + (m & 2);
  float *x = xmalloc(sizeof(float) * (size_t)(m * ldx));
  int8_t *xq = xmalloc((size_t)(m * ldq));
  float *scale = xmalloc(sizeof(float) * (size_t)(m * ldsc));
  int32_t *gsum = xmalloc(sizeof(int32_t) * (size_t)(m * ldgs));
  uint8_t *w = xmalloc(wbytes);
  float *bias = xmalloc(sizeof(float) * (size_t)n);
  float *y = xmalloc(sizeof(float) * (size_t)(m * ldy)), *y1 = xmalloc(sizeof(float) * (size_t)(m * ldy));
  float *y2 = xmalloc(sizeof(float) * (size_t)(m * ldy)), *yref = xmalloc(sizeof(float) * (size_t)(m * ldy));
  fill_act(x, m, k, ldx, m > 3);
  ref->quant_act(NULL, x, m, k, ldx, G, xq, ldq, scale, ldsc, gsum, ldgs, NULL, 0);
  uint8_t *wp = w;
  for (int p = 0; p < nparts; p++) {
    fill_gguf_rows(wp, types[p], rows[p], k);
    wp += armllm_gguf_row_bytes(types[p], k) * (size_t)rows[p];
  }
  fill(bias, n, 1.0f);
  const size_t len = v->gemm_gguf_packed_len(k, nparts, types, rows);
  void *pk = xmalloc64(len);
  void *pr = xmalloc64(ref->gemm_gguf_packed_len(k, nparts, types, rows));
  v->gemm_gguf_pack(w, k, nparts, types, rows, pk);
  ref->gemm_gguf_pack(w, k, nparts, types, rows, pr);
  for (int64_t i = 0; i < m * ldy; i++) y[i] = y1[i] = y2[i] = yref[i] = -777.0f;
  const float *b = with_bias ? bias : NULL;
  v->gemm_gguf(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, pk, n, b, y, ldy);
  v->gemm_gguf(NULL, xq, m, k, ldq, scale, ldsc, gsum, ldgs, pk, n, b, y1, ldy);
  if (pool2) v->gemm_gguf(pool2, xq, m, k, ldq, scale, ldsc, gsum, ldgs, pk, n, b, y2, ldy);
  else memcpy(y2, y1, sizeof(float) * (size_t)(m * ldy));
  ref->gemm_gguf(NULL, xq, m, k, ldq, scale, ldsc, gsum, ldgs, pr, n, b, yref, ldy);
  const int64_t count = m * ldy;
  if (!same_floats(y, yref, count) || !same_floats(y1, yref, count) ||
      !same_floats(y2, yref, count)) {
    if (r->bad < 5) {
      const float *got = !same_floats(y, yref, count) ? y : !same_floats(y1, yref, count) ? y1 : y2;
      for (int64_t i = 0; i < count; i++)
        if (!same_floats(&got[i], &yref[i], 1)) {
          printf("  gemm_gguf M=%lld K=%lld type %d (of %d parts) n=%lld: y[%lld,%lld] = %.9g, ref %.9g\n",
                 (long long)m, (long long)k, types[0], nparts, (long long)n,
                 (long long)(i / ldy), (long long)(i % ldy), got[i], yref[i]);
          break;
        }
    }
    r->bad++;
  }
  r->cases++;
  free(x); free(xq); free(scale); free(gsum); free(w); free(bias);
  free(y); free(y1); free(y2); free(yref); free(pk); free(pr);
}

static void check_gemm_gguf(const armllm_kernels *v, armllm_pool *pool, int quick) {
  static const int32_t types[] = {
      ARMLLM_GGML_Q4_0, ARMLLM_GGML_Q4_1, ARMLLM_GGML_Q5_0, ARMLLM_GGML_Q5_1,
      ARMLLM_GGML_Q8_0, ARMLLM_GGML_Q2_K, ARMLLM_GGML_Q3_K, ARMLLM_GGML_Q4_K,
      ARMLLM_GGML_Q5_K, ARMLLM_GGML_Q6_K, ARMLLM_GGML_IQ4_NL, ARMLLM_GGML_IQ4_XS,
      ARMLLM_GGML_MXFP4};
  const int ntypes = (int)(sizeof types / sizeof *types);
  /* M: decode 1..4, the first prefill rows, tile edges (8-row tiles,
   * 64-row chunks) */
  static const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 67};
  const int n_ms = (int)(sizeof ms / sizeof *ms);
  char err[256];
  armllm_pool *pool2 = armllm_pool_create(2, 0, err, sizeof err);
  armllm_pool *pool4 = armllm_pool_create(4, 0, err, sizeof err);
  report r;
  report_start(&r, v->isa, "gemm_gguf");
  int c = 0;
  for (int t = 0; t < ntypes; t++) {
    const int be = armllm_gguf_block_elems(types[t]);
    /* K: one block; several blocks over two prefill K blocks (512) */
    const int64_t ks[] = {be, be == 32 ? 576 : 768};
    for (int ik = 0; ik < 2; ik++)
      for (int j = 0; j < (quick ? 2 : 5); j++, c++) {
        int64_t m = ms[(c * 5 + j) % n_ms];
        if (ks[ik] > 512 && m > 17 && quick) m = 17;
        const int64_t rows[1] = {(int64_t)(1 + (c * 7) % 13)};
        gguf_case(&r, v, pool, c % 3 == 0 ? pool4 : pool2, m, ks[ik], 1, &types[t], rows, c & 1);
      }
    /* every M through decode and the first prefill tiles, at one K */
    for (int64_t m = 1; m <= (quick ? 9 : 17); m++) {
      const int64_t rows[1] = {6};
      gguf_case(&r, v, pool, NULL, m, be == 32 ? 96 : 256, 1, &types[t], rows, (int)(m & 1));
    }
  }
  /* mixed parts: a fused QKV (Q4_K, Q4_K, Q6_K), gate/up, 4 parts of 4
   * types; part edges inside panels */
  static const int32_t qkv[3] = {ARMLLM_GGML_Q4_K, ARMLLM_GGML_Q4_K, ARMLLM_GGML_Q6_K};
  static const int32_t mix32[4] = {ARMLLM_GGML_Q4_0, ARMLLM_GGML_MXFP4, ARMLLM_GGML_IQ4_NL,
                                   ARMLLM_GGML_Q5_1};
  static const int32_t mixk[4] = {ARMLLM_GGML_Q2_K, ARMLLM_GGML_Q3_K, ARMLLM_GGML_Q5_K,
                                  ARMLLM_GGML_IQ4_XS};
  static const int32_t mixab[4] = {ARMLLM_GGML_Q5_0, ARMLLM_GGML_Q6_K, ARMLLM_GGML_Q4_1,
                                   ARMLLM_GGML_Q2_K};
  static const int64_t qkv_rows[3] = {9, 5, 6}, mix_rows[4] = {5, 3, 8, 2};
  static const int64_t mixed_ms[] = {1, 3, 4, 5, 9, 20, 67};
  for (size_t i = 0; i < sizeof mixed_ms / sizeof *mixed_ms; i++) {
    const int64_t m = mixed_ms[i];
    if (quick && m > 20) continue;
    gguf_case(&r, v, pool, pool4, m, 768, 3, qkv, qkv_rows, (int)(i & 1));
    gguf_case(&r, v, pool, pool2, m, 160, 4, mix32, mix_rows, (int)(i & 1) ^ 1);
    gguf_case(&r, v, pool, pool4, m, 512, 4, mixk, mix_rows, (int)(i & 1));
    gguf_case(&r, v, pool, pool2, m, 256, 4, mixab, mix_rows, (int)(i & 1) ^ 1);
  }
  report_end(&r, impl_of(v, ARMLLM_K_gemm_gguf));
  if (pool2) armllm_pool_destroy(pool2);
  if (pool4) armllm_pool_destroy(pool4);
}

/* ------------------------------------------------- mixture of experts */

/* A weight of one format, packed for v: float bits (f32, or bf16 widened),
 * w8/w4 (d, o exact in f16; asymmetric: the zero points' correction weight
 * too) or GGUF parts of the given types (tame scales: finite layers). */
typedef struct {
  int kind;            /* ARMLLM_MOE_* */
  int bits;            /* wq */
  int64_t group;       /* wq: weights' group; gguf: the activations' */
  int asym;            /* wq: asymmetric activations */
  int nparts;          /* gguf */
  int32_t types[2];
  int64_t rows[2];
} moe_format;

typedef struct {
  void *w;     /* packed */
  float *corr; /* asymmetric wq: the correction weight, packed f32 */
} moe_packed;

/* random GGUF rows with small finite scales (MXFP4: exponents near 2^-6) */
static void fill_gguf_tame(uint8_t *dst, int type, int64_t rows, int64_t k) {
  const int be = armllm_gguf_block_elems(type), bb = armllm_gguf_block_bytes(type);
  int fd, fs;
  f16_fields(type, &fd, &fs);
  for (int64_t b = 0; b < rows * (k / be); b++) {
    uint8_t *blk = dst + b * bb;
    for (int i = 0; i < bb; i++) blk[i] = (uint8_t)rand_u32();
    if (type == ARMLLM_GGML_MXFP4) {
      blk[0] = (uint8_t)(118 + rand_u32() % 4);
      continue;
    }
    const uint16_t h = (uint16_t)(0x1400 + rand_u32() % 0x400); /* about 2^-10 */
    memcpy(blk + fd, &h, 2);
    if (fs >= 0) memcpy(blk + fs, &h, 2);
  }
}

/* An [n, k] weight of format f, packed for v (gguf: the format's parts, scaled
 * to n rows). */
static moe_packed moe_pack(const armllm_kernels *v, const moe_format *f, int64_t n, int64_t k) {
  moe_packed p = {NULL, NULL};
  if (f->kind == ARMLLM_MOE_F32 || f->kind == ARMLLM_MOE_BF16) {
    float *w = xmalloc(sizeof(float) * (size_t)(n * k));
    fill(w, n * k, 1.0f / sqrtf((float)k));
    if (f->kind == ARMLLM_MOE_F32) {
      p.w = xmalloc64(sizeof(float) * v->gemm_f32_packed_len(n, k));
      v->gemm_f32_pack(w, n, k, p.w);
    } else {
      uint16_t *wb = xmalloc(sizeof(uint16_t) * (size_t)(n * k));
      for (int64_t i = 0; i < n * k; i++) wb[i] = armllm_f32_to_bf16(w[i]);
      p.w = xmalloc64(sizeof(uint16_t) * v->gemm_bf16_packed_len(n, k));
      v->gemm_bf16_pack(wb, n, k, p.w);
      free(wb);
    }
    free(w);
    return p;
  }
  if (f->kind == ARMLLM_MOE_GGUF) {
    int64_t rows[2];
    size_t bytes = 0;
    for (int i = 0; i < f->nparts; i++) {
      rows[i] = f->nparts == 1 ? n : n / 2;
      bytes += armllm_gguf_row_bytes(f->types[i], k) * (size_t)rows[i];
    }
    uint8_t *blocks = xmalloc(bytes), *b = blocks;
    for (int i = 0; i < f->nparts; i++) {
      fill_gguf_tame(b, f->types[i], rows[i], k);
      b += armllm_gguf_row_bytes(f->types[i], k) * (size_t)rows[i];
    }
    p.w = xmalloc64(v->gemm_gguf_packed_len(k, f->nparts, f->types, rows));
    v->gemm_gguf_pack(blocks, k, f->nparts, f->types, rows, p.w);
    free(blocks);
    return p;
  }
  const int64_t ng = armllm_q_groups(k, f->group), gl = armllm_q_group_len(f->group);
  int8_t *q = xmalloc((size_t)(n * k));
  float *d = xmalloc(sizeof(float) * (size_t)(n * ng)), *o = xmalloc(sizeof(float) * (size_t)(n * ng));
  for (int64_t i = 0; i < n * k; i++) {
    const int u = (int)(rand_u32() % 255);
    q[i] = (int8_t)(f->bits == 4 ? u % 16 : u - 127);
  }
  for (int64_t i = 0; i < n * ng; i++) {
    d[i] = round_f16((0.5f + 0.5f * fabsf(frand())) * (f->bits == 4 ? 0.1f : 0.01f) /
                     sqrtf((float)k));
    o[i] = f->bits == 4 ? round_f16(-7.5f * d[i] * (1.0f + 0.1f * frand())) : 0.0f;
  }
  const float *op = f->bits == 4 ? o : NULL;
  p.w = xmalloc64(v->gemm_wq_packed_len(n, k, f->bits, f->group, d, op));
  v->gemm_wq_pack(q, n, k, f->bits, f->group, d, op, p.w);
  if (f->asym) { /* C[n, g] = d * (sum of q over g's real columns) + o * (their count) */
    float *c = xmalloc(sizeof(float) * (size_t)(n * ng));
    for (int64_t j = 0; j < n; j++)
      for (int64_t g = 0; g < ng; g++) {
        int32_t sum = 0, cols = 0;
        for (int64_t i = g * gl; i < (g + 1) * gl && i < k; i++, cols++) sum += q[j * k + i];
        c[j * ng + g] = d[j * ng + g] * (float)sum + o[j * ng + g] * (float)cols;
      }
    p.corr = xmalloc64(sizeof(float) * v->gemm_f32_packed_len(n, ng));
    v->gemm_f32_pack(c, n, ng, p.corr);
    free(c);
  }
  free(q); free(d); free(o);
  return p;
}

/* Activations of m rows of k columns for format f (quant_act's outputs; the
 * zero points' scaled copy and correction of an n-output weight). */
typedef struct {
  armllm_moe_act q;
  int64_t rows;
} moe_scratch;

static moe_scratch moe_scratch_of(const moe_format *f, int64_t rows, int64_t k, int64_t n) {
  moe_scratch s;
  memset(&s, 0, sizeof s);
  s.rows = rows;
  if (f->kind == ARMLLM_MOE_F32 || f->kind == ARMLLM_MOE_BF16) return s;
  const int64_t ng = armllm_q_groups(k, f->group);
  s.q.ldq = armllm_q_kpad(k) + 16;
  s.q.ldsc = s.q.ldgs = s.q.ldzp = s.q.ldszp = ng + 1;
  s.q.xq = xmalloc((size_t)(rows * s.q.ldq));
  s.q.scale = xmalloc(sizeof(float) * (size_t)(rows * s.q.ldsc));
  s.q.gsum = xmalloc(sizeof(int32_t) * (size_t)(rows * s.q.ldgs));
  if (f->asym) {
    s.q.zp = xmalloc(sizeof(int32_t) * (size_t)(rows * s.q.ldzp));
    s.q.szp = xmalloc(sizeof(float) * (size_t)(rows * s.q.ldszp));
    s.q.ldc = n;
    s.q.corr = xmalloc(sizeof(float) * (size_t)(rows * n));
  }
  return s;
}

static void moe_scratch_free(moe_scratch *s) {
  free(s->q.xq); free(s->q.scale); free(s->q.gsum); free(s->q.zp); free(s->q.szp); free(s->q.corr);
}

/* y[m, n] = x[m, k] @ W.T (+ bias) as one bound linear runs it: x quantized
 * in the weight's groups (into s), the whole GEMM slot on one thread, an
 * asymmetric weight's correction taken off. */
static void moe_linear(const armllm_kernels *v, const moe_format *f, const moe_packed *p,
                       moe_scratch *s, const float *x, int64_t ldx, int64_t m, int64_t n,
                       int64_t k, const float *bias, float *y, int64_t ldy) {
  armllm_moe_act *q = &s->q;
  switch (f->kind) {
  case ARMLLM_MOE_F32: v->gemm_f32(NULL, x, m, k, ldx, p->w, n, bias, y, ldy); return;
  case ARMLLM_MOE_BF16: v->gemm_bf16(NULL, x, m, k, ldx, p->w, n, bias, y, ldy); return;
  default: break;
  }
  v->quant_act(NULL, x, m, k, ldx, f->group, q->xq, q->ldq, q->scale, q->ldsc, q->gsum, q->ldgs,
               q->zp, q->ldzp);
  if (f->kind == ARMLLM_MOE_GGUF) {
    v->gemm_gguf(NULL, q->xq, m, k, q->ldq, q->scale, q->ldsc, q->gsum, q->ldgs, p->w, n, bias, y,
                 ldy);
    return;
  }
  v->gemm_wq(NULL, q->xq, m, k, q->ldq, q->scale, q->ldsc, q->gsum, q->ldgs, p->w, n, f->bits,
             f->group, bias, y, ldy);
  if (!f->asym) return;
  const int64_t ng = armllm_q_groups(k, f->group);
  for (int64_t r = 0; r < m; r++)
    for (int64_t g = 0; g < ng; g++)
      q->szp[r * q->ldszp + g] = (float)q->zp[r * q->ldzp + g] * q->scale[r * q->ldsc + g];
  v->gemm_f32(NULL, q->szp, m, ng, q->ldszp, p->corr, n, NULL, q->corr, n);
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < n; j++) y[r * ldy + j] = y[r * ldy + j] - q->corr[r * n + j];
}

/* One layer case: E experts (and a shared one), top-k, t rows, against the
 * per-expert composition of v's slots (each active expert in ascending order
 * on its rows alone, whole GEMMs; then the shared expert), bit for bit. */
static void moe_case(report *r, const armllm_kernels *v, armllm_pool *pool,
                     const moe_format *fgu, const moe_format *fd, int64_t h, int64_t inter,
                     int64_t t, int shared, int clamped, int64_t max_tokens) {
  const int64_t E = 6, k = 2, ne = E + shared, pairs = max_tokens * (k + 1);
  moe_packed *gu = xmalloc(sizeof *gu * (size_t)ne), *dn = xmalloc(sizeof *dn * (size_t)ne);
  const void **guw = xmalloc(sizeof(void *) * (size_t)ne), **dnw = xmalloc(sizeof(void *) * (size_t)ne);
  const float **gub = xmalloc(sizeof(float *) * (size_t)ne), **dnb = xmalloc(sizeof(float *) * (size_t)ne);
  const float **guc = xmalloc(sizeof(float *) * (size_t)ne), **dnc = xmalloc(sizeof(float *) * (size_t)ne);
  float *bias_gu = xmalloc(sizeof(float) * (size_t)(E * 2 * inter));
  float *bias_dn = xmalloc(sizeof(float) * (size_t)(E * h));
  fill(bias_gu, E * 2 * inter, 0.1f);
  fill(bias_dn, E * h, 0.1f);
  for (int64_t e = 0; e < ne; e++) {
    gu[e] = moe_pack(v, fgu, 2 * inter, h);
    dn[e] = moe_pack(v, fd, h, inter);
    guw[e] = gu[e].w, dnw[e] = dn[e].w, guc[e] = gu[e].corr, dnc[e] = dn[e].corr;
    gub[e] = e < E && (e & 1) ? bias_gu + e * 2 * inter : NULL;
    dnb[e] = e < E && (e & 2) ? bias_dn + e * h : NULL;
  }
  float *x = xmalloc(sizeof(float) * (size_t)(t * h)), *logits = xmalloc(sizeof(float) * (size_t)(t * E));
  float *gate = xmalloc(sizeof(float) * (size_t)h);
  fill(x, t * h, 1.0f);
  fill(logits, t * E, 2.0f);
  for (int64_t i = 0; i < t; i++) logits[i * E + 1] += 2.0f; /* expert 1: most rows (prefill tiles) */
  fill(gate, h, 0.1f);
  const int qgu = fgu->kind >= ARMLLM_MOE_WQ, qd = fd->kind >= ARMLLM_MOE_WQ;
  armllm_moe_layer L;
  memset(&L, 0, sizeof L);
  L.experts = E, L.top_k = k, L.hidden = h, L.inter = inter, L.renormalize = 1;
  L.clamped = clamped, L.alpha = 1.702f, L.limit = 1.5f, L.shared = shared;
  L.shared_gate = gate;
  L.gate_up = (armllm_moe_weights){fgu->kind, 2 * inter, h, fgu->bits, fgu->group, guw, gub,
                                   fgu->asym ? guc : NULL};
  L.down = (armllm_moe_weights){fd->kind, h, inter, fd->bits, fd->group, dnw, dnb,
                                fd->asym ? dnc : NULL};
  L.max_tokens = max_tokens;
  L.ldg = (2 * inter > h ? 2 * inter : h) + 3;
  L.gate_up_out = xmalloc(sizeof(float) * (size_t)(pairs * L.ldg));
  L.ldx = h + 1, L.lda = inter + 2;
  L.x_pairs = qgu ? NULL : xmalloc(sizeof(float) * (size_t)(pairs * L.ldx));
  L.act = qd ? NULL : xmalloc(sizeof(float) * (size_t)(pairs * L.lda));
  moe_scratch in_s = moe_scratch_of(fgu, pairs, h, 2 * inter), act_s = moe_scratch_of(fd, pairs, inter, h);
  L.in_q = in_s.q, L.act_q = act_s.q;
  const int64_t routed = max_tokens * k;
  L.ids = xmalloc(sizeof(int32_t) * (size_t)routed), L.pair_row = xmalloc(sizeof(int32_t) * (size_t)routed);
  L.weights = xmalloc(sizeof(float) * (size_t)routed), L.pair_weight = xmalloc(sizeof(float) * (size_t)routed);
  L.counts = xmalloc(sizeof(int32_t) * (size_t)E), L.start = xmalloc(sizeof(int32_t) * (size_t)(E + 1));
  L.active = xmalloc(sizeof(int32_t) * (size_t)(E + 1)), L.taken = xmalloc((size_t)E);
  L.shared_scale = xmalloc(sizeof(float) * (size_t)max_tokens);
  char err[256];
  if (armllm_moe_check(v, &L, err, sizeof err)) {
    printf("  moe: %s\n", err);
    r->bad++;
  }
  const int64_t ldo = h + 5;
  float *out = xmalloc(sizeof(float) * (size_t)(t * ldo)), *want = xmalloc(sizeof(float) * (size_t)(t * ldo));
  for (int64_t i = 0; i < t * ldo; i++) out[i] = want[i] = -777.0f;
  armllm_moe_run(v, pool, &L, x, h, logits, E, t, out, ldo);

  /* the per-expert composition */
  int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(t * k));
  float *w = xmalloc(sizeof(float) * (size_t)(t * k));
  uint8_t *taken = xmalloc((size_t)E);
  armllm_moe_route(logits, E, t, E, k, 1, ids, w, taken);
  for (int64_t i = 0; i < t; i++) memset(want + i * ldo, 0, sizeof(float) * (size_t)h);
  float *xin = xmalloc(sizeof(float) * (size_t)(t * h)), *gbuf = xmalloc(sizeof(float) * (size_t)(t * 2 * inter));
  float *abuf = xmalloc(sizeof(float) * (size_t)(t * inter)), *ybuf = xmalloc(sizeof(float) * (size_t)(t * h));
  int32_t *rows = xmalloc(sizeof(int32_t) * (size_t)t);
  float *rw = xmalloc(sizeof(float) * (size_t)t);
  moe_scratch s1 = moe_scratch_of(fgu, t, h, 2 * inter), s2 = moe_scratch_of(fd, t, inter, h);
  for (int64_t e = 0; e < ne; e++) {
    int64_t m = 0;
    if (e < E) {
      for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < k; j++)
          if (ids[i * k + j] == e) rows[m] = (int32_t)i, rw[m++] = w[i * k + j];
    } else {
      for (int64_t i = 0; i < t; i++) {
        float dot = 0;
        for (int64_t j = 0; j < h; j++) dot = dot + x[i * h + j] * gate[j];
        rw[i] = (float)(1.0 / (1.0 + (double)expf(-dot)));
      }
      m = t;
    }
    if (!m) continue;
    for (int64_t i = 0; i < m; i++)
      memcpy(xin + i * h, x + (e < E ? rows[i] : i) * h, sizeof(float) * (size_t)h);
    moe_linear(v, fgu, &gu[e], &s1, xin, h, m, 2 * inter, h, gub[e], gbuf, 2 * inter);
    if (clamped && e < E) armllm_swiglu_clamped(gbuf, 2 * inter, m, inter, 1.702f, 1.5f, abuf, inter);
    else v->silu_mul(NULL, gbuf, 2 * inter, m, inter, abuf, inter);
    moe_linear(v, fd, &dn[e], &s2, abuf, inter, m, h, inter, dnb[e], ybuf, h);
    armllm_moe_accumulate(ybuf, h, m, h, e < E ? rows : NULL, rw, want, ldo);
  }
  if (!same_floats(out, want, t * ldo)) {
    if (r->bad < 3)
      for (int64_t i = 0; i < t * ldo; i++)
        if (!same_floats(&out[i], &want[i], 1)) {
          printf("  moe kinds %d/%d t=%lld shared=%d clamped=%d passes of %lld: out[%lld,%lld] "
                 "= %.9g, composition %.9g\n", fgu->kind, fd->kind, (long long)t, shared, clamped,
                 (long long)max_tokens, (long long)(i / ldo), (long long)(i % ldo), out[i], want[i]);
          break;
        }
    r->bad++;
  }
  r->cases++;
  for (int64_t e = 0; e < ne; e++) free(gu[e].w), free(gu[e].corr), free(dn[e].w), free(dn[e].corr);
  free(gu); free(dn); free(guw); free(dnw); free(gub); free(dnb); free(guc); free(dnc);
  free(bias_gu); free(bias_dn); free(x); free(logits); free(gate);
  free(L.gate_up_out); free(L.x_pairs); free(L.act);
  moe_scratch_free(&in_s); moe_scratch_free(&act_s); moe_scratch_free(&s1); moe_scratch_free(&s2);
  free(L.ids); free(L.pair_row); free(L.weights); free(L.pair_weight); free(L.counts);
  free(L.start); free(L.active); free(L.taken); free(L.shared_scale);
  free(out); free(want); free(ids); free(w); free(taken); free(xin); free(gbuf); free(abuf);
  free(ybuf); free(rows); free(rw);
}

/* Every expert format: f32, bf16, w8 (channelwise, group 32), w4 (group 32,
 * symmetric and asymmetric activations), GGUF Q4_0, Q8_0 gate/up with a
 * Q4_0 down, K-quants (Q4_K gate | Q6_K up, Q4_K down), MXFP4; one row
 * (decode), 13 and 27 rows (prefill tiles), passes of 5 rows, a shared
 * expert, GPT-OSS's clamped SwiGLU; inter off the float panels (12, 16). */
static void check_moe(const armllm_kernels *v, armllm_pool *pool, int quick) {
  static const moe_format
      f32 = {ARMLLM_MOE_F32, 0, 0, 0, 0, {0, 0}, {0, 0}},
      bf16 = {ARMLLM_MOE_BF16, 0, 0, 0, 0, {0, 0}, {0, 0}},
      w8 = {ARMLLM_MOE_WQ, 8, 0, 0, 0, {0, 0}, {0, 0}},
      w8g = {ARMLLM_MOE_WQ, 8, 32, 0, 0, {0, 0}, {0, 0}},
      w4 = {ARMLLM_MOE_WQ, 4, 32, 0, 0, {0, 0}, {0, 0}},
      w4a = {ARMLLM_MOE_WQ, 4, 32, 1, 0, {0, 0}, {0, 0}},
      q40 = {ARMLLM_MOE_GGUF, 0, 32, 0, 1, {ARMLLM_GGML_Q4_0, 0}, {0, 0}},
      q80 = {ARMLLM_MOE_GGUF, 0, 32, 0, 1, {ARMLLM_GGML_Q8_0, 0}, {0, 0}},
      kgu = {ARMLLM_MOE_GGUF, 0, 256, 0, 2, {ARMLLM_GGML_Q4_K, ARMLLM_GGML_Q6_K}, {0, 0}},
      kd = {ARMLLM_MOE_GGUF, 0, 256, 0, 1, {ARMLLM_GGML_Q4_K, 0}, {0, 0}},
      mx = {ARMLLM_MOE_GGUF, 0, 32, 0, 1, {ARMLLM_GGML_MXFP4, 0}, {0, 0}};
  static const struct {
    const moe_format *gu, *down;
    int64_t h, inter;
  } cases[] = {{&f32, &f32, 48, 100}, {&bf16, &bf16, 48, 100}, {&w8, &w8, 64, 100},
               {&w8g, &w8g, 96, 100}, {&w4, &w4, 64, 100},     {&w4a, &w4a, 64, 100},
               {&q80, &q40, 64, 96},   {&kgu, &kd, 256, 256},   {&mx, &mx, 64, 160}};
  static const int64_t ts[] = {1, 13, 27};
  report r;
  report_start(&r, v->isa, "moe_layer");
  int c = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (size_t it = 0; it < sizeof ts / sizeof *ts; it++, c++) {
      if (quick && it == 2) continue;
      const int64_t t = ts[it];
      moe_case(&r, v, pool, cases[i].gu, cases[i].down, cases[i].h, cases[i].inter, t, c & 1,
               (c >> 1) & 1, t);
      if (t > 1) /* passes of 5 rows, one thread */
        moe_case(&r, v, NULL, cases[i].gu, cases[i].down, cases[i].h, cases[i].inter, t, c & 1,
                 0, 5);
    }
  report_end(&r, impl_of(v, ARMLLM_K_gemm_wq));
}

/* One column-window case of each GEMM: the window of the whole call's y, bit
 * for bit, and nothing written outside it. */
static void cols_compare(report *r, const float *full, const float *win, int64_t m, int64_t n,
                         int64_t n0, int64_t n1) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      const float *a = &win[i * n + j];
      if (j < n0 || j >= n1) {
        if (*a != -777.0f) r->bad++;
      } else if (!same_floats(a, &full[i * n + j], 1)) {
        r->bad++;
      }
    }
  r->cases++;
}

static void check_gemm_cols(const armllm_kernels *v) {
  static const int64_t ms[] = {1, 3, 5, 9, 20};
  report r;
  report_start(&r, v->isa, "gemm_cols");
  for (int fmt = 0; fmt < 6; fmt++) {
    static const moe_format formats[6] = {
        {ARMLLM_MOE_F32, 0, 0, 0, 0, {0, 0}, {0, 0}},
        {ARMLLM_MOE_BF16, 0, 0, 0, 0, {0, 0}, {0, 0}},
        {ARMLLM_MOE_WQ, 8, 0, 0, 0, {0, 0}, {0, 0}},
        {ARMLLM_MOE_WQ, 4, 32, 0, 0, {0, 0}, {0, 0}},
        {ARMLLM_MOE_GGUF, 0, 256, 0, 2, {ARMLLM_GGML_Q4_K, ARMLLM_GGML_Q6_K}, {0, 0}},
        {ARMLLM_MOE_GGUF, 0, 32, 0, 1, {ARMLLM_GGML_MXFP4, 0}, {0, 0}}};
    const moe_format *f = &formats[fmt];
    const int64_t panel = f->kind == ARMLLM_MOE_F32 ? v->gemm_f32_panel
                          : f->kind == ARMLLM_MOE_BF16 ? v->gemm_bf16_panel
                          : f->kind == ARMLLM_MOE_WQ ? v->gemm_wq_panel : v->gemm_gguf_panel;
    const int64_t k = f->kind == ARMLLM_MOE_GGUF && f->group == 256 ? 512 : 96;
    const int64_t n = f->nparts == 2 ? 2 * (3 * panel + 2) : 5 * panel + 3; /* parts end mid-panel */
    const moe_packed p = moe_pack(v, f, n, k);
    float *bias = xmalloc(sizeof(float) * (size_t)n);
    fill(bias, n, 1.0f);
    for (size_t im = 0; im < sizeof ms / sizeof *ms; im++) {
      const int64_t m = ms[im];
      float *x = xmalloc(sizeof(float) * (size_t)(m * k));
      float *full = xmalloc(sizeof(float) * (size_t)(m * n)), *y = xmalloc(sizeof(float) * (size_t)(m * n));
      fill(x, m * k, 1.0f);
      moe_scratch s = moe_scratch_of(f, m, k, n);
      armllm_moe_act *q = &s.q;
      moe_linear(v, f, &p, &s, x, k, m, n, k, bias, full, n); /* quantizes x into s */
      /* windows from each panel start of each part (the second part starts off
       * the panels), to N, past the next panel's first column, or one column */
      const int64_t half = f->nparts == 2 ? n / 2 : n;
      for (int64_t n0 = 0; n0 < n; n0 = n0 + panel < half || n0 >= half ? n0 + panel : half) {
        for (int e = 0; e < 3; e++) {
          int64_t n1 = e == 0 ? n : e == 1 ? n0 + panel + 1 : n0 + 1;
          if (n1 > n) n1 = n;
          for (int64_t i = 0; i < m * n; i++) y[i] = -777.0f;
          const float *b = bias + n0;
          float *yw = y + n0;
          switch (f->kind) {
          case ARMLLM_MOE_F32: v->gemm_f32_cols(x, m, k, k, p.w, n, n0, n1, b, yw, n); break;
          case ARMLLM_MOE_BF16: v->gemm_bf16_cols(x, m, k, k, p.w, n, n0, n1, b, yw, n); break;
          case ARMLLM_MOE_WQ:
            v->gemm_wq_cols(q->xq, m, k, q->ldq, q->scale, q->ldsc, q->gsum, q->ldgs, p.w, n,
                            f->bits, f->group, n0, n1, b, yw, n);
            break;
          default:
            v->gemm_gguf_cols(q->xq, m, k, q->ldq, q->scale, q->ldsc, q->gsum, q->ldgs, p.w, n,
                              n0, n1, b, yw, n);
          }
          cols_compare(&r, full, y, m, n, n0, n1);
        }
      }
      moe_scratch_free(&s);
      free(x); free(full); free(y);
    }
    free(bias); free(p.w); free(p.corr);
  }
  report_end(&r, impl_of(v, ARMLLM_K_gemm_f32));
}

/* ----------------------------------------------------- Gated DeltaNet */

/* Varlen metadata of sequences with q_lens rows after starts tokens, in
 * slots n_seqs .. 1 (reversed, so slot and sequence differ); slot 0 is spare. */
typedef struct {
  int32_t query_start[8], seq_lens[8], state_slots[8];
  int64_t n_seqs, rows, num_slots;
} gdn_meta;

static gdn_meta gdn_metadata(const int *q_lens, const int *starts, int64_t n_seqs) {
  gdn_meta m;
  memset(&m, 0, sizeof m);
  m.n_seqs = n_seqs;
  m.num_slots = n_seqs + 1;
  for (int64_t b = 0; b < n_seqs; b++) {
    m.query_start[b + 1] = m.query_start[b] + q_lens[b];
    m.seq_lens[b] = starts[b] + q_lens[b];
    m.state_slots[b] = (int32_t)(n_seqs - b);
  }
  m.rows = m.query_start[n_seqs];
  return m;
}

/* Every variant gives ref's bits for y and the state: ref's products, sums,
 * exp and division in ref's order. Channels around the vector widths and the
 * 256-channel task, fresh and continuing sequences, q_len below kernel - 1,
 * an empty sequence; bad metadata is reported and writes nothing. */
static void check_gdn_conv(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t channels[] = {1, 3, 4, 5, 9, 17, 256, 300, 513, 600};
  static const int64_t kernels[] = {2, 3, 4, 5, 8};
  static const int q_lens[] = {1, 5, 0, 2, 12}, starts[] = {9, 0, 3, 1, 0};
  report r;
  report_start(&r, v->isa, "gdn_conv");
  for (size_t ic = 0; ic < sizeof channels / sizeof *channels; ic++)
    for (size_t ik = 0; ik < sizeof kernels / sizeof *kernels; ik++) {
      const int64_t ch = channels[ic], kernel = kernels[ik], ldx = ch + 3, ldy = ch + 1;
      const gdn_meta m = gdn_metadata(q_lens, starts, 5);
      const int64_t state_n = m.num_slots * (kernel - 1) * ch;
      float *x = xmalloc(sizeof(float) * (size_t)(m.rows * ldx));
      float *w = xmalloc(sizeof(float) * (size_t)(ch * kernel));
      float *state = xmalloc(sizeof(float) * (size_t)state_n);
      float *state2 = xmalloc(sizeof(float) * (size_t)state_n);
      float *y = xmalloc(sizeof(float) * (size_t)(m.rows * ldy));
      float *y2 = xmalloc(sizeof(float) * (size_t)(m.rows * ldy));
      fill(x, m.rows * ldx, 4.0f);
      fill(w, ch * kernel, 1.0f);
      fill(state, state_n, 4.0f);
      memcpy(state2, state, sizeof(float) * (size_t)state_n);
      for (int64_t i = 0; i < m.rows * ldy; i++) y[i] = y2[i] = -777.0f;
      armllm_gdn_conv_args a = {x, ldx, y, ldy, w, ch, kernel, state, m.num_slots,
                                m.query_start, m.seq_lens, m.state_slots, m.n_seqs};
      armllm_gdn_conv_args a2 = a;
      a2.y = y2;
      a2.state = state2;
      if (v->gdn_conv(pool, &a) != -1 || armllm_kernels_ref.gdn_conv(NULL, &a2) != -1) r.bad++;
      if (memcmp(y, y2, sizeof(float) * (size_t)(m.rows * ldy)) != 0) r.bad++; /* padding too */
      if (memcmp(state, state2, sizeof(float) * (size_t)state_n) != 0) r.bad++;
      int32_t bad_slots[8];
      memcpy(bad_slots, m.state_slots, sizeof bad_slots);
      bad_slots[3] = (int32_t)m.num_slots; /* outside [0, num_slots) */
      a.state_slots = bad_slots;
      if (v->gdn_conv(pool, &a) != 3) r.bad++;
      if (memcmp(y, y2, sizeof(float) * (size_t)(m.rows * ldy)) != 0) r.bad++;
      if (memcmp(state, state2, sizeof(float) * (size_t)state_n) != 0) r.bad++;
      r.cases++;
      free(x); free(w); free(state); free(state2); free(y); free(y2);
    }
  report_end(&r, impl_of(v, ARMLLM_K_gdn_conv));
}

/* One gdn_rule call against ref: out and the state within 5e-6 of their
 * largest values (the same steps, FMAs where ref rounds twice; test_gdn.py's
 * VARIANT_TOL),
 * rows past the heads' columns untouched, slots of empty sequences untouched,
 * and the same bits on one thread and on the pool. */
static void gdn_rule_case(report *r, const armllm_kernels *v, armllm_pool *pool, int64_t n_k,
                          int64_t n_v, int64_t dk, int64_t dv, int v_tiled, const int *q_lens,
                          const int *starts, int64_t n_seqs, int correlated) {
  const double rule_tol = 5e-6;
  const gdn_meta m = gdn_metadata(q_lens, starts, n_seqs);
  const int64_t rows = m.rows, ldqkv = 2 * n_k * dk + n_v * dv + 1, ldab = 2 * n_v + 3;
  const int64_t ldo = n_v * dv + 2, state_n = m.num_slots * n_v * dk * dv;
  float *qkv = xmalloc(sizeof(float) * (size_t)(rows * ldqkv));
  float *ab = xmalloc(sizeof(float) * (size_t)(rows * ldab));
  float *a_neg = xmalloc(sizeof(float) * (size_t)n_v), *dt_bias = xmalloc(sizeof(float) * (size_t)n_v);
  float *state0 = xmalloc(sizeof(float) * (size_t)state_n);
  float *states[3], *outs[3];
  for (int i = 0; i < 3; i++) {
    states[i] = xmalloc(sizeof(float) * (size_t)state_n);
    outs[i] = xmalloc(sizeof(float) * (size_t)(rows * ldo));
  }
  fill(qkv, rows * ldqkv, 1.0f);
  if (correlated) /* keys and queries near one direction: A near its bound */
    for (int64_t i = 1; i < rows; i++)
      for (int64_t j = 0; j < 2 * n_k * dk; j++) qkv[i * ldqkv + j] = qkv[j] + 0.1f * qkv[i * ldqkv + j];
  fill(ab, rows * ldab, 1.0f);
  for (int64_t h = 0; h < n_v; h++) { /* even heads keep most of their state over a chunk */
    a_neg[h] = h % 2 ? -(0.01f + 8.0f * (frand() + 1.0f)) : -(0.001f + 0.02f * (frand() + 1.0f));
    dt_bias[h] = frand();
  }
  fill(state0, state_n, 0.3f);
  for (int i = 0; i < 3; i++) {
    memcpy(states[i], state0, sizeof(float) * (size_t)state_n);
    for (int64_t j = 0; j < rows * ldo; j++) outs[i][j] = -777.0f;
  }
  armllm_gdn_args a = {qkv, qkv + n_k * dk, qkv + 2 * n_k * dk, ldqkv, ab, ab + n_v + 1, ldab,
                       a_neg, dt_bias, NULL, ldo, NULL, m.num_slots, n_k, n_v, dk, dv, v_tiled,
                       m.query_start, m.seq_lens, m.state_slots, n_seqs};
  for (int i = 0; i < 3; i++) { /* ref, the variant on the pool, the variant alone */
    a.out = outs[i];
    a.state = states[i];
    const armllm_kernels *k = i == 0 ? &armllm_kernels_ref : v;
    if (k->gdn_rule(i == 1 ? pool : NULL, &a) != -1) r->bad++;
  }
  double out_max = 0.0, state_max = 0.0;
  for (int64_t j = 0; j < rows * ldo; j++)
    if (j % ldo < n_v * dv) out_max = fmax(out_max, fabs(outs[0][j]));
  for (int64_t j = 0; j < state_n; j++) state_max = fmax(state_max, fabs(states[0][j]));
  for (int64_t j = 0; j < rows * ldo; j++) {
    if (j % ldo >= n_v * dv) {
      if (outs[1][j] != -777.0f) r->bad++;
      continue;
    }
    report_value(r, outs[1][j], outs[0][j], rule_tol * out_max + 1e-30);
  }
  for (int64_t j = 0; j < state_n; j++)
    report_value(r, states[1][j], states[0][j], rule_tol * state_max + 1e-30);
  for (int64_t b = -1; b < n_seqs; b++) /* the spare slot, and those of sequences without rows */
    if (b < 0 || q_lens[b] == 0) {
      const size_t at = b < 0 ? 0 : (size_t)m.state_slots[b] * (size_t)(n_v * dk * dv);
      if (memcmp(states[1] + at, state0 + at, sizeof(float) * (size_t)(n_v * dk * dv))) r->bad++;
    }
  if (memcmp(outs[1], outs[2], sizeof(float) * (size_t)(rows * ldo)) != 0) r->bad++;
  if (memcmp(states[1], states[2], sizeof(float) * (size_t)state_n) != 0) r->bad++;
  r->cases++;
  free(qkv); free(ab); free(a_neg); free(dt_bias); free(state0);
  for (int i = 0; i < 3; i++) { free(states[i]); free(outs[i]); }
}

/* Decode rows (the recurrence), whole 64-row chunks (fresh: from a state the
 * chunk must not read) and the rows after them, head dims around the vector
 * widths (odd ones too), GQA in both orders, and batches mixing them. */
static void check_gdn_rule(const armllm_kernels *v, armllm_pool *pool, int quick) {
  static const int decode[] = {1, 1, 0, 1}, decode_starts[] = {5, 0, 3, 40};
  static const int few[] = {3, 0, 2}, few_starts[] = {0, 2, 7};
  static const int64_t dims[][2] = {{16, 16}, {32, 64}, {64, 32}, {48, 80}, {10, 7}, {6, 18}, {4, 36}};
  report r;
  report_start(&r, v->isa, "gdn_rule");
  gdn_rule_case(&r, v, pool, 2, 4, 128, 128, 0, decode, decode_starts, 4, 0);
  for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
    gdn_rule_case(&r, v, pool, 1, 2, dims[i][0], dims[i][1], (int)(i & 1), few, few_starts, 3, 0);
  static const int chunked[] = {130, 1}, chunked_starts[] = {5, 9};
  gdn_rule_case(&r, v, pool, 2, 4, 32, 64, 1, chunked, chunked_starts, 2, 1);
  static const int one_chunk[] = {64}, fresh[] = {0};
  gdn_rule_case(&r, v, pool, 1, 1, 10, 7, 0, one_chunk, fresh, 1, 0);
  static const int chunk_tail[] = {70}, cont[] = {3};
  gdn_rule_case(&r, v, pool, 1, 3, 6, 18, 0, chunk_tail, cont, 1, 1);
  /* a decode, a fresh chunk and its recurrent tail, an empty sequence, a continuation */
  static const int mixed[] = {1, 70, 0, 3}, mixed_starts[] = {5, 0, 2, 9};
  static const int64_t mixed_shapes[][4] = {{2, 4, 32, 64}, {1, 1, 16, 24}, {2, 2, 128, 128},
                                            {1, 3, 20, 7}};
  for (size_t i = 0; i < sizeof mixed_shapes / sizeof *mixed_shapes; i++) {
    const int64_t *sh = mixed_shapes[i];
    gdn_rule_case(&r, v, pool, sh[0], sh[1], sh[2], sh[3], (int)(i & 1), mixed, mixed_starts, 4,
                  0);
  }
  if (!quick) {
    gdn_rule_case(&r, v, pool, 1, 2, 128, 128, 0, one_chunk, cont, 1, 1);
    gdn_rule_case(&r, v, pool, 1, 1, 48, 80, 0, chunk_tail, fresh, 1, 0);
  }
  report_end(&r, impl_of(v, ARMLLM_K_gdn_rule));
}

/* Within 1e-6 of ref relative: the float64 sum of squares in another order;
 * the float32 products are ref's. In place too; padding untouched. */
static void check_gated_rmsnorm(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ds[] = {1, 3, 4, 5, 7, 8, 16, 33, 64, 128, 130, 1000};
  static const float scales[] = {1e-10f, 1.0f, 1e10f};
  report r;
  report_start(&r, v->isa, "gated_rmsnorm");
  for (size_t i = 0; i < sizeof ds / sizeof *ds; i++)
    for (int inplace = 0; inplace < 2; inplace++) {
      const int64_t t = 3, heads = 1 + (int64_t)(i % 3), d = ds[i], n = heads * d, ld = n + 2;
      float *x = xmalloc(sizeof(float) * (size_t)(t * ld)), *z = xmalloc(sizeof(float) * (size_t)(t * ld));
      float *w = xmalloc(sizeof(float) * (size_t)d), *out = xmalloc(sizeof(float) * (size_t)(t * ld));
      float *want = xmalloc(sizeof(float) * (size_t)(t * ld));
      fill(x, t * ld, 1.0f);
      for (int64_t a = 0; a < t; a++)
        for (int64_t j = 0; j < ld; j++) x[a * ld + j] *= scales[(a + (int64_t)i) % 3];
      fill(z, t * ld, 6.0f);
      fill(w, d, 1.0f);
      for (int64_t j = 0; j < t * ld; j++) out[j] = want[j] = -777.0f;
      armllm_kernels_ref.gated_rmsnorm(NULL, x, ld, z, ld, w, t, heads, d, 1e-6f, want, ld);
      float *o = inplace ? x : out;
      v->gated_rmsnorm(pool, x, ld, z, ld, w, t, heads, d, 1e-6f, o, ld);
      for (int64_t j = 0; j < t * ld; j++) {
        if (j % ld >= n) {
          if (!inplace && o[j] != -777.0f) r.bad++;
          continue;
        }
        report_value(&r, o[j], want[j], 1e-6 * fabs(want[j]) + 1e-38);
      }
      r.cases++;
      free(x); free(z); free(w); free(out); free(want);
    }
  report_end(&r, impl_of(v, ARMLLM_K_gated_rmsnorm));
}

/* ref's bits (NaN as NaN), gates where exp(-g) overflows or is 0; padding
 * columns untouched. */
static void check_sigmoid_mul(const armllm_kernels *v, armllm_pool *pool) {
  static const int64_t ns[] = {1, 3, 4, 5, 8, 9, 17, 300};
  static const float special[] = {100.0f, -100.0f, NAN, INFINITY, -INFINITY, -88.0f, 0.0f, -0.0f};
  report r;
  report_start(&r, v->isa, "sigmoid_mul");
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    const int64_t t = 3, n = ns[i], ldg = n + 3, ldx = n + 1;
    float *g = xmalloc(sizeof(float) * (size_t)(t * ldg));
    float *x = xmalloc(sizeof(float) * (size_t)(t * ldx)), *x2 = xmalloc(sizeof(float) * (size_t)(t * ldx));
    fill(g, t * ldg, 12.0f);
    for (int s = 0; s < 8 && s < n; s++) g[ldg + s] = special[s]; /* row 1 */
    fill(x, t * ldx, 2.0f);
    memcpy(x2, x, sizeof(float) * (size_t)(t * ldx));
    v->sigmoid_mul(pool, g, ldg, t, n, x, ldx);
    armllm_kernels_ref.sigmoid_mul(NULL, g, ldg, t, n, x2, ldx);
    for (int64_t j = 0; j < t * ldx; j++) {
      const float got = x[j], want = x2[j];
      if (isnan(want) ? !isnan(got) : memcmp(&got, &want, sizeof got) != 0) r.bad++;
    }
    r.cases++;
    free(g); free(x); free(x2);
  }
  report_end(&r, impl_of(v, ARMLLM_K_sigmoid_mul));
}

/* The checks of Whisper's kernels draw their data from a copy of the random stream:
 * every other check keeps the data it always had. */
static void check_whisper_kernels(const armllm_kernels *v, armllm_pool *pool) {
  const uint64_t saved = rng_state;
  check_layernorm(v, pool);
  check_gelu(v, pool);
  check_attention_bidirectional(v, pool);
  rng_state = saved;
}

/* ------------------------------------------------------------ sampling */

/* A logits-like row: a normal-ish bulk, a few large entries, and (specials)
 * -inf, NaN and exact ties. */
static void fill_logits(float *x, int64_t n, int specials) {
  for (int64_t i = 0; i < n; i++) x[i] = frand() * 6.0f;
  for (int k = 0; k < 3; k++) x[(int64_t)((frand() + 1.0f) * 0.5f * (float)n) % n] = 9.0f + frand();
  if (!specials) return;
  for (int64_t i = 0; i < n; i++) {
    const float u = frand();
    if (u > 0.9f) x[i] = -INFINITY;
    else if (u < -0.95f) x[i] = NAN;
    else if (u < -0.9f) x[i] = 2.0f;
  }
}

static int same_bits(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }

/* The sampling slots against ref's, bit for bit: argmax, find_above, the exp
 * pass (e, block sums, total) at several floors, block sums, collect; and the
 * exp pass against the table's full exp over every 9973rd float of [-80, 0]. */
static void check_sample_slots(const armllm_kernels *v) {
  report r;
  report_start(&r, v->isa, "sample_exp");
  const armllm_kernels *ref = &armllm_kernels_ref;
  const int64_t max_n = 1100;
  float *x = xmalloc(sizeof(float) * max_n), *e = xmalloc(sizeof(float) * max_n);
  float *e2 = xmalloc(sizeof(float) * max_n), *sums = xmalloc(sizeof(float) * max_n);
  float *sums2 = xmalloc(sizeof(float) * max_n);
  float *ce = xmalloc(sizeof(float) * (max_n + 16)), *ce2 = xmalloc(sizeof(float) * (max_n + 16));
  int32_t *ci = xmalloc(sizeof(int32_t) * (max_n + 16)), *ci2 = xmalloc(sizeof(int32_t) * (max_n + 16));
  int32_t *ids = xmalloc(sizeof(int32_t) * max_n);
  static const float floors[] = {0.0f, 1e-3f, 0.5f, 1.0f};
  static const float inv_ts[] = {1.0f, 1.25f, 0.05f, 3.0e38f};
  for (int64_t n = 1; n <= max_n; n = n < 40 ? n + 1 : n * 5 / 3) {
    for (int specials = 0; specials < 2; specials++) {
      fill_logits(x, n, specials);
      for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(3 * i + 1);
      const int64_t at = v->sample_argmax(x, n);
      if (at != ref->sample_argmax(x, n)) r.bad++;
      const float m = at < 0 ? 0.0f : x[at];
      if (!isfinite(m)) continue; /* the sampler never runs the exp pass then */
      if (v->sample_find_above(x, n, 8.5f) != ref->sample_find_above(x, n, 8.5f)) r.bad++;
      if (v->sample_find_above(x, n, INFINITY) != n) r.bad++;
      for (size_t t = 0; t < sizeof inv_ts / sizeof *inv_ts; t++)
        for (size_t f = 0; f < sizeof floors / sizeof *floors; f++) {
          const double total = v->sample_exp(x, e, n, m, inv_ts[t], floors[f], sums);
          const double total2 = ref->sample_exp(x, e2, n, m, inv_ts[t], floors[f], sums2);
          const size_t blocks = (size_t)((n + 15) / 16);
          if (!same_bits(e, e2, sizeof(float) * (size_t)n) ||
              !same_bits(sums, sums2, sizeof(float) * blocks) || total != total2)
            r.bad++;
          if (v->sample_block_sums(e2, n, floors[f], sums) != total2 ||
              !same_bits(sums, sums2, sizeof(float) * blocks))
            r.bad++;
          const int64_t c = v->sample_collect(e2, f % 2 ? ids : NULL, n, floors[f], ce, ci);
          const int64_t c2 = ref->sample_collect(e2, f % 2 ? ids : NULL, n, floors[f], ce2, ci2);
          if (c != c2 || !same_bits(ce, ce2, sizeof(float) * (size_t)c) ||
              !same_bits(ci, ci2, sizeof(int32_t) * (size_t)c))
            r.bad++;
          memcpy(e, x, sizeof(float) * (size_t)n); /* in place */
          v->sample_exp(e, e, n, m, inv_ts[t], floors[f], sums);
          if (!same_bits(e, e2, sizeof(float) * (size_t)n)) r.bad++;
          r.cases++;
        }
    }
  }
  /* the exp pass on [-80, 0] is the shared exp (the table's own exp slot) */
  uint32_t lo;
  const float minus_80 = -80.0f;
  memcpy(&lo, &minus_80, sizeof lo);
  int64_t k = 0;
  for (uint32_t bits = 0x80000000u; bits <= lo; bits += 9973u) {
    memcpy(&x[k++], &bits, sizeof bits);
    if (k == max_n || bits + 9973u > lo) {
      v->sample_exp(x, e, k, 0.0f, 1.0f, 0.0f, sums);
      v->exp(x, e2, k);
      if (!same_bits(e, e2, sizeof(float) * (size_t)k)) r.bad++;
      r.cases++;
      k = 0;
    }
  }
  free(x); free(e); free(e2); free(sums); free(sums2); free(ce); free(ce2); free(ci); free(ci2);
  free(ids);
  report_end(&r, impl_of(v, ARMLLM_K_sample_exp));
}

enum { SAMPLE_ROWS = 13 };

/* One batch of SAMPLE_ROWS rows of n logits, each row its own mix of the
 * parameters, sampled with table t on pool; outputs into out_* ([rows] and
 * [rows, 20]). */
static void sample_batch(const armllm_kernels *t, armllm_pool *pool, const float *logits,
                         int64_t n, void *scratch, int64_t slots, int32_t *token, float *logprob,
                         int32_t *top_ids, float *top_lp) {
  enum { R = SAMPLE_ROWS };
  static const float temperature[R] = {0, 0.8f, 1, 0.5f, 1.5f, 1, 0.8f, 0, 1, 2, 0.7f, 1, 1};
  static const float top_p[R] = {1, 0.95f, 1, 0.5f, 1, 0.9f, 1, 1, 0.999f, 0.3f, 0.8f, 1, 1};
  static const float min_p[R] = {0, 0, 0.05f, 0, 0.1f, 0, 0, 0, 0, 0, 0.02f, 0, 1};
  static const int32_t top_k[R] = {0, 0, 0, 7, 0, 40, 3, 0, 0, 0, 20, 1, 0};
  static const int32_t n_lp[R] = {3, -1, 0, 20, -1, 5, 1, 2, -1, 4, 0, -1, 1};
  static const float rep[R] = {1, 1.2f, 1, 1, 0.8f, 1, 1, 1.3f, 1, 1, 1, 1, 1};
  static const float pres[R] = {0, 0.5f, 0, 0, 0, -0.5f, 0, 0, 0, 0, 0, 0, 0};
  static const float freq[R] = {0, 0.25f, 0, 0, 0, 0.5f, 0, 0.1f, 0, 0, 0, 0, 0};
  static const int32_t mask_row[R] = {-1, -1, 0, -1, -1, -1, 1, -1, -1, -1, -1, -1, -1};
  /* bad words, DRY (on the rows with a history) and XTC */
  static const float dry_mult[R] = {0, 0.8f, 0, 0, 2, 0, 0, 1, 0, 0, 0.5f, 0, 0};
  static const float dry_base[R] = {1.75f, 1.75f, 1.75f, 1.75f, 1e10f, 1.75f, 1.75f, 1,
                                    1.75f, 1.75f, 1.75f, 1.75f, 1.75f};
  static const int32_t dry_allowed[R] = {2, 2, 2, 2, 0, 2, 2, 1, 2, 2, 3, 2, 2};
  static const int64_t dry_last_n[R] = {-1, -1, -1, -1, 30, -1, -1, 10, -1, -1, -1, -1, -1};
  static const float xtc_p[R] = {0, 1, 0, 0.5f, 0, 1, 0, 0, 1, 0, 0, 0, 0};
  static const float xtc_t[R] = {0.1f, 0.05f, 0.1f, 0.1f, 0.1f, 0.01f, 0.1f, 0.1f, 0, 0.1f,
                                 0.1f, 0.1f, 0.1f};
  const int32_t *bad[R], *breakers[R];
  uint64_t seed[R], stream[R], counter[R];
  int64_t hist_len[R], prompt_len[R], bias_len[R];
  float *rows[R];
  const int32_t *hist[R], *bias_ids[R];
  const float *bias_values[R];
  static int32_t history[40], bias_id[3];
  /* sequence lists (sample.h): bad words {h[39]} and {h[38], h[39]}; one breaker {h[35]} */
  static int32_t bad_word[9], breaker[5];
  static const float bias_value[3] = {5.0f, -3.0f, 2.5f};
  for (int i = 0; i < 40; i++) history[i] = (int32_t)((i % 13 * 7919) % n); /* repeats */
  bad_word[0] = 2, bad_word[1] = 3, bad_word[2] = 5, bad_word[3] = 1, bad_word[4] = history[39];
  bad_word[5] = 2, bad_word[6] = history[38], bad_word[7] = history[39];
  breaker[0] = 1, breaker[1] = 2, breaker[2] = 1, breaker[3] = history[35];
  for (int i = 0; i < 3; i++) bias_id[i] = (int32_t)((i * 104729 + 5) % n);
  const int64_t words = (n + 31) / 32;
  uint32_t *masks = xmalloc(sizeof(uint32_t) * (size_t)(2 * words));
  for (int64_t w = 0; w < 2 * words; w++) masks[w] = (uint32_t)(0x9e3779b9u * (uint32_t)(w + 1));
  float *work = xmalloc(sizeof(float) * (size_t)(R * n));
  memcpy(work, logits, sizeof(float) * (size_t)(R * n));
  for (int i = 0; i < R; i++) {
    rows[i] = work + (int64_t)i * n;
    seed[i] = 42 + (uint64_t)i;
    stream[i] = (uint64_t)(i % 2);
    counter[i] = 1000 + (uint64_t)i;
    hist[i] = i % 3 == 1 ? history : NULL;
    hist_len[i] = i % 3 == 1 ? 40 : 0;
    prompt_len[i] = i % 3 == 1 ? 25 : 0;
    bias_ids[i] = bias_id;
    bias_values[i] = bias_value;
    bias_len[i] = i % 4 == 2 ? 3 : 0;
    bad[i] = i % 3 == 1 ? bad_word : NULL;
    breakers[i] = i % 2 ? breaker : NULL;
  }
  int32_t *dry_scratch = xmalloc(slots * armllm_sample_dry_bytes(40));
  armllm_sample_batch b = {
      .rows = R, .n = n, .row = rows, .temperature = temperature, .top_p = top_p,
      .min_p = min_p, .repetition_penalty = rep, .presence_penalty = pres,
      .frequency_penalty = freq, .top_k = top_k, .num_logprobs = n_lp, .seed = seed,
      .stream = stream, .counter = counter, .history = hist, .history_len = hist_len,
      .prompt_len = prompt_len, .bias_ids = bias_ids, .bias_values = bias_values,
      .bias_len = bias_len, .masks = masks, .mask_ld = words, .mask_row = mask_row,
      .bad_words = bad, .dry_multiplier = dry_mult, .dry_base = dry_base,
      .dry_allowed_length = dry_allowed, .dry_last_n = dry_last_n, .dry_breakers = breakers,
      .xtc_probability = xtc_p, .xtc_threshold = xtc_t, .dry_scratch = dry_scratch,
      .dry_window = 40, .token = token, .logprob = logprob, .top_ids = top_ids,
      .top_logprobs = top_lp, .scratch = scratch, .slots = slots};
  armllm_sample_rows(t, pool, &b);
  free(dry_scratch);
  free(masks);
  free(work);
}

/* Whole batches with the variant's table against ref's: the same tokens,
 * logprobs and top lists, on 1 thread and on the pool; vocabularies from a
 * few tokens to 20000 (top-p's radix path). */
static void check_sample_rows(const armllm_kernels *v, armllm_pool *pool) {
  report r;
  report_start(&r, v->isa, "sample_rows");
  enum { R = SAMPLE_ROWS, TOP = ARMLLM_SAMPLE_MAX_LOGPROBS, SLOTS = 3 };
  static const int64_t vocab[] = {1, 17, 300, 2049, 20000};
  for (size_t k = 0; k < sizeof vocab / sizeof *vocab; k++) {
    const int64_t n = vocab[k];
    float *logits = xmalloc(sizeof(float) * (size_t)(R * n));
    for (int i = 0; i < R; i++) fill_logits(logits + (int64_t)i * n, n, i % 5 == 4);
    const size_t bytes = SLOTS * armllm_sample_rows_slot_bytes(n);
    void *scratch = xmalloc64(bytes), *scratch2 = xmalloc64(bytes);
    memset(scratch, 0, bytes); /* the kernel's marks start at 0 */
    memset(scratch2, 0, bytes);
    int32_t tok[2][R], ids[2][R * TOP];
    float lp[2][R], top_lp[2][R * TOP];
    for (int threads = 0; threads < 2; threads++) {
      sample_batch(&armllm_kernels_ref, NULL, logits, n, scratch2, SLOTS, tok[0], lp[0], ids[0],
                   top_lp[0]);
      sample_batch(v, threads ? pool : NULL, logits, n, scratch, SLOTS, tok[1], lp[1], ids[1],
                   top_lp[1]);
      if (!same_bits(tok[0], tok[1], sizeof tok[0]) || !same_bits(lp[0], lp[1], sizeof lp[0]) ||
          !same_bits(ids[0], ids[1], sizeof ids[0]) ||
          !same_bits(top_lp[0], top_lp[1], sizeof top_lp[0]))
        r.bad++;
      for (int i = 0; i < R; i++)
        if (tok[1][i] < 0 || tok[1][i] >= n) r.bad++;
      r.cases++;
    }
    free(logits);
    free(scratch);
    free(scratch2);
  }
  report_end(&r, impl_of(v, ARMLLM_K_sample_exp));
}

static void check_sample_kernels(const armllm_kernels *v, armllm_pool *pool) {
  const uint64_t saved = rng_state;
  check_sample_slots(v);
  check_sample_rows(v, pool);
  rng_state = saved;
}

/* --------------------------------------------------------------- pool */

static void check_pool(void) {
  report r;
  report_start(&r, "pool", "count");
  char err[256];
  static const int64_t grains[] = {1, 3, 64};
  for (int threads = 1; threads <= 4; threads++) {
    armllm_pool *pool = armllm_pool_create(threads, 0, err, sizeof err);
    if (!pool) { printf("pool create failed: %s\n", err); failures++; return; }
    for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
      for (int rep = 0; rep < 20; rep++) {
        int64_t n = 20000 + rep;
        uint32_t *counts = calloc((size_t)n, sizeof *counts);
        armllm_pool_count_items(pool, n, grains[g], counts);
        for (int64_t i = 0; i < n; i++)
          if (counts[i] != 1) { r.bad++; break; }
        free(counts);
        r.cases++;
      }
    armllm_pool_destroy(pool);
  }
  report_end(&r, armllm_pool_atomic_impl());
}

/* --------------------------------------------------------------- comm */

/* Rank r's value at element i of all-reduce k: a few distinct bits per rank. */
static float comm_value(int k, int r, int64_t i) {
  return (float)((i * 7 + k * 13 + r * 5) % 101) * 0.37f - 11.0f + (float)r * 1e-3f;
}

/* Rank 0's broadcast of 9,001 bytes (three slices) straight after an
 * all-reduce; the number of wrong bytes this rank received. */
static int comm_broadcast_errors(void *segment, int rank) {
  unsigned char b[9001];
  for (int i = 0; i < 9001; i++) b[i] = rank == 0 ? (unsigned char)(i * 7 % 251) : 0;
  armllm_comm_broadcast(segment, rank, b, sizeof b);
  int bad = 0;
  for (int i = 0; i < 9001; i++) bad += b[i] != (unsigned char)(i * 7 % 251);
  return bad;
}

/* A gather of column blocks of 5 + 3r columns from rank r onto rank 0, 300 rows (in
 * slices of whole rows: 1,000 floats hold 76 rows of the widest block); the number
 * of wrong values rank 0 holds afterwards (0 on the other ranks), or 1 if the call
 * failed. */
static int comm_gather_errors(void *segment, int rank, int ranks) {
  enum { ROWS = 300 };
  int64_t col_start[5] = {0};
  for (int q = 0; q < ranks; q++) col_start[q + 1] = col_start[q] + 5 + 3 * q;
  const int64_t total = col_start[ranks], ld = rank == 0 ? total : col_start[rank + 1] - col_start[rank];
  static float m[ROWS * 40]; /* the widest: rank 0 of 4 ranks, 38 columns */
  for (int64_t i = 0; i < ROWS; i++)
    for (int64_t j = 0; j < ld; j++)
      m[i * ld + j] = rank == 0 && j >= col_start[1] ? -1.0f : (float)(i * 1000 + col_start[rank] + j);
  if (armllm_comm_gather_cols(segment, rank, m, ROWS, ld, col_start)) return 1;
  int bad = 0;
  if (rank == 0)
    for (int64_t i = 0; i < ROWS; i++)
      for (int64_t j = 0; j < total; j++) bad += m[i * total + j] != (float)(i * 1000 + j);
  return bad;
}

/* After the last rank aborts the segment instead of joining an all-reduce, every
 * other rank's all-reduce returns -1, and so does the next one; 1 if not. */
static int comm_abort_errors(void *segment, int rank, int ranks) {
  float z[8] = {0};
  if (rank == ranks - 1) {
    usleep(20000); /* the others are waiting by now (spinning or asleep) */
    armllm_comm_abort(segment);
    return 0;
  }
  return armllm_comm_allreduce(segment, rank, z, 8) != -1 ||
         armllm_comm_allreduce(segment, rank, z, 8) != -1;
}

/* N processes (fork) sum arrays of several lengths, in slices of 1,000 floats, then
 * 2,000 small back-to-back all-reduces (a third of them staged), a broadcast, a
 * column gather and an abort;
 * every rank's result must equal the sum in rank order, bit for bit, and rank 0's
 * bytes; the abort must release every waiting rank with an error. */
/* One of the back-to-back all-reduces of 16 floats rank + i: every third one
 * written into the staging buffer first, as the layers do. */
static void comm_back_to_back(void *shared, int rank, int rep, float *y) {
  float *staging = rep % 3 == 1 ? armllm_comm_staging(shared, rank, 16) : NULL;
  float *src = staging ? staging : y;
  for (int i = 0; i < 16; i++) src[i] = (float)(rank + i);
  if (staging) armllm_comm_allreduce_staged(shared, rank, y, 16);
  else armllm_comm_allreduce(shared, rank, y, 16);
}

static void check_comm(void) {
  report r;
  report_start(&r, "comm", "allreduce");
  static const int64_t sizes[] = {1, 5, 999, 1000, 1001, 4321};
  enum { NSIZES = sizeof sizes / sizeof *sizes, MAXN = 4321, BACK_TO_BACK = 2000 };
  const int64_t max_floats = 1000;
  for (int ranks = 2; ranks <= 4; ranks++) {
    size_t seg_bytes = armllm_comm_segment_bytes(ranks, max_floats);
    size_t res_bytes = (size_t)ranks * NSIZES * MAXN * sizeof(float);
    char *shared = mmap(NULL, seg_bytes + res_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) { r.bad++; break; }
    armllm_comm_init(shared, ranks, max_floats);
    float *results = (float *)(shared + seg_bytes);
    pid_t kids[4];
    for (int rank = 1; rank < ranks; rank++) {
      kids[rank] = fork();
      if (kids[rank] == 0) { /* a child rank: its part, then exit */
        for (int k = 0; k < NSIZES; k++) {
          float *x = results + ((size_t)rank * NSIZES + k) * MAXN;
          for (int64_t i = 0; i < sizes[k]; i++) x[i] = comm_value(k, rank, i);
          armllm_comm_allreduce(shared, rank, x, sizes[k]);
        }
        float y[16];
        for (int rep = 0; rep < BACK_TO_BACK; rep++)
          comm_back_to_back(shared, rank, rep, y);
        int bad = comm_broadcast_errors(shared, rank) + comm_gather_errors(shared, rank, ranks);
        bad += comm_abort_errors(shared, rank, ranks);
        _exit(bad ? 1 : 0);
      }
    }
    for (int k = 0; k < NSIZES; k++) {
      float *x = results + (size_t)k * MAXN;
      for (int64_t i = 0; i < sizes[k]; i++) x[i] = comm_value(k, 0, i);
      armllm_comm_allreduce(shared, 0, x, sizes[k]);
    }
    float y[16];
    for (int rep = 0; rep < BACK_TO_BACK; rep++) {
      comm_back_to_back(shared, 0, rep, y);
      for (int i = 0; i < 16; i++) /* sum over ranks of (rank + i) */
        if (y[i] != (float)(ranks * i + ranks * (ranks - 1) / 2)) { r.bad++; break; }
    }
    r.bad += comm_broadcast_errors(shared, 0);
    r.bad += comm_gather_errors(shared, 0, ranks);
    r.bad += comm_abort_errors(shared, 0, ranks);
    for (int rank = 1; rank < ranks; rank++) {
      int st = 0;
      if (waitpid(kids[rank], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) r.bad++;
    }
    for (int k = 0; k < NSIZES; k++)
      for (int64_t i = 0; i < sizes[k]; i++) {
        float want = comm_value(k, 0, i);
        for (int q = 1; q < ranks; q++) want += comm_value(k, q, i);
        for (int q = 0; q < ranks; q++)
          if (memcmp(&results[((size_t)q * NSIZES + k) * MAXN + i], &want, sizeof want)) {
            r.bad++;
            break;
          }
      }
    r.cases += NSIZES + 3;
    munmap(shared, seg_bytes + res_bytes);
  }
  report_end(&r, armllm_comm_atomic_impl());
}

int main(int argc, char **argv) {
  const char *only[16];
  int n_only = 0, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--isa") && i + 1 < argc && n_only < 16) only[n_only++] = argv[++i];
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else { fprintf(stderr, "usage: %s [--isa NAME ...] [--quick]\n", argv[0]); return 2; }
  }
  const armllm_cpu *cpu = armllm_cpu_detect();
  printf("arch %s, features:", cpu->arch);
  for (int f = 0; f < ARMLLM_CPU_NUM_FEATURES; f++)
    if (armllm_cpu_has(cpu, f)) printf(" %s", armllm_cpu_feature_name(f));
  if (cpu->sve_vector_bits) printf(", SVE %d bits", cpu->sve_vector_bits);
  printf("; best variant %s; fetch-add %s\n", armllm_isa_best(cpu), armllm_pool_atomic_impl());
  printf("%-10s %-10s %-12s %6s  %9s  %s\n", "variant", "kernel", "impl", "cases", "err/tol", "result");

  check_pool();
  check_comm();
  char err[256];
  armllm_pool *pool = armllm_pool_create(3, 0, err, sizeof err);
  if (!pool) { printf("pool: %s\n", err); return 1; }
  for (const char *const *name = armllm_isa_built(); *name; name++) {
    int wanted = n_only == 0 && strcmp(*name, "ref") != 0;
    for (int i = 0; i < n_only; i++) wanted |= !strcmp(only[i], *name);
    if (!wanted) continue;
    const armllm_kernels *v = armllm_isa_table(*name, cpu, err, sizeof err);
    if (!v) {
      printf("%-10s skipped: %s\n", *name, err);
      continue;
    }
    check_gemm(v, pool, quick, 0);
    check_gemm(v, pool, quick, 1);
    check_gemm_threads(v, pool, 0);
    check_gemm_threads(v, pool, 1);
    check_gemm_blocks(v, pool, 0);
    check_gemm_blocks(v, pool, 1);
    check_rmsnorm(v, pool);
    check_rope(v, pool);
    check_silu_mul(v, pool);
    check_gelu_tanh_mul(v, pool);
    check_embed(v, pool);
    check_exp(v);
    check_kv_write(v, pool);
    check_attention(v, pool);
    check_attention_split(v, pool);
    check_quant_act(v, pool);
    check_rmsnorm_quant(v, pool);
    check_gemm_wq(v, pool, quick);
    check_gemm_gguf(v, pool, quick);
    check_gemm_cols(v);
    check_moe(v, pool, quick);
    check_gdn_conv(v, pool);
    check_gdn_rule(v, pool, quick);
    check_gated_rmsnorm(v, pool);
    check_sigmoid_mul(v, pool);
    check_whisper_kernels(v, pool);
    check_sample_kernels(v, pool);
  }
  armllm_pool_destroy(pool);
  printf("%s: %d failed\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
