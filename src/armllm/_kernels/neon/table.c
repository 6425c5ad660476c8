/* neon/table.c: the neon (Armv8.0 NEON) variant's dispatch table. Every
 * kernel is ported; layouts are described in gemm.c. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_neon = {
    .isa = "neon",
    .impl = {"neon", "neon", "neon", "neon", "neon", "neon", "neon", "neon", "neon", "neon", "neon"},
    .gemm_f32_layout = "nr12k1",
    .gemm_bf16_layout = "nr12k1",
    .attention_bf16_compute = "f32",
    .gemm_bf16_compute = "f32",
    .gemm_f32_packed_len = armllm_neon_gemm_f32_packed_len,
    .gemm_f32_pack = armllm_neon_gemm_f32_pack,
    .gemm_f32 = armllm_neon_gemm_f32,
    .gemm_bf16_packed_len = armllm_neon_gemm_bf16_packed_len,
    .gemm_bf16_pack = armllm_neon_gemm_bf16_pack,
    .gemm_bf16 = armllm_neon_gemm_bf16,
    .rmsnorm = armllm_neon_rmsnorm,
    .rope = armllm_neon_rope,
    .silu_mul = armllm_neon_silu_mul,
    .embed_f32 = armllm_neon_embed_f32,
    .embed_bf16 = armllm_neon_embed_bf16,
    .kv_write = armllm_neon_kv_write,
    .attention = armllm_neon_attention,
    .exp = armllm_neon_exp,
    .gemm_wq_layout = "sdot_n8k4",
    .quant_act = armllm_neon_quant_act,
    .gemm_wq_packed_len = armllm_neon_gemm_wq_packed_len,
    .gemm_wq_pack = armllm_neon_gemm_wq_pack,
    .gemm_wq = armllm_neon_gemm_wq,
};
