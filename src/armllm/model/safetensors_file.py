"""safetensors_file: memory-maps .safetensors files (single or sharded) and
hands out zero-copy numpy views, whole or by rows (bf16 tensors come as
uint16 bits, since numpy has no bfloat16), and releases the pages of rows a
loader is done with."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from armllm.model.mapped import map_file, release

# BF16 is the only 16-bit unsigned type here: uint16 arrays are bf16 bits.
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
MAX_HEADER = 100 << 20  # the format's own limit on the JSON header


class SafetensorsFile:
    """One .safetensors file: `tensors` maps names to (dtype, shape, byte range)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mmap = map_file(self.path, "safetensors")
        if len(self._mmap) < 8:
            raise ValueError(f"{self.path}: truncated safetensors file")
        (n,) = struct.unpack("<Q", self._mmap[:8])
        if n > MAX_HEADER or 8 + n > len(self._mmap):
            raise ValueError(f"{self.path}: corrupt or truncated safetensors header ({n} bytes)")
        try:
            header = json.loads(bytes(self._mmap[8:8 + n]))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path}: corrupt safetensors header: {exc}") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._data_start = 8 + n
        self.tensors: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self.tensors[name] = self._check(name, info)

    def _check(self, name, info):
        try:
            dtype = np.dtype(_DTYPES[info["dtype"]])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{self.path}: tensor {name}: malformed entry {info!r}") from None
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or begin < 0:
            raise ValueError(f"{self.path}: tensor {name}: byte range {begin}..{end} does not "
                             f"hold {info['dtype']} {list(shape)}")
        if self._data_start + end > len(self._mmap):
            raise ValueError(f"{self.path}: truncated file: tensor {name} ends at byte "
                             f"{self._data_start + end}, file has {len(self._mmap)}")
        return dtype, shape, begin, end

    def array(self, name: str) -> np.ndarray:
        """A read-only view of the mapped bytes (bf16 as uint16)."""
        dtype, shape, begin, end = self.tensors[name]
        return np.frombuffer(self._mmap, dtype=dtype.newbyteorder("<"),
                             count=(end - begin) // dtype.itemsize,
                             offset=self._data_start + begin).reshape(shape)

    def release(self, name: str, row0: int = 0, row1: int | None = None) -> None:
        """Drops the resident pages of rows [row0, row1) of `name` (all of it by
        default; mapped.release)."""
        _, shape, begin, end = self.tensors[name]
        start = self._data_start + begin
        if row1 is not None and shape and shape[0]:
            row_bytes = (end - begin) // shape[0]
            start, end = start + row0 * row_bytes, start + min(row1, shape[0]) * row_bytes
        else:
            end = self._data_start + end
        release(self._mmap, start, end)


# the top-level modules of a bare decoder's checkpoint (an embedding model saved from
# e.g. Qwen3Model), whose tensors lack the "model." prefix of the causal LM's names
_BARE_MODULES = ("embed_tokens", "layers", "norm")


class SafetensorsCheckpoint:
    """All tensors of a model directory: model.safetensors, or shards listed in
    model.safetensors.index.json. A bare decoder's tensors (embed_tokens.weight,
    layers.0..., norm.weight) answer to the causal LM's names (model.embed_tokens.weight,
    ...) as well."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise ValueError(f"{index}: malformed index: {exc}") from None
            files = {f: SafetensorsFile(self.dir / f) for f in sorted(set(weight_map.values()))}
            self._where = {name: files[f] for name, f in weight_map.items()}
            for name, f in self._where.items():
                if name not in f.tensors:
                    raise ValueError(f"{f.path}: tensor {name} listed in {index.name} is missing")
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise ValueError(f"{self.dir}: no *.safetensors weights found")
            self._where = {}
            for path in files:
                f = SafetensorsFile(path)
                for name in f.tensors:
                    self._where[name] = f
        self._real: dict[str, str] = {}   # a bare decoder's tensors: causal LM name -> own
        if not any(name.startswith("model.") for name in self._where):
            self._real = {f"model.{name}": name for name in self._where
                          if name.split(".", 1)[0] in _BARE_MODULES}
            self._where.update({alias: self._where[name] for alias, name in self._real.items()})

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def array(self, name: str) -> np.ndarray:
        try:
            f = self._where[name]
        except KeyError:
            raise ValueError(f"{self.dir}: checkpoint has no tensor {name!r}") from None
        return f.array(self._real.get(name, name))

    def row_chunks(self, name: str, rows: int):
        """(first row, view of up to `rows` rows) of `name`, chunk after chunk; the pages
        of a chunk are released when the next one is asked for (consume a chunk first)."""
        a = self.array(name)
        for row0 in range(0, a.shape[0], rows):
            yield row0, a[row0:row0 + rows]
            self._where[name].release(self._real.get(name, name), row0, row0 + rows)

    def release(self, name: str) -> None:
        """Drops the resident pages of the whole of `name`."""
        self._where[name].release(self._real.get(name, name))
