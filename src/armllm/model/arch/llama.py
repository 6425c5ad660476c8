"""llama: the Llama layer as Llama, Mistral, Qwen2, Qwen3 and SmolLM run it (and
their bare decoders, e.g. Qwen3-Embedding, gte-Qwen2, e5-mistral, served as
embedding models): pre-norm attention (q/k/v biases: Qwen2; per-head q/k
RMSNorm: Qwen3; a sliding window in every layer: Mistral), then a SwiGLU MLP.

GGUF: llama.cpp's "llama" (Llama, Mistral, SmolLM: Q/K rows permuted for its
RoPE, undone at load; with llama.expert_count it is Mixtral:
model/arch/mixtral.py's), "qwen2" and "qwen3" (Hugging Face's rows)."""
from __future__ import annotations

from typing import Any

from armllm.model.arch.base import Architecture, TensorRef, gguf_sliding_fields, sliding_fields
from armllm.model.config import ModelConfig


class Llama(Architecture):
    name = "llama"
    hf_architectures = {
        "LlamaForCausalLM": "LlamaForCausalLM", "MistralForCausalLM": "MistralForCausalLM",
        "Qwen2ForCausalLM": "Qwen2ForCausalLM", "Qwen3ForCausalLM": "Qwen3ForCausalLM",
        "LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
        "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM",
        # cross-encoders and rerankers: the decoder under a one-label score head
        "LlamaForSequenceClassification": "LlamaForCausalLM",
        "MistralForSequenceClassification": "MistralForCausalLM",
        "Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
        "Qwen3ForSequenceClassification": "Qwen3ForCausalLM"}
    gguf_architectures = ("llama", "qwen2", "qwen3")
    MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                   "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
    PERMUTED_ROPE = ("LlamaForCausalLM",)   # what a "llama" GGUF runs as
    # the HF architecture each GGUF architecture runs as
    GGUF_AS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        fields = self.hf_fields(cfg, arch)
        name = fields["architecture"]
        fields["attention_bias"] = bool(cfg.get("attention_bias", name == "Qwen2ForCausalLM"))
        fields["qk_norm"] = name == "Qwen3ForCausalLM"
        if name == "MistralForCausalLM":
            fields.update(sliding_fields(cfg, fields["num_layers"]))
        return ModelConfig(**fields)

    def runs_gguf(self, meta: dict[str, Any]) -> bool:
        return not meta.get("llama.expert_count")   # else Mixtral's

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        fields = self.gguf_fields(meta, gguf_arch, source)
        fields["architecture"] = self.GGUF_AS[gguf_arch]
        # llama.cpp's qwen2 graph adds q/k/v biases; the loader finds them by name
        fields["attention_bias"] = gguf_arch == "qwen2"
        fields["qk_norm"] = gguf_arch == "qwen3"
        fields.update(gguf_sliding_fields(meta, gguf_arch, fields["num_layers"]))
        return ModelConfig(**fields)

    def export_config(self, c: ModelConfig, dtype: str) -> dict[str, Any]:
        if c.rope_scaling:
            raise ValueError(f"{c.architecture}: armllm writes no config.json for its "
                             f"RoPE scaling {c.rope_scaling.get('rope_type')!r}")
        window = {"sliding_window": c.sliding_window} if c.sliding_layers else {}
        return {
            "architectures": [c.architecture], "model_type": self.MODEL_TYPES[c.architecture],
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "max_position_embeddings": c.max_position_embeddings,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "rope_scaling": None,
            "tie_word_embeddings": c.tie_word_embeddings, "attention_bias": c.attention_bias,
            "mlp_bias": False, "hidden_act": "silu", "bos_token_id": c.bos_token_id,
            "eos_token_id": c.eos_token_ids[0] if len(c.eos_token_ids) == 1
            else list(c.eos_token_ids),
            "torch_dtype": dtype, **window,
        }

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        ref = super().gguf_tensor(c, name)
        if c.architecture not in self.PERMUTED_ROPE or not name.endswith(
                ("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            return ref
        # llama.cpp's converter permutes a "llama" file's Q/K rows for its RoPE
        heads = c.num_heads if name.endswith("q_proj.weight") else c.num_kv_heads
        return TensorRef(ref.name, rope_heads=heads)


ARCHITECTURE = Llama()
