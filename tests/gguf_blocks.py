"""GGUF quantized blocks for tests: random blocks of every type armllm runs as
stored (every code point, scales from tiny to extreme), and an independent numpy
decoder into the parts the kernels compute with: integer values v, and per 16
columns a scale d and an offset o, such that d * v + o is the gguf package's
dequantization (checked in tests/kernels/test_gguf.py); for the super-block types
also the integers behind d and o (decode_super: d = D * s, o = O * m), which their
GEMM sums in int32."""
from __future__ import annotations

import numpy as np

# type -> (elements, bytes per block, byte offsets of its f16 fields, weight group)
BLOCKS = {
    "Q4_0": (32, 18, (0,), 32), "Q4_1": (32, 20, (0, 2), 32), "Q5_0": (32, 22, (0,), 32),
    "Q5_1": (32, 24, (0, 2), 32), "Q8_0": (32, 34, (0,), 32), "Q2_K": (256, 84, (80, 82), 16),
    "Q3_K": (256, 110, (108,), 16), "Q4_K": (256, 144, (0, 2), 32),
    "Q5_K": (256, 176, (0, 2), 32), "Q6_K": (256, 210, (208,), 16),
    "IQ4_NL": (32, 18, (0,), 32), "IQ4_XS": (256, 136, (0,), 32),
    "MXFP4": (32, 17, (), 32),   # its scale: the e8m0 byte 0
}
# typical |v * sub-scale| of random blocks: their f16 scale of s / TYPICAL[type] gives
# weights of about s in magnitude
TYPICAL = {"Q4_0": 4, "Q4_1": 8, "Q5_0": 8, "Q5_1": 16, "Q8_0": 64, "Q2_K": 12, "Q3_K": 32,
           "Q4_K": 240, "Q5_K": 480, "Q6_K": 1024, "IQ4_NL": 60, "IQ4_XS": 960, "MXFP4": 5}
RANDOM_ONLY = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")  # gguf can't quantize
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
            "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "MXFP4": 39}
OFFSET_TYPES = ("Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K")
# 256-element blocks: their GEMM sums integer sub-scales over a whole block
SUPER_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                       113], np.int8)
# the OCP MX spec's FP4 (e2m1) values of the 16 codes: sign bit 3, exponent bits 2-1,
# mantissa bit 0; subnormal 0.5 at exponent 0
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def e8m0(e: np.ndarray) -> np.ndarray:
    """The OCP MX spec's E8M0 scale: 2^(e - 127) as float64 (exact down to 2^-127),
    NaN for 0xFF."""
    return np.where(e == 255, np.nan, np.ldexp(1.0, e.astype(np.int64) - 127))


def random_blocks(rng: np.random.Generator, type_name: str, n_blocks: int,
                  scale: float = 1e-3, extremes: bool = False) -> np.ndarray:
    """[n_blocks, bytes] uint8: random bits everywhere (every code point and
    sub-scale), the f16 scale fields finite: |N(0, scale)|-sized values, or with
    extremes also zeros, subnormals, the largest f16 and negative ones (MXFP4's e8m0
    exponent: near scale's, or with extremes also 0, 1, 2, 253, 254 and NaN's 255)."""
    _, nbytes, f16_at, _ = BLOCKS[type_name]
    blocks = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    for off in f16_at:
        vals = (rng.standard_normal(n_blocks) * scale).astype(np.float16)
        if extremes:
            pick = rng.integers(0, 6, n_blocks)
            special = np.array([0.0, 6e-8, -3e-5, 65504.0, -65504.0, 1.0], np.float16)
            vals = np.where(pick < 3, special[rng.integers(0, 6, n_blocks)], vals)
        blocks[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    if type_name == "MXFP4":   # e8m0 exponents around `scale`'s; with extremes the ends too
        e = np.clip(np.round(np.log2(scale)) + 128 + rng.integers(-4, 5, n_blocks), 0, 254)
        if extremes:
            pick = rng.integers(0, 6, n_blocks)
            ends = np.array([0, 1, 2, 253, 254, 255])[rng.integers(0, 6, n_blocks)]
            e = np.where(pick < 3, ends, e)
        blocks[:, 0] = e.astype(np.uint8)
    return blocks


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, off:off + 2]).view(np.float16).astype(np.float32)[:, 0]


def _k4_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's eight 6-bit scales and mins from their 12 bytes, [nb, 8] each."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, mn


def _two_bit(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K low bits: element e of a 256-block is bits 2*((e%128)//32) of byte
    (e//128)*32 + e%32."""
    e = np.arange(256)
    return (qs[:, (e // 128) * 32 + e % 32] >> (2 * ((e % 128) // 32))) & 3


def decode(type_name: str, blocks: np.ndarray):
    """(v int32 [nb, elems], d f32 [nb, elems/16], o f32 [nb, elems/16])."""
    nb = blocks.shape[0]
    b = blocks.astype(np.int32)
    e32 = np.arange(32)
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"):
        qs = b[:, -16:]
        q = np.where(e32 < 16, qs[:, e32 % 16] & 15, qs[:, e32 % 16] >> 4)
        d = _f16(blocks, 0)
        o = _f16(blocks, 2) if type_name in ("Q4_1", "Q5_1") else np.zeros(nb, np.float32)
        if type_name.startswith("Q5"):
            h0 = 2 if type_name == "Q5_0" else 4
            qh = (b[:, h0] | b[:, h0 + 1] << 8 | b[:, h0 + 2] << 16 | b[:, h0 + 3] << 24)
            q = q | ((qh[:, None] >> e32) & 1) << 4
        if type_name == "IQ4_NL":
            v = IQ4_VALUES[q]
        else:
            v = {"Q4_0": q - 8, "Q5_0": q - 16}.get(type_name, q)
        return v.astype(np.int32), np.repeat(d[:, None], 2, 1), np.repeat(o[:, None], 2, 1)
    if type_name == "Q8_0":
        v = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.int32)
        return v, np.repeat(_f16(blocks, 0)[:, None], 2, 1), np.zeros((nb, 2), np.float32)
    if type_name == "MXFP4":   # v = twice the code's value (integral), d = half the scale
        qs = b[:, 1:17]
        q = np.where(e32 < 16, qs[:, e32 % 16] & 15, qs[:, e32 % 16] >> 4)
        d = (e8m0(b[:, 0]) / 2).astype(np.float32)
        return (2 * E2M1[q]).astype(np.int32), np.repeat(d[:, None], 2, 1), \
            np.zeros((nb, 2), np.float32)
    if type_name in SUPER_TYPES:
        v, sub, mins, dd, od = decode_super(type_name, blocks)
        return v, dd[:, None] * sub.astype(np.float32), od[:, None] * mins.astype(np.float32)
    raise ValueError(f"no decoder for {type_name}")


def decode_super(type_name: str, blocks: np.ndarray):
    """A super-block type's integers: (v int32 [nb, 256], s int32 [nb, 16], m int32
    [nb, 16], D f32 [nb], O f32 [nb]): per 16 columns the sub-scale s and min m (0
    without offsets; a 32-column group's twice), D = d and O = -dmin (0 without
    offsets), so that d = D * s and o = O * m."""
    nb = blocks.shape[0]
    b = blocks.astype(np.int32)
    e = np.arange(256)
    zeros = np.zeros((nb, 16), np.int32)
    if type_name == "Q2_K":
        sc = b[:, :16]
        return _two_bit(b[:, 16:80]), sc & 15, sc >> 4, _f16(blocks, 80), -_f16(blocks, 82)
    if type_name == "Q3_K":
        high = (b[:, e % 32] >> (e // 32)) & 1
        v = _two_bit(b[:, 32:96]) - 4 * (1 - high)
        s = b[:, 96:108]
        j = np.arange(16)
        sc = ((s[:, j % 8] >> (4 * (j // 8))) & 15) | (((s[:, 8 + j % 4] >> (2 * (j // 4))) & 3)
                                                        << 4)
        return v, sc - 32, zeros, _f16(blocks, 108), np.zeros(nb, np.float32)
    if type_name in ("Q4_K", "Q5_K"):
        sc, mn = _k4_scale_min(blocks[:, 4:16])
        qs = b[:, 48:] if type_name == "Q5_K" else b[:, 16:]
        v = (qs[:, (e // 64) * 32 + e % 32] >> (4 * ((e % 64) // 32))) & 15
        if type_name == "Q5_K":
            v = v | ((b[:, 16 + e % 32] >> (e // 32)) & 1) << 4
        return v, np.repeat(sc, 2, 1), np.repeat(mn, 2, 1), _f16(blocks, 0), -_f16(blocks, 2)
    if type_name == "Q6_K":
        lo = (b[:, (e // 128) * 64 + e % 64] >> (4 * ((e % 128) // 64))) & 15
        hi = (b[:, 128 + (e // 128) * 32 + e % 32] >> (2 * ((e % 128) // 32))) & 3
        sc = blocks[:, 192:208].view(np.int8).astype(np.int32)
        return (lo | hi << 4) - 32, sc, zeros, _f16(blocks, 208), np.zeros(nb, np.float32)
    if type_name == "IQ4_XS":
        sh = b[:, 2] | b[:, 3] << 8
        j = np.arange(8)
        ls = ((b[:, 4 + j // 2] >> (4 * (j % 2))) & 15) | ((sh[:, None] >> (2 * j)) & 3) << 4
        i = e % 32
        idx = np.where(i < 16, b[:, 8 + 16 * (e // 32) + i % 16] & 15,
                       b[:, 8 + 16 * (e // 32) + i % 16] >> 4)
        return (IQ4_VALUES[idx].astype(np.int32), np.repeat(ls - 32, 2, 1), zeros,
                _f16(blocks, 0), np.zeros(nb, np.float32))
    raise ValueError(f"{type_name} is not a super-block type")


def decode_rows(type_name: str, raw: np.ndarray, rows: int, k: int):
    """(v [rows, k], d [rows, k/16], o [rows, k/16]) of rows of blocks as stored."""
    elems, nbytes = BLOCKS[type_name][:2]
    v, d, o = decode(type_name, np.asarray(raw, np.uint8).reshape(-1, nbytes))
    return v.reshape(rows, k), d.reshape(rows, k // 16), o.reshape(rows, k // 16)


def decode_super_rows(type_name: str, raw: np.ndarray, rows: int, k: int):
    """(v [rows, k], s [rows, k/16], m [rows, k/16], D [rows, k/256], O [rows, k/256])."""
    v, sub, mins, dd, od = decode_super(type_name, np.asarray(raw, np.uint8).reshape(-1, BLOCKS[
        type_name][1]))
    return (v.reshape(rows, k), sub.reshape(rows, k // 16), mins.reshape(rows, k // 16),
            dd.reshape(rows, k // 256), od.reshape(rows, k // 256))
