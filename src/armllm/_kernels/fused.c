/* fused.c: kernels composed from a table's own slots, so that every variant
 * gets them with its own vector code and ref's bits.
 *
 * rmsnorm_quant: RMSNorm (with the residual add) and the int8 quantization
 * of its output, one row block at a time in one pool job: the block's
 * normalized rows are still in L1/L2 when they are quantized, and the
 * caller makes one call instead of two (at decode, one row, that is most of
 * the saving: two kernel entries and their argument checks per layer). */
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
