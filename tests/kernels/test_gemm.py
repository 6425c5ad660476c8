"""GEMM: every variant against ref, ref against numpy float64.

Tolerances (per output element, against the exact float64 sum, with
mag = sum_k |x*w| (+|bias|)):
  - f32 weights, and bf16 weights widened to f32: 1e-5 * mag
  - variants that round activations to bf16 (gemm_bf16_compute == "bf16"):
    2^-8 * mag (each product's activation carries up to 2^-9 relative error)
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import examples, rand

F32_REL = 1e-5
BF16_ACT_REL = 2.0 ** -8


def exact_gemm(x, w32, bias):
    y = x.astype(np.float64) @ w32.astype(np.float64).T
    mag = np.abs(x.astype(np.float64)) @ np.abs(w32.astype(np.float64)).T
    if bias is not None:
        y += bias
        mag += np.abs(bias)
    return y, mag


def weights(rng, n, k, dtype, scale=1.0):
    """(what to pack, the float32 values it stands for)."""
    w = rand(rng, (n, k), scale)
    if dtype == "bf16":
        bits = ops.f32_to_bf16(w)
        return bits, ops.bf16_to_f32(bits)
    return w, w


def run_gemm(kern, x, w, dtype, bias=None, pool=None, out=None):
    pw = kern.pack(w, dtype)
    y = np.full((x.shape[0], pw.n), np.nan, np.float32) if out is None else out
    kern.gemm(x, pw, y, bias, pool)
    return y


def tolerance(kern, dtype):
    return BF16_ACT_REL if dtype == "bf16" and kern.gemm_bf16_compute == "bf16" else F32_REL


shapes = st.tuples(st.integers(1, 67), st.integers(1, 131), st.integers(1, 131))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes, seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-20, 1.0, 1e15]),
       with_bias=st.booleans(), pad=st.integers(0, 5))
def test_gemm_matches_exact(variant, pool, dtype, shape, seed, scale, with_bias, pad):
    m, n, k = shape
    rng = np.random.default_rng(seed)
    xbuf = rand(rng, (m, k + pad), scale)
    x = xbuf[:, :k]  # rows with a stride longer than K
    w, w32 = weights(rng, n, k, dtype)
    bias = rand(rng, n) if with_bias else None
    ybuf = np.full((m, n + pad), -7.0, np.float32)
    y = run_gemm(variant, x, w, dtype, bias, pool, out=ybuf[:, :n])
    want, mag = exact_gemm(x, w32, bias)
    tol = tolerance(variant, dtype) * mag + np.finfo(np.float32).tiny
    assert np.all(np.abs(y - want) <= tol), np.max(np.abs(y - want) / tol)
    assert np.all(ybuf[:, n:] == -7.0), "wrote past N"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_bit_identical_for_any_thread_count(variant, pools, dtype):
    rng = np.random.default_rng(1)
    for m in (1, 3, 8, 9, 64, 67, 200):  # 200: several row blocks of every prefill driver
        x = rand(rng, (m, 200))
        w, _ = weights(rng, 300, 200, dtype)
        outs = [run_gemm(variant, x, w, dtype, pool=p) for p in [None, *pools.values()]]
        for y in outs[1:]:
            assert np.array_equal(y, outs[0])


@pytest.mark.parametrize("k", [77, 600])  # 600: several K blocks on both paths
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_rows_do_not_depend_on_batch(variant, pool, dtype, k):
    """A row's output is the same alone or inside a batch (decode vs prefill path)."""
    rng = np.random.default_rng(2)
    x = rand(rng, (40, k))
    w, _ = weights(rng, 50, k, dtype)
    pw = variant.pack(w, dtype)
    full = np.empty((40, 50), np.float32)
    variant.gemm(x, pw, full, None, pool)
    for rows in (slice(0, 1), slice(5, 9), slice(3, 40)):
        part = np.empty((rows.stop - rows.start, 50), np.float32)
        variant.gemm(np.ascontiguousarray(x[rows]), pw, part, None, pool)
        assert np.array_equal(part, full[rows])


def col_windows(n, panel):
    """Column windows (n0, n1) of an n-column GEMM: the whole, from a later panel on,
    ending mid-panel, one panel, the last (short) panel."""
    last = (n - 1) // panel * panel
    return [(0, n), (panel, n), (panel, min(n, 2 * panel + 5)), (2 * panel, 3 * panel),
            (last, n), (0, 1)]


@pytest.mark.parametrize("k", [77, 600])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_cols_are_the_whole_calls_columns(variant, pool, dtype, k):
    """gemm(cols=(n0, n1)) writes exactly columns [n0, n1) of the whole call, bit for
    bit, for decode and prefill row counts, with a bias."""
    rng = np.random.default_rng(9)
    panel = variant.gemm_panels[dtype]
    n = 5 * panel + 3
    w, _ = weights(rng, n, k, dtype)
    bias = rand(rng, n)
    pw = variant.pack(w, dtype)
    for m in (1, 3, 5, 9, 40):
        x = rand(rng, (m, k))
        full = np.empty((m, n), np.float32)
        variant.gemm(x, pw, full, bias, pool)
        for n0, n1 in col_windows(n, panel):
            y = np.full((m, n), np.nan, np.float32)
            variant.gemm(x, pw, y, bias, cols=(n0, n1))
            assert np.array_equal(y[:, n0:n1], full[:, n0:n1]), (m, n0, n1)
            assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all(), (m, n0, n1)


def test_gemm_cols_must_start_on_a_panel(variant):
    x = np.ones((2, 8), np.float32)
    pw = variant.pack(np.ones((40, 8), np.float32), "f32")
    y = np.empty((2, 40), np.float32)
    with pytest.raises(ValueError, match="0 <= n0 < n1 <= 40"):
        variant.gemm(x, pw, y, cols=(3, 3))
    if variant.gemm_panels["f32"] > 1:
        with pytest.raises(ValueError, match="start on a packed panel"):
            variant.gemm(x, pw, y, cols=(1, 40))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_rows_do_not_depend_on_batch_across_blocks(variant, pool, dtype):
    """The same across row blocks, tile-row counts (AMX tiles have M rows below 16) and
    K blocks whose length depends on M (AMX: all of K for a few rows, 512 at 128)."""
    rng = np.random.default_rng(8)
    x = rand(rng, (200, 1100))
    w, _ = weights(rng, 70, 1100, dtype)
    bias = rand(rng, 70)
    pw = variant.pack(w, dtype)
    full = np.empty((200, 70), np.float32)
    variant.gemm(x, pw, full, bias, pool)
    for rows in (slice(0, 1), slice(7, 23), slice(40, 56), slice(99, 200)):
        part = np.empty((rows.stop - rows.start, 70), np.float32)
        variant.gemm(np.ascontiguousarray(x[rows]), pw, part, bias, pool)
        assert np.array_equal(part, full[rows]), rows


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_is_bit_identical_to_ref_unless_it_rounds_activations(variant, ref, pool, dtype):
    """Every variant computes each output as ref does, one FMA chain over k
    ascending from +0 then + bias (bf16 weights widened exactly), on the decode
    and prefill paths and across K blocks: the same bits. Only variants that
    round activations to bf16 (gemm_bf16_compute "bf16") differ, within the
    tolerance test_gemm_matches_exact checks."""
    if dtype == "bf16" and variant.gemm_bf16_compute == "bf16":
        pytest.skip(f"{variant.isa} rounds activations to bf16: not ref's bits by design")
    rng = np.random.default_rng(3)
    for m, n, k in ((1, 33, 100), (3, 50, 600), (9, 33, 100), (67, 40, 600)):
        x = rand(rng, (m, k))
        w, _ = weights(rng, n, k, dtype)
        bias = rand(rng, n)
        want = run_gemm(ref, x, w, dtype, bias)
        got = run_gemm(variant, x, w, dtype, bias, pool)
        differ = got.view(np.uint32) != want.view(np.uint32)
        assert not differ.any(), f"{differ.sum()} of {differ.size} differ at m, n, k = {m, n, k}"


# Around every variant's tiles: rows 1-4 (decode), 5-13 and 23-25 (prefill tiles of 4 to 12
# rows and their tails), 15-17 and 31-33 (AMX tiles of 16 rows, in pairs), 97 (past a
# 96-row block), 129 (past a 128-row block); columns around 8/16/32-wide panels and tiles
# and a 16-panel group; K odd and even around 4-wide groups, AMX's K tiles of 32 bf16
# (31-33, 63-65) and 128/256/512-long K blocks (in k or in k pairs).
TAIL_M = (1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 15, 16, 17, 23, 25, 31, 33, 97, 129)
TAIL_N = (1, 15, 16, 17, 31, 33, 47, 257)
TAIL_K = (1, 2, 3, 5, 31, 33, 63, 65, 127, 129, 256, 257, 513)


def strided(rng, m, k, fill):
    """An [m, k] view of rows longer than k whose extra columns hold `fill`."""
    buf = np.full((m, k + 3), fill, np.float32)
    buf[:, :k] = rand(rng, (m, k))
    return buf[:, :k]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_tails(variant, ref, pool, dtype):
    """Every tail of M, N and K around the tile and block sizes, with bias and row
    strides (ldx, ldy > the row): f32 math gives ref's bits; variants that round
    activations to bf16 give the product of the rounded activations (round to nearest
    even) within f32 accumulation error. x's columns past K are NaN (a kernel that
    reads them, e.g. the odd half of an odd K's last pair, poisons its rows); y's
    columns past N must stay untouched."""
    rng = np.random.default_rng(7)
    rounds = dtype == "bf16" and variant.gemm_bf16_compute == "bf16"
    for k in TAIL_K:
        for n in TAIL_N:
            w, w32 = weights(rng, n, k, dtype)
            bias = rand(rng, n)
            pw, pr = variant.pack(w, dtype), ref.pack(w, dtype)
            for m in TAIL_M:
                x = strided(rng, m, k, np.nan)
                ybuf = np.full((m, n + 5), -7.0, np.float32)
                variant.gemm(x, pw, ybuf[:, :n], bias, pool)
                y = ybuf[:, :n]
                assert np.all(ybuf[:, n:] == -7.0), f"wrote past N at m, n, k = {m, n, k}"
                if not rounds:
                    want = np.empty((m, n), np.float32)
                    ref.gemm(x, pr, want, bias)
                    differ = y.view(np.uint32) != want.view(np.uint32)
                    assert not differ.any(), f"{differ.sum()} differ at m, n, k = {m, n, k}"
                    continue
                xr = ops.bf16_to_f32(ops.f32_to_bf16(np.ascontiguousarray(x)))
                want, mag = exact_gemm(xr, w32, bias)
                err = np.abs(y - want) / (mag + np.finfo(np.float32).tiny)
                assert err.max() <= F32_REL, f"{err.max()} at m, n, k = {m, n, k}"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gemm_propagates_nan_and_inf(variant, dtype):
    rng = np.random.default_rng(4)
    x = rand(rng, (5, 37))
    x[1, 3] = np.nan
    x[3, 36] = np.inf
    w, w32 = weights(rng, 19, 37, dtype)
    y = run_gemm(variant, x, w, dtype)
    assert np.all(np.isnan(y[1]))
    want = np.where(w32[:, 36] > 0, np.inf, -np.inf)
    assert np.array_equal(y[3], want)
    assert np.all(np.isfinite(y[[0, 2, 4]]))


def test_gemm_from_two_python_threads(variant, pool):
    """Concurrent calls on one pool are serialized safely, results intact."""
    rng = np.random.default_rng(5)
    x = rand(rng, (16, 96))
    w, _ = weights(rng, 128, 96, "f32")
    pw = variant.pack(w, "f32")
    want = np.empty((16, 128), np.float32)
    variant.gemm(x, pw, want, None, pool)
    errors = []

    def worker():
        y = np.empty_like(want)
        for _ in range(300):
            variant.gemm(x, pw, y, None, pool)
            if not np.array_equal(y, want):
                errors.append("mismatch")
                return

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_packed_weight_knows_its_layout(variant):
    w = np.ones((3, 5), np.float32)
    pw = variant.pack(w, "f32")
    assert pw.shape == (3, 5) and pw.dtype == "f32" and pw.isa == variant.isa
    assert pw.layout == variant.gemm_layouts["f32"]
    assert not pw.data.flags.writeable
    assert pw.data.ctypes.data % 64 == 0


def test_linear_uses_selected_kernels():
    rng = np.random.default_rng(6)
    x, w = rand(rng, (4, 64)), rand(rng, (24, 64))
    bias = rand(rng, 24)
    y = ops.linear(x, ops.pack_weight(w), bias)
    np.testing.assert_allclose(y, x @ w.T + bias, rtol=1e-4, atol=1e-4)
    yb = ops.linear(x, ops.pack_weight(w, "bf16"))
    wb = ops.bf16_to_f32(ops.f32_to_bf16(w))
    np.testing.assert_allclose(yb, x @ wb.T, rtol=2e-2, atol=2e-2)
