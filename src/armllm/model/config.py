"""config: the architecture hyper-parameters armllm needs, from a Hugging Face
config.json or from GGUF metadata, validated where they enter."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CAUSAL_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                        "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
                        "GptOssForCausalLM")
# the bare decoders (no lm_head) that embedding checkpoints declare, e.g. Qwen3-Embedding,
# gte-Qwen2, e5-mistral: run as their causal kin, serving embeddings only
BASE_ARCHITECTURES = {"LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
                      "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM"}
SUPPORTED_ARCHITECTURES = CAUSAL_ARCHITECTURES + tuple(BASE_ARCHITECTURES)
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool          # q/k/v projections carry a bias (Qwen2, GPT-OSS)
    qk_norm: bool                 # RMSNorm on each q/k head before RoPE (Qwen3)
    sliding_window: int           # tokens a sliding layer attends (0: none)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # mixture of experts (Mixtral, Qwen3-MoE): the layers whose MLP is sparse, each a
    # router over num_experts experts of moe_intermediate_size, experts_per_token of
    # them run per token, their softmax weights renormalized to sum 1 if norm_topk_prob
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    # the layers that attend only their last sliding_window tokens (Mistral, Mixtral: all;
    # GPT-OSS: every other one); the others attend the whole context
    sliding_layers: tuple[int, ...] = ()
    # GPT-OSS: o_proj and the router and experts carry biases, each attention head a sink
    # logit in its softmax denominator, and the experts' activation is the clamped
    # SwiGLU (up + 1) * g * sigmoid(alpha * g), g = min(gate, limit), up in [-limit, limit]
    o_bias: bool = False
    attention_sinks: bool = False
    moe_bias: bool = False
    clamped_swiglu: tuple[float, float] | None = None   # (alpha, limit)
    # False: the checkpoint holds no lm_head (an embedding model): it serves embeddings only
    has_lm_head: bool = True

    def __post_init__(self):
        def positive(name: str) -> None:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"config: {name} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            positive(name)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: num_attention_heads ({self.num_heads}) must be a multiple "
                             f"of num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2 or self.head_dim > 256:
            raise ValueError(f"config: head_dim must be even and at most 256, got {self.head_dim}")
        if self.moe_layers:
            for name in ("num_experts", "experts_per_token", "moe_intermediate_size"):
                positive(name)
            if self.experts_per_token > self.num_experts:
                raise ValueError(f"config: num_experts_per_tok ({self.experts_per_token}) "
                                 f"exceeds the number of experts ({self.num_experts})")
            if any(not 0 <= i < self.num_layers for i in self.moe_layers):
                raise ValueError(f"config: sparse layers {list(self.moe_layers)} outside the "
                                 f"{self.num_layers} layers")
        if any(not 0 <= i < self.num_layers for i in self.sliding_layers):
            raise ValueError(f"config: sliding layers {list(self.sliding_layers)} outside the "
                             f"{self.num_layers} layers")
        if self.sliding_layers and self.sliding_window < 1:
            raise ValueError(f"config: sliding layers need a sliding_window >= 1, got "
                             f"{self.sliding_window!r}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"config: rms_norm_eps and rope_theta must be > 0, got "
                             f"{self.rms_norm_eps} and {self.rope_theta}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def is_moe_layer(self, i: int) -> bool:
        """Layer i's MLP is a router over experts (else a dense MLP)."""
        return i in self.moe_layers

    def window(self, i: int) -> int:
        """The tokens layer i attends back (0: all of them)."""
        return self.sliding_window if i in self.sliding_layers else 0

    def mlp_size(self, i: int) -> int:
        """The intermediate size of layer i's MLP: an expert's in a sparse layer."""
        return self.moe_intermediate_size if self.is_moe_layer(i) else self.intermediate_size


def _moe_fields(arch: str, cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral or Qwen3-MoE config.json (transformers'
    rules: Mixtral's every layer is sparse and its top-k weights renormalized; Qwen3-MoE's
    layer i is sparse unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step)."""
    if arch == "MixtralForCausalLM":
        return {"moe_layers": tuple(range(num_layers)),
                "num_experts": int(cfg["num_local_experts"]),
                "experts_per_token": int(cfg["num_experts_per_tok"]),
                "moe_intermediate_size": int(cfg["intermediate_size"]), "norm_topk_prob": True}
    if arch == "Qwen3MoeForCausalLM":
        # the Hub's config.json says num_experts, transformers 5 writes num_local_experts
        experts = int(cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"])
        step = int(cfg.get("decoder_sparse_step", 1))
        dense = {int(i) for i in cfg.get("mlp_only_layers") or ()}
        return {"moe_layers": tuple(i for i in range(num_layers) if experts > 0 and step > 0
                                    and i not in dense and (i + 1) % step == 0),
                "num_experts": experts, "experts_per_token": int(cfg["num_experts_per_tok"]),
                "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
                "norm_topk_prob": bool(cfg.get("norm_topk_prob", False))}
    if arch == "GptOssForCausalLM":   # top-k of the logits, then their softmax: renormalized
        return {"moe_layers": tuple(range(num_layers)),
                "num_experts": int(cfg["num_local_experts"]),
                "experts_per_token": int(cfg["num_experts_per_tok"]),
                "moe_intermediate_size": int(cfg["intermediate_size"]), "norm_topk_prob": True,
                "o_bias": bool(cfg.get("attention_bias", True)), "attention_sinks": True,
                "moe_bias": True,
                "clamped_swiglu": (float(cfg.get("swiglu_alpha", 1.702)),
                                   float(cfg.get("swiglu_limit", 7.0)))}
    return {}


def _sliding_fields(arch: str, cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """sliding_window and sliding_layers: Mistral's and Mixtral's window in every layer,
    GPT-OSS's in the layers layer_types calls "sliding_attention" (by default every
    other one, from layer 0)."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if not window or arch not in ("MistralForCausalLM", "MixtralForCausalLM",
                                  "GptOssForCausalLM"):
        return {"sliding_window": 0}
    types = cfg.get("layer_types")
    if arch != "GptOssForCausalLM":
        layers = range(num_layers)
    elif types is None:
        layers = range(0, num_layers, 2)
    else:
        if len(types) != num_layers:
            raise ValueError(f"config: layer_types has {len(types)} entries for "
                             f"{num_layers} layers")
        layers = [i for i, t in enumerate(types) if t == "sliding_attention"]
    return {"sliding_window": int(window), "sliding_layers": tuple(layers)}


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list | tuple) else [value]))


def config_from_hf(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"{source}: unsupported architecture {archs or cfg.get('model_type')!r} "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    has_lm_head = arch not in BASE_ARCHITECTURES
    arch = BASE_ARCHITECTURES.get(arch, arch)
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default")
                                              != "default" else None)
        layers = int(cfg["num_hidden_layers"])
        return ModelConfig(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=has_lm_head and bool(cfg.get("tie_word_embeddings", False)),
            has_lm_head=has_lm_head,
            attention_bias=bool(cfg.get("attention_bias", arch in ("Qwen2ForCausalLM",
                                                                 "GptOssForCausalLM"))),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
            **_sliding_fields(arch, cfg, layers),
            **_moe_fields(arch, cfg, layers),
        )
    except KeyError as exc:
        raise ValueError(f"{source}: missing key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        if str(exc).startswith("config:"):
            raise ValueError(f"{source}: {exc}") from None
        raise ValueError(f"{source}: malformed value: {exc}") from None


def load_hf_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (a Hugging Face model directory needs config.json)") \
            from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return config_from_hf(cfg, str(path))


# GGUF's general.architecture -> the architecture armllm runs it as (llama with
# llama.expert_count is Mixtral)
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
                      "gpt-oss": "GptOssForCausalLM"}
# llama.cpp's GPT-OSS graph (openai-moe.cpp): the SwiGLU constants it hard-codes, its
# sliding layers (swa pattern 2: the even ones) and YaRN as the checkpoint defines it
GPT_OSS_SWIGLU = (1.702, 7.0)


def config_from_gguf(meta: dict[str, Any], source: str) -> ModelConfig:
    gguf_arch = meta.get("general.architecture")
    if gguf_arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{source}: unsupported GGUF architecture {gguf_arch!r} (supported: "
                         f"{', '.join(GGUF_ARCHITECTURES)})")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{gguf_arch}.{name}", default)
        if value is None:
            raise ValueError(f"{source}: missing GGUF key {gguf_arch}.{name}")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    vocab = meta.get(f"{gguf_arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    eos = meta.get("tokenizer.ggml.eos_token_id")
    layers, experts = int(key("block_count")), int(meta.get(f"{gguf_arch}.expert_count") or 0)
    arch = GGUF_ARCHITECTURES[gguf_arch]
    extra: dict[str, Any] = {}
    if experts:   # Mixtral (llama.cpp's "llama" with experts), Qwen3-MoE, GPT-OSS: all sparse
        arch = "MixtralForCausalLM" if gguf_arch == "llama" else arch
        extra = {"moe_layers": tuple(range(layers)), "num_experts": experts,
                 "experts_per_token": int(key("expert_used_count")),
                 "moe_intermediate_size": int(meta.get(f"{gguf_arch}.expert_feed_forward_length")
                                              or key("feed_forward_length")),
                 "norm_topk_prob": True}
    scaling = None
    if gguf_arch == "gpt-oss":
        window = int(key("attention.sliding_window"))
        extra.update(o_bias=True, attention_sinks=True, moe_bias=True,
                     clamped_swiglu=GPT_OSS_SWIGLU, sliding_window=window,
                     sliding_layers=tuple(range(0, layers, 2)))
        if meta.get(f"{gguf_arch}.rope.scaling.type") == "yarn":
            scaling = {"rope_type": "yarn", "factor": float(key("rope.scaling.factor")),
                       "original_max_position_embeddings":
                           int(key("rope.scaling.original_context_length")),
                       "truncate": False}
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{gguf_arch}.attention.key_length") or hidden // heads),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(key("context_length", 4096)),
        tie_word_embeddings=False,  # decided by the loader: no output.weight means tied
        attention_bias=gguf_arch == "gpt-oss",
        qk_norm=gguf_arch == "qwen3moe",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_ids(eos),
        **({"sliding_window": 0} | extra),
    )
