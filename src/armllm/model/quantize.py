"""quantize: weight quantization schemes and the form the quantized GEMM
reads: W[n, k] = d[n, g] * q[n, k] + o[n, g] with g = k // group.

- bits 8: q int8 in [-127, 127], o = 0 (symmetric);
- bits 4: q in [0, 15] (one per byte here; the kernels pack two per byte),
  o any float: symmetric int4 v in [-8, 7] is q = v + 8, o = -8 d; GGUF Q4_1
  is (d, m); asymmetric zero points zp give o = -d (zp + 8).
- group 32, 64 or 128 columns, or 0 for one group per row (channelwise).
  Groups are counted over K rounded up to 32 (the kernels' padding), so the
  last group of a row may be shorter.

Round-to-nearest quantization of float weights (`quantize_rtn`) and the
exact mapping of GGUF Q8_0 / Q4_0 / Q4_1 blocks (`from_gguf_blocks`) live
here; packing for a CPU is ops.pack_quantized."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

K_ALIGN = 32  # armllm_kernels.h ARMLLM_Q_KALIGN


@dataclass(frozen=True)
class Scheme:
    name: str
    bits: int
    group: int              # 0: channelwise
    act_symmetric: bool = True  # False: activations get zero points (name ends in -asym)

    @property
    def label(self) -> str:
        grouping = f"group {self.group}" if self.group else "per channel"
        acts = "" if self.act_symmetric else " asymmetric"
        return (f"{self.name} (int{self.bits} weights {grouping}, int8{acts} per-token "
                f"activations)")


SCHEMES = {
    "w8a8": Scheme("w8a8", 8, 0),
    "w8a8-g32": Scheme("w8a8-g32", 8, 32),
    "w4a8": Scheme("w4a8", 4, 32),
    "w4a8-g32": Scheme("w4a8-g32", 4, 32),
    "w4a8-g64": Scheme("w4a8-g64", 4, 64),
    "w4a8-g128": Scheme("w4a8-g128", 4, 128),
    "w4a8-ch": Scheme("w4a8-ch", 4, 0),
}


ASYM_SUFFIX = "-asym"  # any scheme + this: asymmetric activations
SCHEME_NAMES = (*SCHEMES, *(name + ASYM_SUFFIX for name in SCHEMES))  # what parse_scheme takes


def parse_scheme(name: str | None) -> Scheme | None:
    """A scheme by name (a SCHEMES key, optionally + ASYM_SUFFIX for asymmetric
    activations); None, "none" -> no quantization."""
    if name is None or name == "none":
        return None
    base = name[:-len(ASYM_SUFFIX)] if name.endswith(ASYM_SUFFIX) else name
    if base not in SCHEMES:
        raise ValueError(f"quantization must be none or one of {', '.join(SCHEMES)} (each "
                         f"also with {ASYM_SUFFIX} for asymmetric activations), got {name!r}")
    s = SCHEMES[base]
    return s if base == name else Scheme(name, s.bits, s.group, act_symmetric=False)


def kpad(k: int) -> int:
    return -(-k // K_ALIGN) * K_ALIGN


def num_groups(k: int, group: int) -> int:
    return -(-kpad(k) // group) if group else 1


@dataclass
class QuantizedMatrix:
    q: np.ndarray               # [n, k] int8 (bits 4: values 0..15)
    d: np.ndarray               # [n, groups] float32
    o: np.ndarray | None        # [n, groups] float32, bits 4 only
    bits: int
    group: int
    act_symmetric: bool = True  # the activations it meets: symmetric, or with zero points

    def __post_init__(self):
        n, k = self.q.shape
        ng = num_groups(k, self.group)
        if self.q.dtype != np.int8:
            raise ValueError(f"q must be int8, got {self.q.dtype}")
        if self.d.shape != (n, ng) or (self.o is not None and self.o.shape != (n, ng)):
            raise ValueError(f"scales of shape {list(self.d.shape)} (offsets "
                             f"{None if self.o is None else list(self.o.shape)}) do not fit "
                             f"{n} x {k} weights in groups of {self.group or 'a row'}: "
                             f"expected [{n}, {ng}]")
        lo, hi = (0, 15) if self.bits == 4 else (-127, 127)
        if self.q.size and (int(self.q.min()) < lo or int(self.q.max()) > hi):
            raise ValueError(f"{self.bits}-bit values must lie in [{lo}, {hi}]")
        if self.bits == 8 and self.o is not None:
            raise ValueError("8-bit weights are symmetric: no offsets")

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def group_index(self) -> np.ndarray:
        """The group of each column."""
        k = self.q.shape[1]
        return np.arange(k) // self.group if self.group else np.zeros(k, np.int64)

    def dequantize(self) -> np.ndarray:
        g = self.group_index()
        w = self.q.astype(np.float32) * self.d[:, g]
        if self.o is not None:
            w += self.o[:, g]
        return w

    def take_rows(self, rows: np.ndarray) -> QuantizedMatrix:
        return QuantizedMatrix(np.ascontiguousarray(self.q[rows]), self.d[rows],
                               None if self.o is None else self.o[rows], self.bits, self.group,
                               self.act_symmetric)


def _group_view(w: np.ndarray, group: int) -> tuple[np.ndarray, int]:
    """w [n, k] as [n, groups, group] padded with zeros (padding does not change amax)."""
    n, k = w.shape
    g = group or kpad(k)
    ng = num_groups(k, group)
    padded = np.zeros((n, ng * g), np.float32)
    padded[:, :k] = w
    return padded.reshape(n, ng, g), ng


F16_MIN_NORMAL, F16_MAX = 2.0 ** -14, 65504.0


def _f16_up(d: np.ndarray) -> np.ndarray:
    """d rounded up to the next f16 value where f16 holds it as a normal number (else
    kept): 4-bit scales then pack as f16 (1/6 fewer bytes to read at group 32), and
    rounding up keeps every |w| / d within the int4 range."""
    with np.errstate(over="ignore"):   # beyond f16: kept below
        up = d.astype(np.float16)
    up = np.where(up.astype(np.float32) < d, np.nextafter(up, np.float16(np.inf)), up)
    ok = (d >= F16_MIN_NORMAL) & (d <= F16_MAX / 8)   # o = -8 d must fit too
    return np.where(ok, up.astype(np.float32), d).astype(np.float32)


def _rounded(groups: np.ndarray, d: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """clip(rint(groups / d), lo, hi) (d = 0: divided by 1), in one new array."""
    v = groups / np.where(d > 0, d, 1.0)[..., None]
    np.rint(v, out=v)
    return np.clip(v, lo, hi, out=v)


def quantize_rtn(w: np.ndarray, scheme: Scheme) -> QuantizedMatrix:
    """Round-to-nearest symmetric quantization of float weights [n, k]: int8 with
    d = amax / 127, or int4 in [-8, 7] with d = amax / 7.5 (compressed-tensors'
    symmetric range) rounded up to an f16 value, stored as q = v + 8 with offset
    o = -8 d."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"weights must be a matrix, got shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or Inf")
    n, k = w.shape
    groups, ng = _group_view(w, scheme.group)
    amax = np.abs(groups).max(axis=2)
    if scheme.bits == 8:
        d = (amax / 127.0).astype(np.float32)
        v = _rounded(groups, d, -127, 127)
        q = v.reshape(n, -1)[:, :k].astype(np.int8)
        return QuantizedMatrix(q, d, None, 8, scheme.group, scheme.act_symmetric)
    d = _f16_up((amax / 7.5).astype(np.float32))
    v = _rounded(groups, d, -8, 7)
    q = (v.reshape(n, -1)[:, :k] + 8).astype(np.int8)
    return QuantizedMatrix(q, d, (-8.0 * d).astype(np.float32), 4, scheme.group,
                           scheme.act_symmetric)


GGUF_QUANTIZED = {"Q8_0": (8, 32), "Q4_0": (4, 32), "Q4_1": (4, 32)}


def from_gguf_blocks(type_name: str, blocks: np.ndarray, n: int, k: int) -> QuantizedMatrix:
    """GGUF Q8_0 / Q4_0 / Q4_1 blocks [n * k / 32, bytes] of a [n, k] tensor, exactly:
    the block's fp16 scale (and Q4_1 min) become the group's d (and o)."""
    if k % 32:
        raise ValueError(f"row length {k} is not a multiple of the 32-element block")
    nb = k // 32
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(n, nb)
    if type_name == "Q8_0":
        q = np.ascontiguousarray(blocks[:, 2:34]).view(np.int8).reshape(n, k)
        return QuantizedMatrix(q, d, None, 8, 32)
    qs = blocks[:, -16:]
    # low nibbles are elements 0..15 of the block, high nibbles 16..31
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8).reshape(n, k)
    if type_name == "Q4_0":
        return QuantizedMatrix(q, d, (-8.0 * d).astype(np.float32), 4, 32)
    if type_name == "Q4_1":
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(n, nb)
        return QuantizedMatrix(q, d, m, 4, 32)
    raise ValueError(f"ggml type {type_name} has no exact quantized form here")
