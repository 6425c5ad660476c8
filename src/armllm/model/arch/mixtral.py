"""mixtral: Mixtral, Llama's layer with a sparse MLP in every layer (top-2 of 8
experts, their softmax weights renormalized) and Mistral's sliding window.

GGUF: llama.cpp writes it as "llama" with llama.expert_count, Q/K rows permuted
for its RoPE (undone at load)."""
from __future__ import annotations

from typing import Any

from armllm.model.arch.base import (
    SparseArchitecture,
    TensorRef,
    gguf_sliding_fields,
    sliding_fields,
)
from armllm.model.config import ModelConfig


class Mixtral(SparseArchitecture):
    name = "mixtral"
    hf_architectures = {"MixtralForCausalLM": "MixtralForCausalLM"}
    gguf_architectures = ("llama",)   # with llama.expert_count (without: llama.py's)
    expert_names = ("block_sparse_moe.experts.{e}.w1.weight",
                    "block_sparse_moe.experts.{e}.w3.weight",
                    "block_sparse_moe.experts.{e}.w2.weight")
    router_name = "block_sparse_moe.gate.weight"

    def runs_gguf(self, meta: dict[str, Any]) -> bool:
        return bool(meta.get("llama.expert_count"))

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        fields = self.hf_fields(cfg, arch)
        layers = fields["num_layers"]
        return ModelConfig(**fields, **sliding_fields(cfg, layers),
                           moe_layers=tuple(range(layers)),
                           num_experts=int(cfg["num_local_experts"]),
                           experts_per_token=int(cfg["num_experts_per_tok"]),
                           moe_intermediate_size=int(cfg["intermediate_size"]),
                           norm_topk_prob=True)

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        fields = self.gguf_fields(meta, gguf_arch, source)
        fields.update(gguf_sliding_fields(meta, gguf_arch, fields["num_layers"]))
        return ModelConfig(**fields, **self.gguf_moe_fields(meta, gguf_arch, source,
                                                             fields["num_layers"]))

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        ref = super().gguf_tensor(c, name)
        if not name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            return ref
        # llama.cpp's "llama" files carry its RoPE permutation of Q/K rows
        heads = c.num_heads if name.endswith("q_proj.weight") else c.num_kv_heads
        return TensorRef(ref.name, rope_heads=heads)


ARCHITECTURE = Mixtral()
