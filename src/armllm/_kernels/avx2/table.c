/* avx2/table.c: the avx2 variant's dispatch table (x86-64, AVX2 + FMA + F16C).
 * Every kernel is ported; see gemm.c for the packed layouts
 * "nr16k1" (f32) and "nr16k1u" (bf16), quant.c for "nr8k4g" (w8/w4). */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_avx2 = {
    .isa = "avx2",
    .impl = {"avx2", "avx2", "avx2", "avx2", "avx2", "avx2", "avx2", "avx2", "avx2", "avx2",
             "avx2"},
    .gemm_f32_layout = "nr16k1",
    .gemm_bf16_layout = "nr16k1u",
    .attention_bf16_compute = "f32",
    .gemm_bf16_compute = "f32",
    .gemm_f32_packed_len = armllm_avx2_gemm_f32_packed_len,
    .gemm_f32_pack = armllm_avx2_gemm_f32_pack,
    .gemm_f32 = armllm_avx2_gemm_f32,
    .gemm_bf16_packed_len = armllm_avx2_gemm_bf16_packed_len,
    .gemm_bf16_pack = armllm_avx2_gemm_bf16_pack,
    .gemm_bf16 = armllm_avx2_gemm_bf16,
    .rmsnorm = armllm_avx2_rmsnorm,
    .rope = armllm_avx2_rope,
    .silu_mul = armllm_avx2_silu_mul,
    .embed_f32 = armllm_avx2_embed_f32,
    .embed_bf16 = armllm_avx2_embed_bf16,
    .kv_write = armllm_avx2_kv_write,
    .attention = armllm_avx2_attention,
    .exp = armllm_avx2_exp,
    .gemm_wq_layout = "nr8k4g",
    .quant_act = armllm_avx2_quant_act,
    .gemm_wq_packed_len = armllm_avx2_gemm_wq_packed_len,
    .gemm_wq_pack = armllm_avx2_gemm_wq_pack,
    .gemm_wq = armllm_avx2_gemm_wq,
};
