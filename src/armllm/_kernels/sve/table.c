/* sve/table.c: the sve variant's dispatch table. A kernel this variant does
 * not port points at a lower level (neon) or ref and says so in impl. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_sve = {
    .isa = "sve",
    /* gemm_f32, gemm_bf16, rmsnorm, rope, silu_mul, embed, exp, kv_write, attention,
       quant_act, gemm_wq */
    .impl = {"sve", "sve", "sve", "neon", "sve", "neon", "sve", "neon", "sve", "neon", "sve"},
    .gemm_f32_layout = "nr16k1",
    .gemm_bf16_layout = "sve_mmla_n16k4",
    .attention_bf16_compute = "f32",
    .gemm_bf16_compute = "bf16",
    .gemm_f32_packed_len = armllm_sve_gemm_f32_packed_len,
    .gemm_f32_pack = armllm_sve_gemm_f32_pack,
    .gemm_f32 = armllm_sve_gemm_f32,
    .gemm_bf16_packed_len = armllm_sve_gemm_bf16_packed_len,
    .gemm_bf16_pack = armllm_sve_gemm_bf16_pack,
    .gemm_bf16 = armllm_sve_gemm_bf16,
    .rmsnorm = armllm_sve_rmsnorm,
    .rope = armllm_neon_rope, /* NEON code runs on every SVE CPU */
    .silu_mul = armllm_sve_silu_mul,
    .embed_f32 = armllm_neon_embed_f32,
    .embed_bf16 = armllm_neon_embed_bf16,
    .kv_write = armllm_neon_kv_write, /* memory-bound: NEON stores suffice */
    .attention = armllm_sve_attention,
    .exp = armllm_sve_exp,
    .gemm_wq_layout = "mmla_n8k8", /* neon_mmla's layout: independent of the vector length */
    .quant_act = armllm_neon_quant_act, /* memory-bound: NEON suffices */
    .gemm_wq_packed_len = armllm_neon_mmla_gemm_wq_packed_len,
    .gemm_wq_pack = armllm_neon_mmla_gemm_wq_pack,
    .gemm_wq = armllm_sve_gemm_wq,
};
