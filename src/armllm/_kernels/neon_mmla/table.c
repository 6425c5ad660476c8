/* neon_mmla/table.c: the neon_mmla (Armv8.6 BF16/I8MM) variant's dispatch
 * table: gemm_bf16 runs on BFMMLA (gemm.c), attention with a bf16 cache too
 * (attn.c), gemm_wq and gemm_gguf's prefill on SMMLA (quant_gemm.c, gguf.c);
 * every other kernel is the neon one,
 * and gemm_f32 shares the neon packed layout. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_neon_mmla = {
    .isa = "neon_mmla",
    .gemm_f32_layout = "nr12k1",
    .gemm_bf16_layout = "nr8k4x2",
    .gemm_wq_layout = "mmla_n8k8",
    .gemm_gguf_layout = "gguf-arm-p4",
    .gemm_bf16_compute = "bf16",
    .attention_bf16_compute = "bf16",
    ARMLLM_SLOT(gemm_f32_packed_len, neon),
    ARMLLM_SLOT(gemm_f32_pack, neon),
    ARMLLM_SLOT(gemm_f32, neon),
    ARMLLM_SLOT(gemm_bf16_packed_len, neon_mmla),
    ARMLLM_SLOT(gemm_bf16_pack, neon_mmla),
    ARMLLM_SLOT(gemm_bf16, neon_mmla),
    ARMLLM_SLOT(rmsnorm, neon),
    ARMLLM_SLOT(rope, neon),
    ARMLLM_SLOT(silu_mul, neon),
    ARMLLM_SLOT(gelu_tanh_mul, neon),
    ARMLLM_SLOT(embed_f32, neon),
    ARMLLM_SLOT(embed_bf16, neon),
    ARMLLM_SLOT(exp, neon),
    ARMLLM_SLOT(kv_write, neon),
    ARMLLM_SLOT(attention, neon_mmla),
    ARMLLM_SLOT(quant_act, neon),
    ARMLLM_SLOT(gemm_wq_packed_len, neon_mmla),
    ARMLLM_SLOT(gemm_wq_pack, neon_mmla),
    ARMLLM_SLOT(gemm_wq, neon_mmla),
    ARMLLM_SLOT(gemm_gguf_packed_len, neon), /* one Arm layout: neon packs it */
    ARMLLM_SLOT(gemm_gguf_pack, neon),
    ARMLLM_SLOT(gemm_gguf, neon_mmla),
    ARMLLM_SLOT(gdn_conv, neon),
    ARMLLM_SLOT(gdn_rule, neon),
    ARMLLM_SLOT(gated_rmsnorm, neon),
    ARMLLM_SLOT(sigmoid_mul, neon),
    ARMLLM_SLOT(layernorm, neon),
    ARMLLM_SLOT(gelu, neon),
    ARMLLM_SLOT(sample_argmax, neon),
    ARMLLM_SLOT(sample_find_above, neon),
    ARMLLM_SLOT(sample_exp, neon),
    ARMLLM_SLOT(sample_block_sums, neon),
    ARMLLM_SLOT(sample_collect, neon),
};
