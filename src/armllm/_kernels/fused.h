/* fused.h: kernels fused.c composes from a table's own slots (beside
 * armllm_rmsnorm_quant, declared in armllm_kernels.h), kept out of the slot
 * ABI: every variant gets them, with its own vector code and ref's bits. */
#ifndef ARMLLM_FUSED_H
#define ARMLLM_FUSED_H

#include "armllm_kernels.h"

/* RoPE on q and k, then the KV write of k and v, one row block at a time in one
 * pool job: exactly rope(q), rope(k) and kv_write (armllm_kernels.h) with the
 * same arguments (neox or gpt-j style, rot_dim <= head_dim), while each block's
 * rows are in L1, and the KV write spread over the threads with the rotations.
 * Checks every position and slot first: returns -1, or the first bad row with
 * *bad_slot 0 (its position is outside [0, max_pos)) or 1 (its slot is outside
 * [-1, num_blocks*block_size)); then nothing was modified. */
int64_t armllm_rope_kv_write(const armllm_kernels *kt, armllm_pool *pool, float *q, int64_t ldq,
                             int64_t n_heads, float *k, int64_t ldk, const float *v, int64_t ldv,
                             int64_t n_kv_heads, int64_t head_dim, int64_t rot_dim, int style,
                             const int32_t *positions, const float *cos_sin, int64_t max_pos,
                             const int32_t *slot_mapping, int64_t t, void *k_cache, void *v_cache,
                             int cache_dtype, uint16_t *k_scale, uint16_t *v_scale,
                             int64_t block_size, int64_t num_blocks,
                             int *bad_slot);

#endif /* ARMLLM_FUSED_H */
