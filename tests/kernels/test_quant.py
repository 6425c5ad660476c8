"""Quantized GEMM: activation quantization and int8/int4-weight GEMM.

Every variant must equal an exact numpy model bit for bit (and so equal ref
and each other): quant_act is exact arithmetic (a correctly rounded
division, round-half-even, clamp, integer sums), and the GEMM is an exact
integer dot product per group followed by the header's float epilogue,
which the model replays in float32 with an exact emulation of fmaf.

Activations get one scale per token and group (channelwise weights run as
groups of ARMLLM_Q_CHANNEL_GROUP = quant_group_len(0) with the row's scale
repeated). End to end (ops.linear with a quantized weight against a float
GEMM with the dequantized weight), the only difference is the activation
rounding: |x - scale_g*xq| <= scale_g/2 per element of group g, so per
output |y_q - y_f| <= sum_g scale_g/2 * sum_{k in g} |W_deq| (+ float
rounding, 1e-5 * mag).
"""
from __future__ import annotations

import ctypes
import mmap
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import examples, rand

q_kpad, q_groups, q_glen = ops.quant_kpad, ops.quant_groups, ops.quant_group_len

GROUPS = [0, 32, 64, 128]


# ------------------------------------------------------------ numpy models


def fma32(a, b, c):
    """fmaf(a, b, c) on float32 arrays, exactly: a*b is exact in float64; the
    sum is rounded to odd in float64 (TwoSum), which then rounds to float32
    correctly. Finite inputs only."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    a, b, c = np.broadcast_arrays(a, b, c)
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    nudge = (err != 0) & even
    s = np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def np_quant_act(x, group):
    """(xq [M, kpad] int8, scale [M, ng] f32, gsum [M, ng] int32), as the header
    says: one scale per row and group of quant_group_len(group) columns."""
    m, k = x.shape
    kpad, ng, gl = q_kpad(k), q_groups(k, group), q_glen(group)
    xp = np.zeros((m, ng * gl), np.float32)
    xp[:, :k] = x
    xg = xp.reshape(m, ng, gl)
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(xg), axis=2)  # NaN propagates; padding zeros change nothing
        scale = (amax / np.float32(127)).astype(np.float32)
        v = np.rint(xg / scale[:, :, None])
    v = np.clip(v, -127, 127)
    v[~np.isfinite(v)] = 0
    v[np.broadcast_to((scale == 0)[:, :, None], v.shape)] = 0
    xq = v.astype(np.int8).reshape(m, ng * gl)
    xq[:, k:] = 0
    gsum = xq.reshape(m, ng, gl).astype(np.int32).sum(axis=2)
    return xq[:, :kpad], scale, gsum.astype(np.int32)


def per_group(a, group, ng):
    """Weight scales/offsets [n, ng]: channelwise ones ([n, 1]) repeated over the groups."""
    return a if group else np.repeat(a, ng, axis=1)


def np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, bias):
    """The header's y: exact int sums per group, then the fixed float epilogue
    (a = acc * sx; t = fma(d, a, t); b = gsum * sx; t = fma(o, b, t); y = t + bias)."""
    n, k = q.shape
    ng, gl = q_groups(k, group), q_glen(group)
    d = per_group(d, group, ng)
    o = np.zeros((n, ng), np.float32) if o is None else per_group(o, group, ng)
    m = xq.shape[0]
    t = np.zeros((m, n), np.float32)
    for g in range(ng):
        k0, k1 = g * gl, min((g + 1) * gl, k)
        acc = np.zeros((m, n), np.int64)
        if k1 > k0:
            acc = xq[:, k0:k1].astype(np.int64) @ q[:, k0:k1].astype(np.int64).T
        assert np.all(np.abs(acc) < 2**31)
        sx = scale[:, g:g + 1]
        a = acc.astype(np.float32) * sx
        t = fma32(d[None, :, g], a, t)
        if bits == 4:
            b = gsum[:, g:g + 1].astype(np.float32) * sx
            t = fma32(o[None, :, g], b, t)
    y = t
    if bias is not None:
        with np.errstate(all="ignore"):
            y = y + bias[None, :]
    return y


def quantize_weight(w, bits, group, symmetric):
    """Round-to-nearest (q, d, o) of float W: int8 symmetric, or int4 symmetric
    (q = v + 8, o = -8 d) or asymmetric (d = (max - min) / 15, o = min)."""
    n, k = w.shape
    gl = group or q_kpad(k)  # channelwise: one scale for the row
    ng = q_groups(k, group) if group else 1
    g = np.zeros((n, ng * gl), np.float32)
    g[:, :k] = w
    g = g.reshape(n, ng, gl)
    if bits == 8 or symmetric:
        qmax = 127 if bits == 8 else 7
        d = (np.abs(g).max(axis=2) / qmax).astype(np.float32)
        v = np.clip(np.rint(g / np.where(d > 0, d, 1)[:, :, None]), -qmax - (bits == 4), qmax)
        q, o = (v, None) if bits == 8 else (v + 8, (-8 * d).astype(np.float32))
    else:
        lo = g.min(axis=2)
        d = ((g.max(axis=2) - lo) / 15).astype(np.float32)
        q = np.clip(np.rint((g - lo[:, :, None]) / np.where(d > 0, d, 1)[:, :, None]), 0, 15)
        o = lo.astype(np.float32)
    return np.ascontiguousarray(q.reshape(n, -1)[:, :k], dtype=np.int8), d, o


def make_weights(rng, n, k, bits, group, offsets=True):
    ng = q_groups(k, group) if group else 1  # channelwise: d, o are [n, 1]
    if bits == 8:
        q = rng.integers(-127, 128, (n, k)).astype(np.int8)
        o = None
    else:
        q = rng.integers(0, 16, (n, k)).astype(np.int8)
        o = rand(rng, (n, ng), 0.1) if offsets else None
    d = (rng.random((n, ng)) * 0.02 + 1e-4).astype(np.float32)
    return q, d, o


def quantize(kern, x, group, pool=None, sums=True):
    m, k = x.shape
    xq = np.empty((m, q_kpad(k)), np.int8)
    scale = np.empty((m, q_groups(k, group)), np.float32)
    gsum = np.empty((m, q_groups(k, group)), np.int32) if sums else None
    kern.quant_act(x, xq, scale, gsum, group, pool)
    return xq, scale, gsum


def run_wq(kern, x, q, d, o, bits, group, bias=None, pool=None):
    xq, scale, gsum = quantize(kern, x, group, pool)
    pw = kern.pack_wq(q, d, o, bits, group)
    y = np.full((x.shape[0], q.shape[0]), np.nan, np.float32)
    kern.gemm_wq(xq, scale, gsum, pw, y, bias, pool)
    return y


# -------------------------------------------------------------- quant_act


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 67), k=st.integers(1, 600), group=st.sampled_from(GROUPS + [256]),
       seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e30]),
       pad=st.integers(0, 9))
def test_quant_act_matches_numpy(variant, pool, m, k, group, seed, scale, pad):
    """Every weight group, and 256 (the K-quant GEMM's activations)."""
    rng = np.random.default_rng(seed)
    x = rand(rng, (m, k + pad), scale)[:, :k]  # rows with a stride longer than K
    kpad, ng = q_kpad(k), q_groups(k, group)
    xq_buf = np.full((m, kpad + pad), 99, np.int8)
    gs_buf = np.full((m, ng + pad), -5, np.int32)
    sc_buf = np.full((m, ng + pad), -1.0, np.float32)
    variant.quant_act(x, xq_buf, sc_buf, gs_buf, group, pool)
    want_q, want_s, want_g = np_quant_act(x, group)
    assert np.array_equal(sc_buf[:, :ng], want_s)
    assert np.all(sc_buf[:, ng:] == -1.0), "wrote past the scales"
    assert np.array_equal(xq_buf[:, :kpad], want_q)
    assert np.all(xq_buf[:, k:kpad] == 0), "padding columns must be 0"
    assert np.array_equal(gs_buf[:, :ng], want_g)
    assert np.all(xq_buf[:, kpad:] == 99) and np.all(gs_buf[:, ng:] == -5), "wrote past"
    assert np.all(np.abs(xq_buf[:, :k]) <= 127)
    # the scale is the group's max |x| over 127: its largest element maps to +-127
    gl = q_glen(group)
    for g in range(ng):
        xs = x[:, g * gl:min((g + 1) * gl, k)]
        big = np.abs(xs).max(axis=1) > 0
        assert np.all(np.abs(xq_buf[big, g * gl:min((g + 1) * gl, k)]).max(axis=1) == 127)


def test_quant_act_ties_round_to_even(variant):
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]], np.float32)
    xq, scale, _ = quantize(variant, x, 0)
    assert scale[0, 0] == 1.0
    assert xq[0, :8].tolist() == [127, 0, 2, 2, 0, -2, -2, 4]


def test_quant_act_special_rows(variant):
    x = rand(np.random.default_rng(1), (5, 70))
    x[0] = 0.0
    x[1, 7] = np.nan
    x[2, 69] = np.inf
    x[3, 0] = -np.inf
    x[4] = np.float32(1e-45)  # below 127 * the smallest subnormal: the scale rounds to 0
    xq, scale, gsum = quantize(variant, x, 32)  # groups [0, 32), [32, 64), [64, 96)
    assert np.all(scale[0] == 0) and np.all(scale[4] == 0)
    assert np.isnan(scale[1, 0]) and scale[2, 2] == np.inf and scale[3, 0] == np.inf
    special = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 2), (3, 0), (4, 0), (4, 1), (4, 2)]
    for r, g in special:  # a group with a NaN or Inf (or all zero) is all zeros
        assert np.all(xq[r, 32 * g:32 * g + 32] == 0) and gsum[r, g] == 0
    # the other groups of those rows are quantized as usual (scale Inf, no NaN)
    want_q, want_s, want_g = np_quant_act(x, 32)
    assert np.array_equal(xq, want_q) and np.array_equal(gsum, want_g)
    assert np.array_equal(scale, want_s, equal_nan=True)
    for r, g in [(1, 1), (1, 2), (2, 0), (2, 1), (3, 1), (3, 2)]:
        assert np.isfinite(scale[r, g]) and scale[r, g] > 0
        assert np.abs(xq[r, 32 * g:32 * g + 32]).max() == 127


def test_quant_act_channelwise_groups(variant, pool):
    """group 0 quantizes activations in groups of quant_group_len(0) = 128."""
    assert q_glen(0) == 128 and q_groups(576, 0) == 5 and q_groups(1000, 0) == 8
    rng = np.random.default_rng(15)
    x = rand(rng, (3, 576))
    x[:, 300] = 1000.0  # an outlier costs only its own group's resolution
    xq, scale, gsum = quantize(variant, x, 0, pool)
    want_q, want_s, want_g = np_quant_act(x, 0)
    assert np.array_equal(xq, want_q) and np.array_equal(scale, want_s)
    assert np.array_equal(gsum, want_g)
    assert np.all(scale[:, 2] > 100 * scale[:, [0, 1, 3, 4]].max(axis=1))
    xq128, scale128, gsum128 = quantize(variant, x, 128, pool)
    assert np.array_equal(xq, xq128) and np.array_equal(scale, scale128)
    assert np.array_equal(gsum, gsum128)


def test_quant_act_without_sums(variant):
    x = rand(np.random.default_rng(2), (3, 40))
    xq, scale, gsum = quantize(variant, x, 32, sums=False)
    want_q, want_s, _ = np_quant_act(x, 32)
    assert gsum is None and np.array_equal(xq, want_q) and np.array_equal(scale, want_s)


# ----------------------------------------------------------------- gemm_wq


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 67), n=st.integers(1, 131), k=st.integers(1, 300),
       bits=st.sampled_from([8, 4]), group=st.sampled_from(GROUPS),
       seed=st.integers(0, 2**32 - 1), with_bias=st.booleans(), offsets=st.booleans(),
       pad=st.integers(0, 5))
def test_gemm_wq_matches_exact(variant, pool, m, n, k, bits, group, seed, with_bias, offsets,
                               pad):
    rng = np.random.default_rng(seed)
    x = rand(rng, (m, k))
    x[rng.integers(0, m), rng.integers(0, k)] *= 300  # an outlier group
    q, d, o = make_weights(rng, n, k, bits, group, offsets)
    bias = rand(rng, n) if with_bias else None
    ng = q_groups(k, group)
    xq = np.empty((m, q_kpad(k)), np.int8)
    scale = np.empty((m, ng + pad), np.float32)[:, :ng]  # scale rows longer than ng
    gsum = np.empty((m, ng + 2 * pad), np.int32)[:, :ng]
    variant.quant_act(x, xq, scale, gsum, group, pool)
    pw = variant.pack_wq(q, d, o, bits, group)
    ybuf = np.full((m, n + pad), -7.0, np.float32)
    variant.gemm_wq(xq, scale, gsum, pw, ybuf[:, :n], bias, pool)
    want = np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, bias)
    assert np.array_equal(ybuf[:, :n], want)
    assert np.all(ybuf[:, n:] == -7.0), "wrote past N"
    if bits == 8:  # 8-bit weights compute the group sums themselves without gsum
        y = np.empty((m, n), np.float32)
        variant.gemm_wq(xq, scale, None, pw, y, bias, pool)
        assert np.array_equal(y, want)


@pytest.mark.parametrize("bits,group", [(8, 0), (8, 128), (8, 32), (4, 32), (4, 128), (4, 0)])
def test_gemm_wq_model_shapes(variant, pool, bits, group, decode_streams):
    """K = 576 (SmolLM2) with group 128 or channelwise: five groups, the last of
    64 columns; 1536 (its MLP); 1000 (a padded last group); decode rows over
    enough panels for a thread's lockstep streams and a remainder (N = 150), with
    one stream and two (cpu.h)."""
    rng = np.random.default_rng(3)
    for m, n, k in [(1, 131, 576), (4, 64, 576), (5, 64, 576), (67, 40, 576), (9, 24, 1000),
                    (2, 48, 1536), (1, 150, 576), (2, 150, 576), (3, 150, 576)]:
        x = rand(rng, (m, k))
        q, d, o = make_weights(rng, n, k, bits, group)
        bias = rand(rng, n)
        xq, scale, gsum = quantize(variant, x, group)
        assert scale.shape == (m, q_groups(k, group))
        pw = variant.pack_wq(q, d, o, bits, group)
        assert pw.n_groups == q_groups(k, group)
        y = np.empty((m, n), np.float32)
        variant.gemm_wq(xq, scale, gsum, pw, y, bias, pool)
        assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, bias))


@pytest.mark.parametrize("bits,group", [(8, 0), (8, 32), (4, 32), (4, 128)])
def test_gemm_wq_cols_are_the_whole_calls_columns(variant, pool, bits, group):
    """gemm_wq(cols=(n0, n1)) writes exactly columns [n0, n1) of the whole call, bit for
    bit: decode and prefill row counts, a bias, windows from any packed panel."""
    from tests.kernels.test_gemm import col_windows
    rng = np.random.default_rng(10)
    panel = variant.gemm_panels["wq"]
    n, k = 5 * panel + 3, 576
    q, d, o = make_weights(rng, n, k, bits, group)
    bias = rand(rng, n)
    pw = variant.pack_wq(q, d, o, bits, group)
    for m in (1, 3, 5, 9, 40):
        xq, scale, gsum = quantize(variant, rand(rng, (m, k)), group)
        full = np.empty((m, n), np.float32)
        variant.gemm_wq(xq, scale, gsum, pw, full, bias, pool)
        for n0, n1 in col_windows(n, panel):
            y = np.full((m, n), np.nan, np.float32)
            variant.gemm_wq(xq, scale, gsum, pw, y, bias, cols=(n0, n1))
            assert np.array_equal(y[:, n0:n1], full[:, n0:n1]), (m, n0, n1)
            assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all(), (m, n0, n1)


def strided_gemm_wq(kern, xq, scale, gsum, pw, bias, pool, pad):
    """gemm_wq with every row stride `pad` elements longer than its row (xq, scale,
    gsum, out); checks that nothing past N was written and returns out[:, :N]."""
    m, n = xq.shape[0], pw.n

    def strided(a, fill):
        buf = np.full((m, a.shape[1] + pad), fill, a.dtype)
        buf[:, :a.shape[1]] = a
        return buf[:, :a.shape[1]]

    ybuf = np.full((m, n + pad), -7.0, np.float32)
    kern.gemm_wq(strided(xq, 99), strided(scale, -1.0),
                 None if gsum is None else strided(gsum, -5), pw, ybuf[:, :n], bias, pool)
    assert np.all(ybuf[:, n:] == -7.0), "wrote past N"
    return ybuf[:, :n]


# M around the decode limit (4), the prefill tile heights (4, 6) and a verify step's
# k + 1 rows (up to 9); N around the 16- and 32-column tiles and the two panel streams
# of a decode thread; K around the 32/64/128 groups and across several L1 K blocks of a
# prefill tile (about 400 to 900 k a block, by format).
TILE_EDGES = [(m, n, k) for m, n, k in [
    (1, 17, 31), (2, 33, 65), (3, 16, 129), (4, 31, 127), (5, 32, 64), (6, 47, 33),
    (7, 48, 96), (8, 97, 300), (5, 80, 2100), (8, 64, 1000), (9, 33, 96), (11, 15, 160),
    (12, 49, 1000), (13, 1, 2100), (4, 50, 2100), (25, 64, 257), (37, 80, 1537)]]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", GROUPS)
def test_gemm_wq_tile_edges(variant, pools, bits, group):
    """Every tail of every tile (M, N, K), with bias and padded strides, on 1 and 3
    threads: the exact model's bits; 8-bit weights also without gsum."""
    _exact_on_tile_edges(variant, pools, bits, group, TILE_EDGES, 17 + bits + group, 3)


def _exact_on_tile_edges(variant, pools, bits, group, shapes, seed, pad):
    """gemm_wq of each (M, N, K) in shapes (an outlier column in x, a bias, rows padded
    by `pad` without a pool, on 3 threads unpadded) gives the exact model's bits; 8-bit
    weights also without precomputed sums."""
    rng = np.random.default_rng(seed)
    for m, n, k in shapes:
        x = rand(rng, (m, k))
        x[:, rng.integers(0, k)] *= 40  # an outlier column
        q, d, o = make_weights(rng, n, k, bits, group)
        bias = rand(rng, n)
        xq, scale, gsum = quantize(variant, x, group)
        pw = variant.pack_wq(q, d, o, bits, group)
        want = np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, bias)
        for pool, pad_rows in [(None, pad), (pools[3], 0)]:
            y = strided_gemm_wq(variant, xq, scale, gsum, pw, bias, pool, pad_rows)
            assert np.array_equal(y, want), (m, n, k, pad_rows)
        if bits == 8:
            y = strided_gemm_wq(variant, xq, scale, None, pw, None, pools[2], 5)
            assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, None))


@pytest.mark.parametrize("bits,group", [(8, 32), (4, 32), (8, 0), (4, 128)])
def test_gemm_wq_tall_blocks(variant, pools, bits, group):
    """More rows than one prefill row block, and row blocks whose per-group terms
    (rows x groups) overflow the kernels' stack buffer: the same bits on 1..4 threads."""
    _same_bits_on_every_pool(variant, pools, bits, group, 40, [(300, 200), (258, 544)], 18)


def _same_bits_on_every_pool(variant, pools, bits, group, n, shapes, seed):
    """gemm_wq of each (M, K) in shapes gives the exact model's bits without a pool and
    on every pool (and, for 8-bit weights, without precomputed sums too)."""
    rng = np.random.default_rng(seed)
    for m, k in shapes:
        x = rand(rng, (m, k))
        q, d, o = make_weights(rng, n, k, bits, group)
        xq, scale, gsum = quantize(variant, x, group, pools[2])
        pw = variant.pack_wq(q, d, o, bits, group)
        want = np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, None)
        for p in [None, *pools.values()]:
            y = np.empty((m, n), np.float32)
            variant.gemm_wq(xq, scale, gsum, pw, y, None, p)
            assert np.array_equal(y, want), (m, k, p)
        if bits == 8:
            y = np.empty((m, n), np.float32)
            variant.gemm_wq(xq, scale, None, pw, y, None, pools[2])
            assert np.array_equal(y, want)


# AMX runs from M = 32 (64 with groups of 32); M around its 16-row tiles (whole, one
# past, a last tile reaching back), N around its two-panel (32-column) C tiles, K
# around its 32/64-k tile steps (last groups of 32 or 96 columns) and several staged K
# blocks; the first shapes run avx512's below the thresholds.
AMX_TILE_EDGES = [(8, 16, 96), (31, 40, 544), (32, 17, 160), (33, 31, 224), (63, 33, 1000),
                  (64, 1, 32), (65, 48, 2080), (79, 63, 288), (96, 80, 4000), (97, 16, 96)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", GROUPS)
def test_gemm_wq_amx_tile_edges(variant, pools, bits, group):
    """Every tail of AMX's tiles, with bias, padded strides (bytes past kpad 99) and
    y past N untouched, on 1 and 3 threads: the exact model's bits."""
    _exact_on_tile_edges(variant, pools, bits, group, AMX_TILE_EDGES, 27 + bits + group, 5)


@pytest.mark.parametrize("bits,group", [(8, 0), (4, 32), (8, 64)])
def test_gemm_wq_many_row_blocks(variant, pools, bits, group):
    """M past AMX's row blocks (about 256 rows: blocks cut at multiples of 16, the
    last tile of each reaching back): the same bits on 1..4 threads."""
    _same_bits_on_every_pool(variant, pools, bits, group, 24, [(530, 96), (1100, 160)], 28)


def _xq_before_a_guard_page(xq):
    """A copy of xq whose last row ends where an unreadable page begins (Linux):
    a kernel reading past the last row's kpad bytes faults. None where that cannot
    be set up."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        m, kpad = xq.shape
        nbytes = m * kpad
        size = (nbytes + page - 1) // page * page + page
        buf = mmap.mmap(-1, size)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        if libc.mprotect(ctypes.c_void_p(addr + size - page), page, 0) != 0:  # PROT_NONE
            return None
    except (OSError, AttributeError):
        return None
    flat = np.frombuffer(buf, np.int8, nbytes, size - page - nbytes)
    out = flat.reshape(m, kpad)
    out[...] = xq
    return out


@pytest.mark.parametrize("bits,group", [(8, 64), (4, 128), (8, 0), (4, 64)])
def test_gemm_wq_reads_nothing_past_the_last_row(variant, bits, group):
    """K whose last group is shorter than the kernels' K steps (AMX multiplies 64 k
    at a time): the last row's xq ends at an unreadable page, so a read past it
    faults; the result is the exact model's."""
    rng = np.random.default_rng(29)
    for m, n, k in [(64, 20, 96), (65, 33, 160), (33, 16, 32), (40, 17, 224), (81, 5, 96)]:
        x = rand(rng, (m, k))
        q, d, o = make_weights(rng, n, k, bits, group)
        xq, scale, gsum = quantize(variant, x, group)
        guarded = _xq_before_a_guard_page(xq)
        if guarded is None:
            pytest.skip("no mprotect here")
        pw = variant.pack_wq(q, d, o, bits, group)
        y = np.empty((m, n), np.float32)
        variant.gemm_wq(guarded, scale, gsum, pw, y)
        assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, None))


@pytest.mark.parametrize("bits,group", [(8, 0), (8, 64), (4, 32), (4, 0)])
def test_gemm_wq_asymmetric_activations(variant, pool, bits, group):
    """Activations quantized with zero points (every xq up to +-127, gsum holding
    z): the GEMM is the same exact sum over the stored bytes."""
    rng = np.random.default_rng(19)
    for m, n, k in [(1, 40, 300), (3, 33, 576), (9, 70, 1000)]:
        x = (rand(rng, (m, k)) + np.float32(2.0)).astype(np.float32)  # skewed: z far from 0
        ng = q_groups(k, group)
        xq, scale = np.empty((m, q_kpad(k)), np.int8), np.empty((m, ng), np.float32)
        gsum, zp = np.empty((m, ng), np.int32), np.empty((m, ng), np.int32)
        variant.quant_act(x, xq, scale, gsum, group, pool, zp=zp)
        assert np.all(zp < 0), "skewed rows: zero points well below 0"
        q, d, o = make_weights(rng, n, k, bits, group)
        pw = variant.pack_wq(q, d, o, bits, group)
        y = np.empty((m, n), np.float32)
        variant.gemm_wq(xq, scale, gsum, pw, y, None, pool)
        assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, o, bits, group, None))


def test_gemm_wq_long_k_small_groups(variant, pool):
    """Over a thousand groups a row (the kernels' per-block scratch may not fit)."""
    rng = np.random.default_rng(14)
    for bits in (8, 4):
        x = rand(rng, (6, 33000))
        q, d, o = make_weights(rng, 9, 33000, bits, 32)
        xq, scale, gsum = quantize(variant, x, 32, pool)
        y = np.empty((6, 9), np.float32)
        variant.gemm_wq(xq, scale, gsum, variant.pack_wq(q, d, o, bits, 32), y, None, pool)
        assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, o, bits, 32, None))


def test_gemm_wq_extreme_values_do_not_saturate(variant):
    """Every product at its largest (|x| = |q| = 127, or 15 for 4 bits) over a
    long K: int16 partial sums must never saturate."""
    k, n = 4096, 16
    x = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32)[None, :].repeat(4, 0)
    x[1] = 1.0
    x[2] = -1.0
    for bits, qv in [(8, 127), (8, -127), (4, 15)]:
        q = np.full((n, k), qv, np.int8)
        q[1::2] = np.int8(-qv if bits == 8 else 0)
        d = np.ones((n, 1), np.float32)
        xq, scale, gsum = quantize(variant, x, 0)
        y = np.empty((4, n), np.float32)
        variant.gemm_wq(xq, scale, gsum, variant.pack_wq(q, d, None, bits, 0), y)
        assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, None, bits, 0, None))


def test_variants_agree_with_ref_bitwise(ref, pools):
    rng = np.random.default_rng(4)
    for bits, group in [(8, 0), (4, 32), (4, 128), (8, 64), (4, 0), (8, 128)]:
        for m in (1, 4, 6, 8, 67):
            x = rand(rng, (m, 576))
            x[:, 100] *= 50  # an outlier channel
            q, d, o = make_weights(rng, 131, 576, bits, group)
            bias = rand(rng, 131)
            want_act = quantize(ref, x, group)
            want = run_wq(ref, x, q, d, o, bits, group, bias)
            for isa in ops.available_isas():
                kern = ops.kernels(isa)
                for got_a, want_a in zip(quantize(kern, x, group, pools[3]), want_act, strict=True):
                    assert np.array_equal(got_a, want_a), isa
                for p in pools.values():
                    got = run_wq(kern, x, q, d, o, bits, group, bias, p)
                    assert np.array_equal(got, want), (isa, p)


@pytest.mark.parametrize("bits,group", [(8, 0), (4, 64), (4, 0), (8, 128)])
def test_gemm_wq_bit_identical_for_any_thread_count(variant, pools, bits, group):
    rng = np.random.default_rng(5)
    for m in (1, 3, 4, 5, 7, 8, 9, 67):
        x = rand(rng, (m, 640))
        q, d, o = make_weights(rng, 300, 640, bits, group)
        outs = [run_wq(variant, x, q, d, o, bits, group, pool=p)
                for p in [None, *pools.values()]]
        for y in outs[1:]:
            assert np.array_equal(y, outs[0])


def test_gemm_wq_rows_do_not_depend_on_batch(variant, pool):
    """A row's output is the same alone or in a batch (decode vs prefill path)."""
    rng = np.random.default_rng(6)
    x = rand(rng, (40, 200))
    q, d, o = make_weights(rng, 50, 200, 4, 32)
    full = run_wq(variant, x, q, d, o, 4, 32, pool=pool)
    for rows in (slice(0, 1), slice(5, 9), slice(3, 40)):
        part = run_wq(variant, np.ascontiguousarray(x[rows]), q, d, o, 4, 32, pool=pool)
        assert np.array_equal(part, full[rows])


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 0), (4, 0), (8, 64)])
def test_gemm_wq_nan_and_inf_groups(variant, bits, group):
    """A NaN or Inf in one group: that group's scale is NaN / Inf (no other
    group's), its xq 0, and the row's outputs NaN (acc 0 times scale Inf)."""
    rng = np.random.default_rng(7)
    k = 300
    x = rand(rng, (5, k))
    x[1, 3] = np.nan
    x[2, k - 1] = -np.inf
    x[3] = 0.0
    x[4, 150] = np.inf
    q, d, o = make_weights(rng, 19, k, bits, group)
    bias = rand(rng, 19)
    xq, scale, gsum = quantize(variant, x, group)
    gl = q_glen(group)
    assert np.isnan(scale[1, 0]) and scale[2, -1] == np.inf and scale[4, 150 // gl] == np.inf
    assert np.sum(~np.isfinite(scale)) == 3, "only the groups holding NaN / Inf"
    assert np.all(xq[4, 150 // gl * gl:(150 // gl + 1) * gl] == 0)
    y = run_wq(variant, x, q, d, o, bits, group, bias)
    assert np.all(np.isnan(y[1])) and np.all(np.isnan(y[2])) and np.all(np.isnan(y[4]))
    assert np.all(np.isfinite(y[0])) and np.array_equal(y[3], bias)


def test_packed_quantized_weight(variant):
    q, d, o = make_weights(np.random.default_rng(8), 10, 70, 4, 32)
    pw = variant.pack_wq(q, d, o, 4, 32)
    assert pw.shape == (10, 70) and pw.dtype == "w4" and pw.bits == 4 and pw.group == 32
    assert pw.quantized and pw.kpad == 96 and pw.n_groups == 3
    assert pw.layout == variant.gemm_wq_layout == variant.gemm_layouts["wq"]
    assert pw.isa == variant.isa and not pw.data.flags.writeable
    assert pw.data.ctypes.data % 64 == 0
    assert "w4" in repr(pw) and "group=32" in repr(pw)
    pf = variant.pack(np.ones((3, 5), np.float32), "f32")
    assert not pf.quantized and pf.bits == 32


# ------------------------------------------------------------- validation


@pytest.fixture(scope="module")
def kern():
    return ops.kernels()


@pytest.fixture(scope="module")
def w4(kern):
    q, d, o = make_weights(np.random.default_rng(9), 8, 40, 4, 32)
    return kern.pack_wq(q, d, o, 4, 32)


def test_pack_wq_rejects_bad_arguments(kern):
    q, d, _ = make_weights(np.random.default_rng(10), 4, 40, 8, 0)
    with pytest.raises(ValueError, match="bits must be 4 or 8, got 5"):
        kern.pack_wq(q, d, None, 5, 0)
    with pytest.raises(ValueError, match="group must be 0 .*, got 16"):
        kern.pack_wq(q, d, None, 8, 16)
    with pytest.raises(ValueError, match="q must have dtype int8, got int16"):
        kern.pack_wq(q.astype(np.int16), d, None, 8, 0)
    with pytest.raises(ValueError, match=r"d must have shape \(4, 2\)"):
        kern.pack_wq(q, d, None, 8, 32)
    with pytest.raises(ValueError, match="o must be None for bits=8"):
        kern.pack_wq(q, d, d, 8, 0)
    bad = q.copy()
    bad[2, 5] = -128
    with pytest.raises(ValueError, match=r"q values must be in \[-127, 127\] for bits=8"):
        kern.pack_wq(bad, d, None, 8, 0)
    with pytest.raises(ValueError, match=r"q values must be in \[0, 15\] for bits=4, got \[-"):
        kern.pack_wq(q, d, None, 4, 0)
    with pytest.raises(ValueError, match="d must have dtype float32"):
        kern.pack_wq(q, d.astype(np.float64), None, 8, 0)
    # channelwise scales are one per row, even when K spans several groups
    q300 = np.zeros((4, 300), np.int8)
    with pytest.raises(ValueError, match=r"d must have shape \(4, 1\) \(one per row"):
        kern.pack_wq(q300, np.ones((4, 3), np.float32), None, 8, 0)
    assert kern.pack_wq(q300, np.ones((4, 1), np.float32), None, 8, 0).n_groups == 3


def test_quant_act_rejects_bad_arguments(kern):
    x = np.ones((3, 40), np.float32)
    xq, scale, gsum = np.empty((3, 64), np.int8), np.empty((3, 2), np.float32), \
        np.empty((3, 2), np.int32)
    with pytest.raises(ValueError, match="x must have dtype float32, got float64"):
        kern.quant_act(x.astype(np.float64), xq, scale, gsum, 32)
    with pytest.raises(ValueError, match="x must have contiguous rows"):
        kern.quant_act(np.ones((3, 80), np.float32)[:, ::2], xq, scale, gsum, 32)
    with pytest.raises(ValueError, match=r"xq must have 3 rows of at least kpad = 64 columns"):
        kern.quant_act(x, np.empty((3, 40), np.int8), scale, gsum, 32)
    with pytest.raises(ValueError, match="scale must have 3 rows of at least 2 columns"):
        kern.quant_act(x, xq, np.empty((2, 2), np.float32), gsum, 32)
    with pytest.raises(ValueError, match="scale must have 3 rows of at least 2 columns"):
        kern.quant_act(x, xq, scale[:, :1], gsum, 32)
    with pytest.raises(ValueError, match="scale must be 2-D"):
        kern.quant_act(x, xq, np.empty(3, np.float32), gsum, 32)
    with pytest.raises(ValueError, match="gsum must have 3 rows of at least 2 columns"):
        kern.quant_act(x, xq, scale, gsum[:, :1], 32)
    with pytest.raises(ValueError, match="group must be 0 .*, got 48"):
        kern.quant_act(x, xq, scale, gsum, 48)
    with pytest.raises(ValueError, match="gsum must have dtype int32"):
        kern.quant_act(x, xq, scale, gsum.astype(np.int64), 32)
    ro = xq.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="xq is read-only"):
        kern.quant_act(x, ro, scale, gsum, 32)
    buf = np.zeros(64 * 3 + 16, np.int8)
    with pytest.raises(ValueError, match="scale and xq must not overlap"):
        kern.quant_act(x, buf[:192].reshape(3, 64), buf[4:16].view(np.float32).reshape(3, 1),
                       None, 0)


def test_gemm_wq_rejects_bad_arguments(kern, w4):
    x = np.ones((2, 40), np.float32)
    xq, scale, gsum = quantize(kern, x, 32)
    out = np.empty((2, 8), np.float32)
    with pytest.raises(ValueError, match="gsum is required for 4-bit weights"):
        kern.gemm_wq(xq, scale, None, w4, out)
    with pytest.raises(ValueError, match="xq must have at least kpad = 64 columns for K=40"):
        kern.gemm_wq(np.zeros((2, 40), np.int8), scale, gsum, w4, out)
    with pytest.raises(ValueError, match="gsum must have 2 rows of at least 2 columns"):
        kern.gemm_wq(xq, scale, gsum[:, :1], w4, out)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 8\), got \(2, 9\)"):
        kern.gemm_wq(xq, scale, gsum, w4, np.empty((2, 9), np.float32))
    with pytest.raises(ValueError, match="scale must have 2 rows of at least 2 columns"):
        kern.gemm_wq(xq, scale[:1], gsum, w4, out)
    with pytest.raises(ValueError, match="scale must have 2 rows of at least 2 columns"):
        kern.gemm_wq(xq, scale[:, :1], gsum, w4, out)
    with pytest.raises(ValueError, match="scale must be 2-D"):
        kern.gemm_wq(xq, scale[:, 0], gsum, w4, out)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        kern.gemm_wq(xq, scale, gsum, w4, out, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="xq must have dtype int8"):
        kern.gemm_wq(xq.astype(np.uint8), scale, gsum, w4, out)
    with pytest.raises(ValueError, match="w is a float weight"):
        kern.gemm_wq(xq, scale, gsum, kern.pack(np.ones((8, 40), np.float32), "f32"), out)
    with pytest.raises(ValueError, match="w is a quantized weight"):
        kern.gemm(x, w4, out)
    buf = np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match="out and xq must not overlap"):
        kern.gemm_wq(buf.view(np.int8)[:, :64], scale, gsum, w4, buf[:, 8:])


def test_gemm_wq_layout_mismatch():
    tables = [ops.kernels(isa) for isa in ops.available_isas()]
    pairs = [(a, b) for a in tables for b in tables if a.gemm_wq_layout != b.gemm_wq_layout]
    if not pairs:
        pytest.skip("one quantized layout on this machine")
    packer, runner = pairs[0]
    q, d, _ = make_weights(np.random.default_rng(11), 8, 32, 8, 0)
    xq, scale, gsum = quantize(runner, np.ones((1, 32), np.float32), 0)
    with pytest.raises(ValueError, match="pack it with this table"):
        runner.gemm_wq(xq, scale, gsum, packer.pack_wq(q, d, None, 8, 0),
                       np.empty((1, 8), np.float32))


# ------------------------------------------------------------- end to end


@pytest.mark.parametrize("bits,group,symmetric", [(8, 0, False), (4, 32, False),
                                                  (4, 128, True), (4, 0, False)])
def test_linear_quantized_weight_vs_dequantized_float_gemm(bits, group, symmetric):
    rng = np.random.default_rng(12)
    m, n, k = 9, 70, 576
    w = rand(rng, (n, k), k ** -0.5)
    x = rand(rng, (m, k))
    bias = rand(rng, n)
    q, d, o = quantize_weight(w, bits, group, symmetric)
    gl = group or q_kpad(k)  # the weight's groups (channelwise: one a row)
    g = np.arange(k) // gl
    w_deq = d[:, g] * q.astype(np.float32) + (0 if o is None else o[:, g])
    # the weight quantization itself: within half a step of the original
    assert np.all(np.abs(w_deq - w) <= d[:, g] * 0.5001 + 1e-7)
    pw = ops.pack_quantized(q, d, o, bits, group)
    y = ops.linear(x, pw, bias)
    y_f = ops.linear(x, ops.pack_weight(w_deq), bias)
    _, scale, _ = quantize(ops.kernels(), x, group)
    assert scale.shape == (m, q_groups(k, group))
    sx = scale[:, np.arange(k) // q_glen(group)]  # each column's activation scale
    mag = np.abs(x) @ np.abs(w_deq).T + np.abs(bias)
    bound = 0.5 * sx @ np.abs(w_deq).T + 1e-5 * mag
    assert np.all(np.abs(y - y_f) <= bound), np.max(np.abs(y - y_f) / bound)


def test_linear_quantizes_into_the_given_scratch():
    """ops.linear writes the int8 activations into act_scratch (views of its first
    rows), with the kernels' bits; without one it allocates one for the call."""
    rng = np.random.default_rng(13)
    kern = ops.kernels()
    x = rand(rng, (6, 100))
    q, d, o = quantize_weight(rand(rng, (24, 100)), 4, 32, False)
    pw = ops.pack_quantized(q, d, o, 4, 32)
    scratch = ops.ActScratch(16, 100, 32)
    y = ops.linear(x, pw, act_scratch=scratch)
    xq, scale, gsum = quantize(kern, x, 32)
    assert np.array_equal(scratch.xq[:6], xq) and np.array_equal(scratch.scale[:6], scale)
    assert np.array_equal(scratch.gsum[:6], gsum)
    want = np.empty((6, 24), np.float32)
    kern.gemm_wq(xq, scale, gsum, pw, want)
    assert np.array_equal(y, want) and np.array_equal(ops.linear(x, pw), want)
    out = np.empty((6, 24), np.float32)
    assert ops.linear(x, pw, out=out, act_scratch=scratch) is out and np.array_equal(out, want)
    assert np.array_equal(ops.linear(x[:3], pw, act_scratch=scratch), want[:3])


def test_linear_refuses_a_scratch_that_does_not_fit():
    rng = np.random.default_rng(14)
    x = rand(rng, (6, 100))
    q, d, o = quantize_weight(rand(rng, (24, 100)), 4, 32, True)
    pw = ops.pack_quantized(q, d, o, 4, 32)
    q64, d64, o64 = quantize_weight(rand(rng, (24, 100)), 4, 64, True)
    for scratch, weight in [(ops.ActScratch(5, 100, 32), pw),           # too few rows
                            (ops.ActScratch(6, 128, 32), pw),           # another K
                            (ops.ActScratch(6, 100, 32), ops.pack_quantized(q64, d64, o64, 4,
                                                                            64)),  # groups
                            (ops.ActScratch(6, 100, 32, sums=False), pw),  # 4 bits: sums
                            (ops.ActScratch(6, 100, 32),                # no zero points
                             ops.pack_quantized(q, d, o, 4, 32, act_asym=True)),
                            (ops.ActScratch(6, 100, 32, asym_n=23),     # correction too narrow
                             ops.pack_quantized(q, d, o, 4, 32, act_asym=True))]:
        with pytest.raises(ValueError, match="does not fit x of shape"):
            ops.linear(x, weight, act_scratch=scratch)
    with pytest.raises(ValueError, match="x has 99 columns but w has K=100"):
        ops.linear(x[:, :99], pw)


@pytest.mark.parametrize("sums,asym_n", [(True, 0), (False, 0), (True, 40)])
def test_act_scratch_nbytes_counts_every_buffer(sums, asym_n):
    sc = ops.ActScratch(7, 300, 64, sums, asym_n)
    assert ops.ActScratch.nbytes_for(7, 300, 64, sums, asym_n) == sc.nbytes == \
        sum(a.nbytes for a in vars(sc).values() if isinstance(a, np.ndarray))
    with pytest.raises(ValueError, match="group must be one of"):
        ops.ActScratch(7, 300, 48)
    with pytest.raises(ValueError, match="rows and k must be >= 1"):
        ops.ActScratch.nbytes_for(0, 300)


def test_ops_channelwise_shares_group_128_activations():
    """Channelwise weights run as groups of 128: activations quantized for a
    group-128 weight serve a channelwise one (and 8-bit weights take gsum)."""
    rng = np.random.default_rng(16)
    kern = ops.kernels()
    x = rand(rng, (5, 576))
    q, d, _ = quantize_weight(rand(rng, (16, 576)), 8, 0, True)
    assert d.shape == (16, 1)
    pw = ops.pack_quantized(q, d[:, 0], None, 8, 0)  # a 1-D d is channelwise too
    scratch = ops.ActScratch(8, 576, 128)
    assert scratch.fits(5, 576, 0, True) and not scratch.fits(5, 576, 64, False)
    y = ops.linear(x, pw, act_scratch=scratch)
    xq, scale, gsum = quantize(kern, x, 0)
    assert scale.shape == (5, 5) and np.array_equal(scratch.scale[:5], scale)
    without_sums = np.empty_like(y)
    kern.gemm_wq(xq, scale, None, pw, without_sums)
    assert np.array_equal(y, without_sums)
    assert np.array_equal(y, ops.linear(x, pw))
    assert np.array_equal(y, np_gemm_wq(xq, scale, gsum, q, d, None, 8, 0, None))


# ---------------------------------------------------- asymmetric activations


def np_quant_act_asym(x, group):
    """The header's asymmetric quantization: the range [min(0, min x), max(0,
    max x)] in 254 steps, zero point z = rint(-127 - lo / s), xq = clamp(rint(x /
    s) + z, -127, 127). (xq, scale, gsum of the stored bytes, zp). Finite x only."""
    m, k = x.shape
    kpad, ng, gl = q_kpad(k), q_groups(k, group), q_glen(group)
    xp = np.zeros((m, ng * gl), np.float32)
    xp[:, :k] = x
    xg = xp.reshape(m, ng, gl)  # padding zeros: inside the range anyway
    lo = np.minimum(xg.min(axis=2), 0).astype(np.float32)
    hi = np.maximum(xg.max(axis=2), 0).astype(np.float32)
    with np.errstate(all="ignore"):
        scale = ((hi - lo) / np.float32(254)).astype(np.float32)
        zero = (scale == 0) | ~np.isfinite(scale)
        zp = np.where(zero, 0, np.rint(np.float32(-127) - lo / scale)).astype(np.int32)
        v = np.where(zero[:, :, None], 0, np.rint(xg / scale[:, :, None]))
    xq = np.clip(v.astype(np.int64) + zp[:, :, None], -127, 127).astype(np.int8).reshape(m, -1)
    xq[:, k:] = 0
    gsum = xq.reshape(m, ng, gl).astype(np.int32).sum(axis=2).astype(np.int32)
    return xq[:, :kpad], scale, gsum, zp


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 40), k=st.integers(1, 300), group=st.sampled_from(GROUPS),
       seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e30]),
       shift=st.sampled_from([0.0, 0.7, -2.0]))
def test_quant_act_asymmetric_matches_numpy(variant, pool, m, k, group, seed, scale, shift):
    rng = np.random.default_rng(seed)
    x = ((rand(rng, (m, k)) + np.float32(shift)) * np.float32(scale)).astype(np.float32)
    kpad, ng = q_kpad(k), q_groups(k, group)
    xq = np.full((m, kpad), 99, np.int8)
    sc = np.full((m, ng), -1.0, np.float32)
    gs = np.full((m, ng), -5, np.int32)
    zp = np.full((m, ng + 2), 77, np.int32)
    variant.quant_act(x, xq, sc, gs, group, pool, zp=zp)
    want_q, want_s, want_g, want_z = np_quant_act_asym(x, group)
    assert np.array_equal(sc, want_s)
    assert np.array_equal(zp[:, :ng], want_z) and np.all(zp[:, ng:] == 77)
    assert np.array_equal(xq, want_q)
    assert np.array_equal(gs, want_g)
    assert np.all(np.abs(xq) <= 127) and np.all(np.abs(zp[:, :ng]) <= 127)
    # dequantized, every element is within half a step of x
    sx = want_s[:, np.arange(k) // q_glen(group)]
    z = want_z[:, np.arange(k) // q_glen(group)]
    err = np.abs(sx * (xq[:, :k].astype(np.float32) - z) - x)
    assert np.all(err <= 0.5001 * sx + 1e-37)


def test_quant_act_asymmetric_uses_the_range(variant):
    """A skewed row gets about twice the resolution of the symmetric scale, and 0 is exact."""
    x = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 10.0]], np.float32)
    xq, sc, gs, zp = (np.empty((1, 32), np.int8), np.empty((1, 1), np.float32),
                      np.empty((1, 1), np.int32), np.empty((1, 1), np.int32))
    variant.quant_act(x, xq, sc, gs, 0, None, zp=zp)
    assert sc[0, 0] == np.float32(10.0) / np.float32(254)  # symmetric: 10 / 127
    assert zp[0, 0] == -127 and xq[0, 0] == -127 and xq[0, 11] == 127
    assert np.all(xq[0, 12:] == 0)


@pytest.mark.parametrize("bits,group,symmetric", [(8, 0, True), (8, 32, True), (4, 32, False),
                                                  (4, 128, True), (4, 0, False)])
def test_linear_asymmetric_activations_vs_dequantized_float_gemm(bits, group, symmetric):
    """ops.linear on a weight packed for asymmetric activations: the kernels'
    result minus the zero points' correction is the float GEMM of the
    dequantized activations, within float rounding; and against the float
    GEMM of x, within half an activation step."""
    rng = np.random.default_rng(21)
    m, n, k = 7, 50, 300
    w = rand(rng, (n, k), k ** -0.5)
    x = (rand(rng, (m, k)) + np.float32(1.5)).astype(np.float32)  # skewed: mostly positive
    bias = rand(rng, n)
    q, d, o = quantize_weight(w, bits, group, symmetric)
    pw = ops.pack_quantized(q, d, o, bits, group, act_asym=True)
    assert pw.zp_correction is not None
    y = ops.linear(x, pw, bias)
    g = np.arange(k) // (group or q_kpad(k))
    w_deq = (d[:, g] * q.astype(np.float32) + (0 if o is None else o[:, g])).astype(np.float64)
    xq, scale, _, zp = np_quant_act_asym(x, group)
    ga = np.arange(k) // q_glen(group)
    x_deq = scale[:, ga].astype(np.float64) * (xq[:, :k].astype(np.float64) - zp[:, ga])
    want = x_deq @ w_deq.T + bias
    mag = np.abs(x_deq) @ np.abs(w_deq).T + np.abs(bias)
    assert np.all(np.abs(y - want) <= 2e-5 * mag + 1e-6), np.max(np.abs(y - want) / mag)
    # asymmetric steps are finer than symmetric ones for skewed rows: smaller error
    y_f = x.astype(np.float64) @ w_deq.T + bias
    err_asym = np.abs(y - y_f).mean()
    err_sym = np.abs(ops.linear(x, ops.pack_quantized(q, d, o, bits, group), bias) - y_f).mean()
    assert err_asym < err_sym


def test_rms_norm_linear_equals_norm_then_linear(variant):
    """The fused norm + quantization gives the very bits of rms_norm then linear,
    symmetric and asymmetric, with and without the residual."""
    rng = np.random.default_rng(22)
    t, k, n = 5, 576, 40
    x, res, nw = rand(rng, (t, k)), rand(rng, (t, k)), rand(rng, k) + np.float32(1)
    q, d, o = quantize_weight(rand(rng, (n, k), k ** -0.5), 4, 32, False)
    for asym in (False, True):
        pw = ops.pack_quantized(q, d, o, 4, 32, act_asym=asym)
        for residual in (None, res):
            r1 = None if residual is None else residual.copy()
            r2 = None if residual is None else residual.copy()
            normed1 = np.empty_like(x)
            y1 = ops.rms_norm_linear(x, nw, 1e-5, pw, residual=r1, normed=normed1)
            normed2 = ops.rms_norm(x, nw, 1e-5, residual=r2)
            y2 = ops.linear(normed2, pw)
            assert np.array_equal(normed1, normed2) and np.array_equal(y1, y2)
            if residual is not None:
                assert np.array_equal(r1, r2) and np.array_equal(r1, x + residual)
    # a float weight takes the unfused path with the same contract
    wf = ops.pack_weight(rand(rng, (n, k)))
    assert np.array_equal(ops.rms_norm_linear(x, nw, 1e-5, wf),
                          ops.linear(ops.rms_norm(x, nw, 1e-5), wf))


def test_asymmetric_arguments_are_checked(kern):
    x = np.ones((2, 40), np.float32)
    xq, sc = np.empty((2, 64), np.int8), np.empty((2, 2), np.float32)
    gs = np.empty((2, 2), np.int32)
    with pytest.raises(ValueError, match="zp must have dtype int32"):
        kern.quant_act(x, xq, sc, gs, 32, None, zp=np.empty((2, 2), np.float32))
    with pytest.raises(ValueError, match="zp must have 2 rows of at least 2 columns"):
        kern.quant_act(x, xq, sc, gs, 32, None, zp=np.empty((2, 1), np.int32))
    with pytest.raises(ValueError, match="zp and gsum must not overlap"):
        kern.quant_act(x, xq, sc, gs, 32, None, zp=gs)


def test_asymmetric_linear_allocates_nothing_with_a_scratch():
    """The zero points' correction goes to the scratch's own buffer, sized at start:
    a call (the first included) allocates no array."""
    rng = np.random.default_rng(23)
    m, n, k = 64, 512, 1024
    x = (rand(rng, (m, k)) + np.float32(1)).astype(np.float32)
    q, d, o = quantize_weight(rand(rng, (n, k), k ** -0.5), 4, 32, True)
    pw = ops.pack_quantized(q, d, o, 4, 32, act_asym=True)
    scratch, out = ops.ActScratch(m, k, 32, asym_n=n), np.empty((m, n), np.float32)
    want = ops.linear(x, pw)
    tracemalloc.start()
    y = ops.linear(x, pw, out=out, act_scratch=scratch)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert np.array_equal(y, want)
    # one [m, n] correction alone is 128 KiB; views and call frames stay far below
    assert peak < 8 << 10, f"ops.linear allocated up to {peak} bytes"
