"""base: what an architecture file declares, and the Llama-shaped defaults most
families share.

An Architecture turns a Hugging Face config.json or a GGUF file's metadata into
a ModelConfig, names the checkpoint tensors of every weight the loader reads
(under the family's own Hugging Face names, the logical names the loader,
sharding and sizing speak), maps those names to what a safetensors checkpoint or
a GGUF file stores (TensorRef: the stored tensor, a row range, llama.cpp's Q/K
row permutation, a constant added to a norm), and declares each decoder layer
as steps (model/layer.py). An architecture file subclasses Architecture and
overrides only what differs."""
from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from armllm.model.config import ModelConfig, eos_ids, gguf_key
from armllm.model.layer import Step, llama_steps

# the llama.cpp name of each per-layer tensor under "model.layers.{i}." (Llama's names)
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GGUF_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"

Parts = list[tuple[str, tuple[int, int]]]   # (tensor, [N, K]) stacked into one packed matrix


@dataclass(frozen=True)
class TensorRef:
    """Where a logical tensor is stored: `name` in the checkpoint; `rows` (first,
    count) of it (a part of a fused tensor), or `expert` e of a stacked [E, N, K]
    tensor; `rope_heads` > 0: its rows carry llama.cpp's Q/K RoPE permutation over
    that many heads, undone as they are read; `add`: a constant added to a float
    vector as it is read (Gemma's 1 + w norms); `interleave`: a second tensor whose
    columns alternate with this one's (GPT-OSS's expert gate/up biases in GGUF);
    `log_neg`: the stored vector is -exp(x) of the logical x (llama.cpp's Qwen3.5 A)."""
    name: str
    rows: tuple[int, int] | None = None
    expert: int | None = None
    rope_heads: int = 0
    add: float = 0.0
    interleave: str | None = None
    log_neg: bool = False


def sliding_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A config.json's window in every layer (Mistral's, Mixtral's, Phi-3's), unless
    use_sliding_window turns it off."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if not window:
        return {"sliding_window": 0}
    return {"sliding_window": int(window), "sliding_layers": tuple(range(num_layers))}


def gguf_sliding_fields(meta: dict[str, Any], gguf_arch: str, num_layers: int
                        ) -> dict[str, Any]:
    """A GGUF's window in every layer ({arch}.attention.sliding_window), if it has one."""
    window = int(meta.get(f"{gguf_arch}.attention.sliding_window") or 0)
    if not window:
        return {}
    return {"sliding_window": window, "sliding_layers": tuple(range(num_layers))}


def gguf_rope_scaling(meta: dict[str, Any], gguf_arch: str, source: str) -> dict | None:
    """The rope_scaling a GGUF's rope.scaling.* keys describe (linear or YaRN), or None."""
    kind = meta.get(f"{gguf_arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = float(gguf_key(meta, gguf_arch, "rope.scaling.factor", source))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings":
                    int(gguf_key(meta, gguf_arch, "rope.scaling.original_context_length", source)),
                "truncate": False}
    raise ValueError(f"{source}: unsupported GGUF RoPE scaling {kind!r} (supported: linear, yarn)")


class Architecture:
    """A model family. Class attributes: `hf_architectures` maps each Hugging Face
    `architectures` entry the family runs to the name its ModelConfig records (a bare
    decoder such as Qwen3Model runs as its causal kin, serving embeddings);
    `gguf_architectures` the GGUF `general.architecture` values; `norms` each layer
    norm's LayerWeights name -> its tensor under "model.layers.{i}."."""
    name: str = ""
    hf_architectures: dict[str, str] = {}
    gguf_architectures: tuple[str, ...] = ()
    norms: dict[str, str] = {"input_norm": "input_layernorm.weight",
                             "post_norm": "post_attention_layernorm.weight"}

    # ------------------------------------------------------------ configs

    def runs_gguf(self, meta: dict[str, Any]) -> bool:
        """Whether this family runs a GGUF file of one of its gguf_architectures (two
        families may share one: llama.cpp's "llama" is Mixtral with experts)."""
        return True

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        """The ModelConfig of a config.json whose `architectures` names `arch` (KeyError
        for a missing key, ValueError for a bad value: the caller names the file)."""
        return ModelConfig(**self.hf_fields(cfg, arch))

    def hf_fields(self, cfg: dict[str, Any], arch: str) -> dict[str, Any]:
        """The ModelConfig fields every Llama-shaped config.json spells alike."""
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default")
                                              != "default" else None)
        has_lm_head = arch in self.causal_architectures()
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        return dict(
            architecture=self.hf_architectures[arch],
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rotary_dim=int(head_dim * float(cfg.get("partial_rotary_factor")
                                            or rope.get("partial_rotary_factor") or 1.0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=has_lm_head and bool(cfg.get("tie_word_embeddings", False)),
            has_lm_head=has_lm_head,
            attention_bias=bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids(cfg.get("eos_token_id")),
        )

    def causal_architectures(self) -> tuple[str, ...]:
        """The HF architectures with an lm_head (the others are bare decoders)."""
        return tuple(a for a in self.hf_architectures if a.endswith("ForCausalLM")
                     or a.endswith("ForConditionalGeneration"))

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        return ModelConfig(**self.gguf_fields(meta, gguf_arch, source))

    def gguf_fields(self, meta: dict[str, Any], gguf_arch: str, source: str
                    ) -> dict[str, Any]:
        """The ModelConfig fields llama.cpp's converter writes alike for every family."""
        def key(name: str, default: Any = None) -> Any:
            return gguf_key(meta, gguf_arch, name, source, default)

        hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
        vocab = meta.get(f"{gguf_arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        head_dim = int(meta.get(f"{gguf_arch}.attention.key_length") or hidden // heads)
        return dict(
            architecture=next(iter(self.hf_architectures.values())),
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(key("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rotary_dim=int(meta.get(f"{gguf_arch}.rope.dimension_count") or head_dim),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=gguf_rope_scaling(meta, gguf_arch, source),
            max_position_embeddings=int(key("context_length", 4096)),
            tie_word_embeddings=False,  # decided by the loader: no output.weight means tied
            attention_bias=False,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=eos_ids(meta.get("tokenizer.ggml.eos_token_id")),
        )

    def text_only_note(self, c: ModelConfig) -> str | None:
        """What the loader logs when a checkpoint carries more than armllm runs (a
        *ForConditionalGeneration's vision tower), or None."""
        if c.architecture.endswith("ForConditionalGeneration"):
            return (f"{c.architecture}: its language model runs on text; the vision tower "
                    f"it carries is not loaded (image input is not supported yet)")
        return None

    def export_config(self, c: ModelConfig, dtype: str) -> dict[str, Any]:
        """The config.json of c written as a Hugging Face checkpoint under the logical
        names (armllm convert / quantize), or a ValueError for a family that cannot be."""
        raise ValueError(f"{c.architecture}: armllm writes no Hugging Face checkpoint of "
                         f"this architecture; it runs the model as it is")

    # ------------------------------------------------------------ the layer

    def layer(self, c: ModelConfig, i: int) -> tuple[Step, ...]:
        """Layer i's steps."""
        return llama_steps(window=c.window(i), qk_norm=c.qk_norm, sinks=c.attention_sinks,
                           sparse=c.is_moe_layer(i))

    # ------------------------------------------------------------ logical tensors

    def linear_parts(self, c: ModelConfig, i: int, expert: int = 0) -> list[Parts]:
        """The tensors (name, [N, K]) of layer i's packed linear weights, in
        model/layer.LINEARS order: q/k/v fused, o, gate/up fused, down; in a sparse
        layer (a SparseArchitecture's) the gate/up and down of expert `expert`."""
        p = f"model.layers.{i}."
        h, q, kv, inter = c.hidden_size, c.q_size, c.kv_size, c.mlp_size(i)
        if c.is_moe_layer(i):
            gate, up, down = self.expert_tensors(i, expert)
        else:
            gate, up, down = (p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down"))
        return [[(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                 (p + "self_attn.v_proj.weight", (kv, h))],
                [(p + "self_attn.o_proj.weight", (h, q))],
                [(gate, (inter, h)), (up, (inter, h))],
                [(down, (h, inter))]]

    def head_tensor(self, c: ModelConfig) -> str:
        """The tensor the lm_head is read from (the embedding when tied)."""
        return EMBED if c.tie_word_embeddings else LM_HEAD

    # ------------------------------------------------------------ where they are stored

    def hf_tensor(self, c: ModelConfig, name: str, stored: Container[str] = ()) -> TensorRef:
        """Where a safetensors checkpoint of this family stores `name` (stored: the
        checkpoint's tensor names, for a family whose checkpoints name a part two ways)."""
        return TensorRef(name)

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        """Where llama.cpp's converter stores `name` in a GGUF file."""
        if name in GGUF_GLOBAL_NAMES:
            return TensorRef(GGUF_GLOBAL_NAMES[name])
        parts = name.split(".", 3)   # model.layers.N.rest
        if len(parts) != 4 or parts[1] != "layers":
            return TensorRef(name)
        layer, rest = parts[2], parts[3]
        gname = self.gguf_layer_names().get(rest)
        if gname is None:
            return TensorRef(name)
        return TensorRef(f"blk.{layer}.{gname}")

    def gguf_layer_names(self) -> dict[str, str]:
        """HF name under "model.layers.{i}." -> GGUF name under "blk.{i}."."""
        return GGUF_LAYER_NAMES


# llama.cpp's stacked [experts, N, K] tensors of a sparse layer, by part
GGUF_EXPERT_NAMES = {"gate": "ffn_gate_exps.weight", "up": "ffn_up_exps.weight",
                     "down": "ffn_down_exps.weight"}


class SparseArchitecture(Architecture):
    """A family with mixture-of-experts layers: `expert_names` are expert e's gate, up
    and down weights and `router_name` the router under "model.layers.{i}."; a GGUF
    stacks each part's experts in one tensor, the router is ffn_gate_inp."""
    expert_names: tuple[str, str, str] = ()
    router_name: str = ""

    def expert_tensors(self, i: int, expert: int) -> tuple[str, str, str]:
        """Expert `expert`'s gate, up and down weights in sparse layer i."""
        return tuple(f"model.layers.{i}." + n.format(e=expert) for n in self.expert_names)

    def router_tensor(self, i: int) -> str:
        """Sparse layer i's router weight [experts, hidden]."""
        return f"model.layers.{i}." + self.router_name

    def gguf_layer_names(self) -> dict[str, str]:
        return {**GGUF_LAYER_NAMES, self.router_name: "ffn_gate_inp.weight"}

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        parts = name.split(".", 3)
        if len(parts) == 4 and parts[1] == "layers":
            for e_part, pattern in zip(("gate", "up", "down"), self.expert_names, strict=True):
                prefix, _, suffix = pattern.partition("{e}")
                rest = parts[3]
                if rest.startswith(prefix) and rest.endswith(suffix) and \
                        rest[len(prefix):len(rest) - len(suffix)].isdigit():
                    expert = int(rest[len(prefix):len(rest) - len(suffix)])
                    return TensorRef(f"blk.{parts[2]}.{GGUF_EXPERT_NAMES[e_part]}",
                                     expert=expert)
        return super().gguf_tensor(c, name)

    def gguf_moe_fields(self, meta: dict[str, Any], gguf_arch: str, source: str,
                        num_layers: int) -> dict[str, Any]:
        """Every layer sparse, top-k renormalized (llama.cpp's Mixtral, Qwen3-MoE and
        GPT-OSS graphs)."""
        def key(name: str) -> Any:
            return gguf_key(meta, gguf_arch, name, source)
        return {"moe_layers": tuple(range(num_layers)),
                "num_experts": int(key("expert_count")),
                "experts_per_token": int(key("expert_used_count")),
                "moe_intermediate_size": int(meta.get(f"{gguf_arch}.expert_feed_forward_length")
                                             or key("feed_forward_length")),
                "norm_topk_prob": True}
