"""sources: a checkpoint's tensors as load_weights (model/weights.py) reads them:
HFSource (a safetensors directory, compressed-tensors and MXFP4 experts
included) and GGUFSource (a GGUF file), each handing out a matrix's rows a
chunk at a time (`float_rows`, `quantized_rows`) and telling the format a
quantized tensor runs in as stored (`native_format`, a QuantFormat)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from armllm import ops
from armllm.model.compressed_tensors import CTConfig
from armllm.model.compressed_tensors import load_matrix as ct_load_matrix
from armllm.model.config import ModelConfig
from armllm.model.gguf import GGML_TYPES, QUANTIZED_TYPES, TYPE_IDS, GGUFFile
from armllm.model.quantize import GGUF_QUANTIZED, QuantizedMatrix, from_gguf_blocks
from armllm.model.safetensors_file import SafetensorsCheckpoint
from armllm.model.stacked_experts import StackedExperts


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


# f32 bytes of the rows converted or quantized at a time: a conversion's temporaries
# stay a few times this whatever the matrix size (2 MiB: hundreds of rows of a 1B-8B
# model, so the per-chunk Python overhead is lost in the work, and a few MiB at most
# next to the weights)
CHUNK_BYTES = 2 << 20


def chunk_rows(k: int) -> int:
    return max(1, CHUNK_BYTES // (4 * k))


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
        bits, group = GGUF_QUANTIZED.get(
            t.type_name, (0, ops.gguf_act_group([TYPE_IDS[t.type_name]])))
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
        for row0, rows in self.raw_rows(name, shape, chunk_rows(shape[1])):
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


def as_f32(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:
        return ops.bf16_to_f32(a)
    return np.ascontiguousarray(a, dtype=np.float32)


def as_bf16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a) if a.dtype == np.uint16 else ops.f32_to_bf16(as_f32(a))
