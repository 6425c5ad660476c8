"""gguf: reads GGUF files: header, metadata, tensor infos, and tensor data
memory-mapped (never read twice), whole or by rows, dequantized to float32
on request; the pages of rows a loader is done with can be released.

Loads F32, F16, BF16 and the quantized types the kernels decode (LOADED_TYPES:
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4); the other ggml types
are known by name and size (a file holding them parses) and fail with one line
naming the tensor and its type when read.
Shapes are reported in numpy/Hugging Face order (outermost first), i.e.
GGUF's dims reversed. Every malformed input raises ValueError naming the
file (and tensor), never reads out of bounds.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from armllm import ops
from armllm.model.mapped import map_file, release

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_STRING = 1 << 30  # longer "strings" mean a corrupt file, not a real key or token

# ggml type id -> (name, elements per block, bytes per block): every type of ggml.h
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
FLOAT_TYPES = ("F32", "F16", "BF16")
# the quantized types the kernels decode exactly and run as stored (gguf_blocks.h)
QUANTIZED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                   "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4")
LOADED_TYPES = FLOAT_TYPES + QUANTIZED_TYPES
TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


def type_name(ggml_type: int) -> str:
    """A ggml type's name ("Q4_K"), or "id N" for an id ggml does not define."""
    return GGML_TYPES[ggml_type][0] if ggml_type in GGML_TYPES else f"id {ggml_type}"


# metadata value type id -> struct format (scalars)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_ARRAY_DTYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32,
                 5: np.int32, 6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64,
                 12: np.float64}
TYPE_STRING, TYPE_ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]   # numpy order (GGUF dims reversed)
    ggml_type: int
    offset: int              # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)


class _Reader:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file while reading {what} "
                             f"(need {n} bytes at offset {self.pos}, file has {len(self.buf)})")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        if n > MAX_STRING:
            raise ValueError(f"{self.path}: corrupt GGUF file: {what} claims {n} bytes")
        raw = bytes(self.take(n, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == TYPE_STRING:
            return self.string(what)
        if vtype == TYPE_ARRAY:
            etype = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            if etype in _ARRAY_DTYPES:
                dt = np.dtype(_ARRAY_DTYPES[etype]).newbyteorder("<")
                if count * dt.itemsize > len(self.buf):
                    raise ValueError(f"{self.path}: corrupt GGUF file: {what} claims {count} items")
                raw = self.take(count * dt.itemsize, what)
                return np.frombuffer(raw, dtype=dt).copy()
            if count > len(self.buf):
                raise ValueError(f"{self.path}: corrupt GGUF file: {what} claims {count} items")
            return [self.value(etype, what) for _ in range(count)]
        raise ValueError(f"{self.path}: corrupt GGUF file: unknown value type {vtype} for {what}")


class GGUFFile:
    """A GGUF file, memory-mapped. `metadata` holds the key/value pairs,
    `tensors` the tensor infos by name."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mmap = map_file(self.path, "GGUF")
        self._buf = memoryview(self._mmap)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensor] = {}
        self._parse()

    def _parse(self) -> None:
        r = _Reader(self._buf, self.path)
        if bytes(r.take(4, "magic")) != GGUF_MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (bad magic)")
        self.version = r.scalar("<I", "version")
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: unsupported GGUF version {self.version} (need 2 or 3)")
        n_tensors = r.scalar("<Q", "tensor count")
        n_kv = r.scalar("<Q", "metadata count")
        if n_tensors > len(self._buf) or n_kv > len(self._buf):
            raise ValueError(f"{self.path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        for _ in range(n_kv):
            key = r.string("metadata key")
            vtype = r.scalar("<I", f"type of {key}")
            self.metadata[key] = r.value(vtype, key)
        infos = []
        for _ in range(n_tensors):
            name = r.string("tensor name")
            n_dims = r.scalar("<I", f"dims of tensor {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ValueError(f"{self.path}: tensor {name} has {n_dims} dimensions")
            dims = [r.scalar("<Q", f"shape of tensor {name}") for _ in range(n_dims)]
            ggml_type = r.scalar("<I", f"type of tensor {name}")
            offset = r.scalar("<Q", f"offset of tensor {name}")
            infos.append((name, dims, ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment % 8:
            raise ValueError(f"{self.path}: general.alignment must be a positive multiple of 8, "
                             f"got {alignment}")
        data_start = (r.pos + alignment - 1) // alignment * alignment
        for name, dims, ggml_type, offset in infos:
            self.tensors[name] = self._tensor_info(name, dims, ggml_type, offset, data_start)

    def _tensor_info(self, name, dims, ggml_type, offset, data_start) -> GGUFTensor:
        count = int(np.prod(dims, dtype=np.uint64))
        if ggml_type in GGML_TYPES:
            _, block, block_bytes = GGML_TYPES[ggml_type]
            if dims[0] % block:
                raise ValueError(f"{self.path}: tensor {name}: row length {dims[0]} is not a "
                                 f"multiple of the {GGML_TYPES[ggml_type][0]} block ({block})")
            nbytes = count // block * block_bytes
        else:
            nbytes = 0  # unknown types are reported when the tensor is read
        start = data_start + offset
        if ggml_type in GGML_TYPES and start + nbytes > len(self._buf):
            raise ValueError(f"{self.path}: truncated GGUF file: tensor {name} needs bytes "
                             f"{start}..{start + nbytes}, file has {len(self._buf)}")
        return GGUFTensor(name, tuple(int(d) for d in reversed(dims)), ggml_type, start, nbytes)

    # ----------------------------------------------------------------- data

    def _info(self, name: str) -> GGUFTensor:
        try:
            t = self.tensors[name]
        except KeyError:
            raise ValueError(f"{self.path}: no tensor named {name!r}") from None
        if t.type_name not in LOADED_TYPES:
            kind = (f"{t.type_name} (id {t.ggml_type})" if t.ggml_type in GGML_TYPES
                    else f"{t.ggml_type}, which ggml does not define")
            raise ValueError(f"{self.path}: tensor {name} has ggml type {kind}; armllm loads "
                             f"{', '.join(LOADED_TYPES)}")
        return t

    def type_counts(self) -> dict[str, int]:
        """How many tensors each ggml type holds, most first ({"Q4_K": 112, ...})."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def type_summary(self) -> str:
        """The type counts as one line: "Q4_K: 112, Q6_K: 17, F32: 33"."""
        return ", ".join(f"{name}: {count}" for name, count in self.type_counts().items())

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapping."""
        t = self._info(name)
        return np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    @staticmethod
    def _rows(t: GGUFTensor) -> int:
        """Rows of a tensor: a matrix's, a 3-D tensor's [A, B, K] as [A * B, K] (a
        mixture of experts' stacked matrices), a vector's elements."""
        return int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else t.shape[0]

    def _row_bytes(self, t: GGUFTensor) -> int:
        return t.nbytes // self._rows(t) if self._rows(t) else 0

    def raw_rows(self, name: str, row0: int, row1: int) -> np.ndarray:
        """The bytes of rows [row0, row1) (_rows: a 3-D tensor's rows run across its
        matrices) as a uint8 view."""
        t = self._info(name)
        row_bytes = self._row_bytes(t)
        row1 = min(row1, self._rows(t))
        return np.frombuffer(self._buf, dtype=np.uint8, count=(row1 - row0) * row_bytes,
                             offset=t.offset + row0 * row_bytes)

    def float_rows(self, name: str, row0: int, row1: int) -> np.ndarray:
        """Rows [row0, row1) of a matrix: F32/F16 as float32/float16 views and BF16 as
        uint16 bits (no copy), quantized types dequantized to a new float32 array."""
        t = self._info(name)
        raw = self.raw_rows(name, row0, row1)
        rows = (min(row1, self._rows(t)) - row0, *t.shape[-1:])
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}.get(t.type_name)
        if dtype is not None:
            return raw.view(np.dtype(dtype).newbyteorder("<")).reshape(rows)
        return dequantize_rows(t.ggml_type, raw, int(np.prod(rows[:-1])),
                               rows[-1]).reshape(rows)

    def release(self, name: str, row0: int = 0, row1: int | None = None) -> None:
        """Drops the resident pages of rows [row0, row1) of `name` (all of it by
        default; mapped.release)."""
        t = self._info(name)
        if row1 is None:
            release(self._mmap, t.offset, t.offset + t.nbytes)
            return
        row_bytes = self._row_bytes(t)
        release(self._mmap, t.offset + row0 * row_bytes,
                t.offset + min(row1, self._rows(t)) * row_bytes)

    def array(self, name: str) -> np.ndarray:
        """F32/F16 tensors as float32/float16 views, BF16 as uint16 bits (no copy)."""
        t = self._info(name)
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}.get(t.type_name)
        if dtype is None:
            raise ValueError(f"{self.path}: tensor {name} is {t.type_name}; use dequantize()")
        return self.raw(name).view(np.dtype(dtype).newbyteorder("<")).reshape(t.shape)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array."""
        t = self._info(name)
        if t.type_name in ("F32", "F16"):
            return self.array(name).astype(np.float32)
        if t.type_name == "BF16":
            return (self.array(name).astype(np.uint32) << 16).view(np.float32)
        k = t.shape[-1]
        return dequantize_rows(t.ggml_type, self.raw(name), int(np.prod(t.shape)) // k,
                               k).reshape(t.shape)

    def close(self) -> None:
        self._buf.release()
        self._mmap.close()


def dequantize_rows(ggml_type: int, raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    """[rows, k] float32 of `rows` rows of a quantized type as stored (the kernels'
    exact decoder: the gguf package's dequantization bit for bit)."""
    return ops.gguf_dequantize(ggml_type, raw, rows, k)
