"""gpt_oss: GPT-OSS. Attention with q/k/v/o biases, a sink logit per head in
each softmax's denominator and a 128-token window in the layers layer_types
calls "sliding_attention" (by default every other one, from layer 0), YaRN
RoPE; a sparse MLP in every layer whose router and experts carry biases and
whose activation is the clamped SwiGLU (up + 1) * g * sigmoid(alpha * g),
g = min(gate, limit), up in [-limit, limit]; the router's top-k logits are
softmaxed (the same weights as renormalizing the top-k of their softmax).

The safetensors checkpoint stacks each layer's experts (gate_up_proj with
gate and up rows interleaved, MXFP4 or bf16): model/stacked_experts.py hands
them out under per-expert names. GGUF: llama.cpp's "gpt-oss"."""
from __future__ import annotations

from typing import Any

from armllm.model.arch.base import SparseArchitecture, TensorRef
from armllm.model.config import ModelConfig, gguf_key

# llama.cpp's GPT-OSS graph (openai-moe.cpp) hard-codes the SwiGLU constants
SWIGLU = (1.702, 7.0)


class GptOss(SparseArchitecture):
    name = "gpt_oss"
    hf_architectures = {"GptOssForCausalLM": "GptOssForCausalLM"}
    gguf_architectures = ("gpt-oss",)
    expert_names = ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
                    "mlp.experts.{e}.down_proj.weight")
    router_name = "mlp.router.weight"

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        fields = self.hf_fields(cfg, arch)
        layers = fields["num_layers"]
        fields["attention_bias"] = bool(cfg.get("attention_bias", True))
        window, types = cfg.get("sliding_window"), cfg.get("layer_types")
        sliding: dict[str, Any] = {}
        if window:
            if types is not None and len(types) != layers:
                raise ValueError(f"config: layer_types has {len(types)} entries for "
                                 f"{layers} layers")
            sliding = {"sliding_window": int(window), "sliding_layers": tuple(
                range(0, layers, 2) if types is None
                else (i for i, t in enumerate(types) if t == "sliding_attention"))}
        return ModelConfig(
            **fields, **sliding, moe_layers=tuple(range(layers)),
            num_experts=int(cfg["num_local_experts"]),
            experts_per_token=int(cfg["num_experts_per_tok"]),
            moe_intermediate_size=int(cfg["intermediate_size"]), norm_topk_prob=True,
            o_bias=fields["attention_bias"], attention_sinks=True, moe_bias=True,
            clamped_swiglu=(float(cfg.get("swiglu_alpha", SWIGLU[0])),
                            float(cfg.get("swiglu_limit", SWIGLU[1]))))

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        fields = self.gguf_fields(meta, gguf_arch, source)
        layers = fields["num_layers"]
        fields["attention_bias"] = True
        # llama.cpp's sliding layers: swa pattern 2, the even ones
        return ModelConfig(
            **fields, **self.gguf_moe_fields(meta, gguf_arch, source, layers),
            o_bias=True, attention_sinks=True, moe_bias=True, clamped_swiglu=SWIGLU,
            sliding_window=int(gguf_key(meta, gguf_arch, "attention.sliding_window", source)),
            sliding_layers=tuple(range(0, layers, 2)))

    def gguf_layer_names(self) -> dict[str, str]:
        return {**super().gguf_layer_names(),
                "post_attention_layernorm.weight": "post_attention_norm.weight",
                "self_attn.sinks": "attn_sinks.weight",
                "mlp.router.bias": "ffn_gate_inp.bias",
                "mlp.experts.down_proj_bias": "ffn_down_exps.bias"}

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        if name.endswith(".mlp.experts.gate_up_proj_bias"):
            # [E, 2 inter], gate and up columns interleaved as in the checkpoint
            blk = "blk." + name.split(".")[2]
            return TensorRef(f"{blk}.ffn_gate_exps.bias", interleave=f"{blk}.ffn_up_exps.bias")
        return super().gguf_tensor(c, name)


ARCHITECTURE = GptOss()
