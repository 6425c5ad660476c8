/* sve/table.c: the sve variant's dispatch table. A kernel this variant does
 * not port points at a lower level (NEON code runs on every SVE CPU). */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_sve = {
    .isa = "sve",
    .gemm_f32_layout = "nr16k1",
    .gemm_bf16_layout = "sve_mmla_n16k4",
    .gemm_wq_layout = "mmla_n8k8", /* neon_mmla's layout: independent of the vector length */
    /* neon_mmla's GGUF-block GEMM: decode is memory-bound (NEON SDOT keeps
     * up), and SVE SMMLA has the NEON form's peak on every I8MM core (128-bit
     * SVE on Neoverse N2/V2; V1's 2 x 256-bit pipes equal its 4 x 128) */
    .gemm_gguf_layout = "gguf-arm-p4",
    .gemm_f32_panel = 16,
    .gemm_bf16_panel = 16,
    .gemm_wq_panel = 8,
    .gemm_gguf_panel = 4,
    .gemm_bf16_compute = "bf16",
    .attention_bf16_compute = "f32",
    ARMLLM_SLOT(gemm_f32_packed_len, sve),
    ARMLLM_SLOT(gemm_f32_pack, sve),
    ARMLLM_SLOT(gemm_f32, sve),
    ARMLLM_SLOT(gemm_f32_cols, sve),
    ARMLLM_SLOT(gemm_bf16_packed_len, sve),
    ARMLLM_SLOT(gemm_bf16_pack, sve),
    ARMLLM_SLOT(gemm_bf16, sve),
    ARMLLM_SLOT(gemm_bf16_cols, sve),
    ARMLLM_SLOT(rmsnorm, sve),
    ARMLLM_SLOT(rope, neon),
    ARMLLM_SLOT(silu_mul, sve),
    ARMLLM_SLOT(gelu_tanh_mul, sve),
    ARMLLM_SLOT(embed_f32, neon),
    ARMLLM_SLOT(embed_bf16, neon),
    ARMLLM_SLOT(exp, sve),
    ARMLLM_SLOT(kv_write, neon),  /* memory-bound: NEON stores suffice */
    ARMLLM_SLOT(attention, sve),
    ARMLLM_SLOT(quant_act, neon), /* memory-bound: NEON suffices */
    ARMLLM_SLOT(gemm_wq_packed_len, neon_mmla),
    ARMLLM_SLOT(gemm_wq_pack, neon_mmla),
    ARMLLM_SLOT(gemm_wq, sve),
    ARMLLM_SLOT(gemm_wq_cols, sve),
    ARMLLM_SLOT(gemm_gguf_packed_len, neon), /* one Arm layout: neon packs it */
    ARMLLM_SLOT(gemm_gguf_pack, neon),
    ARMLLM_SLOT(gemm_gguf, neon_mmla),
    ARMLLM_SLOT(gemm_gguf_cols, neon_mmla),
    ARMLLM_SLOT(gdn_conv, sve),
    ARMLLM_SLOT(gdn_rule, sve),
    ARMLLM_SLOT(gated_rmsnorm, sve),
    ARMLLM_SLOT(sigmoid_mul, sve),
    ARMLLM_SLOT(layernorm, sve),
    ARMLLM_SLOT(gelu, sve),
    ARMLLM_SLOT(sample_argmax, neon), /* memory-bound: NEON suffices */
    ARMLLM_SLOT(sample_find_above, neon),
    ARMLLM_SLOT(sample_exp, sve),
    ARMLLM_SLOT(sample_block_sums, neon), /* the 16-lane tree as NEON groups it */
    ARMLLM_SLOT(sample_collect, neon),
};
