"""weights: loads a checkpoint's tensors (safetensors directory or GGUF),
checks every shape against the config, converts to the chosen precision and
prepacks the linear layers once (fused QKV and gate/up), so that `forward`
never converts or repacks anything."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from armllm import ops
from armllm.model.compressed_tensors import CTConfig
from armllm.model.compressed_tensors import load_matrix as ct_load_matrix
from armllm.model.config import ModelConfig
from armllm.model.gguf import GGML_TYPES, GGUFFile
from armllm.model.quantize import (
    GGUF_QUANTIZED,
    QuantizedMatrix,
    Scheme,
    from_gguf_blocks,
    quantize_rtn,
)
from armllm.model.safetensors_file import SafetensorsCheckpoint

WeightDtype = Literal["f32", "bf16"]


class HFSource:
    """Tensors of a Hugging Face safetensors checkpoint, by HF name; the Linear
    layers of a compressed-tensors checkpoint come quantized (get_quantized) or
    dequantized (get)."""

    def __init__(self, model_dir: str | Path, ct: CTConfig | None = None):
        self.ckpt = SafetensorsCheckpoint(model_dir)
        self.where = str(model_dir)
        self.ct = ct

    def _quantized_module(self, name: str):
        if self.ct is None or not name.endswith(".weight"):
            return None
        module = name[:-len(".weight")]
        if f"{module}.weight_scale" not in self.ckpt:
            return None
        return module, self.ct.weight_args(module)

    def has(self, name: str) -> bool:
        return name in self.ckpt or (self._quantized_module(name) is not None
                                     and f"{name}_packed" in self.ckpt)

    def get(self, name: str) -> np.ndarray:
        if self._quantized_module(name) is not None:
            return self.get_quantized(name, None).dequantize()
        return self.ckpt.array(name)

    def get_quantized(self, name: str, shape: tuple[int, int] | None) -> QuantizedMatrix | None:
        found = self._quantized_module(name)
        if found is None:
            return None
        module, scheme = found
        if scheme is None:
            raise ValueError(f"{self.where}: tensor {module}.weight_scale belongs to a layer "
                             "the quantization_config does not target")
        args, fmt = scheme
        if shape is None:
            shape = self._shape(module)
        return ct_load_matrix(self.ckpt.array, self.ckpt.__contains__, module, args, fmt, shape,
                              self.where)

    def _shape(self, module: str) -> tuple[int, int]:
        if f"{module}.weight" in self.ckpt:
            return tuple(self.ckpt.array(f"{module}.weight").shape)
        return tuple(int(v) for v in self.ckpt.array(f"{module}.weight_shape"))


class GGUFSource:
    """Tensors of a GGUF file under their HF names, dequantized, with the Q/K
    row permutation of llama.cpp's converter undone."""

    _LAYER = {"input_layernorm.weight": "attn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight",
              "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight",
              "self_attn.o_proj.weight": "attn_output.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight",
              "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}

    def __init__(self, gguf: GGUFFile, config: ModelConfig):
        self.gguf, self.config, self.where = gguf, config, str(gguf.path)

    def _gguf_name(self, name: str) -> str:
        if name == "model.embed_tokens.weight":
            return "token_embd.weight"
        if name == "model.norm.weight":
            return "output_norm.weight"
        if name == "lm_head.weight":
            return "output.weight"
        parts = name.split(".", 3)  # model.layers.N.rest
        if len(parts) == 4 and parts[1] == "layers" and parts[3] in self._LAYER:
            return f"blk.{parts[2]}.{self._LAYER[parts[3]]}"
        return name

    def has(self, name: str) -> bool:
        return self._gguf_name(name) in self.gguf.tensors

    def _rope_heads(self, name: str) -> int | None:
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            return self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
        return None

    def get(self, name: str) -> np.ndarray:
        w = self.gguf.dequantize(self._gguf_name(name))
        heads = self._rope_heads(name)
        return w if heads is None else unpermute_rope_rows(w, heads)

    def get_quantized(self, name: str, shape: tuple[int, int]) -> QuantizedMatrix | None:
        """Q8_0 / Q4_0 / Q4_1 tensors exactly as the quantized GEMM's (q, d, o)."""
        gname = self._gguf_name(name)
        t = self.gguf.tensors.get(gname)
        if t is None or t.type_name not in GGUF_QUANTIZED or tuple(t.shape) != tuple(shape):
            return None
        blocks = self.gguf.raw(gname).reshape(-1, GGML_TYPES[t.ggml_type][2])
        qm = from_gguf_blocks(t.type_name, blocks, *shape)
        heads = self._rope_heads(name)
        if heads is not None:
            qm = qm.take_rows(unpermute_rope_rows(np.arange(shape[0]), heads))
        return qm


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's convert permute (interleaved -> half-split RoPE rows)."""
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _as_f32(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:
        return ops.bf16_to_f32(a)
    return np.ascontiguousarray(a, dtype=np.float32)


def _as_bf16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a) if a.dtype == np.uint16 else ops.f32_to_bf16(_as_f32(a))


@dataclass
class LayerWeights:
    input_norm: np.ndarray
    qkv: ops.PackedWeight          # [q; k; v] rows
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None      # per-head RMSNorm weights (Qwen3)
    k_norm: np.ndarray | None
    o: ops.PackedWeight
    post_norm: np.ndarray
    gate_up: ops.PackedWeight      # [gate; up] rows
    down: ops.PackedWeight


@dataclass
class ModelWeights:
    dtype: WeightDtype
    embed: np.ndarray              # [vocab, hidden] float32, or uint16 bf16 bits
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: ops.PackedWeight
    quantization: str | None = None   # what the linear layers run as, e.g. "w4a8-g32 (GGUF Q4_1)"

    @property
    def nbytes(self) -> int:
        linear = sum(w.nbytes for lw in self.layers for w in (lw.qkv, lw.o, lw.gate_up, lw.down))
        return linear + self.embed.nbytes + self.lm_head.nbytes


Quantization = Literal["auto", "none"] | Scheme


def load_weights(source, config: ModelConfig, dtype: WeightDtype = "bf16",
                 progress=None, quantization: Quantization = "auto",
                 quantize_lm_head: bool = False) -> ModelWeights:
    """Reads, checks, converts and packs every tensor of the model.

    quantization: "auto" runs the checkpoint's own quantized layers as they are (GGUF
    Q8_0/Q4_0/Q4_1, compressed-tensors) and float layers in `dtype`; "none" dequantizes
    everything to `dtype`; a Scheme quantizes float layers at load (round to nearest) and
    keeps quantized ones that already match it. Embeddings stay in `dtype`. The lm_head
    follows the linear layers' rule when the checkpoint stores it quantized ("auto", e.g.
    a GGUF's Q8_0 token_embd under a tied head, runs as is, as llama.cpp runs it) or when
    quantize_lm_head asks for it; a float lm_head otherwise stays in `dtype`."""
    if dtype not in ("f32", "bf16"):
        raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")
    if not (isinstance(quantization, Scheme) or quantization in ("auto", "none")):
        raise ValueError(f"quantization must be auto, none or a Scheme, got {quantization!r}")
    c = config
    used: set[str] = set()   # what the linear layers ended up as

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if not source.has(name):
            raise ValueError(f"{source.where}: missing tensor {name}")
        a = source.get(name)
        if tuple(a.shape) != shape:
            raise ValueError(f"{source.where}: tensor {name} has shape {list(a.shape)}, "
                             f"expected {list(shape)} for this config")
        return a

    def native(name: str, shape: tuple[int, int]) -> QuantizedMatrix | None:
        getter = getattr(source, "get_quantized", None)
        if getter is None:
            return None
        if not source.has(name):
            raise ValueError(f"{source.where}: missing tensor {name}")
        return getter(name, shape)

    def quantized(names_shapes) -> QuantizedMatrix | None:
        if quantization == "none":
            return None
        natives = [native(n, s) for n, s in names_shapes]
        if quantization == "auto":
            if all(q is not None for q in natives) and \
                    len({(q.bits, q.group) for q in natives}) == 1:
                stacked = QuantizedMatrix.stack(natives)
                acts = "" if stacked.act_symmetric else ", asymmetric activations"
                used.add(f"w{natives[0].bits}a8-{_group_name(natives[0].group)} "
                         f"({_origin(source)}{acts})")
                return stacked
            return None  # float, or mixed formats within one fused matrix: run in dtype
        parts = []
        for (n, shp), q in zip(names_shapes, natives, strict=True):
            if q is not None and q.bits == quantization.bits and q.group == quantization.group:
                parts.append(q)   # already in the scheme: no second rounding
            else:
                parts.append(quantize_rtn(_as_f32(tensor(n, shp)), quantization))
        used.add(quantization.name)
        return replace(QuantizedMatrix.stack(parts), act_symmetric=quantization.act_symmetric)

    def matrix(names_shapes: list[tuple[str, tuple[int, int]]],
               may_quantize: bool = True) -> ops.PackedWeight:
        qm = quantized(names_shapes) if may_quantize else None
        if qm is not None:
            return ops.pack_quantized(qm.q, qm.d, qm.o, qm.bits, qm.group,
                                      act_asym=not qm.act_symmetric)
        parts = [tensor(n, s) for n, s in names_shapes]
        conv = _as_bf16 if dtype == "bf16" else _as_f32
        fused = conv(parts[0]) if len(parts) == 1 else np.concatenate([conv(p) for p in parts])
        if may_quantize:
            used.add(dtype)
        return ops.pack_weight(fused, dtype)

    h, q, kv, inter = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size
    layers = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        bias = None
        if c.attention_bias:
            bias = np.concatenate([_as_f32(tensor(p + f"self_attn.{n}_proj.bias", (size,)))
                                   for n, size in (("q", q), ("k", kv), ("v", kv))])
        layers.append(LayerWeights(
            input_norm=_as_f32(tensor(p + "input_layernorm.weight", (h,))),
            qkv=matrix([(p + "self_attn.q_proj.weight", (q, h)),
                        (p + "self_attn.k_proj.weight", (kv, h)),
                        (p + "self_attn.v_proj.weight", (kv, h))]),
            qkv_bias=bias,
            q_norm=_as_f32(tensor(p + "self_attn.q_norm.weight", (c.head_dim,))) if c.qk_norm
            else None,
            k_norm=_as_f32(tensor(p + "self_attn.k_norm.weight", (c.head_dim,))) if c.qk_norm
            else None,
            o=matrix([(p + "self_attn.o_proj.weight", (h, q))]),
            post_norm=_as_f32(tensor(p + "post_attention_layernorm.weight", (h,))),
            gate_up=matrix([(p + "mlp.gate_proj.weight", (inter, h)),
                            (p + "mlp.up_proj.weight", (inter, h))]),
            down=matrix([(p + "mlp.down_proj.weight", (h, inter))]),
        ))
        if progress:
            progress(i + 1, c.num_layers)
    embed_raw = tensor("model.embed_tokens.weight", (c.vocab_size, h))
    embed = _as_bf16(embed_raw) if dtype == "bf16" else _as_f32(embed_raw)
    tied = c.tie_word_embeddings
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    head_q, label = None, ", ".join(sorted(used)) or None
    if quantization == "auto" or (quantize_lm_head and quantization != "none"):
        used.clear()
        head_q = quantized([(head_name, (c.vocab_size, h))])
        if head_q is not None:
            label = f"{label}; lm_head {', '.join(used)}"
    if head_q is not None:
        lm_head = ops.pack_quantized(head_q.q, head_q.d, head_q.o, head_q.bits, head_q.group,
                                     act_asym=not head_q.act_symmetric)
    elif tied:
        lm_head = ops.pack_weight(embed, dtype)
    else:
        lm_head = matrix([(head_name, (c.vocab_size, h))], may_quantize=False)
    return ModelWeights(dtype, embed, layers, _as_f32(tensor("model.norm.weight", (h,))), lm_head,
                        label)


def _group_name(group: int) -> str:
    return f"g{group}" if group else "ch"


def _origin(source) -> str:
    if isinstance(source, GGUFSource):
        return "GGUF"
    return "compressed-tensors"
