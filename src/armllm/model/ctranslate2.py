"""ctranslate2: reads CTranslate2 model directories (what faster-whisper and
ctranslate2's converters write): model.bin memory-mapped, its header and
variable index read eagerly, the data lazily as zero-copy views; config.json
and the vocabulary file beside it.

model.bin, little-endian (the converter writes native order; every machine
that runs it is little-endian): u32 binary version; from version 2 the
spec name (e.g. "WhisperSpec") and the spec revision (u32); u32 variable count,
then per variable its name, u8 rank, u32 dims, the dtype (from version 4 a u8
type id and u32 byte count; before, a u8 item size and u32 element count) and
the raw bytes; from version 3, u32 alias count and (alias, target) name pairs.
A string is a u16 length (its NUL included), the UTF-8 bytes and the NUL.
Variable names are "/"-scoped ("decoder/layer_0/ffn/linear_0/weight").

Quantized weights: an int8 `<name>` [N, ...] comes with a float32
`<name>_scale` [N] (per row, 127 / amax of the row), an int16 one with a scalar
`<name>_scale`; the weight is q / scale, computed as CTranslate2 does it:
q * (1 / scale). An alias also aliases its target's scale.
Every malformed input raises ValueError naming the file (and variable).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from armllm.model.mapped import map_file, release

CURRENT_BINARY_VERSION = 6   # what ctranslate2 4.x writes; versions 1..6 share this reader
# type id -> (CTranslate2's name, numpy dtype of the stored bits); bfloat16 as uint16 bits
DTYPES = {0: ("float32", np.float32), 1: ("int8", np.int8), 2: ("int16", np.int16),
          3: ("int32", np.int32), 4: ("float16", np.float16), 5: ("bfloat16", np.uint16)}
_NUMPY_DTYPES = dict(DTYPES.values())
# before binary version 4 a variable's type was only its item size (CTranslate2's own
# reading of it: 2 bytes meant int16, never float16)
_ITEM_SIZE_TYPE_IDS = {4: 0, 2: 2, 1: 1}
# the scale CTranslate2 assumes for an int16 weight saved without one (old conversions)
LEGACY_INT16_SCALE = np.float32(1000)
VOCABULARY_FILES = ("vocabulary.json", "vocabulary.txt",
                    "shared_vocabulary.json", "shared_vocabulary.txt")


@dataclass(frozen=True)
class CT2Variable:
    name: str
    shape: tuple[int, ...]
    dtype: str       # CTranslate2's name: int8, int16, int32, float16, bfloat16, float32
    offset: int      # absolute byte offset of the data in model.bin
    nbytes: int

    @property
    def numpy_dtype(self) -> np.dtype:
        """The dtype of `CT2File.array`'s view (bfloat16 as uint16 bits)."""
        return np.dtype(_NUMPY_DTYPES[self.dtype]).newbyteorder("<")


class _Reader:
    """Walks the header of model.bin, every read bounds-checked."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated CTranslate2 model file while reading "
                             f"{what} (need {n} bytes at offset {self.pos}, file has "
                             f"{len(self.buf)})")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = bytes(self.take(self.scalar("<H", what), what))
        try:  # the length counts the NUL; CTranslate2 reads up to the first NUL
            return raw.split(b"\0", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: corrupt CTranslate2 model file: {what} at "
                             f"offset {self.pos - len(raw)} is not UTF-8") from None


class CT2File:
    """A CTranslate2 model.bin, memory-mapped: `spec` and `revision` name the layout,
    `variables` index the stored variables by name, `aliases` map a name to the
    variable it shares (tied weights)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mmap = map_file(self.path, "CTranslate2 model")
        self._buf = memoryview(self._mmap)
        self.variables: dict[str, CT2Variable] = {}
        self.aliases: dict[str, str] = {}
        self._parse()

    def _parse(self) -> None:
        r = _Reader(self._buf, self.path)
        self.binary_version = r.scalar("<I", "binary version")
        if not 1 <= self.binary_version <= CURRENT_BINARY_VERSION:
            raise ValueError(f"{self.path}: unsupported CTranslate2 binary version "
                             f"{self.binary_version} (armllm reads 1 to "
                             f"{CURRENT_BINARY_VERSION}), or not a CTranslate2 model.bin")
        self.spec, self.revision = "", 1
        if self.binary_version >= 2:
            self.spec = r.string("spec name")
            self.revision = r.scalar("<I", "spec revision")
        count = r.scalar("<I", "variable count")
        for _ in range(count):
            variable = self._variable(r)
            self.variables[variable.name] = variable
        if self.binary_version >= 3:
            for _ in range(r.scalar("<I", "alias count")):
                alias = r.string("alias name")
                self.aliases[alias] = r.string(f"target of alias {alias}")
        for alias, target in list(self.aliases.items()):
            if self._resolve(target) is None:
                raise ValueError(f"{self.path}: alias {alias} names {target}, "
                                 f"which the file does not hold")
            # as CTranslate2's loader does: the alias shares its target's scale too
            if self._resolve(target + "_scale") and alias + "_scale" not in self.variables:
                self.aliases.setdefault(alias + "_scale", target + "_scale")

    def _variable(self, r: _Reader) -> CT2Variable:
        name = r.string("variable name")
        rank = r.scalar("<B", f"rank of {name}")
        shape = tuple(r.scalar("<I", f"shape of {name}") for _ in range(rank))
        if self.binary_version >= 4:
            type_id = r.scalar("<B", f"dtype of {name}")
            nbytes = r.scalar("<I", f"size of {name}")
        else:
            item_size = r.scalar("<B", f"item size of {name}")
            if item_size not in _ITEM_SIZE_TYPE_IDS:
                raise ValueError(f"{self.path}: variable {name} has unknown item size "
                                 f"{item_size} (binary version {self.binary_version} "
                                 f"knows 1, 2 and 4)")
            type_id = _ITEM_SIZE_TYPE_IDS[item_size]
            nbytes = r.scalar("<I", f"size of {name}") * item_size
        if type_id not in DTYPES:
            raise ValueError(f"{self.path}: variable {name} has unknown dtype id {type_id} "
                             f"(CTranslate2 defines {', '.join(_NUMPY_DTYPES)})")
        dtype_name, np_type = DTYPES[type_id]
        count = int(np.prod(shape, dtype=np.int64))
        if nbytes != count * np.dtype(np_type).itemsize:
            raise ValueError(f"{self.path}: variable {name}: {nbytes} bytes do not hold "
                             f"{dtype_name} {list(shape)}")
        if r.pos + nbytes > len(self._buf):
            raise ValueError(f"{self.path}: truncated CTranslate2 model file: variable {name} "
                             f"needs bytes {r.pos}..{r.pos + nbytes}, file has "
                             f"{len(self._buf)}")
        variable = CT2Variable(name, shape, dtype_name, r.pos, nbytes)
        r.pos += nbytes
        return variable

    # ------------------------------------------------------------------ names

    def _resolve(self, name: str) -> str | None:
        seen = set()
        while name in self.aliases and name not in seen:
            seen.add(name)
            name = self.aliases[name]
        return name if name in self.variables else None

    def names(self) -> list[str]:
        """Every name the file answers to: its variables, then its aliases."""
        return [*self.variables, *self.aliases]

    def has(self, name: str) -> bool:
        return self._resolve(name) is not None

    def variable(self, name: str) -> CT2Variable:
        """The stored variable `name` is, or is an alias of."""
        resolved = self._resolve(name)
        if resolved is None:
            raise ValueError(f"{self.path}: no variable named {name!r}")
        return self.variables[resolved]

    # ------------------------------------------------------------------- data

    def array(self, name: str) -> np.ndarray:
        """A read-only view of the mapped bytes in the stored dtype (bfloat16 as
        uint16 bits); a scalar as a 0-d array."""
        v = self.variable(name)
        dtype = v.numpy_dtype
        return np.frombuffer(self._buf, dtype=dtype, count=v.nbytes // dtype.itemsize,
                             offset=v.offset).reshape(v.shape)

    def _scale(self, name: str, v: CT2Variable) -> np.ndarray | None:
        scale_name = v.name + "_scale"
        if not self.has(scale_name):
            if v.dtype == "int16" and v.name.endswith("weight"):
                return LEGACY_INT16_SCALE
            return None
        scale = self.array(scale_name)
        rows = () if v.dtype == "int16" else v.shape[:1]
        if scale.shape != rows or scale.dtype != np.float32:
            raise ValueError(f"{self.path}: {scale_name} is {self.variable(scale_name).dtype} "
                             f"{list(scale.shape)}, expected float32 {list(rows)} for "
                             f"{v.dtype} {list(v.shape)}")
        return scale

    def dequantize(self, name: str) -> np.ndarray:
        """The variable as a new float32 array: int8/int16 weights times 1 / their
        scale (CTranslate2's own dequantization, bit for bit), float16/bfloat16
        widened, float32 copied."""
        v = self.variable(name)
        stored = self.array(name)
        if v.dtype in ("int8", "int16"):
            scale = self._scale(name, v)
            if scale is None:
                raise ValueError(f"{self.path}: {v.dtype} variable {name} has no "
                                 f"{v.name}_scale: not a quantized weight")
            multiplier = np.float32(1) / scale
            if v.dtype == "int8":
                rows = stored.reshape(v.shape[0], -1).astype(np.float32)
                return (rows * multiplier[:, None]).reshape(v.shape)
            return stored.astype(np.float32) * multiplier
        if v.dtype == "bfloat16":
            return (stored.astype(np.uint32) << 16).view(np.float32)
        if v.dtype in ("float16", "float32"):
            return stored.astype(np.float32)
        raise ValueError(f"{self.path}: variable {name} is {v.dtype}, not a weight")

    def int8_rows(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """An int8 weight as stored, for W8A8 kernels: (q [N, K] int8 view, d [N]
        float32) with weight[n, k] = q[n, k] * d[n] (a conv's [N, C, W] as [N, C * W])."""
        v = self.variable(name)
        if v.dtype != "int8" or not v.shape:
            raise ValueError(f"{self.path}: variable {name} is {v.dtype} {list(v.shape)}, "
                             f"not an int8 weight")
        scale = self._scale(name, v)
        if scale is None:
            raise ValueError(f"{self.path}: int8 variable {name} has no {v.name}_scale")
        return self.array(name).reshape(v.shape[0], -1), np.float32(1) / scale

    def release(self, name: str) -> None:
        """Drops the resident pages of `name` once a loader has packed it (mapped.release)."""
        v = self.variable(name)
        release(self._mmap, v.offset, v.offset + v.nbytes)

    def dtype_counts(self) -> dict[str, int]:
        """How many variables each dtype holds, most first ({"int8": 50, ...})."""
        counts: dict[str, int] = {}
        for v in self.variables.values():
            counts[v.dtype] = counts.get(v.dtype, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def close(self) -> None:
        self._buf.release()
        self._mmap.close()


def read_ct2_config(directory: str | Path) -> dict:
    """A CTranslate2 directory's config.json ({} where old conversions have none)."""
    path = Path(directory) / "config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: malformed config.json: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: config.json holds {type(config).__name__}, not an object")
    return config


def ct2_vocabulary(directory: str | Path) -> list[str] | None:
    """The tokens of a CTranslate2 directory's vocabulary file (vocabulary.json/.txt,
    else shared_vocabulary.json/.txt), by id; None where it has none. A .txt holds
    one token a line; a "\\r" ending is dropped only when every line has one (tokens
    may end in a carriage return), as CTranslate2 reads it."""
    for filename in VOCABULARY_FILES:
        path = Path(directory) / filename
        if path.exists():
            break
    else:
        return None
    try:
        text = path.read_bytes().decode("utf-8")  # as is: no newline translation
        tokens = json.loads(text) if path.suffix == ".json" else _text_tokens(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: malformed vocabulary: {exc}") from None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path}: a vocabulary must be a list of strings")
    return tokens


def _text_tokens(text: str) -> list[str]:
    lines = text.split("\n")   # not splitlines(): tokens may hold other line breaks
    if lines and lines[-1] == "":
        lines.pop()
    if lines and all(line.endswith("\r") for line in lines):
        lines = [line[:-1] for line in lines]
    return lines
