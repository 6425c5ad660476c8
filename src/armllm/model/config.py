"""config: ModelConfig, the hyper-parameters armllm runs a model by, validated
where they enter; the architecture files (model/arch/) fill it from a Hugging
Face config.json or a GGUF file's metadata (model/arch's load_hf_config,
config_from_hf and config_from_gguf find the file that does)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeltaNetShape:
    """A Gated DeltaNet mixer's shape (Qwen3.5's linear-attention layers): key heads
    of k_dim (q and k) and value heads of v_dim (v, the output and its gate z), a
    depthwise causal conv of conv_kernel taps over [q | k | v]; v_tiled: value head h
    reads key head h % k_heads (llama.cpp's GGUF order) instead of h // (v_heads /
    k_heads) (Hugging Face's)."""
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    v_tiled: bool = False

    def __post_init__(self):
        if min(self.k_heads, self.v_heads, self.k_dim, self.v_dim) < 1 or \
                self.v_heads % self.k_heads:
            raise ValueError(f"config: linear attention needs value heads ({self.v_heads}) a "
                             f"multiple of key heads ({self.k_heads}), all sizes >= 1")
        if max(self.k_dim, self.v_dim) > 256 or not 2 <= self.conv_kernel <= 8:
            raise ValueError(f"config: linear attention head dims at most 256 and a conv "
                             f"kernel of 2 to 8 taps, got {self.k_dim}/{self.v_dim} and "
                             f"{self.conv_kernel}")

    @property
    def key_size(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_size(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_size(self) -> int:
        """The conv's channels: q, k and v."""
        return 2 * self.key_size + self.value_size

    @property
    def projection_size(self) -> int:
        """The input projection's rows: [q | k | v | z] (b and a apart, kept float)."""
        return self.conv_size + self.value_size

    @property
    def state_floats(self) -> int:
        """One sequence's state in one layer: the conv's last inputs and the delta
        rule's matrix per value head, float32."""
        return (self.conv_kernel - 1) * self.conv_size + self.v_heads * self.k_dim * self.v_dim


@dataclass(frozen=True)
class EncoderShape:
    """An encoder-decoder's audio encoder (Whisper): two conv1d over n_mels log-mel
    channels (the second of stride 2), `positions` frames out of one 30 s window,
    `layers` pre-norm bidirectional attention layers of `heads` heads over `hidden`
    features with GELU MLPs of `ffn`."""
    n_mels: int
    layers: int
    heads: int
    hidden: int
    ffn: int
    positions: int

    def __post_init__(self):
        if min(self.n_mels, self.layers, self.heads, self.hidden, self.ffn,
               self.positions) < 1 or self.hidden % self.heads:
            raise ValueError(f"config: an encoder needs positive sizes and hidden "
                             f"({self.hidden}) a multiple of its heads ({self.heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


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
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2, GPT-OSS)
    qk_norm: bool = False         # RMSNorm on each q/k head before RoPE (Qwen3, Gemma 3)
    sliding_window: int = 0       # tokens a sliding layer attends (0: none)
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
    # the dims of each head RoPE rotates, from the first (partial rotary: Phi-4-mini's
    # 0.75); 0: all of head_dim
    rotary_dim: int = 0
    embed_scale: float = 1.0          # the embeddings' factor (Gemma: sqrt(hidden))
    attn_scale: float = 0.0           # the scores' factor (0: head_dim ** -0.5)
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap) (0: none)
    # the sliding layers' own RoPE (Gemma 3: base 10000, unscaled); 0: the global one
    local_rope_theta: float = 0.0
    local_rope_scaling: dict | None = None
    # hybrids (Qwen3.5): the layers whose mixer is a Gated DeltaNet of this shape, with
    # a recurrent state per sequence instead of a KV cache
    linear_layers: tuple[int, ...] = ()
    delta_net: DeltaNetShape | None = None
    # the attention output is gated by sigmoid(gate), the gate a second half of each
    # query head's q_proj rows (Qwen3.5's full-attention layers)
    attn_output_gate: bool = False
    # a dense expert every token runs beside the routed ones, scaled by sigmoid(x . w)
    # (Qwen3.5-MoE); 0: none
    shared_expert_intermediate_size: int = 0
    # multi-token-prediction layers the checkpoint carries (kept for speculative decoding)
    mtp_layers: int = 0
    # an encoder-decoder (Whisper): the encoder whose output every decoder layer's
    # cross-attention reads (the decoder fields above are the decoder's); None: a decoder
    encoder: EncoderShape | None = None

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
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(f"config: the rotary dims must be even and at most head_dim "
                             f"({self.head_dim}), got {self.rotary_dim}")
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
        if any(not 0 <= i < self.num_layers for i in self.linear_layers) or \
                bool(self.linear_layers) != (self.delta_net is not None):
            raise ValueError(f"config: linear-attention layers {list(self.linear_layers)} "
                             f"need a DeltaNet shape and must lie within the {self.num_layers} "
                             f"layers")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"config: rms_norm_eps and rope_theta must be > 0, got "
                             f"{self.rms_norm_eps} and {self.rope_theta}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def rot_dim(self) -> int:
        """The dims of each head RoPE rotates."""
        return self.rotary_dim or self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def is_moe_layer(self, i: int) -> bool:
        """Layer i's MLP is a router over experts (else a dense MLP)."""
        return i in self.moe_layers

    def is_linear_layer(self, i: int) -> bool:
        """Layer i mixes tokens with a Gated DeltaNet (a recurrent state, no KV cache)."""
        return i in self.linear_layers

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that keep K and V in the cache."""
        return tuple(i for i in range(self.num_layers) if i not in self.linear_layers)

    def window(self, i: int) -> int:
        """The tokens layer i attends back (0: all of them)."""
        return self.sliding_window if i in self.sliding_layers else 0

    def mlp_size(self, i: int) -> int:
        """The intermediate size of layer i's MLP: an expert's in a sparse layer."""
        return self.moe_intermediate_size if self.is_moe_layer(i) else self.intermediate_size


def eos_ids(value: Any) -> tuple[int, ...]:
    """A config's eos_token_id (one id, a list or None) as a tuple."""
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list | tuple) else [value]))


def gguf_key(meta: dict[str, Any], gguf_arch: str, name: str, source: str,
             default: Any = None) -> Any:
    """Metadata key `{gguf_arch}.{name}`, or default; missing without one: a ValueError."""
    value = meta.get(f"{gguf_arch}.{name}", default)
    if value is None:
        raise ValueError(f"{source}: missing GGUF key {gguf_arch}.{name}")
    return value
