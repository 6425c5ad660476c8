"""GGUF blocks as stored: the block decoder, the embedding gather and the
GGUF-block GEMM.

The decoder must give the gguf package's dequantization bit for bit, and so
must tests/gguf_blocks.py's independent numpy decoder of the parts (v, d, o).
Every variant's GEMM must equal an exact numpy model of the header's
epilogue bit for bit: integer sums per weight group (16 or 32 columns), then
per 32-element block a = acc * sx, t = fmaf(d, a, t) [, b = gs * sx, t =
fmaf(o, b, t)], or per 256-element super-block the sums times their integer
sub-scales (and mins) summed in int32 first, a = isum * sx, t = fmaf(D, a, t)
[, b = msum * sx, t = fmaf(O, b, t)], replayed in float32 with an exact fmaf;
activations scaled per 256 columns when a super-block type is among the parts.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armllm import ops
from armllm._kernels import _ext
from tests.conftest import examples, rand
from tests.gguf_blocks import (
    BLOCKS,
    OFFSET_TYPES,
    SUPER_TYPES,
    TYPE_IDS,
    decode_rows,
    decode_super_rows,
    random_blocks,
)
from tests.kernels.test_quant import fma32

gguf = pytest.importorskip("gguf")

TYPES = list(BLOCKS)
ACT_GROUP = _ext.GGUF_ACT_GROUP


def gguf_dequantize(type_name, raw, rows, k):
    """The gguf package's dequantization; MXFP4's blocks of e = 255 NaN, as the OCP MX
    spec reads the scale (gguf, like ggml, reads 2^127)."""
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    raw = np.asarray(raw).reshape(rows, -1)
    with np.errstate(all="ignore"):
        out = gguf.quants.dequantize(raw, qtype).reshape(rows, k)
    if type_name == "MXFP4":
        nan = np.repeat(raw.reshape(rows, -1, 17)[:, :, 0] == 255, 32, axis=1)
        out[nan] = np.nan
    return out


def raw_rows(rng, type_name, rows, k, **kw):
    elems = BLOCKS[type_name][0]
    return random_blocks(rng, type_name, rows * k // elems, **kw).reshape(rows, -1)


# ------------------------------------------------------------ decoding


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("extremes", [False, True])
def test_decoder_matches_gguf_package(type_name, extremes):
    """Every code point and sub-scale, scales from subnormal to the largest f16."""
    rng = np.random.default_rng(TYPE_IDS[type_name])
    rows, k = 24, 4 * BLOCKS[type_name][0]
    raw = raw_rows(rng, type_name, rows, k, extremes=extremes)
    want = gguf_dequantize(type_name, raw, rows, k)
    ours = _ext.gguf_dequantize(TYPE_IDS[type_name], raw, rows, k)
    assert np.array_equal(ours.view(np.uint32), want.view(np.uint32))
    v, d, o = decode_rows(type_name, raw, rows, k)
    with np.errstate(all="ignore"):
        w = np.repeat(d, 16, axis=1) * v.astype(np.float32)  # exact: <= 19 + 8 bits
        if type_name in OFFSET_TYPES:
            w = w + np.repeat(o, 16, axis=1)
    assert np.array_equal(w.view(np.uint32), want.view(np.uint32))
    if type_name not in OFFSET_TYPES:
        assert not o.any()


@pytest.mark.parametrize("type_name", TYPES)
def test_decoder_on_any_bits(type_name):
    """Fully random blocks (NaN and Inf scales too): the same values, NaN for NaN."""
    rng = np.random.default_rng(100 + TYPE_IDS[type_name])
    rows, k = 16, 2 * BLOCKS[type_name][0]
    raw = rng.integers(0, 256, (rows, k // BLOCKS[type_name][0] * BLOCKS[type_name][1]),
                       dtype=np.uint8)
    want = gguf_dequantize(type_name, raw, rows, k)
    np.testing.assert_array_equal(_ext.gguf_dequantize(TYPE_IDS[type_name], raw, rows, k), want)


def test_mxfp4_decodes_as_the_ocp_mx_spec_says():
    """Every FP4 (e2m1) code under every E8M0 scale, 2^-127 .. 2^127 and NaN (0xFF):
    code value * 2^(e - 127), computed in float64 from the spec's tables, rounded
    once to float32 (exact: at most 2 significant bits), or NaN; code 8 (-0) reads
    +0, as in ggml (an integer value has no signed zero)."""
    from tests.gguf_blocks import E2M1, e8m0
    e = np.arange(256, dtype=np.uint8)
    codes = np.arange(16, dtype=np.uint8)
    raw = np.zeros((256, 17), np.uint8)
    raw[:, 0] = e
    raw[:, 1:] = (codes | ((15 - codes) << 4))[None, :]   # codes 0..15, then 15..0
    ours = _ext.gguf_dequantize(TYPE_IDS["MXFP4"], raw, 256, 32)
    values = np.concatenate([E2M1, E2M1[::-1]])
    with np.errstate(all="ignore"):
        want = (values[None, :] * e8m0(e.astype(np.int64))[:, None]).astype(np.float32)
    assert np.array_equal(np.isnan(ours), np.isnan(want)) and np.isnan(ours[255]).all()
    want[want == 0] = 0.0
    finite = ~np.isnan(want)
    assert np.array_equal(ours[finite].view(np.uint32), want[finite].view(np.uint32))
    assert ours[0, 1] == np.float32(2.0 ** -128) and ours[254, 2] == np.float32(2.0 ** 127)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS", "Q5_0", "MXFP4"])
def test_embed_gathers_dequantized_rows(type_name):
    rng = np.random.default_rng(7)
    vocab, d = 40, 2 * BLOCKS[type_name][0]
    raw = raw_rows(rng, type_name, vocab, d)
    ids = rng.integers(0, vocab, 13).astype(np.int32)
    out = np.full((13, d + 3), np.nan, np.float32)[:, :d]
    _ext.gguf_embed(ids, raw, TYPE_IDS[type_name], d, out)
    want = gguf_dequantize(type_name, raw, vocab, d)[ids]
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match=r"ids\[1\] = 40 is outside the vocabulary \[0, 40\)"):
        _ext.gguf_embed(np.array([0, 40], np.int32), raw, TYPE_IDS[type_name], d,
                        np.empty((2, d), np.float32))


# ------------------------------------------------------------ GEMM


def act_group(types):
    """The activation group of a GEMM of these parts (armllm_gguf_act_group)."""
    return 256 if any(t in SUPER_TYPES for t in types) else ACT_GROUP


def np_gemm_gguf(xq, scale, parts, bias):
    """The header's GEMM, exactly: parts = [(type_name, raw, rows)] in row order; the
    32-element types' epilogue per block from decode_rows' d and o, the super-block
    types' per 256 columns from decode_super_rows' integer sub-scales."""
    G = act_group([p[0] for p in parts])
    m = xq.shape[0]
    cols = []
    for type_name, raw, n in parts:
        k = raw.size // n * BLOCKS[type_name][0] // BLOCKS[type_name][1]
        x = xq[:, :k].astype(np.int64)
        gl = BLOCKS[type_name][3]
        t = np.zeros((m, n), np.float32)
        if type_name in SUPER_TYPES:
            v, sub, mins, dd, od = decode_super_rows(type_name, raw, n, k)
            for b in range(k // 256):
                isum = np.zeros((m, n), np.int64)
                msum = np.zeros((m, n), np.int64)
                for k0 in range(256 * b, 256 * (b + 1), gl):
                    acc = x[:, k0:k0 + gl] @ v[:, k0:k0 + gl].astype(np.int64).T
                    isum += acc * sub[:, k0 // 16][None, :]
                    msum += x[:, k0:k0 + gl].sum(axis=1)[:, None] * mins[:, k0 // 16][None, :]
                assert np.abs(isum).max(initial=0) < 2**31 and np.abs(msum).max(initial=0) < 2**31
                sx = scale[:, 256 * b // G][:, None]
                t = fma32(dd[:, b][None, :], isum.astype(np.float32) * sx, t)
                if type_name in OFFSET_TYPES:
                    t = fma32(od[:, b][None, :], msum.astype(np.float32) * sx, t)
        else:
            v, d, o = decode_rows(type_name, raw, n, k)
            for k0 in range(0, k, gl):
                sx = scale[:, k0 // G][:, None]
                acc = x[:, k0:k0 + gl] @ v[:, k0:k0 + gl].astype(np.int64).T
                t = fma32(d[:, k0 // 16][None, :], acc.astype(np.float32) * sx, t)
                if type_name in OFFSET_TYPES:
                    gs = x[:, k0:k0 + gl].sum(axis=1)[:, None]
                    t = fma32(o[:, k0 // 16][None, :], gs.astype(np.float32) * sx, t)
        cols.append(t)
    y = np.concatenate(cols, axis=1)
    return y if bias is None else (y + bias).astype(np.float32)


def make_parts(rng, types, rows, k, **kw):
    raws, parts = [], []
    for type_name, n in zip(types, rows, strict=True):
        raw = raw_rows(rng, type_name, n, k, **kw)
        raws.append(raw.reshape(-1))
        parts.append((type_name, raw.reshape(-1), n))
    return np.concatenate(raws), parts


def run_gguf(kern, x, blocks, types, rows, bias=None, pool=None, pad=0):
    k = x.shape[1]
    pw = kern.pack_gguf(blocks, k, [TYPE_IDS[t] for t in types], rows)
    m, G = x.shape[0], act_group(types)
    assert pw.group == G
    xq = np.empty((m, k + pad), np.int8)
    scale = np.empty((m, k // G + pad), np.float32)
    gsum = np.empty((m, k // G + pad), np.int32)
    kern.quant_act(x, xq, scale, gsum, G, pool)
    out = np.full((m, pw.n + pad), np.nan, np.float32)[:, :pw.n]
    kern.gemm_gguf(xq, scale, gsum, pw, out, bias, pool)
    return out, xq, scale


# K-quants need K % 256 == 0; the 32-element types mix with them there
MIXES = [("Q4_K",), ("Q5_K",), ("Q6_K",), ("Q2_K",), ("Q3_K",), ("IQ4_XS",), ("Q4_0",),
         ("Q4_1",), ("Q5_0",), ("Q5_1",), ("Q8_0",), ("IQ4_NL",), ("Q4_K", "Q4_K", "Q6_K"),
         ("Q5_0", "Q8_0"), ("Q2_K", "Q3_K", "Q4_K", "Q6_K"), ("IQ4_NL", "Q5_1", "Q4_0"),
         ("MXFP4",), ("MXFP4", "Q8_0", "MXFP4")]


@settings(max_examples=examples(40), deadline=None)
@given(m=st.integers(1, 40), mix=st.sampled_from(MIXES), data=st.data(),
       seed=st.integers(0, 2**32 - 1), with_bias=st.booleans(), pad=st.integers(0, 3))
def test_gemm_gguf_matches_exact(variant, pool, m, mix, data, seed, with_bias, pad):
    rng = np.random.default_rng(seed)
    block = max(BLOCKS[t][0] for t in mix)
    k = block * data.draw(st.integers(1, 3 if block == 256 else 12))
    rows = [data.draw(st.integers(1, 40)) for _ in mix]
    blocks, parts = make_parts(rng, mix, rows, k, extremes=data.draw(st.booleans()))
    x = rand(rng, (m, k))
    bias = rand(rng, (sum(rows),)) if with_bias else None
    out, xq, scale = run_gguf(variant, x, blocks, mix, rows, bias, pool, pad)
    want = np_gemm_gguf(xq, scale, parts, bias)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(out), finite)
    assert np.array_equal(out[finite].view(np.uint32), want[finite].view(np.uint32))


@pytest.mark.parametrize("mix", [("Q4_K", "Q4_K", "Q6_K"), ("Q5_K",), ("Q2_K", "Q3_K"),
                                 ("IQ4_XS", "Q8_0")])
def test_gemm_gguf_model_shapes_any_thread_count(variant, pools, mix):
    """SmolLM2-like K and fused QKV rows: every pool gives the same bits."""
    rng = np.random.default_rng(3)
    k, rows = 512, [96, 32, 32][:len(mix)] if len(mix) > 1 else [200]
    blocks, parts = make_parts(rng, mix, rows, k)
    x = rand(rng, (37, k))
    outs = [run_gguf(variant, x, blocks, mix, rows, pool=p)[0] for p in pools.values()]
    for o in outs[1:]:
        assert np.array_equal(o.view(np.uint32), outs[0].view(np.uint32))
    _, xq, scale = run_gguf(variant, x[:1], blocks, mix, rows)
    # a row's bits do not depend on the batch it came in
    assert np.array_equal(run_gguf(variant, x[:1], blocks, mix, rows)[0].view(np.uint32),
                          outs[0][:1].view(np.uint32))


@pytest.mark.parametrize("mix,rows,k", [(("MXFP4",), [83], 96), (("Q4_0", "Q4_0"), [40, 40], 64),
                                        (("Q4_K", "Q6_K"), [21, 37], 512)])
def test_gemm_gguf_cols_are_the_whole_calls_columns(variant, pool, mix, rows, k):
    """gemm_gguf(cols=(n0, n1)) writes exactly columns [n0, n1) of the whole call, bit
    for bit: windows from any panel of a part (parts of rows that end mid-panel), across
    parts, ending mid-panel; decode and prefill row counts."""
    rng = np.random.default_rng(11)
    blocks, _ = make_parts(rng, mix, rows, k)
    pw = variant.pack_gguf(blocks, k, [TYPE_IDS[t] for t in mix], rows)
    n, panel, G = pw.n, variant.gemm_panels["gguf"], act_group(mix)
    bias = rand(rng, (n,))
    starts = sorted({s0 + p for s0, r in zip(np.cumsum([0, *rows[:-1]]), rows, strict=True)
                     for p in range(0, r, panel)})
    for m in (1, 5, 9, 40):
        x = rand(rng, (m, k))
        xq = np.empty((m, k), np.int8)
        scale = np.empty((m, k // G), np.float32)
        gsum = np.empty((m, k // G), np.int32)
        variant.quant_act(x, xq, scale, gsum, G, pool)
        full = np.empty((m, n), np.float32)
        variant.gemm_gguf(xq, scale, gsum, pw, full, bias, pool)
        for n0 in starts[::3] + [starts[-1]]:
            for n1 in {min(n, n0 + 2 * panel + 1), n}:
                y = np.full((m, n), np.nan, np.float32)
                variant.gemm_gguf(xq, scale, gsum, pw, y, bias, cols=(int(n0), n1))
                assert np.array_equal(y[:, n0:n1], full[:, n0:n1]), (m, n0, n1)
                assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all(), (m, n0, n1)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 6, 7, 8, 9, 259])
@pytest.mark.parametrize("mix,k", [(("Q6_K", "Q4_K", "Q2_K"), 768),
                                   (("Q4_1", "IQ4_NL", "Q8_0", "Q5_0"), 288),
                                   (("Q3_K", "Q5_K"), 4352), (("Q4_0", "Q4_K"), 512)])
def test_gemm_gguf_tile_and_plan_edges(variant, pools, m, mix, k):
    """Decode at M = 1 and 3, one and two register passes (M = 4, 5..8), the
    decode/prefill boundary (M = 8, 9), more rows
    than a prefill row block (259), parts whose row counts end panels and panel
    pairs early (17, 33, 1) or fill enough panels for a decode thread's lockstep
    streams and a remainder (150),
    several 256-column chunks or a 32-column tail chunk, a K long enough to
    shorten the row blocks of 16-column groups, one thread or several: all
    equal the exact model."""
    rng = np.random.default_rng(m + k)
    rows = [17, 33, 1, 150][:len(mix)]
    blocks, parts = make_parts(rng, mix, rows, k)
    x = rand(rng, (m, k))
    bias = rand(rng, (sum(rows),))
    want = None
    for p in (None, pools[2], pools[3]):
        out, xq, scale = run_gguf(variant, x, blocks, mix, rows, bias, p)
        if want is None:
            want = np_gemm_gguf(xq, scale, parts, bias)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("type_name", TYPES)
def test_gemm_gguf_every_type_at_every_decode_m(variant, type_name, decode_streams):
    """Every type at M = 1..8 (the decode plan's rows: a speculative verify step's
    k + 1; above 4 two register passes over each chunk, the second reading the
    first's kept bytes or unpacking again) and M = 9 (the prefill tiles), with
    several chunks (and a 32-element type's tail chunk), enough panels for a
    decode thread's lockstep streams and a lone one, with one stream and two
    (cpu.h): the exact model's bits."""
    rng = np.random.default_rng(TYPE_IDS[type_name])
    k = 512 if BLOCKS[type_name][0] == 256 else 544
    rows = [72]   # 4.5 panels of 16 (9 of 8): two lockstep streams and a lone panel
    blocks, parts = make_parts(rng, (type_name,), rows, k, extremes=True)
    x = rand(rng, (9, k))
    for m in range(1, 10):
        out, xq, scale = run_gguf(variant, x[:m], blocks, (type_name,), rows)
        want = np_gemm_gguf(xq, scale, parts, None)
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(out), finite), m
        assert np.array_equal(out[finite].view(np.uint32), want[finite].view(np.uint32)), m


def test_gemm_gguf_close_to_dequantized_float_gemm(pool):
    """End to end: only the activations' int8 rounding separates the two."""
    kern = ops.kernels()
    rng = np.random.default_rng(11)
    mix, rows, k = ("Q4_K", "Q6_K"), [48, 16], 768
    blocks, parts = make_parts(rng, mix, rows, k)
    x = rand(rng, (9, k))
    out, xq, scale = run_gguf(kern, x, blocks, mix, rows, pool=pool)
    w = np.concatenate([gguf_dequantize(t, b, n, k) for t, b, n in zip(
        mix, np.split(blocks, [rows[0] * k // 256 * BLOCKS["Q4_K"][1]]), rows, strict=True)])
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    # |x - sx*xq| <= sx/2 per element
    bound = (np.repeat(scale, act_group(mix), axis=1)[:, :k].astype(np.float64) / 2) \
        @ np.abs(w).T
    assert np.all(np.abs(out - exact) <= bound * 1.001 + 1e-5 * (np.abs(x) @ np.abs(w).T))


def test_pack_gguf_rejects_bad_arguments():
    kern = ops.kernels()
    raw = random_blocks(np.random.default_rng(0), "Q4_K", 2).reshape(-1)
    q4k = TYPE_IDS["Q4_K"]
    with pytest.raises(ValueError, match=r"K a multiple of each type's block"):
        kern.pack_gguf(raw, 128, [q4k], [4])
    with pytest.raises(ValueError, match=r"known types"):
        kern.pack_gguf(raw, 256, [16], [2])           # IQ2_XXS: not decoded
    with pytest.raises(ValueError, match=r"1 to 4 parts"):
        kern.pack_gguf(raw, 256, [q4k] * 5, [1] * 5)
    with pytest.raises(ValueError, match=r"blocks hold 288 bytes; parts \[12\] x rows \[3\]"):
        kern.pack_gguf(raw, 256, [q4k], [3])
    with pytest.raises(ValueError, match=r"2 types for 1 row counts"):
        kern.pack_gguf(raw, 256, [q4k, q4k], [2])
    pw = kern.pack_gguf(raw, 256, [q4k], [2])
    assert (pw.n, pw.k, pw.dtype, pw.gguf_types, pw.gguf_rows, pw.group) == (
        2, 256, "gguf", (12,), (2,), 256)   # a K-quant: activations per 256 columns
    xq, scale, gsum = (np.zeros((1, 256), np.int8), np.zeros((1, 1), np.float32),
                       np.zeros((1, 1), np.int32))
    with pytest.raises(ValueError, match="gsum is required"):
        kern.gemm_gguf(xq, scale, None, pw, np.empty((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"scale must have 1 rows of at least 1 columns "
                                         r"\(groups of 256\)"):
        kern.gemm_gguf(xq, np.zeros((2, 1), np.float32), gsum, pw, np.empty((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"out must have shape \(1, 2\)"):
        kern.gemm_gguf(xq, scale, gsum, pw, np.empty((1, 3), np.float32))
