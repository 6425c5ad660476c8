/* neon_mmla/table.c: the neon_mmla (Armv8.6 BF16/I8MM) variant's dispatch
 * table: gemm_bf16 runs on BFMMLA (gemm.c), attention with a bf16 cache too
 * (attn.c); every other kernel is the neon one, and gemm_f32 shares the neon
 * packed layout. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_neon_mmla = {
    .isa = "neon_mmla",
    .impl = {"neon", "neon_mmla", "neon", "neon", "neon", "neon", "neon", "neon", "neon_mmla", "neon", "neon_mmla"},
    .gemm_f32_layout = "nr12k1",
    .gemm_bf16_layout = "nr8k4x2",
    .attention_bf16_compute = "bf16",
    .gemm_bf16_compute = "bf16",
    .gemm_f32_packed_len = armllm_neon_gemm_f32_packed_len,
    .gemm_f32_pack = armllm_neon_gemm_f32_pack,
    .gemm_f32 = armllm_neon_gemm_f32,
    .gemm_bf16_packed_len = armllm_neon_mmla_gemm_bf16_packed_len,
    .gemm_bf16_pack = armllm_neon_mmla_gemm_bf16_pack,
    .gemm_bf16 = armllm_neon_mmla_gemm_bf16,
    .rmsnorm = armllm_neon_rmsnorm,
    .rope = armllm_neon_rope,
    .silu_mul = armllm_neon_silu_mul,
    .embed_f32 = armllm_neon_embed_f32,
    .embed_bf16 = armllm_neon_embed_bf16,
    .kv_write = armllm_neon_kv_write,
    .attention = armllm_neon_mmla_attention,
    .exp = armllm_neon_exp,
    .gemm_wq_layout = "mmla_n8k8",
    .quant_act = armllm_neon_quant_act,
    .gemm_wq_packed_len = armllm_neon_mmla_gemm_wq_packed_len,
    .gemm_wq_pack = armllm_neon_mmla_gemm_wq_pack,
    .gemm_wq = armllm_neon_mmla_gemm_wq,
};
