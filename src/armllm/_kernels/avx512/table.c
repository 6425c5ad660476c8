/* avx512/table.c: the avx512 variant's dispatch table (x86-64 with
 * AVX-512 F/BW/VL/DQ, AVX512_VNNI and AVX512_BF16: Zen 4, Sapphire Rapids and
 * later). Slots it does not port run the avx2 code (every avx512 CPU runs
 * AVX2), and `impl` says so. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_avx512 = {
    .isa = "avx512",
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
    ARMLLM_SLOT(gemm_bf16, avx512),
    ARMLLM_SLOT(rmsnorm, avx512),
    ARMLLM_SLOT(rope, avx512),
    ARMLLM_SLOT(silu_mul, avx512),
    ARMLLM_SLOT(gelu_tanh_mul, avx512),
    ARMLLM_SLOT(embed_f32, avx2), /* a row memcpy either way: no avx512 code to win */
    ARMLLM_SLOT(embed_bf16, avx512),
    ARMLLM_SLOT(exp, avx512),
    ARMLLM_SLOT(kv_write, avx512),
    ARMLLM_SLOT(attention, avx512),
    ARMLLM_SLOT(quant_act, avx512),
    ARMLLM_SLOT(gemm_wq_packed_len, avx512),
    ARMLLM_SLOT(gemm_wq_pack, avx512),
    ARMLLM_SLOT(gemm_wq, avx512),
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
