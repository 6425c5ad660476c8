"""qwen3_moe: Qwen3-MoE, Qwen3's attention (per-head q/k RMSNorm) over sparse
MLPs: layer i is sparse unless listed in mlp_only_layers or (i + 1) %
decoder_sparse_step (transformers' rule); its top-k weights renormalized when
norm_topk_prob. GGUF: llama.cpp's "qwen3moe" (every layer sparse)."""
from __future__ import annotations

from typing import Any

from armllm.model.arch.base import SparseArchitecture
from armllm.model.config import ModelConfig


class Qwen3Moe(SparseArchitecture):
    name = "qwen3_moe"
    hf_architectures = {"Qwen3MoeForCausalLM": "Qwen3MoeForCausalLM"}
    gguf_architectures = ("qwen3moe",)
    expert_names = ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
                    "mlp.experts.{e}.down_proj.weight")
    router_name = "mlp.gate.weight"

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        fields = self.hf_fields(cfg, arch)
        layers = fields["num_layers"]
        # the Hub's config.json says num_experts, transformers 5 writes num_local_experts
        experts = int(cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"])
        step = int(cfg.get("decoder_sparse_step", 1))
        dense = {int(i) for i in cfg.get("mlp_only_layers") or ()}
        return ModelConfig(
            **fields, qk_norm=True,
            moe_layers=tuple(i for i in range(layers) if experts > 0 and step > 0
                             and i not in dense and (i + 1) % step == 0),
            num_experts=experts, experts_per_token=int(cfg["num_experts_per_tok"]),
            moe_intermediate_size=int(cfg["moe_intermediate_size"]),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        fields = self.gguf_fields(meta, gguf_arch, source)
        return ModelConfig(**fields, qk_norm=True, **self.gguf_moe_fields(
            meta, gguf_arch, source, fields["num_layers"]))


ARCHITECTURE = Qwen3Moe()
