/* fused.c: kernels composed from a table's own slots, so that every variant
 * gets them with its own vector code and ref's bits.
 *
 * rmsnorm_quant: RMSNorm (with the residual add) and the int8 quantization
 * of its output, one row block at a time in one pool job: the block's
 * normalized rows are still in L1/L2 when they are quantized, and the
 * caller makes one call instead of two (at decode, one row, that is most of
 * the saving: two kernel entries and their argument checks per layer). */
#include "armllm_kernels.h"

/* Rows a block: about 16 KB of normalized floats, so the block stays in L1
 * between the two passes. */
#define FUSED_BLOCK_FLOATS 4096

typedef struct {
  const armllm_kernels *kt;
  const float *x;
  int64_t ldx;
  float *residual;
  int64_t ldr;
  const float *weight;
  int64_t d;
  float eps;
  float *out;
  int64_t ldo, group;
  int8_t *xq;
  int64_t ldq;
  float *scale;
  int64_t ldsc;
  int32_t *gsum;
  int64_t ldgs;
  int32_t *zp;
  int64_t ldzp;
} norm_quant_job;

static void norm_quant_block(const norm_quant_job *j, int64_t r0, int64_t n) {
  j->kt->rmsnorm(NULL, j->x + r0 * j->ldx, j->ldx, j->residual ? j->residual + r0 * j->ldr : NULL,
                 j->ldr, j->weight, n, j->d, j->eps, j->out + r0 * j->ldo, j->ldo);
  j->kt->quant_act(NULL, j->out + r0 * j->ldo, n, j->d, j->ldo, j->group, j->xq + r0 * j->ldq,
                   j->ldq, j->scale + r0 * j->ldsc, j->ldsc,
                   j->gsum ? j->gsum + r0 * j->ldgs : NULL, j->ldgs,
                   j->zp ? j->zp + r0 * j->ldzp : NULL, j->ldzp);
}

static void norm_quant_rows(void *ctx, int64_t r0, int64_t r1) {
  const norm_quant_job *j = ctx;
  const int64_t block = j->d < FUSED_BLOCK_FLOATS ? FUSED_BLOCK_FLOATS / j->d : 1;
  for (int64_t r = r0; r < r1; r += block) norm_quant_block(j, r, r1 - r < block ? r1 - r : block);
}

void armllm_rmsnorm_quant(const armllm_kernels *kt, armllm_pool *pool, const float *x,
                          int64_t ldx, float *residual, int64_t ldr, const float *weight,
                          int64_t t, int64_t d, float eps, float *out, int64_t ldo,
                          int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                          int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp) {
  norm_quant_job job = {kt, x, ldx, residual, ldr, weight, d, eps, out, ldo, group,
                        xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp};
  if (t * d < (1 << 16)) pool = NULL; /* a few rows: cheaper than waking workers */
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), norm_quant_rows, &job);
}
