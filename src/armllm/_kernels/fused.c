/* fused.c: kernels composed from a table's own slots, so that every variant
 * gets them with its own vector code and ref's bits.
 *
 * rmsnorm_quant: RMSNorm (with the residual add) and the int8 quantization
 * of its output, one row block at a time in one pool job: the block's
 * normalized rows are still in L1/L2 when they are quantized, and the
 * caller makes one call instead of two (at decode, one row, that is most of
 * the saving: two kernel entries and their argument checks per layer).
 *
 * rope_kv_write (fused.h): RoPE on q and k and the KV write of the rotated k
 * and v, per row block in one pool job. */
#include "fused.h"

#include "armllm_kernels.h"
#include "family_jobs.h"

/* Rows a block: about 16 KB of normalized floats, so the block stays in L1
 * between the two passes. */
#define FUSED_BLOCK_FLOATS 4096

typedef struct {
  const armllm_kernels *kt;
  armllm_norm_job norm;   /* its out is quant's x */
  armllm_quant_job quant;
  int64_t group;
} norm_quant_job;

static void norm_quant_block(const norm_quant_job *j, int64_t r0, int64_t n) {
  const armllm_norm_job *nj = &j->norm;
  const armllm_quant_job *qj = &j->quant;
  j->kt->rmsnorm(NULL, nj->x + r0 * nj->ldx, nj->ldx,
                 nj->residual ? nj->residual + r0 * nj->ldr : NULL, nj->ldr, nj->weight, n, nj->d,
                 nj->eps, nj->out + r0 * nj->ldo, nj->ldo);
  j->kt->quant_act(NULL, qj->x + r0 * qj->ldx, n, qj->k, qj->ldx, j->group, qj->xq + r0 * qj->ldq,
                   qj->ldq, qj->scale + r0 * qj->ldsc, qj->ldsc,
                   qj->gsum ? qj->gsum + r0 * qj->ldgs : NULL, qj->ldgs,
                   qj->zp ? qj->zp + r0 * qj->ldzp : NULL, qj->ldzp);
}

static void norm_quant_rows(void *ctx, int64_t r0, int64_t r1) {
  const norm_quant_job *j = ctx;
  const int64_t d = j->norm.d, block = d < FUSED_BLOCK_FLOATS ? FUSED_BLOCK_FLOATS / d : 1;
  for (int64_t r = r0; r < r1; r += block) norm_quant_block(j, r, r1 - r < block ? r1 - r : block);
}

void armllm_rmsnorm_quant(const armllm_kernels *kt, armllm_pool *pool, const float *x,
                          int64_t ldx, float *residual, int64_t ldr, const float *weight,
                          int64_t t, int64_t d, float eps, float *out, int64_t ldo,
                          int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                          int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp) {
  norm_quant_job job = {kt,
                        {x, ldx, residual, ldr, weight, d, eps, out, ldo},
                        armllm_quant_job_of(out, d, ldo, group, xq, ldq, scale, ldsc, gsum, ldgs,
                                            zp, ldzp),
                        group};
  if (t * d < (1 << 16)) pool = NULL; /* a few rows: cheaper than waking workers */
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), norm_quant_rows, &job);
}

typedef struct {
  const armllm_kernels *kt;
  float *q, *k;
  const float *v;
  int64_t ldq, ldk, ldv, n_heads, n_kv_heads, head_dim, rot_dim;
  int style;
  const int32_t *positions, *slot_mapping;
  const float *cos_sin;
  int64_t max_pos;
  void *k_cache, *v_cache;
  int cache_dtype;
  uint16_t *k_scale, *v_scale;
  int64_t block_size, num_blocks;
} rope_kv_job;

static void rope_kv_rows(void *ctx, int64_t r0, int64_t r1) {
  const rope_kv_job *j = ctx;
  const int64_t n = r1 - r0;
  j->kt->rope(NULL, j->q + r0 * j->ldq, n, j->n_heads, j->head_dim, j->ldq, j->positions + r0,
              j->cos_sin, j->max_pos, j->rot_dim, j->style);
  j->kt->rope(NULL, j->k + r0 * j->ldk, n, j->n_kv_heads, j->head_dim, j->ldk,
              j->positions + r0, j->cos_sin, j->max_pos, j->rot_dim, j->style);
  j->kt->kv_write(NULL, j->k + r0 * j->ldk, j->ldk, j->v + r0 * j->ldv, j->ldv,
                  j->slot_mapping + r0, n, j->k_cache, j->v_cache, j->cache_dtype, j->k_scale,
                  j->v_scale, j->n_kv_heads, j->head_dim, j->block_size, j->num_blocks);
}

/* Elements a row block rotates and writes at least, so that a few rows (a decode)
 * stay on the calling thread. */
#define ROPE_KV_MIN_ELEMS (1 << 14)

int64_t armllm_rope_kv_write(const armllm_kernels *kt, armllm_pool *pool, float *q, int64_t ldq,
                             int64_t n_heads, float *k, int64_t ldk, const float *v, int64_t ldv,
                             int64_t n_kv_heads, int64_t head_dim, int64_t rot_dim, int style,
                             const int32_t *positions, const float *cos_sin, int64_t max_pos,
                             const int32_t *slot_mapping, int64_t t, void *k_cache, void *v_cache,
                             int cache_dtype, uint16_t *k_scale, uint16_t *v_scale,
                             int64_t block_size, int64_t num_blocks,
                             int *bad_slot) {
  int64_t bad = armllm_first_out_of_range(positions, t, max_pos);
  if (bad >= 0) {
    *bad_slot = 0;
    return bad;
  }
  const int64_t n_slots = num_blocks * block_size;
  for (int64_t i = 0; i < t; i++)
    if (slot_mapping[i] < -1 || slot_mapping[i] >= n_slots) {
      *bad_slot = 1;
      return i;
    }
  rope_kv_job job = {kt, q, k, v, ldq, ldk, ldv, n_heads, n_kv_heads, head_dim, rot_dim, style,
                     positions, slot_mapping, cos_sin, max_pos, k_cache, v_cache, cache_dtype,
                     k_scale, v_scale, block_size, num_blocks};
  const int64_t per_row = (n_heads + 2 * n_kv_heads) * head_dim;
  const int64_t min_rows = (ROPE_KV_MIN_ELEMS + per_row - 1) / per_row;
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, min_rows), rope_kv_rows, &job);
  return -1;
}
