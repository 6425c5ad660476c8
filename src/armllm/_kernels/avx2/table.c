/* avx2/table.c: the avx2 variant's dispatch table (x86-64, AVX2 + FMA + F16C).
 * Every kernel is ported; see gemm.c for the packed layouts
 * "nr16k1" (f32) and "nr16k1u" (bf16), quant.c for "nr8k4g" (w8/w4). */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_avx2 = {
    .isa = "avx2",
    .gemm_f32_layout = "nr16k1",
    .gemm_bf16_layout = "nr16k1u",
    .gemm_wq_layout = "nr8k4g",
    .gemm_gguf_layout = "gguf-nr8c256",
    .gemm_bf16_compute = "f32",
    .attention_bf16_compute = "f32",
    ARMLLM_SLOT(gemm_f32_packed_len, avx2),
    ARMLLM_SLOT(gemm_f32_pack, avx2),
    ARMLLM_SLOT(gemm_f32, avx2),
    ARMLLM_SLOT(gemm_bf16_packed_len, avx2),
    ARMLLM_SLOT(gemm_bf16_pack, avx2),
    ARMLLM_SLOT(gemm_bf16, avx2),
    ARMLLM_SLOT(rmsnorm, avx2),
    ARMLLM_SLOT(rope, avx2),
    ARMLLM_SLOT(silu_mul, avx2),
    ARMLLM_SLOT(gelu_tanh_mul, avx2),
    ARMLLM_SLOT(embed_f32, avx2),
    ARMLLM_SLOT(embed_bf16, avx2),
    ARMLLM_SLOT(exp, avx2),
    ARMLLM_SLOT(kv_write, avx2),
    ARMLLM_SLOT(attention, avx2),
    ARMLLM_SLOT(quant_act, avx2),
    ARMLLM_SLOT(gemm_wq_packed_len, avx2),
    ARMLLM_SLOT(gemm_wq_pack, avx2),
    ARMLLM_SLOT(gemm_wq, avx2),
    ARMLLM_SLOT(gemm_gguf_packed_len, avx2),
    ARMLLM_SLOT(gemm_gguf_pack, avx2),
    ARMLLM_SLOT(gemm_gguf, avx2),
};
