/* family_jobs.h: the pool-task arguments of the element-wise kernel families
 * (norm, rope, act, embed, activation quantization), the same for every ISA,
 * the range checks those kernels run before they touch anything, the rope
 * driver every variant runs around its head rotations, and the row loops
 * and pool splits the x86 variants run around their per-row vector code. */
#ifndef ARMLLM_FAMILY_JOBS_H
#define ARMLLM_FAMILY_JOBS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "armllm_kernels.h"
#include "pool.h"

typedef struct {
  const float *x;
  int64_t ldx;
  float *residual; /* NULL: no fused residual add */
  int64_t ldr;
  const float *weight;
  int64_t d;
  float eps;
  float *out;
  int64_t ldo;
} armllm_norm_job;

/* quant_act's arguments (armllm_kernels.h), K's padding and groups worked
 * out (armllm_quant_job_of). */
typedef struct {
  const float *x;
  int64_t k, ldx, kpad, gl, ng; /* gl: group length, ng: groups a row */
  int8_t *xq;
  int64_t ldq;
  float *scale;
  int64_t ldsc;
  int32_t *gsum; /* NULL: no sums */
  int64_t ldgs;
  int32_t *zp; /* NULL: symmetric */
  int64_t ldzp;
} armllm_quant_job;

static inline armllm_quant_job armllm_quant_job_of(const float *x, int64_t k, int64_t ldx,
                                                   int64_t group, int8_t *xq, int64_t ldq,
                                                   float *scale, int64_t ldsc, int32_t *gsum,
                                                   int64_t ldgs, int32_t *zp, int64_t ldzp) {
  const armllm_quant_job job = {x,    k,    ldx,  armllm_q_kpad(k), armllm_q_group_len(group),
                                armllm_q_groups(k, group), xq, ldq, scale, ldsc, gsum, ldgs, zp,
                                ldzp};
  return job;
}

typedef struct {
  float *x;
  int64_t n_heads, head_dim, ldx;
  const int32_t *positions;
  const float *cos_sin;
  int64_t rot_dim;
  int style;
} armllm_rope_job;

typedef struct {
  const float *x;
  int64_t ldx;
  const float *weight, *bias; /* bias NULL: none */
  int64_t d;
  float eps;
  float *out;
  int64_t ldo;
} armllm_layernorm_job;

/* gelu's chunks: elements [c * ARMLLM_GELU_CHUNK, ...) of x into y */
typedef struct {
  const float *x;
  float *y;
  int64_t n;
} armllm_gelu_job;

typedef struct {
  const float *gate_up;
  int64_t ldg, inter;
  float *out;
  int64_t ldo;
} armllm_act_job;

typedef struct {
  const int32_t *ids;
  const void *table; /* float or uint16_t (bf16) rows of d */
  int64_t d;
  float *out;
  int64_t ldo;
} armllm_embed_job;

/* The first i with v[i] outside [0, limit), or -1. */
static inline int64_t armllm_first_out_of_range(const int32_t *v, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++)
    if (v[i] < 0 || v[i] >= limit) return i;
  return -1;
}

/* Runs task over rows [0, t) of job on the pool, a row at least per chunk;
 * a call of fewer than serial_elems elements (t x row_elems) stays on the
 * calling thread: waking workers would cost more than the work. */
static inline void armllm_rows_run(armllm_pool *pool, int64_t t, int64_t row_elems,
                                   int64_t serial_elems, armllm_task_fn task, void *job) {
  if (t * row_elems < serial_elems) pool = NULL;
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), task, job);
}

/* GELU with the tanh approximation (gelu_pytorch_tanh: Gemma's GeGLU) as
 * g * sigmoid(2 w), w = sqrt(2/pi) (g + 0.044715 g^3), since 0.5 (1 + tanh(w)) =
 * 1 / (1 + exp(-2 w)): the SiLU kernels' exp and division, in every variant in
 * the same order (c = g * g * CUBIC; z = fmaf(c, g, g) * TWO_K; g / (1 + exp(-z)) * u). */
#define ARMLLM_GELU_CUBIC 0.044715f
#define ARMLLM_GELU_TWO_K 1.5957691216057308f /* 2 sqrt(2 / pi) */

/* Exact GELU's erfc in the vector variants (armllm_kernels.h): erfc(z) =
 * t exp(-z^2 + u R(u)), t = 1 / (1 + z/2) in (0, 1] for every z >= 0 and
 * u = 1 - t = (z/2) t (a product: exact to an ulp near z = 0, where 1 - t
 * would cancel). R of degree 9 is fitted (minimax by Lawson's iteration in
 * float64 against mpmath) so that u R(u) = log(erfc(z)) + z^2 - log(t) over
 * z in [0, 11.5] within 9e-9: the relative error of erfc. Evaluated by Horner
 * from R9 down with FMAs, times u; the exponent as fma(-z, z, u R). x is
 * clamped to [-CLAMP, CLAMP] first: there erfc(z) is 0 in float, so y = x
 * (x > 0) or -0, and +-inf stay finite inside (y = +inf, -0). */
#define ARMLLM_GELU_CLAMP 16.0f
#define ARMLLM_GELU_R0 -1.2567596435546875f
#define ARMLLM_GELU_R1 -0.30317744612693787f
#define ARMLLM_GELU_R2 0.1605149805545807f
#define ARMLLM_GELU_R3 0.19978134334087372f
#define ARMLLM_GELU_R4 0.03350330516695976f
#define ARMLLM_GELU_R5 -0.03709593042731285f
#define ARMLLM_GELU_R6 -0.003897859016433358f
#define ARMLLM_GELU_R7 -0.3159443140029907f
#define ARMLLM_GELU_R8 0.38417279720306396f
#define ARMLLM_GELU_R9 -0.12665514647960663f
#define ARMLLM_SQRT1_2 0.70710678118654752f /* 1 / sqrt(2) */
/* elements a pool chunk of gelu holds (a few microseconds of work), and the
 * fewest that wake the workers */
#define ARMLLM_GELU_CHUNK 4096
#define ARMLLM_GELU_SERIAL 32768

/* A variant's GELU of n elements of x into y (y may be x). */
typedef void (*armllm_gelu_span_fn)(const float *x, float *y, int64_t n);

/* Chunks [c0, c1) of a gelu job, each with span. */
static inline __attribute__((always_inline)) void armllm_gelu_chunks(const armllm_gelu_job *job,
                                                                     int64_t c0, int64_t c1,
                                                                     armllm_gelu_span_fn span) {
  const int64_t i0 = c0 * ARMLLM_GELU_CHUNK;
  const int64_t i1 = c1 * ARMLLM_GELU_CHUNK < job->n ? c1 * ARMLLM_GELU_CHUNK : job->n;
  span(job->x + i0, job->y + i0, i1 - i0);
}

/* Runs task over the chunks of n elements, on the calling thread below
 * ARMLLM_GELU_SERIAL elements. */
static inline void armllm_gelu_run(armllm_pool *pool, const float *x, float *y, int64_t n,
                                   armllm_task_fn task) {
  armllm_gelu_job job = {x, y, n};
  const int64_t chunks = (n + ARMLLM_GELU_CHUNK - 1) / ARMLLM_GELU_CHUNK;
  if (n < ARMLLM_GELU_SERIAL) pool = NULL;
  armllm_pool_run(pool, chunks, armllm_pool_grain(pool, chunks, 2, 1), task, &job);
}

/* A variant's SiLU(g) * u of one row of inter elements into out (out may be
 * g: it must load each block before it stores it). */
typedef void (*armllm_act_row_fn)(const float *g, const float *u, float *out, int64_t inter);

/* Rows [t0, t1) of an act job, each with row. */
static inline __attribute__((always_inline)) void armllm_act_rows(const armllm_act_job *job,
                                                                       int64_t t0, int64_t t1,
                                                                       armllm_act_row_fn row) {
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate_up + t * job->ldg;
    row(g, g + job->inter, job->out + t * job->ldo, job->inter);
  }
}

/* A variant's bf16 row widening: d elements of src to f32 at out. */
typedef void (*armllm_widen_row_fn)(const uint16_t *src, float *out, int64_t d);

/* Rows [t0, t1) of a bf16 embed job, each widened with widen. */
static inline __attribute__((always_inline)) void armllm_embed_bf16_rows(
    const armllm_embed_job *job, int64_t t0, int64_t t1, armllm_widen_row_fn widen) {
  const uint16_t *table = job->table;
  for (int64_t i = t0; i < t1; i++)
    widen(table + (int64_t)job->ids[i] * job->d, job->out + i * job->ldo, job->d);
}

/* An embed kernel: ids checked against vocab first (the first bad index
 * returned, else -1), then task over the rows, on the calling thread below
 * serial_elems elements (armllm_rows_run). */
static inline int64_t armllm_embed_run(armllm_pool *pool, const int32_t *ids, int64_t t,
                                       const void *table, int64_t vocab, int64_t d, float *out,
                                       int64_t ldo, int64_t serial_elems, armllm_task_fn task) {
  const int64_t bad = armllm_first_out_of_range(ids, t, vocab);
  if (bad >= 0) return bad;
  armllm_embed_job job = {ids, table, d, out, ldo};
  armllm_rows_run(pool, t, d, serial_elems, task, &job);
  return -1;
}

/* x[k0, kx)'s range with 0 in it, *lo <= 0 <= *hi, in ref's order: a NaN
 * wins every max and min (the walk vector forms fall back to on a NaN). */
static inline void armllm_q_range(const float *x, int64_t k0, int64_t kx, float *lo, float *hi) {
  float l = 0.0f, h = 0.0f;
  for (int64_t i = k0; i < kx; i++) {
    h = (x[i] > h || x[i] != x[i]) ? x[i] : h;
    l = (x[i] < l || x[i] != x[i]) ? x[i] : l;
  }
  *lo = l;
  *hi = h;
}

/* An asymmetric group's scale s = (hi - lo) / 254 (returned) and zero
 * point *z = round(-127 - lo / s) from its range (armllm_kernels.h); z is 0
 * when s is 0 or not finite: the group quantizes to zeros. */
static inline float armllm_q_asym_scale(float lo, float hi, int32_t *z) {
  const float s = (hi - lo) / 254.0f;
  *z = s != 0.0f && isfinite(s) ? (int32_t)nearbyintf(-127.0f - lo / s) : 0;
  return s;
}

/* Stores an asymmetric group's scale and zero point (its gsum, if any, 0)
 * from its range and returns 1; or, when it quantizes to zeros, also writes
 * its bytes q[k0, k1) and returns 0. */
static inline int armllm_q_asym_group(float lo, float hi, int8_t *q, int64_t k0, int64_t k1,
                                      float *scale, int32_t *zp, int32_t *gs) {
  const float s = armllm_q_asym_scale(lo, hi, zp);
  *scale = s;
  if (gs) *gs = 0;
  if (s != 0.0f && isfinite(s)) return 1;
  memset(q + k0, 0, (size_t)(k1 - k0));
  return 0;
}

/* A variant's rotation of one head v: pairs (v[i], v[half + i]) (neox) or
 * (v[2i], v[2i + 1]) (gpt-j), i < half, by cos cs[i] and sin cs[half + i]. */
typedef void (*armllm_rope_head_fn)(float *v, const float *cs, int64_t half);

/* Rows [t0, t1) of a rope job, head by head, in the job's style. */
static inline __attribute__((always_inline)) void armllm_rope_rows(const armllm_rope_job *job,
                                                                   int64_t t0, int64_t t1,
                                                                   armllm_rope_head_fn neox,
                                                                   armllm_rope_head_fn gptj) {
  const int64_t half = job->rot_dim / 2;
  for (int64_t t = t0; t < t1; t++) {
    const float *cs = job->cos_sin + (int64_t)job->positions[t] * job->rot_dim;
    float *row = job->x + t * job->ldx;
    if (job->style == ARMLLM_ROPE_NEOX)
      for (int64_t h = 0; h < job->n_heads; h++) neox(row + h * job->head_dim, cs, half);
    else
      for (int64_t h = 0; h < job->n_heads; h++) gptj(row + h * job->head_dim, cs, half);
  }
}

/* Defines `name`, a rope kernel (armllm_kernels.h) rotating each head with
 * `neox` or `gptj` (armllm_rope_head_fn): positions checked first; each
 * thread's chunk rotates at least min_elems elements (below that the call
 * stays on the calling thread). */
#define ARMLLM_ROPE_KERNEL(name, neox, gptj, min_elems)                                          \
  static void name##_rows(void *ctx, int64_t t0, int64_t t1) {                                  \
    armllm_rope_rows(ctx, t0, t1, neox, gptj);                                                  \
  }                                                                                             \
  int64_t name(armllm_pool *pool, float *x, int64_t t, int64_t n_heads, int64_t head_dim,       \
               int64_t ldx, const int32_t *positions, const float *cos_sin, int64_t max_pos,    \
               int64_t rot_dim, int style) {                                                    \
    const int64_t bad = armllm_first_out_of_range(positions, t, max_pos);                       \
    if (bad >= 0) return bad;                                                                   \
    if (rot_dim < 2) return -1;                                                                 \
    armllm_rope_job job = {x, n_heads, head_dim, ldx, positions, cos_sin, rot_dim, style};      \
    const int64_t per_row = n_heads * rot_dim + 1;                                              \
    const int64_t min_rows = ((min_elems) + per_row - 1) / per_row;                             \
    armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, min_rows), name##_rows, &job);       \
    return -1;                                                                                  \
  }

#endif /* ARMLLM_FAMILY_JOBS_H */
