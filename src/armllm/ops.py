"""ops: armllm's only door to the C kernels.

Chooses the kernel table once at import (the best the CPU runs, or the one
named by ARMLLM_ISA; ARMLLM_DECODE_STREAMS overrides a per-CPU constant of the
x86 quantized decode GEMVs, for measuring a new CPU), owns the default thread
pool (ARMLLM_NUM_THREADS or the process's CPU affinity), and wraps each kernel
in a typed function that writes into `out=` when given (the hot path) and
allocates only when not.
Load-time helpers (weight packing, bf16 conversion) live here too; nothing
here calls numpy's BLAS. The cos|sin tables `rope` reads are model/rope.py's.
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Literal

import numpy as np

from armllm._kernels import _ext
from armllm._kernels._ext import (
    Comm,
    CommAborted,
    DecoderLayer,
    DeltaNetMixer,
    Kernels,
    NormHead,
    PackedWeight,
    SparseLayer,
    StepBatch,
    ThreadPool,
    attn_scratch_len,
    comm_atomic_impl,
    comm_init,
    comm_segment_bytes,
    mask_logits,
    moe_accumulate,
    moe_route,
    probe_fma,  # machine limits, for bench kernels and plan
    probe_read,
    sample_uniform,
    sequence_list,
)
from armllm._kernels._ext import q_group_len as quant_group_len
from armllm._kernels._ext import q_groups as quant_groups
from armllm._kernels._ext import q_kpad as quant_kpad

__all__ = [
    "ActScratch", "Comm", "CommAborted", "DecoderLayer", "DeltaNetMixer", "Kernels", "NormHead",
    "PackedWeight", "SparseLayer", "StepBatch", "ThreadPool", "bind_delta_net",
    "attn_scratch_len", "available_isas", "comm_atomic_impl", "comm_init",
    "comm_segment_bytes", "bf16_to_f32", "bind_decoder_layer", "bind_norm_head",
    "bind_sparse_layer", "cpu_info", "mask_logits", "moe_accumulate", "moe_route",
    "gelu_tanh_mul",
    "decoder_layer", "embedding", "norm_head", "exp", "f32_to_bf16", "gated_rmsnorm",
    "gdn_conv", "gdn_rule", "gelu", "get_pool", "kernels", "layer_norm",
    "GGUFTable", "gguf_act_group", "gguf_dequantize", "kv_write", "linear", "num_threads",
    "pack_gguf", "pack_quantized", "pack_weight", "paged_attention",
    "probe_fma", "probe_read", "quant_group_len", "quant_groups", "quant_kpad", "rms_norm",
    "rms_norm_linear", "rope", "RowSampler",
    "sample_uniform", "sequence_list",
    "restart_pool", "selected_isa", "set_num_threads", "sigmoid_mul", "silu_mul",
]

WeightDtype = Literal["f32", "bf16"]
# columns per activation scale group of a GGUF-block GEMM of 32-element types only
# (ARMLLM_GGUF_ACT_GROUP); with a K-quant part it is 256 (gguf_act_group)
GGUF_ACT_GROUP = _ext.GGUF_ACT_GROUP


def gguf_act_group(types: Sequence[int]) -> int:
    """Columns per activation scale of the GGUF-block GEMM of parts of these ggml type
    ids: 256 when one is a super-block type (the K-quants, IQ4_XS), else 32."""
    return _ext.gguf_act_group(types)
# columns per scale group of quantized weights; 0: one scale per row (channelwise), run
# as groups of quant_group_len(0) columns with that scale repeated
QUANT_GROUPS = (0, 32, 64, 128)
# activation groups: the weights', and a K-quant super-block's (gguf_act_group)
ACT_GROUPS = QUANT_GROUPS + (_ext.GGUF_SUPER,)


def _isa_from_env() -> tuple[str, str]:
    forced = os.environ.get("ARMLLM_ISA", "").strip()
    if not forced or forced == "auto":
        return _ext.isa_best(), "auto"
    try:
        Kernels(forced)
    except ValueError as exc:
        raise ValueError(f"ARMLLM_ISA={forced}: {exc}") from None
    return forced, "ARMLLM_ISA"


def _threads_from_env() -> int:
    raw = os.environ.get("ARMLLM_NUM_THREADS", "").strip()
    if not raw:
        return _ext.allowed_cpus()
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 4096:
        raise ValueError(f"ARMLLM_NUM_THREADS must be an integer from 1 to 4096, got {raw!r}")
    return n


def _decode_streams_from_env() -> int:
    """ARMLLM_DECODE_STREAMS: 1 or 2 panel streams a thread of the x86 quantized decode
    GEMVs reads at once; 0 (unset) for the CPU's choice (cpu.h)."""
    raw = os.environ.get("ARMLLM_DECODE_STREAMS", "").strip()
    if not raw:
        return 0
    if raw not in ("1", "2"):
        raise ValueError(f"ARMLLM_DECODE_STREAMS must be 1 or 2, got {raw!r}")
    return int(raw)


_ISA, _ISA_SOURCE = _isa_from_env()
_ext.set_x86_decode_streams(_decode_streams_from_env())
_KERNELS = Kernels(_ISA)
_NUM_THREADS = _threads_from_env()
_pool: ThreadPool | None = None
_pool_lock = threading.Lock()


def selected_isa() -> str:
    """The kernel variant every ops function uses."""
    return _ISA


def kernels(isa: str | None = None) -> Kernels:
    """The dispatch table of `isa` (default: the selected one)."""
    return _KERNELS if isa is None else Kernels(isa)


def available_isas() -> list[str]:
    """Variants built into this package that this CPU can run, best first."""
    out = []
    for name in _ext.isa_built():
        try:
            Kernels(name)
        except ValueError:
            continue
        out.append(name)
    return out


def num_threads() -> int:
    return _NUM_THREADS


def set_num_threads(n: int) -> None:
    """Sets the default pool's thread count (EngineArgs.threads). The pool is one per
    process: once it has started, only its own count is accepted."""
    global _NUM_THREADS
    with _pool_lock:
        if _pool is not None and n != _pool.num_threads:
            raise ValueError(f"threads={n}, but this process's kernel thread pool already runs "
                             f"{_pool.num_threads} threads")
        _NUM_THREADS = n


def restart_pool(n: int) -> None:
    """Sets the pool's thread count and lets the next kernel call start a new pool
    under the calling thread's CPU affinity (a tensor-parallel rank, once bound to its
    CPUs); the old pool's workers stop once no call uses it."""
    global _NUM_THREADS, _pool
    if not 1 <= n <= 4096:
        raise ValueError(f"threads must be an integer from 1 to 4096, got {n!r}")
    with _pool_lock:
        _NUM_THREADS, _pool = n, None


def get_pool() -> ThreadPool:
    """The process-wide pool, started on first use."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPool(_NUM_THREADS)
    return _pool


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "CPU part") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return "unknown"


def cpu_info() -> dict:
    """The CPU, its features, the thread count and the kernel chosen per slot."""
    info = _ext.cpu_features()
    return {
        "cpu": _cpu_model(),
        "arch": info["arch"],
        "features": info["features"],
        "sve_vector_bits": info["sve_vector_bits"],
        "amx_denied": info["amx_denied"],
        "cpuid": {k: info[k] for k in ("vendor", "family", "model")},
        "x86_decode_streams": _ext.x86_decode_streams(),
        "allowed_cpus": _ext.allowed_cpus(),
        "num_threads": _NUM_THREADS,
        "fetch_add": _ext.atomic_impl(),
        "isa": _ISA,
        "isa_source": _ISA_SOURCE,
        "isa_built": _ext.isa_built(),
        "isa_available": available_isas(),
        "kernels": _KERNELS.impl,
        "gemm_layouts": _KERNELS.gemm_layouts,
        "gemm_bf16_compute": _KERNELS.gemm_bf16_compute,
        "attention_bf16_compute": _KERNELS.attention_bf16_compute,
    }


# ----------------------------------------------------------- load-time helpers


def f32_to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even; NaN stays NaN."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def bf16_to_f32(a: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exact."""
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def pack_weight(w: np.ndarray, dtype: WeightDtype = "f32") -> PackedWeight:
    """Prepacks W[N, K] for the selected GEMM. float32 input is converted to
    bf16 when dtype="bf16"; uint16 input is taken as bf16 bits."""
    if dtype not in ("f32", "bf16"):
        raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")
    if isinstance(w, np.ndarray) and dtype == "bf16" and w.dtype == np.float32:
        w = f32_to_bf16(w)
    return _KERNELS.pack(w, dtype)


def pack_quantized(q: np.ndarray, d: np.ndarray, o: np.ndarray | None = None, bits: int = 8,
                   group: int = 0, act_asym: bool = False) -> PackedWeight:
    """Prepacks quantized weights W = d * q + o for the selected kernels: q[N, K]
    int8 (bits 8: -127..127; bits 4: 0..15 one per byte), d and o float32
    [N, n_groups], or [N, 1] (or 1-D [N]) for group 0 (channelwise: one scale
    per row), o only for bits 4. act_asym: the weight meets asymmetric
    activations (zero points), whose correction it then carries."""
    d = np.asarray(d, dtype=np.float32)
    if d.ndim == 1:
        d = d.reshape(-1, 1)
    if o is not None:
        o = np.asarray(o, dtype=np.float32)
        if o.ndim == 1:
            o = o.reshape(-1, 1)
    packed = _KERNELS.pack_wq(q, d, o, bits, group)
    if act_asym:
        packed.zp_correction = pack_weight(_zp_correction(q, d, o, group), "f32")
    return packed


def pack_gguf(blocks: np.ndarray, k: int, types: list[int], rows: list[int]) -> PackedWeight:
    """Prepacks GGUF-block weights as stored for the selected kernels: blocks holds the
    rows of each part in turn (rows[i] rows of ggml type types[i], K columns, the file's
    bytes). Parts may differ in type (a fused QKV whose V is Q6_K)."""
    return _KERNELS.pack_gguf(blocks, k, types, rows)


def gguf_dequantize(ggml_type: int, raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    """[rows, k] float32 of rows of GGUF blocks of a ggml type as stored (the kernels'
    exact decoder: the gguf package's dequantization bit for bit)."""
    return _ext.gguf_dequantize(ggml_type, raw, rows, k)


class GGUFTable:
    """An embedding table as a GGUF file stores it: [vocab, d] in blocks of one ggml
    type (raw uint8 [vocab, row bytes], a private copy); embedding() dequantizes only
    the rows it gathers."""

    def __init__(self, raw: np.ndarray, ggml_type: int, d: int):
        geometry = _ext.gguf_block_geometry(ggml_type)
        if geometry is None or d % geometry[0] or raw.ndim != 2 \
                or raw.shape[1] != d // geometry[0] * geometry[1]:
            raise ValueError(f"a GGUF table of ggml type {ggml_type} needs uint8 rows of {d} "
                             f"elements, got {raw.shape} {raw.dtype}")
        self.raw, self.ggml_type = np.ascontiguousarray(raw, dtype=np.uint8), ggml_type
        self.shape = (raw.shape[0], d)

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    def dequantize(self) -> np.ndarray:
        """The whole table as float32."""
        return gguf_dequantize(self.ggml_type, self.raw, *self.shape)


ZP_CHUNK = 1 << 18   # int64 elements (2 MiB) of _zp_correction's padded rows at a time


def _zp_correction(q: np.ndarray, d: np.ndarray, o: np.ndarray | None, group: int) -> np.ndarray:
    """C[n, g] = d * (sum of q over the group's real columns) + o * (their count):
    what zero points z of the activations add to a row, per unit of scale * z. Rows go
    a chunk at a time (ZP_CHUNK int64 sums), so loading holds no int64 copy of a matrix."""
    n, k = q.shape
    gl, ng = quant_group_len(group), quant_groups(k, group)
    real = np.clip(k - np.arange(ng) * gl, 0, gl).astype(np.float64)
    dd = np.broadcast_to(d, (n, ng))
    oo = None if o is None else np.broadcast_to(o, (n, ng))
    out = np.empty((n, ng), np.float32)
    step = max(1, ZP_CHUNK // (ng * gl))
    for r0 in range(0, n, step):
        rows = slice(r0, r0 + step)
        padded = np.zeros((len(q[rows]), ng * gl), np.int64)
        padded[:, :k] = q[rows]
        c = dd[rows].astype(np.float64) * padded.reshape(-1, ng, gl).sum(axis=2).astype(np.float64)
        if oo is not None:
            c += oo[rows].astype(np.float64) * real
        out[rows] = c
    return out


# ------------------------------------------------------------------- kernels


def _out(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, dtype=np.float32) if out is None else out


class ActScratch:
    """The int8 activations of up to `rows` rows of K columns, quantized in the
    groups of weights of `group`: xq [rows, kpad], scale [rows, n_groups], with
    sums the group sums [rows, n_groups]; for asymmetric activations (asym_n > 0)
    also the zero points and their scaled copy [rows, n_groups] and the zero
    points' correction [rows, N] of weights of up to asym_n outputs. Allocated
    once, by the model's Workspace (or for one call by linear() when none is
    given), so that quantizing allocates nothing."""

    def __init__(self, rows: int, k: int, group: int = 0, sums: bool = True, asym_n: int = 0):
        buffers = self.buffers(rows, k, group, sums, asym_n)
        self.rows, self.k, self.group, self.asym_n = rows, k, group, asym_n
        self._group_len = quant_group_len(group)
        # uninitialized: the kernels write every element a call reads (xq's padding too)
        self.xq, self.scale = (np.empty(*buffers[name]) for name in ("xq", "scale"))
        self.gsum = np.empty(*buffers["gsum"]) if sums else None
        asym = asym_n > 0
        self.zp = np.empty(*buffers["zp"]) if asym else None
        self.scaled_zp = np.empty(*buffers["scaled_zp"]) if asym else None
        self._correction = np.empty(*buffers["correction"]) if asym else None

    @staticmethod
    def buffers(rows: int, k: int, group: int = 0, sums: bool = True, asym_n: int = 0
                ) -> dict[str, tuple[tuple[int, ...], type]]:
        """Shape and dtype of each buffer an ActScratch of these arguments holds."""
        if rows < 1 or k < 1 or asym_n < 0:
            raise ValueError(f"rows and k must be >= 1 and asym_n >= 0, got {rows}, {k} and "
                             f"{asym_n}")
        if group not in ACT_GROUPS:
            raise ValueError(f"group must be one of {ACT_GROUPS}, got {group}")
        ng = quant_groups(k, group)
        out = {"xq": ((rows, quant_kpad(k)), np.int8), "scale": ((rows, ng), np.float32)}
        if sums:
            out["gsum"] = ((rows, ng), np.int32)
        if asym_n:
            out.update(zp=((rows, ng), np.int32), scaled_zp=((rows, ng), np.float32),
                       correction=((rows * asym_n,), np.float32))
        return out

    @classmethod
    def nbytes_for(cls, rows: int, k: int, group: int = 0, sums: bool = True,
                   asym_n: int = 0) -> int:
        """Bytes an ActScratch of these arguments allocates."""
        return sum(math.prod(shape) * np.dtype(dtype).itemsize
                   for shape, dtype in cls.buffers(rows, k, group, sums, asym_n).values())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.xq, self.scale, self.gsum, self.zp, self.scaled_zp,
                                      self._correction) if a is not None)

    def fits(self, rows: int, k: int, group: int, sums: bool, asym_n: int = 0) -> bool:
        # equal group lengths give equal groups (channelwise runs as groups of 128)
        return rows <= self.rows and k == self.k \
            and (group == self.group or (group in ACT_GROUPS
                                         and quant_group_len(group) == self._group_len)) \
            and (not sums or self.gsum is not None) and asym_n <= self.asym_n

    def views(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if rows == self.rows:
            return self.xq, self.scale, self.gsum
        gsum = None if self.gsum is None else self.gsum[:rows]
        return self.xq[:rows], self.scale[:rows], gsum

    def zero_points(self, rows: int) -> np.ndarray | None:
        return None if self.zp is None else self.zp[:rows]

    def correction(self, rows: int, n: int) -> np.ndarray:
        """A [rows, n] float32 view for the zero points' correction (n <= asym_n)."""
        return self._correction[:rows * n].reshape(rows, n)


def _checked_scratch(out: ActScratch, rows: int, k: int, group: int, sums: bool,
                     asym_n: int) -> ActScratch:
    if not out.fits(rows, k, group, sums, asym_n):
        raise ValueError(f"act_scratch (ActScratch of {out.rows} rows, K={out.k}, "
                         f"group={out.group}, sums={out.gsum is not None}, "
                         f"asym_n={out.asym_n}) does not fit x of shape {(rows, k)} with "
                         f"group={group}, sums={sums}, asym_n={asym_n}")
    return out


def _quantized_matmul(xq: np.ndarray, scale: np.ndarray, gsum: np.ndarray | None,
                      weight: PackedWeight, sc: ActScratch, bias: np.ndarray | None,
                      out: np.ndarray | None) -> np.ndarray:
    """The int8 GEMM of quantized rows, with the zero points' correction when
    the weight takes asymmetric activations (sc holds them)."""
    rows = xq.shape[0]
    if weight.dtype == "gguf":
        return _KERNELS.gemm_gguf(xq, scale, gsum, weight, _out(out, (rows, weight.n)), bias,
                                  get_pool())
    y = _KERNELS.gemm_wq(xq, scale, gsum, weight, _out(out, (rows, weight.n)), bias, get_pool())
    corr_w = weight.zp_correction
    if corr_w is not None:  # y -= (scale * zp) @ C.T
        szp = sc.scaled_zp[:rows]
        # zp (|zp| <= 127) converts to float32 exactly, and a float32 product is the
        # correctly rounded one a float64 product would round to; a mixed-type multiply
        # would allocate casting buffers every call
        np.copyto(szp, sc.zp[:rows])
        np.multiply(szp, scale, out=szp)
        corr = _KERNELS.gemm(szp, corr_w, sc.correction(rows, weight.n), None, get_pool())
        np.subtract(y, corr, out=y)
    return y


def _act_scratch(weight: PackedWeight, rows: int, act_scratch: ActScratch | None
                 ) -> tuple[ActScratch, bool]:
    """The scratch a quantized weight's activations go to (checked; a new one
    when none is given), and whether they are asymmetric."""
    asym = weight.zp_correction is not None
    if act_scratch is None:
        return ActScratch(max(rows, 1), weight.k, weight.group, True,
                          weight.n if asym else 0), asym
    sums = weight.bits == 4 or weight.dtype == "gguf" or act_scratch.gsum is not None
    return _checked_scratch(act_scratch, rows, weight.k, weight.group, sums,
                            weight.n if asym else 0), asym


def linear(x: np.ndarray, weight: PackedWeight, bias: np.ndarray | None = None,
           out: np.ndarray | None = None, act_scratch: ActScratch | None = None) -> np.ndarray:
    """out[M, N] = x[M, K] @ W.T (+ bias) with a prepacked weight. A quantized
    weight (w8/w4) quantizes x per token and group first (with group sums,
    which save the 8-bit GEMM computing them; asymmetric when the weight was
    packed for it) into act_scratch (allocated for this call when not given),
    then runs the int8 GEMM."""
    if not isinstance(weight, PackedWeight):
        raise ValueError(f"weight must be a PackedWeight (see pack_weight), got "
                         f"{type(weight).__name__}")
    rows = x.shape[0] if isinstance(x, np.ndarray) and x.ndim == 2 else 0
    if not weight.quantized:
        return _KERNELS.gemm(x, weight, _out(out, (rows, weight.n)), bias, get_pool())
    if rows and x.shape[1] != weight.k:
        raise ValueError(f"x has {x.shape[1]} columns but w has K={weight.k}")
    sc, asym = _act_scratch(weight, rows, act_scratch)
    xq, scale, gsum = sc.views(rows)
    _KERNELS.quant_act(x, xq, scale, gsum, weight.group, get_pool(),
                       sc.zero_points(rows) if asym else None)
    return _quantized_matmul(xq, scale, gsum, weight, sc, bias, out)


def rms_norm_linear(x: np.ndarray, norm_weight: np.ndarray, eps: float, weight: PackedWeight,
                    bias: np.ndarray | None = None, residual: np.ndarray | None = None,
                    normed: np.ndarray | None = None, out: np.ndarray | None = None,
                    act_scratch: ActScratch | None = None) -> np.ndarray:
    """linear(rms_norm(x [+ residual]), weight): for a quantized weight the norm
    and the activations' quantization are one fused kernel call; normed (the
    normalized rows) is written either way."""
    normed = _out(normed, getattr(x, "shape", (0, 0)))
    if not isinstance(weight, PackedWeight) or not weight.quantized:
        rms_norm(x, norm_weight, eps, residual, normed)
        return linear(normed, weight, bias, out)
    rows = x.shape[0] if isinstance(x, np.ndarray) and x.ndim == 2 else 0
    if rows and x.shape[1] != weight.k:
        raise ValueError(f"x has {x.shape[1]} columns but w has K={weight.k}")
    sc, asym = _act_scratch(weight, rows, act_scratch)
    xq, scale, gsum = sc.views(rows)
    _KERNELS.rmsnorm_quant(x, norm_weight, eps, normed, xq, scale, gsum, weight.group, residual,
                           get_pool(), sc.zero_points(rows) if asym else None)
    return _quantized_matmul(xq, scale, gsum, weight, sc, bias, out)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float,
             residual: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """rmsnorm(x [+ residual]) * weight; with residual, residual becomes x + residual."""
    return _KERNELS.rmsnorm(x, weight, eps, _out(out, getattr(x, "shape", (0, 0))), residual,
                            get_pool())


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float,
               out: np.ndarray | None = None) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight (+ bias) over each row of x [T, n]
    (mean and variance in double); out may be x."""
    return _KERNELS.layernorm(x, weight, bias, eps, _out(out, getattr(x, "shape", (0, 0))),
                              get_pool())


def rope(x: np.ndarray, positions: np.ndarray, cos_sin: np.ndarray, n_heads: int,
         head_dim: int, rot_dim: int | None = None,
         style: Literal["neox", "gptj"] = "neox") -> np.ndarray:
    """Rotates the heads of x[T, n_heads*head_dim (+...)] in place by the rows
    `positions` of cos_sin (model/rope.py's rope_cos_sin)."""
    return _KERNELS.rope(x, positions, cos_sin, n_heads, head_dim, rot_dim or head_dim, style,
                         get_pool())


def silu_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """silu(gate) * up for a fused [T, 2*inter] buffer; out may be gate_up[:, :inter]."""
    shape = (gate_up.shape[0], gate_up.shape[1] // 2) if isinstance(gate_up, np.ndarray) \
        and gate_up.ndim == 2 else (0, 0)
    return _KERNELS.silu_mul(gate_up, _out(out, shape), get_pool())


def gelu_tanh_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """gelu_tanh(gate) * up (GeGLU) over gate_up [T, 2 * inter]'s halves."""
    shape = (gate_up.shape[0], gate_up.shape[1] // 2) if isinstance(gate_up, np.ndarray) \
        and gate_up.ndim == 2 else (0, 0)
    return _KERNELS.gelu_tanh_mul(gate_up, _out(out, shape), get_pool())


def gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Exact GELU x/2 (1 + erf(x / sqrt(2))) (PyTorch's nn.GELU()) of a C-contiguous
    float32 array; out may be x."""
    return _KERNELS.gelu(x, _out(out, getattr(x, "shape", (0,))), get_pool())


def embedding(ids: np.ndarray, table: np.ndarray | GGUFTable,
              out: np.ndarray | None = None) -> np.ndarray:
    """Rows of a float32, bf16 (uint16) or GGUF-block table, as float32."""
    if isinstance(table, GGUFTable):
        return _ext.gguf_embed(ids, table.raw, table.ggml_type, table.shape[1],
                               _out(out, (len(ids), table.shape[1])))
    shape = (len(ids), table.shape[1]) if isinstance(table, np.ndarray) and table.ndim == 2 \
        else (0, 0)
    return _KERNELS.embed(ids, table, _out(out, shape), get_pool())


def exp(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The kernels' vectorized exp (1-D float32)."""
    return _KERNELS.exp(x, _out(out, getattr(x, "shape", (0,))))


class RowSampler(_ext.RowSampler):
    """A step's logits rows to tokens in one call on the pool (sample.h): mask, bad
    words, bias, raw logprobs, penalties, DRY, greedy or temperature / top-k / min-p /
    top-p, XTC and the seeded draw. Columns (max_rows long, the caller fills them
    before run): float32 temperature, top_p, min_p, repetition_penalty,
    presence_penalty, frequency_penalty, dry_multiplier, dry_base, xtc_probability,
    xtc_threshold; int32 top_k, num_logprobs, mask_row, dry_allowed_length; int8
    keep_row (nonzero: the draw leaves the row as it is: only its mask, bad words,
    bias, penalties and DRY change it); uint64 seed, stream, counter; int64
    prompt_len, dry_last_n; outputs int32 token, float32 logprob, int32 top_ids and
    float32 top_logprobs [max_rows, 20]. set_history / clear_history, set_bias /
    clear_bias, set_bad_words / clear_bad_words and set_breakers / clear_breakers
    (sequence_list's arrays) attach per-entry arrays (kept referenced). isa: the
    kernel variant (default: the selected one)."""

    def __init__(self, vocab_size: int, max_rows: int, isa: str | None = None):
        super().__init__(kernels(isa), vocab_size, max_rows, max(1, min(_NUM_THREADS, max_rows)))

    def run(self, logits: np.ndarray, begin: int, end: int, masks: np.ndarray | None = None,
            pool: ThreadPool | None = None) -> None:
        """Samples entries begin..end-1 from rows 0..end-begin-1 of logits (float32
        [rows, vocab_size], rows contiguous, strided allowed; their values afterwards
        are unspecified, except keep_row's); masks: llguidance's int32/uint32 bitmask
        rows that mask_row picks. pool: the default one unless given."""
        super().run(logits, begin, end, masks, get_pool() if pool is None else pool)


def kv_write(k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray, k_cache: np.ndarray,
             v_cache: np.ndarray, k_scale: np.ndarray | None = None,
             v_scale: np.ndarray | None = None) -> None:
    """Stores K/V rows [T, n_kv_heads*head_dim] at cache slots (-1 skips a row); an int8
    cache quantizes each (row, head) with its bf16 scale into k_scale / v_scale."""
    _KERNELS.kv_write(k, v, slot_mapping, k_cache, v_cache, get_pool(), k_scale, v_scale)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                    block_table: np.ndarray, seq_lens: np.ndarray, query_start: np.ndarray,
                    n_heads: int, scale: float, out: np.ndarray | None = None,
                    sliding_window: int = 0, scratch: np.ndarray | None = None,
                    sinks: np.ndarray | None = None, causal: bool = True,
                    k_scale: np.ndarray | None = None,
                    v_scale: np.ndarray | None = None) -> np.ndarray:
    """Varlen attention of q [T, n_heads*head_dim] over the paged cache, causal, or with
    causal=False every row over all seq_lens[b] keys of its sequence (Whisper's encoder
    and cross-attention; no sliding window); sinks: float32 [n_heads] logits each head's
    softmax denominator also holds (GPT-OSS); k_scale, v_scale: an int8 cache's."""
    head_dim = k_cache.shape[-1] if isinstance(k_cache, np.ndarray) and k_cache.ndim == 4 else 0
    shape = (q.shape[0], n_heads * head_dim) if isinstance(q, np.ndarray) and q.ndim == 2 \
        else (0, 0)
    return _KERNELS.attention(q, k_cache, v_cache, block_table, seq_lens, query_start, n_heads,
                              scale, _out(out, shape), sliding_window, scratch, get_pool(),
                              sinks, causal, k_scale, v_scale)


def gdn_conv(x: np.ndarray, weight: np.ndarray, state: np.ndarray, state_slots: np.ndarray,
             query_start: np.ndarray, seq_lens: np.ndarray,
             out: np.ndarray | None = None) -> np.ndarray:
    """silu(causal depthwise conv(x [rows, channels])) per sequence, each one's last
    kernel-1 inputs kept in its state slot (Gated DeltaNet; see Kernels.gdn_conv)."""
    return _KERNELS.gdn_conv(x, weight, state, state_slots, query_start, seq_lens,
                             _out(out, getattr(x, "shape", (0, 0))), get_pool())


def gdn_rule(qkv: np.ndarray, a: np.ndarray, b: np.ndarray, a_neg: np.ndarray,
             dt_bias: np.ndarray, state: np.ndarray, state_slots: np.ndarray,
             query_start: np.ndarray, seq_lens: np.ndarray, n_k_heads: int, n_v_heads: int,
             out: np.ndarray | None = None, v_tiled: bool = False) -> np.ndarray:
    """The gated delta rule over the conv's output qkv [rows, q|k|v], each sequence's
    state [dk, dv] per v head in its slot (see Kernels.gdn_rule)."""
    shape = (getattr(qkv, "shape", (0,))[0], n_v_heads * getattr(state, "shape", (0,))[-1])
    return _KERNELS.gdn_rule(qkv, a, b, a_neg, dt_bias, state, state_slots, query_start,
                             seq_lens, n_k_heads, n_v_heads, _out(out, shape), v_tiled,
                             get_pool())


def gated_rmsnorm(x: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float,
                  out: np.ndarray | None = None) -> np.ndarray:
    """rmsnorm of each head of x (d = len(weight)) * weight * silu(z); out may be x."""
    return _KERNELS.gated_rmsnorm(x, z, weight, eps, _out(out, getattr(x, "shape", (0, 0))),
                                  get_pool())


def sigmoid_mul(gate: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x *= sigmoid(gate), in place (the attention output gate)."""
    return _KERNELS.sigmoid_mul(gate, x, get_pool())


def bind_decoder_layer(steps: list[tuple],
                       linears: list[tuple[PackedWeight | None, np.ndarray | None,
                                           ActScratch | None]],
                       q_norm: np.ndarray | None, k_norm: np.ndarray | None, eps: float,
                       buffers: tuple, k_cache: np.ndarray, v_cache: np.ndarray,
                       cos_sin: np.ndarray, n_heads: int, n_kv_heads: int, head_dim: int,
                       rot_dim: int, scale: float, sliding_window: int, first: bool,
                       sinks: np.ndarray | None = None, comm: Comm | None = None,
                       sparse: SparseLayer | None = None,
                       delta: DeltaNetMixer | None = None,
                       k_scale: np.ndarray | None = None,
                       v_scale: np.ndarray | None = None) -> DecoderLayer:
    """A decoder layer's steps (("norm_linear", "qkv", norm), ("qk_norm",), ...: see
    DecoderLayer) bound to its weights ((weight, bias, act_scratch) for qkv, o,
    gate_up, down), its workspace buffers and KV cache layer (None for a recurrent
    layer), checked once, for decoder_layer() (comm: a tensor-parallel rank's; sparse:
    the sparse_mlp step's; delta: the delta_net step's; k_scale, v_scale: an int8
    cache's row scales)."""
    return DecoderLayer(Kernels(_ISA), steps, linears, q_norm, k_norm, eps, buffers, k_cache,
                        v_cache, cos_sin, n_heads, n_kv_heads, head_dim, rot_dim, scale,
                        sliding_window, first, sinks, comm, sparse, delta, k_scale, v_scale)


def bind_delta_net(ba: PackedWeight, conv: np.ndarray, a_neg: np.ndarray,
                   dt_bias: np.ndarray, norm: np.ndarray, conv_state: np.ndarray,
                   delta_state: np.ndarray, k_heads: int, v_tiled: bool, buffers: tuple
                   ) -> DeltaNetMixer:
    """A recurrent layer's Gated DeltaNet bound to its weights, its state pool arrays
    and a workspace's conv_out and delta_ba buffers (see DeltaNetMixer)."""
    return DeltaNetMixer(Kernels(_ISA), ba, conv, a_neg, dt_bias, norm, conv_state,
                         delta_state, k_heads, v_tiled, buffers)


def decoder_layer(layer: DecoderLayer, batch: StepBatch) -> None:
    """Runs a bound decoder layer on one step's batch: the kernel calls its steps'
    per-op wrappers (rms_norm_linear, rope, kv_write, paged_attention, linear,
    gelu_tanh_mul, silu_mul, a sparse layer's run, ...) make, in one call."""
    layer.run(batch, get_pool())


def bind_sparse_layer(router: PackedWeight, router_bias: np.ndarray | None,
                      gate_up: list[PackedWeight], gate_up_bias: np.ndarray | None,
                      down: list[PackedWeight], down_bias: np.ndarray | None,
                      gate_up_scratch: ActScratch | None, down_scratch: ActScratch | None,
                      top_k: int, renormalize: bool,
                      clamped_swiglu: tuple[float, float] | None, buffers: tuple,
                      shared: tuple | None = None) -> SparseLayer:
    """A sparse layer's router and experts (and shared expert: (gate_up, down, gate))
    bound to a workspace's buffers (normed, hidden, router_logits, expert_in,
    expert_gate_up, expert_act), for a decoder layer's sparse_mlp step (see
    SparseLayer)."""
    return SparseLayer(Kernels(_ISA), router, router_bias, gate_up, gate_up_bias, down,
                       down_bias, gate_up_scratch, down_scratch, top_k, renormalize,
                       clamped_swiglu, buffers, shared)


def bind_norm_head(weight: PackedWeight, act_scratch: ActScratch | None, norm_weight: np.ndarray,
                   eps: float, hidden: np.ndarray, residual: np.ndarray, selected: np.ndarray,
                   selected_residual: np.ndarray, logits: np.ndarray) -> NormHead:
    """The final norm and lm_head bound to a workspace's buffers, for norm_head()."""
    return NormHead(Kernels(_ISA), weight, act_scratch, norm_weight, eps, hidden, residual,
                    selected, selected_residual, logits)


def norm_head(head: NormHead, rows: np.ndarray, batch_rows: int) -> None:
    """Logits of the batch rows `rows` (the runner's logits_rows) into the head's logits
    buffer: rms_norm_linear(hidden + residual, lm_head) on those rows only."""
    head.run(rows, batch_rows, get_pool())
