/* amx/table.c: the amx variant's dispatch table (x86-64 with AMX-TILE,
 * AMX-BF16 and AMX-INT8 on top of everything avx512 needs: Sapphire Rapids
 * and later, with Linux granting tile data). Its layouts are avx512's, so
 * packing is avx512's and packed weights are interchangeable; the slots AMX
 * does not speed up run the avx512 code, and `impl` says so. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_amx = {
    .isa = "amx",
    .gemm_f32_layout = "nr16k1",
    .gemm_bf16_layout = "nr16k2",
    .gemm_wq_layout = "nr16k4g",
    .gemm_gguf_layout = "gguf-nr16c256",
    .gemm_bf16_compute = "bf16",
    .attention_bf16_compute = "bf16",
    ARMLLM_SLOT(gemm_f32_packed_len, avx2),
    ARMLLM_SLOT(gemm_f32_pack, avx2),
    ARMLLM_SLOT(gemm_f32, avx512),
    ARMLLM_SLOT(gemm_bf16_packed_len, avx512),
    ARMLLM_SLOT(gemm_bf16_pack, avx512),
    ARMLLM_SLOT(gemm_bf16, amx),
    ARMLLM_SLOT(rmsnorm, avx512),
    ARMLLM_SLOT(rope, avx512),
    ARMLLM_SLOT(silu_mul, avx512),
    ARMLLM_SLOT(gelu_tanh_mul, avx512),
    ARMLLM_SLOT(embed_f32, avx2),
    ARMLLM_SLOT(embed_bf16, avx512),
    ARMLLM_SLOT(exp, avx512),
    ARMLLM_SLOT(kv_write, avx512),
    ARMLLM_SLOT(attention, amx), /* bf16 caches, head_dim % 32 == 0; else avx512's */
    ARMLLM_SLOT(quant_act, avx512),
    ARMLLM_SLOT(gemm_wq_packed_len, avx512),
    ARMLLM_SLOT(gemm_wq_pack, avx512),
    ARMLLM_SLOT(gemm_wq, amx),
    ARMLLM_SLOT(gemm_gguf_packed_len, avx512),
    ARMLLM_SLOT(gemm_gguf_pack, avx512),
    ARMLLM_SLOT(gemm_gguf, avx512),
    ARMLLM_SLOT(gdn_conv, avx512),
    ARMLLM_SLOT(gdn_rule, avx512),
    ARMLLM_SLOT(gated_rmsnorm, avx512),
    ARMLLM_SLOT(sigmoid_mul, avx512),
    ARMLLM_SLOT(layernorm, avx512),
    ARMLLM_SLOT(gelu, avx512),
    ARMLLM_SLOT(sample_argmax, avx512),
    ARMLLM_SLOT(sample_find_above, avx512),
    ARMLLM_SLOT(sample_exp, avx512),
    ARMLLM_SLOT(sample_block_sums, avx512),
    ARMLLM_SLOT(sample_collect, avx512),
};
