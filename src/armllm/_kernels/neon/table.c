/* neon/table.c: the neon (Armv8.0 NEON) variant's dispatch table. Every
 * kernel is ported; layouts are described in gemm.c, quant.c and
 * gguf_arm.h. gemm_wq and gemm_gguf choose SDOT or SMULL at run time
 * (armllm_neon_sdot in cpu.c), which `impl` shows as neon+dotprod or neon. */
#include "../armllm_kernels.h"

const armllm_kernels armllm_kernels_neon = {
    .isa = "neon",
    .gemm_f32_layout = "nr12k1",
    .gemm_bf16_layout = "nr12k1",
    .gemm_wq_layout = "sdot_n8k4",
    .gemm_gguf_layout = "gguf-arm-p4",
    .gemm_bf16_compute = "f32",
    .attention_bf16_compute = "f32",
    ARMLLM_SLOT(gemm_f32_packed_len, neon),
    ARMLLM_SLOT(gemm_f32_pack, neon),
    ARMLLM_SLOT(gemm_f32, neon),
    ARMLLM_SLOT(gemm_bf16_packed_len, neon),
    ARMLLM_SLOT(gemm_bf16_pack, neon),
    ARMLLM_SLOT(gemm_bf16, neon),
    ARMLLM_SLOT(rmsnorm, neon),
    ARMLLM_SLOT(rope, neon),
    ARMLLM_SLOT(silu_mul, neon),
    ARMLLM_SLOT(gelu_tanh_mul, neon),
    ARMLLM_SLOT(embed_f32, neon),
    ARMLLM_SLOT(embed_bf16, neon),
    ARMLLM_SLOT(exp, neon),
    ARMLLM_SLOT(kv_write, neon),
    ARMLLM_SLOT(attention, neon),
    ARMLLM_SLOT(quant_act, neon),
    ARMLLM_SLOT(gemm_wq_packed_len, neon),
    ARMLLM_SLOT(gemm_wq_pack, neon),
    ARMLLM_SLOT(gemm_wq, neon),
    ARMLLM_SLOT(gemm_gguf_packed_len, neon),
    ARMLLM_SLOT(gemm_gguf_pack, neon),
    ARMLLM_SLOT(gemm_gguf, neon),
    ARMLLM_SLOT(gdn_conv, neon),
    ARMLLM_SLOT(gdn_rule, neon),
    ARMLLM_SLOT(gated_rmsnorm, neon),
    ARMLLM_SLOT(sigmoid_mul, neon),
    ARMLLM_SLOT(layernorm, neon),
    ARMLLM_SLOT(gelu, neon),
};
