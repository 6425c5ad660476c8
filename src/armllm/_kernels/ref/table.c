/* ref/table.c: the portable variant's dispatch table. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_ref = {
    .isa = "ref",
    .impl = {"ref", "ref", "ref", "ref", "ref", "ref", "ref", "ref", "ref"},
    .gemm_f32_layout = "nk",
    .gemm_bf16_layout = "nk",
    .attention_bf16_compute = "f32",
    .gemm_bf16_compute = "f32",
    .gemm_f32_packed_len = armllm_ref_gemm_f32_packed_len,
    .gemm_f32_pack = armllm_ref_gemm_f32_pack,
    .gemm_f32 = armllm_ref_gemm_f32,
    .gemm_bf16_packed_len = armllm_ref_gemm_bf16_packed_len,
    .gemm_bf16_pack = armllm_ref_gemm_bf16_pack,
    .gemm_bf16 = armllm_ref_gemm_bf16,
    .rmsnorm = armllm_ref_rmsnorm,
    .rope = armllm_ref_rope,
    .silu_mul = armllm_ref_silu_mul,
    .embed_f32 = armllm_ref_embed_f32,
    .embed_bf16 = armllm_ref_embed_bf16,
    .kv_write = armllm_ref_kv_write,
    .attention = armllm_ref_attention,
    .exp = armllm_ref_exp,
};
