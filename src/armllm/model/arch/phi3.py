"""phi3: Phi-3, Phi-3.5 and Phi-4 (Phi3ForCausalLM). Llama's layer over fused
tensors: qkv_proj holds q, k and v's rows, gate_up_proj gate's then up's (the
loader reads them as the parts Llama names, so sharding splits them alike);
RoPE over the first partial_rotary_factor of each head (Phi-4-mini: 0.75),
LongRoPE (short and long factors per frequency; the long ones when the engine's
context exceeds original_max_position_embeddings, as llama.cpp chooses them)
and a sliding window in every layer where the config sets one (Phi-3-mini-4k).

GGUF: llama.cpp's "phi3" (attn_qkv, ffn_up holding gate and up, the factors as
rope_factors_long/short tensors)."""
from __future__ import annotations

from collections.abc import Container
from typing import Any

from armllm.model.arch.base import (
    GGUF_LAYER_NAMES,
    Architecture,
    TensorRef,
    gguf_sliding_fields,
    sliding_fields,
)
from armllm.model.config import ModelConfig

# the fused tensor each Llama-named part is stored in, under "model.layers.{i}."
FUSED = {"self_attn.q_proj.weight": "self_attn.qkv_proj.weight",
         "self_attn.k_proj.weight": "self_attn.qkv_proj.weight",
         "self_attn.v_proj.weight": "self_attn.qkv_proj.weight",
         "mlp.gate_proj.weight": "mlp.gate_up_proj.weight",
         "mlp.up_proj.weight": "mlp.gate_up_proj.weight"}
GGUF_FUSED = {"self_attn.qkv_proj.weight": "attn_qkv.weight",
              "mlp.gate_up_proj.weight": "ffn_up.weight"}


class Phi3(Architecture):
    name = "phi3"
    hf_architectures = {"Phi3ForCausalLM": "Phi3ForCausalLM",
                        "Phi3ForSequenceClassification": "Phi3ForCausalLM"}   # a reranker
    gguf_architectures = ("phi3",)

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        fields = self.hf_fields(cfg, arch)
        scaling = fields["rope_scaling"]
        if scaling is not None:
            scaling = dict(scaling)
            kind = scaling.get("rope_type") or scaling.get("type")
            if kind in ("su", "longrope"):   # "su": LongRoPE's first name
                scaling["rope_type"] = "longrope"
            scaling.setdefault("original_max_position_embeddings",
                               int(cfg.get("original_max_position_embeddings")
                                   or fields["max_position_embeddings"]))
            scaling.setdefault("max_position_embeddings", fields["max_position_embeddings"])
        fields["rope_scaling"] = scaling
        return ModelConfig(**fields, **sliding_fields(cfg, fields["num_layers"]))

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        # the LongRoPE factors are tensors: the loader reads them (model/loader.py)
        fields = self.gguf_fields(meta, gguf_arch, source)
        fields.update(gguf_sliding_fields(meta, gguf_arch, fields["num_layers"]))
        return ModelConfig(**fields)

    def _part(self, c: ModelConfig, rest: str) -> tuple[str, tuple[int, int]] | None:
        """The fused tensor and row range of a Llama-named part, or None."""
        if rest not in FUSED:
            return None
        q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
        rows = {"self_attn.q_proj.weight": (0, q), "self_attn.k_proj.weight": (q, kv),
                "self_attn.v_proj.weight": (q + kv, kv), "mlp.gate_proj.weight": (0, inter),
                "mlp.up_proj.weight": (inter, inter)}[rest]
        return FUSED[rest], rows

    def hf_tensor(self, c: ModelConfig, name: str, stored: Container[str] = ()) -> TensorRef:
        parts = name.split(".", 3)
        part = self._part(c, parts[3]) if len(parts) == 4 and parts[1] == "layers" else None
        if part is None:
            return TensorRef(name)
        return TensorRef(f"model.layers.{parts[2]}.{part[0]}", rows=part[1])

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        parts = name.split(".", 3)
        part = self._part(c, parts[3]) if len(parts) == 4 and parts[1] == "layers" else None
        if part is None:
            return super().gguf_tensor(c, name)
        return TensorRef(f"blk.{parts[2]}.{GGUF_FUSED[part[0]]}", rows=part[1])

    def gguf_layer_names(self) -> dict[str, str]:
        return GGUF_LAYER_NAMES


ARCHITECTURE = Phi3()
