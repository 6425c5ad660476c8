"""gemma3: Gemma 3's text model (Gemma3ForCausalLM, and the language model
inside Gemma3ForConditionalGeneration checkpoints).

Its layer: the input RMSNorm, attention with per-head q/k RMSNorm and scores
scaled by query_pre_attn_scalar ** -0.5, a post-attention RMSNorm on the
attention's output before the residual add, then a pre-MLP RMSNorm, a GeGLU
MLP (gelu with the tanh approximation) and a post-MLP RMSNorm. Every norm
multiplies by (1 + w): the loader adds the 1 to a safetensors checkpoint's
weights (llama.cpp's converter already did in a GGUF). The embeddings are
scaled by sqrt(hidden), rounded to the checkpoint's dtype as transformers
does. Local (sliding-window) layers and global layers interleave (five local,
then one global, unless layer_types says otherwise); the global layers use
rope_theta and its scaling (linear 8x in the 4B-27B models), the local ones
their own base (10000) unscaled.

GGUF: llama.cpp's "gemma3"."""
from __future__ import annotations

import math
from collections.abc import Container
from typing import Any

import numpy as np

from armllm.model.arch.base import GGUF_LAYER_NAMES, Architecture, TensorRef
from armllm.model.config import ModelConfig, gguf_key
from armllm.model.layer import (
    Act,
    Attention,
    Linear,
    Norm,
    NormLinear,
    QKNorm,
    RopeKV,
    Step,
)

# Gemma3TextConfig's defaults: the Hub's configs (a ConditionalGeneration's text_config
# above all) leave these out
TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                 "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                 "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
                 "query_pre_attn_scalar": 256, "sliding_window": 4096,
                 "tie_word_embeddings": True}
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0
SLIDING_PATTERN = 6    # five local layers, then a global one
NORMS = {"input_norm": "input_layernorm.weight",
         "post_attn_norm": "post_attention_layernorm.weight",
         "pre_mlp_norm": "pre_feedforward_layernorm.weight",
         "post_mlp_norm": "post_feedforward_layernorm.weight"}
GGUF_NAMES = {**GGUF_LAYER_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
              "pre_feedforward_layernorm.weight": "ffn_norm.weight",
              "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
# the language model's prefix in a ConditionalGeneration checkpoint, as transformers 5
# writes it and as the Hub's first Gemma 3 uploads have it
MULTIMODAL_PREFIXES = ("model.language_model.", "language_model.model.")


def _dtype_round(value: float, dtype: str | None) -> float:
    """value as the checkpoint's dtype holds it (transformers casts embed_scale so)."""
    if dtype == "bfloat16":
        bits = np.array([value], np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000   # round to nearest even
        return float(bits.view(np.float32)[0])
    if dtype == "float16":
        return float(np.float16(value))
    return float(np.float32(value))


class Gemma3(Architecture):
    name = "gemma3"
    hf_architectures = {"Gemma3ForCausalLM": "Gemma3ForCausalLM",
                        "Gemma3ForConditionalGeneration": "Gemma3ForConditionalGeneration",
                        # a reranker: the text decoder under a one-label score head
                        "Gemma3TextForSequenceClassification": "Gemma3ForCausalLM"}
    gguf_architectures = ("gemma3",)
    norms = NORMS

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        text = cfg.get("text_config") or {} if arch.endswith("ConditionalGeneration") else cfg
        text = {**TEXT_DEFAULTS, **{k: v for k, v in text.items() if v is not None}}
        for key in ("eos_token_id", "bos_token_id", "torch_dtype", "dtype"):
            text.setdefault(key, cfg.get(key))
        if text.get("attn_logit_softcapping") is not None:
            raise ValueError("config: attn_logit_softcapping is set; armllm's attention has "
                             "no score soft-capping (Gemma 2's)")
        fields = self.hf_fields(text, arch)
        layers = fields["num_layers"]
        types = text.get("layer_types") or [
            "sliding_attention" if (i + 1) % int(text.get("sliding_window_pattern",
                                                          SLIDING_PATTERN))
            else "full_attention" for i in range(layers)]
        if len(types) != layers:
            raise ValueError(f"config: layer_types has {len(types)} entries for {layers} layers")
        rope = text.get("rope_parameters") or {}
        full, local = rope.get("full_attention", {}), rope.get("sliding_attention", {})
        scaling = text.get("rope_scaling") or (
            full if full.get("rope_type", "default") != "default" else None)
        dtype = text.get("dtype") or text.get("torch_dtype")
        fields.update(
            tie_word_embeddings=fields["has_lm_head"] and bool(text["tie_word_embeddings"]),
            qk_norm=True,
            rope_theta=float(full.get("rope_theta") or text.get("rope_theta") or GLOBAL_THETA),
            rope_scaling=scaling,
            local_rope_theta=float(local.get("rope_theta") or text.get("rope_local_base_freq")
                                   or LOCAL_THETA),
            sliding_window=int(text["sliding_window"]),
            sliding_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
            attn_scale=float(text["query_pre_attn_scalar"]) ** -0.5,
            embed_scale=_dtype_round(math.sqrt(fields["hidden_size"]), dtype),
            final_logit_softcap=float(text.get("final_logit_softcapping") or 0.0))
        return ModelConfig(**fields)

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        fields = self.gguf_fields(meta, gguf_arch, source)
        layers = fields["num_layers"]
        window = int(meta.get(f"{gguf_arch}.attention.sliding_window") or 0)
        pattern = meta.get(f"{gguf_arch}.attention.sliding_window_pattern", SLIDING_PATTERN)
        if isinstance(pattern, list):   # one flag a layer
            sliding = tuple(i for i, swa in enumerate(pattern) if swa)
        else:   # llama.cpp's set_swa_pattern: the last of every n layers is global
            sliding = tuple(i for i in range(layers) if (i + 1) % int(pattern))
        if not window:
            sliding = ()
        # llama.cpp scales 27B's queries by (hidden / heads) ** -0.5, the others' by
        # head_dim ** -0.5 (gemma3.cpp; the converter stores no query_pre_attn_scalar)
        heads = fields["num_heads"]
        scalar = fields["hidden_size"] // heads if layers == 62 else fields["head_dim"]
        fields.update(
            qk_norm=True, sliding_window=window, sliding_layers=sliding,
            local_rope_theta=float(meta.get(f"{gguf_arch}.rope.freq_base_swa") or LOCAL_THETA),
            attn_scale=scalar ** -0.5, embed_scale=math.sqrt(fields["hidden_size"]),
            final_logit_softcap=float(meta.get(f"{gguf_arch}.final_logit_softcapping") or 0.0),
            rms_norm_eps=float(gguf_key(meta, gguf_arch, "attention.layer_norm_rms_epsilon",
                                        source)))
        return ModelConfig(**fields)

    def layer(self, c: ModelConfig, i: int) -> tuple[Step, ...]:
        local = bool(c.window(i))
        return (NormLinear("input_norm", "qkv"), QKNorm(),
                RopeKV("local" if local else "global"),
                Attention(window=c.window(i), scale=c.attn_scale), Linear("o"),
                Norm("post_attn_norm"), NormLinear("pre_mlp_norm", "gate_up"),
                Act("gelu_tanh"), Linear("down"), Norm("post_mlp_norm"))

    def hf_tensor(self, c: ModelConfig, name: str, stored: Container[str] = ()) -> TensorRef:
        if c.architecture.endswith("ConditionalGeneration") and name.startswith("model."):
            for prefix in MULTIMODAL_PREFIXES:
                if prefix + name[len("model."):] in stored:
                    name = prefix + name[len("model."):]
                    break
        # Gemma3RMSNorm multiplies by (1 + w)
        return TensorRef(name, add=1.0 if name.endswith("norm.weight") else 0.0)

    def gguf_layer_names(self) -> dict[str, str]:
        return GGUF_NAMES


ARCHITECTURE = Gemma3()
