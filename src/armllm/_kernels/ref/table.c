/* ref/table.c: the portable variant's dispatch table. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_ref = {
    .isa = "ref",
    .gemm_f32_layout = "nk",
    .gemm_bf16_layout = "nk",
    .gemm_wq_layout = "nk8",
    .gemm_bf16_compute = "f32",
    .attention_bf16_compute = "f32",
    ARMLLM_SLOT(gemm_f32_packed_len, ref),
    ARMLLM_SLOT(gemm_f32_pack, ref),
    ARMLLM_SLOT(gemm_f32, ref),
    ARMLLM_SLOT(gemm_bf16_packed_len, ref),
    ARMLLM_SLOT(gemm_bf16_pack, ref),
    ARMLLM_SLOT(gemm_bf16, ref),
    ARMLLM_SLOT(rmsnorm, ref),
    ARMLLM_SLOT(rope, ref),
    ARMLLM_SLOT(silu_mul, ref),
    ARMLLM_SLOT(embed_f32, ref),
    ARMLLM_SLOT(embed_bf16, ref),
    ARMLLM_SLOT(exp, ref),
    ARMLLM_SLOT(kv_write, ref),
    ARMLLM_SLOT(attention, ref),
    ARMLLM_SLOT(quant_act, ref),
    ARMLLM_SLOT(gemm_wq_packed_len, ref),
    ARMLLM_SLOT(gemm_wq_pack, ref),
    ARMLLM_SLOT(gemm_wq, ref),
};
