"""weights: loads a checkpoint's tensors (safetensors directory or GGUF),
checks every shape against the config, converts to the chosen precision and
prepacks the linear layers once (fused QKV and gate/up), so that `forward`
never converts or repacks anything. Loading holds little beyond the packed
weights: a source (HFSource, GGUFSource) hands out a matrix's rows a chunk at
a time (`float_rows`, `quantized_rows`) and releases each chunk's file pages
once the next is asked for (see load_weights). `linear_formats` tells from a checkpoint's
metadata alone what format each linear weight will load in (what `armllm plan`
and the Workspace size memory by)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

from armllm import ops
from armllm.model.compressed_tensors import CTConfig
from armllm.model.compressed_tensors import load_matrix as ct_load_matrix
from armllm.model.config import ModelConfig
from armllm.model.gguf import GGML_TYPES, QUANTIZED_TYPES, TYPE_IDS, GGUFFile
from armllm.model.quantize import (
    GGUF_QUANTIZED,
    QuantizedMatrix,
    Scheme,
    from_gguf_blocks,
    num_groups,
    quantize_rtn,
)
from armllm.model.safetensors_file import SafetensorsCheckpoint
from armllm.model.stacked_experts import StackedExperts

WeightDtype = Literal["f32", "bf16"]


class HFSource:
    """Tensors of a Hugging Face safetensors checkpoint, by HF name; the Linear
    layers of a compressed-tensors checkpoint come quantized (get_quantized) or
    dequantized (get); GPT-OSS's stacked experts under per-expert names, MXFP4 ones
    as stored (native_format, raw_rows: see stacked_experts)."""

    def __init__(self, model_dir: str | Path, ct: CTConfig | None = None):
        self.ckpt = SafetensorsCheckpoint(model_dir)
        self.where = str(model_dir)
        self.ct = ct
        self.stacked = StackedExperts(self.ckpt)

    def _quantized_module(self, name: str):
        if self.ct is None or not name.endswith(".weight"):
            return None
        module = name[:-len(".weight")]
        if f"{module}.weight_scale" not in self.ckpt:
            return None
        return module, self.ct.weight_args(module)

    def has(self, name: str) -> bool:
        return name in self.ckpt or self.stacked.find(name) is not None or (
            self._quantized_module(name) is not None and f"{name}_packed" in self.ckpt)

    def get(self, name: str) -> np.ndarray:
        if self.stacked.find(name) is not None:
            return np.concatenate([rows for _, rows in self.float_rows(name, 1 << 30)])
        if self._quantized_module(name) is not None:
            return self.get_quantized(name, None).dequantize()
        return self.ckpt.array(name)

    def _scheme(self, name: str):
        """(module, (WeightArgs, format)) of a quantized Linear's weight, else None."""
        found = self._quantized_module(name)
        if found is None:
            return None
        module, scheme = found
        if scheme is None:
            raise ValueError(f"{self.where}: tensor {module}.weight_scale belongs to a layer "
                             "the quantization_config does not target")
        return module, scheme

    def native_format(self, name: str, shape: tuple[int, int]) -> QuantFormat | None:
        """The format get_quantized gives `name` in (or raw_rows, for MXFP4 experts: the
        GGUF-block GEMM's), from the config and headers alone."""
        stacked = self.stacked.find(name)
        if stacked is not None:
            if not stacked.mxfp4 or self.stacked.shape(stacked) != tuple(shape):
                return None
            return QuantFormat(0, ops.GGUF_ACT_GROUP, gguf=(("MXFP4", shape[0]),))
        found = self._scheme(name)
        if found is None:
            return None
        args = found[1][0]
        return QuantFormat(args.bits, args.group, args.act_symmetric)

    def get_quantized(self, name: str, shape: tuple[int, int] | None) -> QuantizedMatrix | None:
        found = self._scheme(name)
        if found is None:
            return None
        module, (args, fmt) = found
        if shape is None:
            shape = self._shape(module)
        return ct_load_matrix(self.ckpt.array, self.ckpt.__contains__, module, args, fmt, shape,
                              self.where)

    def _shape(self, module: str) -> tuple[int, int]:
        if f"{module}.weight" in self.ckpt:
            return tuple(self.ckpt.array(f"{module}.weight").shape)
        return tuple(int(v) for v in self.ckpt.array(f"{module}.weight_shape"))

    def float_rows(self, name: str, rows: int):
        """(first row, float rows) of a matrix, up to `rows` rows at a time: views of the
        file (bf16 as uint16 bits), or a compressed-tensors layer dequantized; a chunk's
        file pages are released when the next chunk is asked for."""
        stacked = self.stacked.find(name)
        if stacked is not None:
            yield from self.stacked.float_rows(stacked, rows)
            return
        if self._quantized_module(name) is None:
            yield from self.ckpt.row_chunks(name, rows)
            return
        qm = self.get_quantized(name, None)
        self._release_module(name)
        for row0 in range(0, qm.shape[0], rows):
            yield row0, qm.take_rows(slice(row0, row0 + rows)).dequantize()

    def quantized_rows(self, name: str, shape: tuple[int, int], rows: int):
        """(0, the whole layer) of a compressed-tensors layer: its int tensors are read
        whole (about the size of the packed weight), then their file pages released."""
        qm = self.get_quantized(name, shape)
        self._release_module(name)
        yield 0, qm

    def raw_rows(self, name: str, shape: tuple[int, int], rows: int):
        """(first row, uint8 GGUF MXFP4 blocks of up to `rows` rows) of an MXFP4 expert."""
        yield from self.stacked.raw_rows(self.stacked.find(name), rows)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape from the headers (a compressed-tensors layer's unpacked)."""
        stacked = self.stacked.find(name)
        if stacked is not None:
            return self.stacked.shape(stacked)
        if self._quantized_module(name) is not None:
            return self._shape(name[:-len(".weight")])
        return tuple(self.ckpt.array(name).shape)

    def _release_module(self, name: str) -> None:
        module = name[:-len(".weight")]
        for suffix in ("weight", "weight_packed", "weight_scale", "weight_zero_point"):
            if f"{module}.{suffix}" in self.ckpt:
                self.ckpt.release(f"{module}.{suffix}")


class GGUFSource:
    """Tensors of a GGUF file under their HF names, as stored or dequantized, with
    the Q/K row permutation of llama.cpp's converter undone (its "llama" files only:
    the others keep HF's rows, as their RoPE is neox-style)."""

    _LAYER = {"input_layernorm.weight": "attn_norm.weight",
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
              "self_attn.sinks": "attn_sinks.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight",
              "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight",
              "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
              "mlp.gate.weight": "ffn_gate_inp.weight",
              "mlp.router.weight": "ffn_gate_inp.weight",
              "mlp.router.bias": "ffn_gate_inp.bias",
              "mlp.experts.down_proj_bias": "ffn_down_exps.bias"}
    # GPT-OSS's post-attention norm has its own GGUF name
    _LAYER_GPT_OSS = {"post_attention_layernorm.weight": "post_attention_norm.weight"}
    # an expert's matrix: rows of the layer's stacked [experts, N, K] tensor (Mixtral's
    # names, Qwen3-MoE's and GPT-OSS's)
    _EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\."
                         r"(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight")
    _EXPERT_GGUF = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps",
                    "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                    "down_proj": "ffn_down_exps"}
    # GPT-OSS's [E, 2 inter] expert gate/up bias, rows interleaved as in its checkpoint,
    # from the GGUF's separate gate and up biases
    _GATE_UP_BIAS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj_bias")

    def __init__(self, gguf: GGUFFile, config: ModelConfig):
        self.gguf, self.config, self.where = gguf, config, str(gguf.path)
        self.permuted_rope = config.architecture in ("LlamaForCausalLM", "MixtralForCausalLM")

    def _locate(self, name: str) -> tuple[str, int, tuple[int, ...] | None]:
        """(GGUF tensor, its first row, shape) of an HF-named tensor; an expert's is a
        slice of its layer's stacked tensor (shape None: no such tensor or expert)."""
        m = self._EXPERT.fullmatch(name)
        if m is None:
            gname = self._gguf_name(name)
            t = self.gguf.tensors.get(gname)
            return gname, 0, None if t is None else tuple(t.shape)
        layer, expert, which = int(m[1]), int(m[2]), m[3]
        gname = f"blk.{layer}.{self._EXPERT_GGUF[which]}.weight"
        t = self.gguf.tensors.get(gname)
        if t is None or len(t.shape) != 3 or expert >= t.shape[0]:
            return gname, 0, None
        return gname, expert * t.shape[1], tuple(t.shape[1:])

    def _gguf_name(self, name: str) -> str:
        if name == "model.embed_tokens.weight":
            return "token_embd.weight"
        if name == "model.norm.weight":
            return "output_norm.weight"
        if name == "lm_head.weight":
            return "output.weight"
        parts = name.split(".", 3)  # model.layers.N.rest
        if len(parts) == 4 and parts[1] == "layers":
            if self.config.architecture == "GptOssForCausalLM" and \
                    parts[3] in self._LAYER_GPT_OSS:
                return f"blk.{parts[2]}.{self._LAYER_GPT_OSS[parts[3]]}"
            if parts[3] in self._LAYER:
                return f"blk.{parts[2]}.{self._LAYER[parts[3]]}"
        return name

    def _gate_up_bias(self, name: str) -> tuple[str, str] | None:
        m = self._GATE_UP_BIAS.fullmatch(name)
        return None if m is None else (f"blk.{m[1]}.ffn_gate_exps.bias",
                                       f"blk.{m[1]}.ffn_up_exps.bias")

    def has(self, name: str) -> bool:
        pair = self._gate_up_bias(name)
        if pair is not None:
            return all(n in self.gguf.tensors for n in pair)
        return self._locate(name)[2] is not None

    def shape(self, name: str) -> tuple[int, ...]:
        pair = self._gate_up_bias(name)
        if pair is not None:
            experts, inter = self.gguf.tensors[pair[0]].shape
            return (experts, 2 * inter)
        return self._locate(name)[2]

    def _rope_heads(self, name: str) -> int | None:
        if self.permuted_rope and name.endswith(("self_attn.q_proj.weight",
                                                 "self_attn.k_proj.weight")):
            return self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
        return None

    def get(self, name: str) -> np.ndarray:
        pair = self._gate_up_bias(name)
        if pair is not None:   # interleaved: row 2j is gate j, 2j + 1 up j
            gate, up = (self.gguf.dequantize(n) for n in pair)
            return np.stack([gate, up], axis=2).reshape(gate.shape[0], -1)
        w = self.gguf.dequantize(self._gguf_name(name))
        heads = self._rope_heads(name)
        return w if heads is None else unpermute_rope_rows(w, heads)

    def _quantized_tensor(self, name: str, shape: tuple[int, int], types=GGUF_QUANTIZED):
        gname, _, found = self._locate(name)
        t = self.gguf.tensors.get(gname)
        if t is None or t.type_name not in types or found != tuple(shape):
            return None
        return t

    def native_format(self, name: str, shape: tuple[int, int]) -> QuantFormat | None:
        """The format `name` runs in as stored, from the tensor's type alone: Q8_0 / Q4_0
        / Q4_1 map to the int8/int4 GEMM's (bits, group) (quantized_rows), and every
        quantized type the kernels decode runs on the GGUF-block GEMM (raw_rows)."""
        t = self._quantized_tensor(name, shape, QUANTIZED_TYPES)
        if t is None:
            return None
        bits, group = GGUF_QUANTIZED.get(t.type_name, (0, ops.GGUF_ACT_GROUP))
        return QuantFormat(bits, group, gguf=((t.type_name, shape[0]),))

    def raw_rows(self, name: str, shape: tuple[int, int], rows: int):
        """(first row, uint8 [rows, row bytes]) of a quantized tensor as stored, up to
        about `rows` rows at a time (Q/K rows back in HF order); a chunk's file pages are
        released when the next one is asked for."""
        gname, first, _ = self._locate(name)
        for row0, row1, unit in self._row_ranges(name, shape[0], rows):
            raw = self.gguf.raw_rows(gname, first + row0, first + row1).reshape(row1 - row0, -1)
            yield row0, raw if unit is None else unpermute_rope_rows(raw, (row1 - row0) // unit)
            self.gguf.release(gname, first + row0, first + row1)

    def embedding_table(self, name: str, shape: tuple[int, int]) -> ops.GGUFTable | None:
        """A quantized embedding table as stored (a private copy; the file's pages are
        released), or None when it is stored as floats."""
        t = self._quantized_tensor(name, shape, QUANTIZED_TYPES)
        if t is None:
            return None
        raw = np.empty((shape[0], t.nbytes // shape[0]), np.uint8)
        for row0, rows in self.raw_rows(name, shape, _chunk_rows(shape[1])):
            raw[row0:row0 + len(rows)] = rows
        return ops.GGUFTable(raw, t.ggml_type, shape[1])

    def _row_ranges(self, name: str, n: int, rows: int):
        """[row0, row1) ranges of up to `rows` rows (at least one), and for Q/K the rows of
        one head (else None): their ranges hold whole heads, since llama.cpp's RoPE
        permutation moves rows within a head only."""
        heads = self._rope_heads(name)
        unit = n // heads if heads else 1
        step = max(unit, rows // unit * unit)
        for row0 in range(0, n, step):
            yield row0, min(n, row0 + step), unit if heads else None

    def float_rows(self, name: str, rows: int):
        """(first row, float rows) of a matrix, up to about `rows` rows at a time: views
        of F32/F16/BF16 data (BF16 as uint16 bits), quantized types dequantized to
        float32; a chunk's file pages are released when the next one is asked for."""
        gname, first, shape = self._locate(name)
        for row0, row1, unit in self._row_ranges(name, shape[0], rows):
            w = self.gguf.float_rows(gname, first + row0, first + row1)
            yield row0, w if unit is None else unpermute_rope_rows(w, (row1 - row0) // unit)
            self.gguf.release(gname, first + row0, first + row1)

    def quantized_rows(self, name: str, shape: tuple[int, int], rows: int):
        """(first row, QuantizedMatrix of up to about `rows` rows) of a Q8_0 / Q4_0 / Q4_1
        tensor, exactly as the quantized GEMM's (q, d, o); a chunk's file pages are
        released when the next one is asked for."""
        t = self._quantized_tensor(name, shape)
        if t is None:
            raise ValueError(f"{self.where}: tensor {name} is not stored quantized as "
                             f"{list(shape)}")
        gname, first, _ = self._locate(name)
        for row0, row1, unit in self._row_ranges(name, shape[0], rows):
            blocks = self.gguf.raw_rows(gname, first + row0, first + row1).reshape(
                -1, GGML_TYPES[t.ggml_type][2])
            count = row1 - row0
            qm = from_gguf_blocks(t.type_name, blocks, count, shape[1])
            if unit is not None:
                qm = qm.take_rows(unpermute_rope_rows(np.arange(count), count // unit))
            yield row0, qm
            self.gguf.release(gname, first + row0, first + row1)


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


@dataclass(frozen=True)
class QuantFormat:
    """How a quantized linear weight runs: int`bits` values in scale groups of
    `group` columns (0: one scale a row), meeting symmetric int8 activations or,
    act_symmetric False, ones with zero points."""
    bits: int
    group: int
    act_symmetric: bool = True
    # GGUF tensors as stored: (ggml type name, rows) of each part. With bits 0 they run
    # on the GGUF-block GEMM; Q8_0/Q4_0/Q4_1 alone keep their bits and the int8/int4 GEMM
    gguf: tuple[tuple[str, int], ...] | None = None

    @property
    def runs_gguf(self) -> bool:
        """Packed for the GGUF-block GEMM (ops.pack_gguf)."""
        return self.bits == 0


LAYER_LINEARS = ("qkv", "o", "gate_up", "down")   # a layer's packed linear weights


@dataclass(frozen=True)
class LinearFormats:
    """What each linear weight runs as: per layer the LAYER_LINEARS weights' formats,
    and the lm_head's; None: a float weight in the model's dtype."""
    layers: tuple[tuple[QuantFormat | None, ...], ...]
    lm_head: QuantFormat | None
    embed_gguf: str | None = None   # the embedding table kept as stored in this ggml type


# the checkpoint names of a sparse layer's router and of expert e's gate, up and down
# projections, under "model.layers.{i}.", by architecture
_MOE_NAMES = {
    "MixtralForCausalLM": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                           "block_sparse_moe.experts.{e}.w3.weight",
                           "block_sparse_moe.experts.{e}.w2.weight"),
    "Qwen3MoeForCausalLM": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                            "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    # slices of the layer's stacked tensors (stacked_experts)
    "GptOssForCausalLM": ("mlp.router.weight", "mlp.experts.{e}.gate_proj.weight",
                          "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
}


def _layer_tensors(c: ModelConfig, i: int, expert: int = 0
                   ) -> list[list[tuple[str, tuple[int, int]]]]:
    """The checkpoint tensors (name, [N, K]) of layer i's packed linear weights, in
    LAYER_LINEARS order: q/k/v fused, o, gate/up fused, down; in a sparse layer the
    gate/up and down of expert `expert`."""
    p = f"model.layers.{i}."
    h, q, kv, inter = c.hidden_size, c.q_size, c.kv_size, c.mlp_size(i)
    gate, up, down = p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", \
        p + "mlp.down_proj.weight"
    if c.is_moe_layer(i):
        gate, up, down = (p + n.format(e=expert) for n in _MOE_NAMES[c.architecture][1:])
    return [[(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
             (p + "self_attn.v_proj.weight", (kv, h))],
            [(p + "self_attn.o_proj.weight", (h, q))],
            [(gate, (inter, h)), (up, (inter, h))],
            [(down, (h, inter))]]


def _router_tensor(c: ModelConfig, i: int) -> tuple[str, tuple[int, int]]:
    return f"model.layers.{i}." + _MOE_NAMES[c.architecture][0], (c.num_experts, c.hidden_size)


def linear_shapes(c: ModelConfig, i: int = 0) -> list[tuple[int, int]]:
    """[N, K] of layer i's packed linear weights, in LAYER_LINEARS order (a sparse
    layer's gate_up and down: one expert's)."""
    return [(sum(n for _, (n, _) in parts), parts[0][1][1]) for parts in _layer_tensors(c, i)]


@dataclass
class MoEWeights:
    """A sparse layer's MLP: the router [experts, hidden] (float, kept in the model's
    dtype) and each expert's fused [gate; up] and down weights, one format for all;
    GPT-OSS's biases: the router's [experts], the experts' [experts, 2 inter] ([gate;
    up] as the weights) and [experts, hidden], float32."""
    router: ops.PackedWeight
    gate_up: list[ops.PackedWeight]
    down: list[ops.PackedWeight]
    router_bias: np.ndarray | None = None
    gate_up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None


@dataclass
class LayerWeights:
    input_norm: np.ndarray
    qkv: ops.PackedWeight          # [q; k; v] rows
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None      # per-head RMSNorm weights (Qwen3)
    k_norm: np.ndarray | None
    o: ops.PackedWeight
    post_norm: np.ndarray
    gate_up: ops.PackedWeight | None   # [gate; up] rows (None in a sparse layer)
    down: ops.PackedWeight | None
    moe: MoEWeights | None = None
    o_bias: np.ndarray | None = None   # GPT-OSS
    sinks: np.ndarray | None = None    # [heads] attention sink logits (GPT-OSS)

    def mlp_weights(self) -> tuple[ops.PackedWeight, ops.PackedWeight]:
        """The (gate_up, down) whose formats stand for the layer's MLP: expert 0's in a
        sparse layer (every expert shares them)."""
        if self.moe is not None:
            return self.moe.gate_up[0], self.moe.down[0]
        return self.gate_up, self.down

    @property
    def nbytes(self) -> int:
        mlp = ([self.moe.router, *self.moe.gate_up, *self.moe.down] if self.moe
               else [self.gate_up, self.down])
        return sum(w.nbytes for w in (self.qkv, self.o, *mlp))


@dataclass
class ModelWeights:
    dtype: WeightDtype
    embed: np.ndarray | ops.GGUFTable  # [vocab, hidden] float32, uint16 bf16 bits, or GGUF blocks
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: ops.PackedWeight
    quantization: str | None = None   # what the linear layers run as, e.g. "w4a8-g32 (GGUF Q4_1)"

    @property
    def nbytes(self) -> int:
        return sum(lw.nbytes for lw in self.layers) + self.embed.nbytes + self.lm_head.nbytes

    @cached_property
    def formats(self) -> LinearFormats | None:
        """The formats of the packed linear weights (None: all float)."""
        def fmt(w: ops.PackedWeight) -> QuantFormat | None:
            if w.dtype == "gguf":
                return QuantFormat(0, w.group, gguf=tuple(
                    (GGML_TYPES[t][0], r) for t, r in zip(w.gguf_types, w.gguf_rows, strict=True)))
            return QuantFormat(w.bits, w.group, w.zp_correction is None) if w.quantized \
                else None
        embed = GGML_TYPES[self.embed.ggml_type][0] if isinstance(self.embed, ops.GGUFTable) \
            else None
        return _formats_or_none(
            tuple((fmt(lw.qkv), fmt(lw.o), *map(fmt, lw.mlp_weights())) for lw in self.layers),
            fmt(self.lm_head), embed)


def _packed_format(w: ops.PackedWeight) -> tuple:
    """What distinguishes the formats of two packed weights."""
    return (w.dtype, w.bits, w.group, w.gguf_types, w.zp_correction is None)


def _formats_or_none(layers: tuple[tuple[QuantFormat | None, ...], ...],
                     lm_head: QuantFormat | None, embed_gguf: str | None = None
                     ) -> LinearFormats | None:
    if lm_head is None and embed_gguf is None and all(f is None for layer in layers
                                                      for f in layer):
        return None
    return LinearFormats(layers, lm_head, embed_gguf)


Quantization = Literal["auto", "none"] | Scheme


def _fused_format(natives: list[QuantFormat | None], quantization: Quantization
                  ) -> QuantFormat | None:
    """What one packed matrix runs as, from the formats its parts are stored in (None:
    float): under "auto" the stored format when every part shares it (mixed parts run
    as floats), a Scheme's own format, or None for "none"."""
    if quantization == "none":
        return None
    if quantization == "auto":
        if any(f is None for f in natives):
            return None
        if len({(f.bits, f.group) for f in natives}) == 1 and natives[0].bits:
            # one quantization of the input serves every part: asymmetric if any asks
            return QuantFormat(natives[0].bits, natives[0].group,
                               all(f.act_symmetric for f in natives))
        if all(f.gguf for f in natives):   # GGUF parts of other types: each as stored
            return QuantFormat(0, ops.GGUF_ACT_GROUP, gguf=sum((f.gguf for f in natives), ()))
        return None
    return QuantFormat(quantization.bits, quantization.group, quantization.act_symmetric)


def _quantizes_head(quantization: Quantization, quantize_lm_head: bool) -> bool:
    return quantization == "auto" or (quantize_lm_head and quantization != "none")


def _head_tensor(c: ModelConfig) -> tuple[str, tuple[int, int]]:
    name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    return name, (c.vocab_size, c.hidden_size)


def linear_formats(source, config: ModelConfig, quantization: Quantization = "auto",
                   quantize_lm_head: bool = False) -> LinearFormats | None:
    """What load_weights runs each linear weight of `source` as (None: all float), from
    the checkpoint's metadata alone: no tensor data is read."""
    getter = getattr(source, "native_format", None)

    def fmt(names_shapes: list[tuple[str, tuple[int, int]]]) -> QuantFormat | None:
        if quantization == "none":
            return None
        natives = [getter(n, s) if getter else None for n, s in names_shapes]
        return _fused_format(natives, quantization)

    layers = tuple(tuple(fmt(parts) for parts in _layer_tensors(config, i))
                   for i in range(config.num_layers))
    head = fmt([_head_tensor(config)]) if _quantizes_head(quantization, quantize_lm_head) \
        else None
    embed = getter(*_embed_tensor(config)) if getter and quantization == "auto" else None
    return _formats_or_none(layers, head, embed.gguf[0][0] if embed and embed.gguf else None)


def _embed_tensor(c: ModelConfig) -> tuple[str, tuple[int, int]]:
    return "model.embed_tokens.weight", (c.vocab_size, c.hidden_size)


# f32 bytes of the rows converted or quantized at a time: a conversion's temporaries
# stay a few times this whatever the matrix size (2 MiB: hundreds of rows of a 1B-8B
# model, so the per-chunk Python overhead is lost in the work, and a few MiB at most
# next to the weights)
CHUNK_BYTES = 2 << 20


def _chunk_rows(k: int) -> int:
    return max(1, CHUNK_BYTES // (4 * k))


def load_weights(source, config: ModelConfig, dtype: WeightDtype = "bf16",
                 progress=None, quantization: Quantization = "auto",
                 quantize_lm_head: bool = False) -> ModelWeights:
    """Reads, checks, converts and packs every tensor of the model.

    quantization: "auto" runs the checkpoint's own quantized layers as they are (GGUF's
    quantized types, compressed-tensors) and float layers in `dtype`, and keeps a GGUF's
    quantized embedding table as stored (the gather dequantizes the rows it reads);
    "none" dequantizes everything to `dtype`; a Scheme quantizes float layers at load
    (round to nearest) and keeps quantized ones that already match it, embeddings in
    `dtype`. A fused matrix whose GGUF parts differ in type (a Q4_K_M file's Q4_K Q/K and
    Q6_K V) runs each part as stored on the GGUF-block GEMM. The lm_head
    follows the linear layers' rule when the checkpoint stores it quantized ("auto", e.g.
    a GGUF's Q8_0 token_embd under a tied head, runs as is, as llama.cpp runs it) or when
    quantize_lm_head asks for it; a float lm_head otherwise stays in `dtype`.

    Memory: loading holds little beyond the packed weights. Each packed matrix is built
    from its parts a chunk of rows at a time (converted, dequantized or quantized per
    chunk) into one buffer in the pack's input form, and each chunk's file pages are
    released once it is copied, so the file's pages do not stay resident; the buffer (one
    matrix's pack input) is the only transient. The embeddings and lm_head, the largest
    matrices, come first, while the least is resident."""
    if dtype not in ("f32", "bf16"):
        raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")
    if not (isinstance(quantization, Scheme) or quantization in ("auto", "none")):
        raise ValueError(f"quantization must be auto, none or a Scheme, got {quantization!r}")
    c = config
    used: set[str] = set()   # what the linear layers ended up as

    def check(name: str, shape: tuple[int, ...]) -> None:
        if not source.has(name):
            raise ValueError(f"{source.where}: missing tensor {name}")
        found = source.shape(name)
        if tuple(found) != shape:
            raise ValueError(f"{source.where}: tensor {name} has shape {list(found)}, "
                             f"expected {list(shape)} for this config")

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        check(name, shape)
        return source.get(name)

    def float_matrix(names_shapes, out_dtype: WeightDtype) -> np.ndarray:
        """The parts' rows stacked into one new [N, K] array in `out_dtype` (bf16 as
        uint16 bits), converted a chunk at a time."""
        conv = _as_bf16 if out_dtype == "bf16" else _as_f32
        k = names_shapes[0][1][1]
        out = np.empty((sum(n for _, (n, _) in names_shapes), k),
                       np.uint16 if out_dtype == "bf16" else np.float32)
        first = 0
        for name, shape in names_shapes:
            check(name, shape)
            for row0, rows in source.float_rows(name, _chunk_rows(k)):
                out[first + row0:first + row0 + len(rows)] = conv(rows)
            first += shape[0]
        return out

    def quantized_matrix(names_shapes, natives: list[QuantFormat | None], fmt: QuantFormat
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(q, d, o) of the parts' rows stacked, in `fmt`: each part as stored when it is
        stored in fmt's bits and group, else quantized (round to nearest) a chunk at a
        time."""
        k = names_shapes[0][1][1]
        n, chunk = sum(s[0] for _, s in names_shapes), _chunk_rows(k)
        q = np.empty((n, k), np.int8)
        d = np.empty((n, num_groups(k, fmt.group)), np.float32)
        o = np.zeros_like(d) if fmt.bits == 4 else None
        first = 0
        for (name, shape), nat in zip(names_shapes, natives, strict=True):
            if nat is not None and (nat.bits, nat.group) == (fmt.bits, fmt.group):
                chunks = source.quantized_rows(name, shape, chunk)   # no second rounding
            else:
                chunks = ((row0, quantize_rtn(_as_f32(rows), quantization))
                          for row0, rows in source.float_rows(name, chunk))
            for row0, qm in chunks:
                rows = slice(first + row0, first + row0 + qm.shape[0])
                q[rows], d[rows] = qm.q, qm.d
                if qm.o is not None:
                    o[rows] = qm.o
            first += shape[0]
        return q, d, o

    def gguf_matrix(names_shapes, fmt: QuantFormat) -> ops.PackedWeight:
        """The parts' rows as stored, one after another, packed for the GGUF-block GEMM."""
        k = names_shapes[0][1][1]
        sizes = [n * GGML_TYPES[TYPE_IDS[t]][2] * k // GGML_TYPES[TYPE_IDS[t]][1]
                 for t, n in fmt.gguf]
        blocks, first = np.empty(sum(sizes), np.uint8), 0
        for (name, shape), size in zip(names_shapes, sizes, strict=True):
            part = blocks[first:first + size].reshape(shape[0], -1)
            for row0, rows in source.raw_rows(name, shape, _chunk_rows(k)):
                part[row0:row0 + len(rows)] = rows
            first += size
        return ops.pack_gguf(blocks, k, [TYPE_IDS[t] for t, _ in fmt.gguf],
                             [n for _, n in fmt.gguf])

    def matrix(names_shapes: list[tuple[str, tuple[int, int]]],
               may_quantize: bool = True) -> ops.PackedWeight:
        fmt = None
        if may_quantize and quantization != "none":
            for name, shape in names_shapes:
                check(name, shape)
            natives = [source.native_format(n, s) for n, s in names_shapes]
            fmt = _fused_format(natives, quantization)
        if fmt is None:  # float, or mixed formats within one fused matrix: run in dtype
            if may_quantize:
                used.add(dtype)
            return ops.pack_weight(float_matrix(names_shapes, dtype), dtype)
        if fmt.runs_gguf:
            origin = "GGUF" if isinstance(source, GGUFSource) else "checkpoint"
            used.update(f"{t} ({origin}, as stored)" for t, _ in fmt.gguf)
            return gguf_matrix(names_shapes, fmt)
        if quantization == "auto":
            acts = "" if fmt.act_symmetric else ", asymmetric activations"
            used.add(f"w{fmt.bits}a8-{_group_name(fmt.group)} ({_origin(source)}{acts})")
        else:
            used.add(quantization.name)
        q, d, o = quantized_matrix(names_shapes, natives, fmt)
        return ops.pack_quantized(q, d, o, fmt.bits, fmt.group, act_asym=not fmt.act_symmetric)

    h, q, kv = c.hidden_size, c.q_size, c.kv_size
    embed = None
    if quantization == "auto" and hasattr(source, "embedding_table"):
        check(*_embed_tensor(c))
        embed = source.embedding_table(*_embed_tensor(c))
    if embed is None:
        embed = float_matrix([_embed_tensor(c)], dtype)
    head = [_head_tensor(c)]
    head_fmt = None
    if _quantizes_head(quantization, quantize_lm_head) and quantization != "none":
        check(*head[0])
        head_fmt = _fused_format([source.native_format(*head[0])], quantization)
    if head_fmt is not None:
        lm_head = matrix(head)
        head_label = ", ".join(sorted(used))
        used.clear()
    elif c.tie_word_embeddings and isinstance(embed, np.ndarray):
        lm_head = ops.pack_weight(embed, dtype)
    elif c.tie_word_embeddings:   # a quantized table under a float head
        lm_head = ops.pack_weight(_as_bf16(embed.dequantize()) if dtype == "bf16"
                                  else embed.dequantize(), dtype)
    else:
        lm_head = matrix(head, may_quantize=False)

    def experts(i: int) -> MoEWeights:
        """Layer i's router and experts, every expert in expert 0's format."""
        packed = [[matrix(parts) for parts in _layer_tensors(c, i, e)[2:]]
                  for e in range(c.num_experts)]
        first = [_packed_format(w) for w in packed[0]]
        for e, pair in enumerate(packed[1:], 1):
            if [_packed_format(w) for w in pair] != first:
                raise ValueError(f"{source.where}: expert {e} of layer {i} is stored in "
                                 f"another format than expert 0; armllm runs a layer's "
                                 f"experts in one format")
        router, biases = _router_tensor(c, i), (None, None, None)
        if c.moe_bias:   # GPT-OSS: stacked per layer, gate_up's rows interleaved
            stem = f"model.layers.{i}.mlp.experts."
            e, inter = c.num_experts, c.moe_intermediate_size
            gate_up = _as_f32(tensor(stem + "gate_up_proj_bias", (e, 2 * inter)))
            biases = (_as_f32(tensor(router[0][:-len("weight")] + "bias", (e,))),
                      np.ascontiguousarray(np.concatenate([gate_up[:, 0::2], gate_up[:, 1::2]],
                                                          axis=1)),
                      _as_f32(tensor(stem + "down_proj_bias", (e, h))))
        return MoEWeights(matrix([router], may_quantize=False), [g for g, _ in packed],
                          [d for _, d in packed], *biases)

    layers = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        qkv, o, gate_up, down = _layer_tensors(c, i)
        moe = experts(i) if c.is_moe_layer(i) else None
        bias = None
        if c.attention_bias:
            bias = np.concatenate([_as_f32(tensor(p + f"self_attn.{n}_proj.bias", (size,)))
                                   for n, size in (("q", q), ("k", kv), ("v", kv))])
        layers.append(LayerWeights(
            input_norm=_as_f32(tensor(p + "input_layernorm.weight", (h,))),
            qkv=matrix(qkv),
            qkv_bias=bias,
            q_norm=_as_f32(tensor(p + "self_attn.q_norm.weight", (c.head_dim,))) if c.qk_norm
            else None,
            k_norm=_as_f32(tensor(p + "self_attn.k_norm.weight", (c.head_dim,))) if c.qk_norm
            else None,
            o=matrix(o),
            post_norm=_as_f32(tensor(p + "post_attention_layernorm.weight", (h,))),
            gate_up=None if moe else matrix(gate_up),
            down=None if moe else matrix(down),
            moe=moe,
            o_bias=_as_f32(tensor(p + "self_attn.o_proj.bias", (h,))) if c.o_bias else None,
            sinks=_as_f32(tensor(p + "self_attn.sinks", (c.num_heads,))) if c.attention_sinks
            else None,
        ))
        if progress:
            progress(i + 1, c.num_layers)
    label = ", ".join(sorted(used)) or None
    if lm_head.quantized:
        label = f"{label}; lm_head {head_label}"
    return ModelWeights(dtype, embed, layers, _as_f32(tensor("model.norm.weight", (h,))), lm_head,
                        label)


def _group_name(group: int) -> str:
    return f"g{group}" if group else "ch"


def _origin(source) -> str:
    if isinstance(source, GGUFSource):
        return "GGUF"
    return "compressed-tensors"
