"""qwen3_5: Qwen3.5 and Qwen3.6, hybrid models (transformers' models/qwen3_5 and
qwen3_5_moe, built on Qwen3-Next), dense and mixture-of-experts.

Three of every four layers (layer_types, or every full_attention_interval-th
layer attends) mix tokens with a Gated DeltaNet: one input projection to
[q | k | v | z | b | a], a depthwise causal conv (SiLU) over q, k, v, the
gated delta rule over L2-normed q and k with a recurrent state per sequence
(model/layer.py's DeltaNet; the state lives in the cache's state pool, not in
KV blocks), a per-head RMSNorm gated by silu(z), and the output projection.
The other layers are Qwen3's attention with two changes: each query head's
q_proj rows are [q | gate] and the attention output is multiplied by
sigmoid(gate) (OutputGate), and RoPE turns only the first quarter of each
head (partial_rotary_factor; the mRoPE sections collapse to 1-D positions for
text). Every RMSNorm but the DeltaNet's gated one multiplies by (1 + w): the
loader adds the 1 to a safetensors checkpoint's weights (llama.cpp's converter
already did). The MoE variant's sparse MLP adds a shared expert scaled by
sigmoid(x . w) (SparseMLP's shared). The multi-token-prediction block (mtp.*,
speculative decoding's draft: an fc over [norm(embedding) | norm(hidden)], full
attention layers as the model's, a norm) is loaded beside the model: its
layer j is logical layer num_layers + j (ModelWeights.mtp).
*ForConditionalGeneration checkpoints run their language model (the vision
tower is not loaded).

GGUF: llama.cpp's "qwen35" and "qwen35moe", whose linear-attention value heads
are stored tiled (value head h reads key head h % k_heads: DeltaNetShape's
v_tiled), A as -exp(A_log), the conv weight squeezed."""
from __future__ import annotations

from collections.abc import Container
from typing import Any

from armllm.model.arch.base import (
    GGUF_LAYER_NAMES,
    Architecture,
    Parts,
    SparseArchitecture,
    TensorRef,
)
from armllm.model.config import DeltaNetShape, ModelConfig, gguf_key
from armllm.model.layer import (
    Act,
    Attention,
    DeltaNet,
    Linear,
    NormLinear,
    OutputGate,
    QKNorm,
    RopeKV,
    SparseMLP,
    Step,
)

FULL_ATTENTION_INTERVAL = 4   # transformers' default: layers 3, 7, 11, ... attend
# the language model's prefix in a ConditionalGeneration checkpoint (transformers 5)
MULTIMODAL_PREFIX = "model.language_model."
# the Gated DeltaNet's tensors under "model.layers.{i}.linear_attn." and llama.cpp's names
DELTA_GGUF_NAMES = {"in_proj_qkv.weight": "attn_qkv.weight", "in_proj_z.weight": "attn_gate.weight",
                    "in_proj_b.weight": "ssm_beta.weight", "in_proj_a.weight": "ssm_alpha.weight",
                    "conv1d.weight": "ssm_conv1d.weight", "A_log": "ssm_a",
                    "dt_bias": "ssm_dt.bias", "norm.weight": "ssm_norm.weight",
                    "out_proj.weight": "ssm_out.weight"}
# the MTP block's own tensors and llama.cpp's names under "blk.{num_layers}." (nextn)
MTP_GGUF_NAMES = {"mtp.fc.weight": "nextn.eh_proj.weight",
                  "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
                  "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
                  "mtp.norm.weight": "nextn.shared_head_norm.weight"}
SHARED_GGUF_NAMES = {"mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
                     "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
                     "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
                     "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}


class Qwen3_5(Architecture):
    name = "qwen3_5"
    hf_architectures = {"Qwen3_5ForCausalLM": "Qwen3_5ForCausalLM",
                        "Qwen3_5ForConditionalGeneration": "Qwen3_5ForConditionalGeneration"}
    gguf_architectures = ("qwen35",)

    # ------------------------------------------------------------ configs

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        return ModelConfig(**self.hybrid_fields(cfg, arch))

    def hybrid_fields(self, cfg: dict[str, Any], arch: str) -> dict[str, Any]:
        text = cfg.get("text_config") or {} if arch.endswith("ConditionalGeneration") else cfg
        text = {k: v for k, v in text.items() if v is not None}
        # the MoE variant's dense size is its shared expert's (no dense MLP runs)
        text.setdefault("intermediate_size", text.get("shared_expert_intermediate_size")
                        or text.get("moe_intermediate_size"))
        for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):
            if key not in text and cfg.get(key) is not None:
                text[key] = cfg[key]
        fields = self.hf_fields(text, arch)
        layers = fields["num_layers"]
        interval = int(text.get("full_attention_interval", FULL_ATTENTION_INTERVAL))
        types = text.get("layer_types") or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)]
        if len(types) != layers or set(types) - {"full_attention", "linear_attention"}:
            raise ValueError(f"config: layer_types must name full_attention or "
                             f"linear_attention for each of the {layers} layers, got {types}")
        if text.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config: hidden_act {text['hidden_act']!r}: Qwen3.5 runs silu")
        fields.update(
            qk_norm=True, attn_output_gate=True,
            linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
            delta_net=DeltaNetShape(
                int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"]),
                int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"]),
                int(text.get("linear_conv_kernel_dim", 4))),
            mtp_layers=int(text.get("mtp_num_hidden_layers") or 0))
        return fields

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        return ModelConfig(**self.hybrid_gguf_fields(meta, gguf_arch, source))

    def hybrid_gguf_fields(self, meta: dict[str, Any], gguf_arch: str, source: str
                           ) -> dict[str, Any]:
        def key(name: str, default: Any = None) -> Any:
            return gguf_key(meta, gguf_arch, name, source, default)

        fields = self.gguf_fields(meta, gguf_arch, source)
        # llama.cpp counts the MTP layers in block_count (nextn_predict_layers of them last)
        mtp = int(meta.get(f"{gguf_arch}.nextn_predict_layers") or 0)
        layers = fields["num_layers"] - mtp
        interval = int(key("full_attention_interval", FULL_ATTENTION_INTERVAL))
        # one flag a layer (the MTP layers' last, False), else every interval-th attends
        recurrent = meta.get(f"{gguf_arch}.attention.recurrent_layers")
        if recurrent is None:
            recurrent = [bool((i + 1) % interval) for i in range(layers)]
        k_heads, v_heads = int(key("ssm.group_count")), int(key("ssm.time_step_rank"))
        k_dim = int(key("ssm.state_size"))
        v_dim = int(key("ssm.inner_size")) // v_heads
        fields.update(
            num_layers=layers, qk_norm=True, attn_output_gate=True, mtp_layers=mtp,
            linear_layers=tuple(i for i in range(layers) if recurrent[i]),
            delta_net=DeltaNetShape(k_heads, v_heads, k_dim, v_dim, int(key("ssm.conv_kernel")),
                                    v_tiled=k_heads != v_heads),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")))
        return fields

    # ------------------------------------------------------------ the layer

    def layer(self, c: ModelConfig, i: int) -> tuple[Step, ...]:
        """Layer i's steps; from num_layers on, the MTP block's (full attention, sparse
        in a mixture-of-experts model)."""
        if c.is_linear_layer(i):
            mixer = (NormLinear("input_norm", "qkv"), DeltaNet(), Linear("o"))
        else:
            mixer = (NormLinear("input_norm", "qkv"), QKNorm(), RopeKV(), Attention(),
                     OutputGate(), Linear("o"))
        if self.sparse(c, i):
            if c.shared_expert_intermediate_size not in (0, c.moe_intermediate_size):
                raise ValueError(f"config: a shared expert of {c.shared_expert_intermediate_size}"
                                 f" beside experts of {c.moe_intermediate_size}: armllm runs "
                                 f"them on one activation scratch, so the sizes must match")
            return (*mixer, SparseMLP("post_norm", shared=c.shared_expert_intermediate_size > 0))
        return (*mixer, NormLinear("post_norm", "gate_up"), Act("silu"), Linear("down"))

    # ------------------------------------------------------------ logical tensors

    @staticmethod
    def sparse(c: ModelConfig, i: int) -> bool:
        """Layer i's MLP is sparse (an MTP layer: when the model's are)."""
        return c.is_moe_layer(i) or (i >= c.num_layers and bool(c.moe_layers))

    def mtp_tensors(self) -> tuple[str, ...]:
        """The MTP block's fc [hidden, 2 hidden] and its three norms [hidden]: the
        embedding's, the hidden state's, the output's."""
        return tuple(MTP_GGUF_NAMES)

    def delta_tensor(self, i: int, name: str) -> str:
        """Recurrent layer i's Gated DeltaNet tensor `name` (a DELTA_GGUF_NAMES key)."""
        return f"model.layers.{i}.linear_attn.{name}"

    def linear_parts(self, c: ModelConfig, i: int, expert: int = 0) -> list[Parts]:
        parts = super().linear_parts(c, i, expert)
        h = c.hidden_size
        if c.is_linear_layer(i):
            d = c.delta_net
            parts[0] = [(self.delta_tensor(i, "in_proj_qkv.weight"), (d.conv_size, h)),
                        (self.delta_tensor(i, "in_proj_z.weight"), (d.value_size, h))]
            parts[1] = [(self.delta_tensor(i, "out_proj.weight"), (h, d.value_size))]
        else:   # q_proj's rows: per head [q | gate]
            name, (q, _) = parts[0][0]
            parts[0][0] = (name, (2 * q, h))
        if self.sparse(c, i) and not c.is_moe_layer(i):   # a sparse MTP layer's expert
            gate, up, down = self.expert_tensors(i, expert)
            inter = c.moe_intermediate_size
            parts[2:] = [[(gate, (inter, h)), (up, (inter, h))], [(down, (h, inter))]]
        return parts

    # ------------------------------------------------------------ where they are stored

    def hf_tensor(self, c: ModelConfig, name: str, stored: Container[str] = ()) -> TensorRef:
        parts = name.split(".", 3)
        if len(parts) == 4 and parts[1] == "layers" and int(parts[2]) >= c.num_layers:
            name = f"mtp.layers.{int(parts[2]) - c.num_layers}.{parts[3]}"   # the MTP block's
        elif name.startswith("model.") and MULTIMODAL_PREFIX + name[len("model."):] in stored:
            name = MULTIMODAL_PREFIX + name[len("model."):]
        # Qwen3_5RMSNorm multiplies by (1 + w), the MTP block's too; the DeltaNet's gated
        # norm by w
        zero_centred = (name.endswith("norm.weight") or name in MTP_GGUF_NAMES) and \
            not name.endswith("linear_attn.norm.weight") and name != "mtp.fc.weight"
        return TensorRef(name, add=1.0 if zero_centred else 0.0)

    def gguf_layer_names(self) -> dict[str, str]:
        return {**GGUF_LAYER_NAMES, **{f"linear_attn.{k}": v for k, v in DELTA_GGUF_NAMES.items()},
                "post_attention_layernorm.weight": "post_attention_norm.weight"}

    def gguf_tensor(self, c: ModelConfig, name: str) -> TensorRef:
        if name in MTP_GGUF_NAMES:
            return TensorRef(f"blk.{c.num_layers}.{MTP_GGUF_NAMES[name]}")
        ref = super().gguf_tensor(c, name)
        # the stored A is -exp(A_log)
        return TensorRef(ref.name, log_neg=True) if name.endswith("linear_attn.A_log") else ref


class Qwen3_5Moe(Qwen3_5, SparseArchitecture):
    name = "qwen3_5"   # the same family, and file
    hf_architectures = {"Qwen3_5MoeForCausalLM": "Qwen3_5MoeForCausalLM",
                        "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForConditionalGeneration"}
    gguf_architectures = ("qwen35moe",)
    expert_names = ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
                    "mlp.experts.{e}.down_proj.weight")
    router_name = "mlp.gate.weight"

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        fields = self.hybrid_fields(cfg, arch)
        text = cfg.get("text_config") or {} if arch.endswith("ConditionalGeneration") else cfg
        experts = int(text["num_experts"])
        return ModelConfig(
            **fields, moe_layers=tuple(range(fields["num_layers"])), num_experts=experts,
            experts_per_token=int(text["num_experts_per_tok"]),
            moe_intermediate_size=int(text["moe_intermediate_size"]), norm_topk_prob=True,
            shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size")
                                                or 0))

    def config_from_gguf(self, meta: dict[str, Any], gguf_arch: str, source: str
                         ) -> ModelConfig:
        fields = self.hybrid_gguf_fields(meta, gguf_arch, source)
        moe = self.gguf_moe_fields(meta, gguf_arch, source, fields["num_layers"])
        shared = int(meta.get(f"{gguf_arch}.expert_shared_feed_forward_length") or 0)
        return ModelConfig(**fields, **moe, shared_expert_intermediate_size=shared)

    def shared_expert_parts(self, c: ModelConfig, i: int) -> list[Parts]:
        """Sparse layer i's shared expert: [gate; up] and down, as LINEARS' gate_up and
        down."""
        p, h, inter = f"model.layers.{i}.", c.hidden_size, c.shared_expert_intermediate_size
        return [[(p + "mlp.shared_expert.gate_proj.weight", (inter, h)),
                 (p + "mlp.shared_expert.up_proj.weight", (inter, h))],
                [(p + "mlp.shared_expert.down_proj.weight", (h, inter))]]

    def shared_gate_tensor(self, i: int) -> str:
        """Sparse layer i's shared-expert gate [1, hidden]."""
        return f"model.layers.{i}.mlp.shared_expert_gate.weight"

    def gguf_layer_names(self) -> dict[str, str]:
        return {**super().gguf_layer_names(), **SHARED_GGUF_NAMES,
                self.router_name: "ffn_gate_inp.weight"}


ARCHITECTURE = Qwen3_5()
MOE_ARCHITECTURE = Qwen3_5Moe()
