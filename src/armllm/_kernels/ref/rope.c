/* ref/rope.c: portable rotary position embedding (neox and gpt-j pairing). */
#include "../armllm_kernels.h"
#include "../family_jobs.h"

static void ref_rope_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_rope_job *job = ctx;
  const int64_t half = job->rot_dim / 2;
  for (int64_t t = t0; t < t1; t++) {
    const float *cs = job->cos_sin + (int64_t)job->positions[t] * job->rot_dim;
    for (int64_t h = 0; h < job->n_heads; h++) {
      float *v = job->x + t * job->ldx + h * job->head_dim;
      for (int64_t i = 0; i < half; i++) {
        int64_t ia = job->style == ARMLLM_ROPE_NEOX ? i : 2 * i;
        int64_t ib = job->style == ARMLLM_ROPE_NEOX ? i + half : 2 * i + 1;
        float a = v[ia], b = v[ib], c = cs[i], s = cs[half + i];
        v[ia] = a * c - b * s;
        v[ib] = b * c + a * s;
      }
    }
  }
}

int64_t armllm_ref_rope(armllm_pool *pool, float *x, int64_t t, int64_t n_heads,
                        int64_t head_dim, int64_t ldx, const int32_t *positions,
                        const float *cos_sin, int64_t max_pos, int64_t rot_dim, int style) {
  int64_t bad = armllm_first_out_of_range(positions, t, max_pos);
  if (bad >= 0) return bad;
  armllm_rope_job job = {x, n_heads, head_dim, ldx, positions, cos_sin, rot_dim, style};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), ref_rope_rows, &job);
  return -1;
}
