"""sources: a checkpoint's tensors as load_weights (model/weights.py) reads them:
HFSource (a safetensors directory, compressed-tensors and MXFP4 experts
included) and GGUFSource (a GGUF file), each handing out a matrix's rows a
chunk at a time (`float_rows`, `quantized_rows`) and telling the format a
quantized tensor runs in as stored (`native_format`, a QuantFormat). Both speak
the architecture's logical (Hugging Face) names and find each tensor where the
architecture file says it is stored (model/arch: a TensorRef)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from armllm import ops
from armllm.model import arch
from armllm.model.arch import TensorRef
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


def _logical(a: np.ndarray, ref: TensorRef) -> np.ndarray:
    """A stored float tensor as its logical value: + ref.add, or log(-a) (log_neg)."""
    if ref.log_neg:
        return np.log(-as_f32(a))
    return as_f32(a) + np.float32(ref.add) if ref.add else a


def chunk_rows(k: int) -> int:
    return max(1, CHUNK_BYTES // (4 * k))


class _StoredNames:
    """A checkpoint's tensor names as an architecture's hf_tensor asks after them (which
    of two prefixes a multimodal checkpoint stores its language model under): a
    pack-quantized Linear's weight is stored, as its weight_packed."""

    def __init__(self, ckpt: SafetensorsCheckpoint):
        self.ckpt = ckpt

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt or (name.endswith(".weight") and f"{name}_packed" in self.ckpt)


class HFSource:
    """Tensors of a Hugging Face safetensors checkpoint, by HF name; the Linear
    layers of a compressed-tensors checkpoint come quantized (get_quantized) or
    dequantized (get); GPT-OSS's stacked experts under per-expert names, MXFP4 ones
    as stored (native_format, raw_rows: see stacked_experts)."""

    def __init__(self, model_dir: str | Path, ct: CTConfig | None = None,
                 config: ModelConfig | None = None):
        self.ckpt = SafetensorsCheckpoint(model_dir)
        self.where = str(model_dir)
        self.ct = ct
        self.stacked = StackedExperts(self.ckpt)
        # logical name -> TensorRef (None: every tensor under its own name)
        self._family = None if config is None else arch.of(config)
        self._config = config

    def _ref(self, name: str) -> TensorRef:
        if self._family is None:
            return TensorRef(name)
        return self._family.hf_tensor(self._config, name, _StoredNames(self.ckpt))

    def _quantized_module(self, name: str):
        if self.ct is None or not name.endswith(".weight"):
            return None
        module = name[:-len(".weight")]
        if f"{module}.weight_scale" not in self.ckpt:
            return None
        return module, self.ct.weight_args(module)

    def has(self, name: str) -> bool:
        if self.stacked.find(name) is not None:
            return True
        name = self._ref(name).name
        return name in self.ckpt or (
            self._quantized_module(name) is not None and f"{name}_packed" in self.ckpt)

    def get(self, name: str) -> np.ndarray:
        if self.stacked.find(name) is not None:
            return np.concatenate([rows for _, rows in self.float_rows(name, 1 << 30)])
        ref = self._ref(name)
        if self._quantized_module(ref.name) is not None:
            a = self.get_quantized(name, None).dequantize()
        else:
            a = self.ckpt.array(ref.name)
            a = a[_row_slice(ref)] if ref.rows else a
        return _logical(a, ref)

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
        found = self._scheme(self._ref(name).name)
        if found is None:
            return None
        args = found[1][0]
        return QuantFormat(args.bits, args.group, args.act_symmetric)

    def get_quantized(self, name: str, shape: tuple[int, int] | None) -> QuantizedMatrix | None:
        ref = self._ref(name)
        found = self._scheme(ref.name)
        if found is None:
            return None
        module, (args, fmt) = found
        qm = ct_load_matrix(self.ckpt.array, self.ckpt.__contains__, module, args, fmt,
                            self._shape(module), self.where)
        return qm.take_rows(_row_slice(ref)) if ref.rows else qm

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
        ref = self._ref(name)
        if self._quantized_module(ref.name) is None:
            yield from _cut_rows(self.ckpt.row_chunks(ref.name, rows), ref)
            return
        qm = self.get_quantized(name, None)
        self._release_module(ref.name)
        for row0 in range(0, qm.shape[0], rows):
            yield row0, qm.take_rows(slice(row0, row0 + rows)).dequantize()

    def quantized_rows(self, name: str, shape: tuple[int, int], rows: int):
        """(0, the whole layer) of a compressed-tensors layer: its int tensors are read
        whole (about the size of the packed weight), then their file pages released."""
        qm = self.get_quantized(name, shape)
        self._release_module(self._ref(name).name)
        yield 0, qm

    def raw_rows(self, name: str, shape: tuple[int, int], rows: int):
        """(first row, uint8 GGUF MXFP4 blocks of up to `rows` rows) of an MXFP4 expert."""
        yield from self.stacked.raw_rows(self.stacked.find(name), rows)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape from the headers (a compressed-tensors layer's unpacked)."""
        stacked = self.stacked.find(name)
        if stacked is not None:
            return self.stacked.shape(stacked)
        ref = self._ref(name)
        if self._quantized_module(ref.name) is not None:
            shape = self._shape(ref.name[:-len(".weight")])
        else:
            shape = tuple(self.ckpt.array(ref.name).shape)
        return (ref.rows[1], *shape[1:]) if ref.rows else shape

    def _release_module(self, name: str) -> None:
        module = name[:-len(".weight")]
        for suffix in ("weight", "weight_packed", "weight_scale", "weight_zero_point"):
            if f"{module}.{suffix}" in self.ckpt:
                self.ckpt.release(f"{module}.{suffix}")


class GGUFSource:
    """Tensors of a GGUF file under the architecture's logical names, as stored or
    dequantized, found where its architecture file says llama.cpp's converter put
    them (a row range of a fused tensor, an expert's rows of a stacked one), with
    the converter's Q/K row permutation undone where it applied one."""

    def __init__(self, gguf: GGUFFile, config: ModelConfig):
        self.gguf, self.config, self.where = gguf, config, str(gguf.path)
        self._family = arch.of(config)

    def _ref(self, name: str) -> TensorRef:
        return self._family.gguf_tensor(self.config, name)

    def _locate(self, name: str) -> tuple[str, int, tuple[int, ...] | None]:
        """(GGUF tensor, its first row, shape) of a logical tensor: a row range of a
        fused tensor, an expert's slice of a stacked one (shape None: no such tensor,
        rows or expert)."""
        ref = self._ref(name)
        t = self.gguf.tensors.get(ref.name)
        if t is None:
            return ref.name, 0, None
        if ref.expert is not None:
            if len(t.shape) != 3 or ref.expert >= t.shape[0]:
                return ref.name, 0, None
            return ref.name, ref.expert * t.shape[1], tuple(t.shape[1:])
        if ref.rows is not None:
            first, count = ref.rows
            if len(t.shape) != 2 or first + count > t.shape[0]:
                return ref.name, 0, None
            return ref.name, first, (count, t.shape[1])
        return ref.name, 0, tuple(t.shape)

    def has(self, name: str) -> bool:
        ref = self._ref(name)
        if ref.interleave is not None:
            return ref.name in self.gguf.tensors and ref.interleave in self.gguf.tensors
        return self._locate(name)[2] is not None

    def shape(self, name: str) -> tuple[int, ...]:
        ref = self._ref(name)
        if ref.interleave is not None:
            experts, inter = self.gguf.tensors[ref.name].shape
            return (experts, 2 * inter)
        return self._locate(name)[2]

    def _rope_heads(self, name: str) -> int | None:
        return self._ref(name).rope_heads or None

    def get(self, name: str) -> np.ndarray:
        ref = self._ref(name)
        if ref.interleave is not None:   # interleaved: column 2j is the first's j
            first, second = (self.gguf.dequantize(n) for n in (ref.name, ref.interleave))
            return np.stack([first, second], axis=2).reshape(first.shape[0], -1)
        gname, first, shape = self._locate(name)
        w = self.gguf.dequantize(gname)
        if first or (shape is not None and len(w.shape) == 3):   # rows of a larger tensor
            w = w.reshape(-1, w.shape[-1])[first:first + shape[0]]
        heads = self._rope_heads(name)
        w = w if heads is None else unpermute_rope_rows(w, heads)
        return _logical(w, ref)

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


def _row_slice(ref: TensorRef) -> slice:
    return slice(ref.rows[0], ref.rows[0] + ref.rows[1])


def _cut_rows(chunks, ref: TensorRef):
    """(first row, rows) chunks of a whole tensor cut to ref's row range."""
    if ref.rows is None:
        yield from chunks
        return
    start, stop = ref.rows[0], ref.rows[0] + ref.rows[1]
    for row0, rows in chunks:
        lo, hi = max(start, row0), min(stop, row0 + rows.shape[0])
        if lo < hi:
            yield lo - start, rows[lo - row0:hi - row0]


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
