"""RMSNorm, LayerNorm, RoPE, SiLU*mul, GELU-tanh*mul, exact GELU, embedding and
exp: every variant against ref, ref against numpy float64.

Tolerances: rmsnorm 2e-6 relative + 1e-6 of the row's largest output;
layernorm 1e-6 of |(x - mean) s w| + |mean| s |w| + |bias| (the float32
steps after the double moments: 2^-24 for m's rounding, of |mean| s |w|, and
a few for the subtraction, the two products and the bias add);
rope 2e-6 * max|x| (float32 table and arithmetic against float64); silu_mul
1e-5 relative + 1e-30 (for g < -88.7, exp(-g) overflows and silu flushes to
0); gelu_tanh_mul every variant ref's bits, ref 3e-7 * (1 + max(-z, 0))
relative, z = 2 sqrt(2/pi) (g + 0.044715 g^3) the exp argument whose float32
roundings exp magnifies (measured 1.6e-7 * (1 + max(-z, 0)), 1.3e-5 at worst,
near g = -10), + 1e-15 |g u| for float64's own 1 + tanh(w) (for g < -10.061,
exp(-z) overflows and out is -0 * u, the exact value below 3e-38 |u|), and
4e-7 |g u| of torch's float32 gelu(approximate="tanh") * u (its 1 + tanh(w)
rounds to float32); exp 2.4e-7 relative between variants (the same
operations), 4e-7 relative for ref against exp in float64; embedding exact;
gelu (exact, erf) 3e-7 (1 + min(x, 0)^2) relative + 1e-38 for every variant
against erfc in float64 (ref, libm's erfc in double, is within half an ulp;
the vector erfc form's exp argument -z^2 + u R(u) carries float roundings
that exp magnifies by z^2 = x^2/2 for negative x, where y is x/2 erfc(|z|)),
measured 1.9e-7 (1 + x^2) below 0 and 1.6e-7 above (x86); absolute, below
2.4e-7 over |x| < 10 (y's own rounding at x ~ 4); and 4e-7 (1 + |x|) against
torch's float32 nn.GELU() (its 1 + erf rounds to float32: 1.2e-6 off at
x = 3.5).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from armllm.model.rope import rope_cos_sin
from tests.conftest import examples, rand

fixture_ok = settings(deadline=None, max_examples=examples(30),
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------- rmsnorm


def rmsnorm_exact(r, w, eps):
    r64 = r.astype(np.float64)
    return r64 / np.sqrt(np.mean(r64 * r64, axis=1, keepdims=True) + eps) * w


@fixture_ok
@given(t=st.integers(1, 9), d=st.integers(1, 300), fused=st.booleans(), inplace=st.booleans(),
       scale=st.sampled_from([1e-15, 1.0, 1e12]), seed=st.integers(0, 2**32 - 1))
def test_rmsnorm(variant, pool, t, d, fused, inplace, scale, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (t, d), scale)
    res = rand(rng, (t, d), scale)
    w = rand(rng, d)
    r = x + res if fused else x
    want = rmsnorm_exact(r, w, 1e-6)
    x_in = x.copy()
    out = x_in if inplace else np.empty_like(x)
    res_in = res.copy()
    variant.rmsnorm(x_in, w, 1e-6, out, res_in if fused else None, pool)
    tol = 2e-6 * np.abs(want) + 1e-6 * np.max(np.abs(want), axis=1, keepdims=True) + 1e-38
    assert np.all(np.abs(out - want) <= tol)
    if fused:
        assert np.array_equal(res_in, r)  # residual now holds x + residual
    if not inplace:
        assert np.array_equal(x_in, x)


def test_rmsnorm_nan_stays_in_its_row(variant):
    x = np.ones((3, 20), np.float32)
    x[1, 7] = np.nan
    out = np.empty_like(x)
    variant.rmsnorm(x, np.ones(20, np.float32), 1e-5, out)
    assert np.all(np.isnan(out[1])) and np.all(np.isfinite(out[[0, 2]]))


# ----------------------------------------------------------------- layernorm


def layernorm_exact(x, w, b, eps):
    """LayerNorm in float64, and its tolerance (module docstring)."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    s = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + eps)
    core = (x64 - mean) * s * w
    bias = 0.0 if b is None else b.astype(np.float64)
    tol = 1e-6 * (np.abs(core) + np.abs(mean) * s * np.abs(w) + np.abs(bias)) + 1e-38
    return core + bias, tol


@fixture_ok
@given(t=st.integers(1, 9), d=st.one_of(st.integers(1, 300), st.sampled_from([384, 1536])),
       with_bias=st.booleans(), inplace=st.booleans(), pad=st.integers(0, 3),
       scale=st.sampled_from([1e-15, 1.0, 1e12]), offset=st.sampled_from([0.0, 3.0, -1e3]),
       seed=st.integers(0, 2**32 - 1))
def test_layernorm(variant, ref, pool, t, d, with_bias, inplace, pad, scale, offset, seed):
    rng = np.random.default_rng(seed)
    wide = rand(rng, (t, d + pad), scale) + np.float32(offset * scale)  # rows strided by pad
    x = wide[:, :d]
    w, b = rand(rng, d), rand(rng, d) if with_bias else None
    want, tol = layernorm_exact(x, w, b, 1e-5)
    buf = wide.copy()
    out = buf[:, :d] if inplace else np.empty((t, d), np.float32)
    variant.layernorm(buf[:, :d], w, b, 1e-5, out, pool)
    assert np.all(np.abs(out - want) <= tol)
    assert np.array_equal(buf[:, d:], wide[:, d:])  # padding untouched
    if not inplace:
        assert np.array_equal(buf, wide)
    ref_out = ref.layernorm(x, w, b, 1e-5, np.empty((t, d), np.float32))
    assert np.all(np.abs(out - ref_out) <= tol)  # ref's bits but for a double's last bits


def test_layernorm_is_thread_invariant_and_refs_bits_at_whisper_shapes(variant, ref, pools):
    """Whisper's LayerNorms ([1500, 384] and [1500, 1536] activations): the same bits on 1
    and 4 threads, and, the moments being double, ref's bits here."""
    rng = np.random.default_rng(3)
    for d in (384, 1536):
        x = rand(rng, (1500, d), 2.0) + np.float32(0.5)
        w, b = rand(rng, d), rand(rng, d)
        one = variant.layernorm(x, w, b, 1e-5, np.empty_like(x), pools[1])
        four = variant.layernorm(x, w, b, 1e-5, np.empty_like(x), pools[4])
        assert np.array_equal(one, four)
        assert np.array_equal(one, ref.layernorm(x, w, b, 1e-5, np.empty_like(x)))
        want, tol = layernorm_exact(x, w, b, 1e-5)
        assert np.all(np.abs(one - want) <= tol)


def test_layernorm_matches_torch(variant):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x, w, b = rand(rng, (6, 384)), rand(rng, 384), rand(rng, 384)
    out = variant.layernorm(x, w, b, 1e-5, np.empty_like(x))
    want = torch.nn.functional.layer_norm(torch.from_numpy(x), (384,), torch.from_numpy(w),
                                          torch.from_numpy(b), 1e-5).numpy()
    assert np.max(np.abs(out - want)) <= 4e-6 * np.max(np.abs(want))


def test_layernorm_constant_row_and_nan(variant):
    x = np.full((3, 20), 7.0, np.float32)
    x[2, 5] = np.nan
    w, b = np.full(20, 2.0, np.float32), np.full(20, 0.25, np.float32)
    out = variant.layernorm(x, w, b, 1e-5, np.empty_like(x))
    assert np.all(out[:2] == 0.25)  # x - mean = 0: only the bias is left
    assert np.all(np.isnan(out[2]))


# ---------------------------------------------------------------------- rope


def rope_exact(x, positions, n_heads, head_dim, rot_dim, theta, style):
    out = x.astype(np.float64).copy()
    half = rot_dim // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2 / rot_dim)
    for t, p in enumerate(positions):
        c, s = np.cos(p * inv), np.sin(p * inv)
        for h in range(n_heads):
            v = out[t, h * head_dim:(h + 1) * head_dim]
            ia = np.arange(half) if style == "neox" else np.arange(half) * 2
            ib = ia + half if style == "neox" else ia + 1
            a, b = v[ia].copy(), v[ib].copy()
            v[ia], v[ib] = a * c - b * s, b * c + a * s
    return out


@fixture_ok
@given(t=st.integers(1, 6), n_heads=st.integers(1, 4), half=st.integers(1, 70),
       extra=st.integers(0, 9), style=st.sampled_from(["neox", "gptj"]),
       seed=st.integers(0, 2**32 - 1))
def test_rope(variant, pool, t, n_heads, half, extra, style, seed):
    rng = np.random.default_rng(seed)
    rot_dim = 2 * half
    head_dim = rot_dim + extra  # partial rotary when extra > 0
    max_pos = 300
    table = rope_cos_sin(max_pos, rot_dim, theta=10000.0)
    x = rand(rng, (t, n_heads * head_dim + 3))  # 3 trailing columns must stay
    positions = rng.integers(0, max_pos, t).astype(np.int32)
    want = rope_exact(x, positions, n_heads, head_dim, rot_dim, 10000.0, style)
    got = x.copy()
    variant.rope(got, positions, table, n_heads, head_dim, rot_dim, style, pool)
    # float32 table and arithmetic vs float64: bounded by a few ulps of |a|+|b|
    scale = np.abs(x).max() * 2
    assert np.max(np.abs(got - want)) <= 1e-6 * scale + 1e-30
    assert np.array_equal(got[:, -3:], x[:, -3:])
    ref_out = x.copy()
    ops.kernels("ref").rope(ref_out, positions, table, n_heads, head_dim, rot_dim, style)
    assert np.max(np.abs(got - ref_out)) <= 1e-6 * scale


def test_rope_rejects_position_outside_table_and_changes_nothing(variant):
    table = rope_cos_sin(16, 8)
    x = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match=r"positions\[1\] = 16"):
        variant.rope(x, np.array([0, 16, 2], np.int32), table, 1, 8)
    assert np.all(x == 1.0)
    with pytest.raises(ValueError, match=r"positions\[2\] = -1"):
        variant.rope(x, np.array([0, 1, -1], np.int32), table, 1, 8)


# ------------------------------------------------------------------ silu*mul


@fixture_ok
@given(t=st.integers(1, 7), inter=st.integers(1, 300), inplace=st.booleans(),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), seed=st.integers(0, 2**32 - 1))
def test_silu_mul(variant, pool, t, inter, inplace, scale, seed):
    rng = np.random.default_rng(seed)
    gu = rand(rng, (t, 2 * inter), scale)
    g, u = gu[:, :inter].astype(np.float64), gu[:, inter:].astype(np.float64)
    want = g / (1 + np.exp(-g)) * u
    buf = gu.copy()
    out = buf[:, :inter] if inplace else np.empty((t, inter), np.float32)
    variant.silu_mul(buf, out, pool)
    # exp(-g) overflows for g < -88.7: silu then flushes to 0 from below 1e-30
    assert np.all(np.abs(out - want) <= 1e-5 * np.abs(want) + 1e-30)


def test_silu_mul_extremes(variant):
    gu = np.array([[100.0, -100.0, np.nan, np.inf, -np.inf, 2.0, 2.0, 2.0, 2.0, 2.0]],
                  np.float32)
    out = np.empty((1, 5), np.float32)
    variant.silu_mul(gu, out)
    assert out[0, 0] == pytest.approx(200.0)
    assert abs(out[0, 1]) < 1e-30
    assert np.isnan(out[0, 2]) and out[0, 3] == np.inf
    assert out[0, 4] == 0.0 or np.isnan(out[0, 4])  # -inf * sigmoid(-inf): 0 (or NaN as in torch)


# ------------------------------------------------------------- gelu_tanh*mul

GELU_FLUSH = -10.061  # below about this gate exp(-z) overflows: out = -0 * u


def gelu_tanh_exact(g, u):
    """0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u in float64 (gelu_pytorch_tanh)."""
    g, u = g.astype(np.float64), u.astype(np.float64)
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u


def gelu_exp_arg(g):
    """z in out = g / (1 + exp(-z)) * u: 2 sqrt(2/pi) (g + 0.044715 g^3)."""
    g = g.astype(np.float64)
    return 2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)


def gelu_rel_tol(g):
    """ref's relative error bound: z carries a few float32 roundings, which
    exp(-z) magnifies by |z| where it dominates the denominator (z < 0)."""
    return 3e-7 * (1 + np.maximum(-gelu_exp_arg(g), 0))


@fixture_ok
@given(t=st.integers(1, 7), inter=st.one_of(st.integers(1, 300), st.integers(2040, 4200)),
       inplace=st.booleans(), pad=st.integers(0, 3), threads=st.sampled_from([1, 2, 3, 4]),
       scale=st.sampled_from([1e-3, 1.0, 12.0, 30.0]), seed=st.integers(0, 2**32 - 1))
def test_gelu_tanh_mul_is_refs_bits(variant, ref, pools, t, inter, inplace, pad, threads, scale,
                                    seed):
    rng = np.random.default_rng(seed)
    wide = rand(rng, (t, 2 * inter + pad), scale)  # pad: rows strided past 2*inter
    gu = wide[:, :2 * inter]
    want = np.empty((t, inter), np.float32)
    ref.gelu_tanh_mul(gu, want)
    buf = wide.copy()
    out_wide = np.full((t, inter + pad), -7.0, np.float32)
    out = buf[:, :inter] if inplace else out_wide[:, :inter]
    variant.gelu_tanh_mul(buf[:, :2 * inter], out, pools[threads])
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))  # -0 and +0 included
    assert np.array_equal(buf[:, inter:], wide[:, inter:])  # up half and padding untouched
    assert np.all(out_wide[:, inter:] == -7.0)


@fixture_ok
@given(t=st.integers(1, 7), inter=st.integers(1, 300),
       scale=st.sampled_from([1e-3, 1.0, 12.0, 30.0]), seed=st.integers(0, 2**32 - 1))
def test_gelu_tanh_mul_ref_matches_float64(ref, t, inter, scale, seed):
    rng = np.random.default_rng(seed)
    gu = rand(rng, (t, 2 * inter), scale)
    g, u = gu[:, :inter], gu[:, inter:]
    out = np.empty((t, inter), np.float32)
    ref.gelu_tanh_mul(gu, out)
    want = gelu_tanh_exact(g, u)
    gu_mag = np.abs(g.astype(np.float64) * u)
    assert np.all(np.abs(out - want) <= gelu_rel_tol(g) * np.abs(want) + 1e-15 * gu_mag)
    try:
        import torch
    except ImportError:
        return
    torch_out = torch.nn.functional.gelu(torch.from_numpy(g.copy()), approximate="tanh") * \
        torch.from_numpy(u.copy())
    assert np.all(np.abs(out - torch_out.numpy()) <= 4e-7 * gu_mag)


def test_gelu_tanh_mul_ref_error_over_the_gate_range(ref):
    """A dense grid of gates against g / (1 + exp(-z)), the same function as
    the tanh form without its cancellation in float64: the bound holds down to
    the flush near GELU_FLUSH, below which out is exactly -0 * u."""
    g = np.linspace(-12.0, 12.0, 600_001, dtype=np.float32)
    gu = np.concatenate([g, np.ones_like(g)]).reshape(1, -1)
    out = np.empty((1, g.size), np.float32)
    ref.gelu_tanh_mul(gu, out)
    out = out[0]
    want = g.astype(np.float64) / (1 + np.exp(-gelu_exp_arg(g)))
    flushed = (out == 0) & (g < 0)
    assert np.all(g[flushed] < GELU_FLUSH + 1e-4) and np.all(flushed[g < GELU_FLUSH - 1e-4])
    assert np.all(np.signbit(out[flushed])) and np.all(np.abs(want[flushed]) < 3e-38)
    kept = ~flushed
    assert np.all(np.abs(out - want)[kept] <= gelu_rel_tol(g[kept]) * np.abs(want[kept]))


def test_gelu_tanh_mul_extremes(variant):
    g = np.array([100.0, -100.0, np.nan, np.inf, -np.inf, 1e20, -1e20, -10.06, -10.07, 0.0],
                 np.float32)
    gu = np.concatenate([g, np.full_like(g, 2.0)]).reshape(1, -1)
    out = np.empty((1, g.size), np.float32)
    variant.gelu_tanh_mul(gu, out)
    out = out[0]
    assert out[0] == 200.0  # exp(-z) rounds 1 + exp(-z) to 1: exactly g * u
    # g < -10.061: exp(-z) overflows to inf and g / inf = -0; the exact value is below 3e-38 |u|
    assert out[1] == 0.0 and np.signbit(out[1])
    assert np.isnan(out[2]) and out[3] == np.inf
    assert out[4] == 0.0 or np.isnan(out[4])  # -inf * sigmoid(-inf): NaN here, as silu's
    # g * g overflows: z = inf, exp(-z) = 0, out = g * u (in float32 whatever numpy's
    # promotion of a Python float: the arm64 root's numpy is 1.x)
    assert out[5] == g[5] * np.float32(2.0)
    assert out[6] == 0.0 and np.signbit(out[6])  # z = -inf: -0 as for any g < -10.061
    assert out[7] == pytest.approx(gelu_tanh_exact(g[7:8], np.float32([2.0]))[0], rel=1e-4)
    assert out[7] < 0  # the last gates above the flush stay normal numbers (~ -6e-38)
    assert out[8] == 0.0 and np.signbit(out[8])
    assert out[9] == 0.0


# ------------------------------------------------------------- gelu (exact)


def gelu_exact(x):
    """x/2 (1 + erf(x / sqrt(2))) in float64, as x/2 erfc(-x / sqrt(2)): the same value
    without 1 + erf's cancellation for negative x."""
    x64 = x.astype(np.float64)
    return 0.5 * x64 * np.vectorize(math.erfc)(-x64 / math.sqrt(2))


def gelu_tol(x, want):
    """Every variant's bound (module docstring)."""
    x64 = x.astype(np.float64)
    return 3e-7 * (1 + np.minimum(x64, 0) ** 2) * np.abs(want) + 1e-38


def gelu_inputs(rng):
    """A dense grid over |x| < 10 and random values of several scales."""
    return np.concatenate([np.linspace(-10, 10, 400_001, dtype=np.float32),
                           rand(rng, 20_000, 3.0), rand(rng, 5_000, 1e-3),
                           rng.uniform(-10, 10, 20_000).astype(np.float32)])


def test_gelu_matches_erf_in_float64(variant, pool):
    x = gelu_inputs(np.random.default_rng(5))
    want = gelu_exact(x)
    out = variant.gelu(x, np.empty_like(x), pool)
    assert np.all(np.abs(out - want) <= gelu_tol(x, want))
    assert np.max(np.abs(out - want)) <= 2.4e-7  # absolute over |x| < 10


def test_gelu_matches_torch(variant):
    torch = pytest.importorskip("torch")
    x = gelu_inputs(np.random.default_rng(6))
    out = variant.gelu(x, np.empty_like(x))
    want = torch.nn.GELU()(torch.from_numpy(x)).numpy()
    assert np.all(np.abs(out - want) <= 4e-7 * (1 + np.abs(x)))


def test_gelu_limits(variant):
    """y = x exactly from 6 up, -0 from -16 down (the exact values are below half an ulp
    of x there, and below float32's smallest subnormal), inf -> inf, -inf -> -0 (torch
    gives NaN for both), NaN -> NaN, +-0 -> +-0."""
    big = np.concatenate([np.linspace(6, 1e4, 5001, dtype=np.float32),
                          np.float32([1e30, 3.4e38, np.inf])])
    assert np.array_equal(variant.gelu(big, np.empty_like(big)), big)
    low = np.concatenate([np.linspace(-1e4, -16, 5001, dtype=np.float32),
                          np.float32([-1e30, -3.4e38, -np.inf])])
    out = variant.gelu(low, np.empty_like(low))
    assert np.all(out == 0) and np.all(np.signbit(out))
    odd = np.float32([np.nan, 0.0, -0.0])
    out = variant.gelu(odd, np.empty_like(odd))
    assert np.isnan(out[0]) and out[1] == 0 and not np.signbit(out[1])
    assert out[2] == 0 and np.signbit(out[2])


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 4095, 4097, 40_000])
def test_gelu_tails_in_place_and_threads(variant, pools, n):
    """Every tail length, in place or not, on 1 and 4 threads (40,000: the pool's path):
    the same bits, and nothing written past n."""
    rng = np.random.default_rng(n)
    x = rand(rng, n + 3, 4.0)
    out = np.full(n + 3, -7.0, np.float32)
    variant.gelu(x[:n], out[:n], pools[1])
    assert np.all(out[n:] == -7.0)
    want = gelu_exact(x[:n])
    assert np.all(np.abs(out[:n] - want) <= gelu_tol(x[:n], want))
    four = variant.gelu(x[:n], np.empty(n, np.float32), pools[4])
    assert np.array_equal(four, out[:n])
    buf = x.copy()
    variant.gelu(buf[:n], buf[:n], pools[4])
    assert np.array_equal(buf[:n], out[:n]) and np.array_equal(buf[n:], x[n:])


def test_gelu_any_shape_through_ops():
    x = rand(np.random.default_rng(9), (3, 5, 7))
    out = ops.gelu(x)
    assert out.shape == x.shape
    assert np.array_equal(out.ravel(), ops.gelu(x.ravel()))
    ops.gelu(x, out=x)
    assert np.array_equal(out, x)


# ----------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_embed_gathers_rows_exactly(variant, pool, dtype):
    rng = np.random.default_rng(7)
    table32 = rand(rng, (50, 77))
    table = ops.f32_to_bf16(table32) if dtype == "bf16" else table32
    ids = rng.integers(0, 50, 33).astype(np.int32)
    out = np.empty((33, 77), np.float32)
    variant.embed(ids, table, out, pool)
    rows = table32[ids] if dtype == "f32" else ops.bf16_to_f32(table[ids])
    assert np.array_equal(out, rows)


def test_embed_rejects_bad_id_and_writes_nothing(variant):
    table = np.ones((10, 8), np.float32)
    out = np.zeros((3, 8), np.float32)
    with pytest.raises(ValueError, match=r"ids\[2\] = 10 is outside the vocabulary \[0, 10\)"):
        variant.embed(np.array([1, 2, 10], np.int32), table, out)
    assert np.all(out == 0)


# ----------------------------------------------------------------------- exp


def test_exp_against_float64_and_ref(variant, ref):
    rng = np.random.default_rng(8)
    x = np.concatenate([
        rng.uniform(-110, 95, 20000).astype(np.float32),
        np.array([0.0, -0.0, 88.72, 88.7228, 88.73, -87.33, -87.34, -103.9, -104.1, np.inf,
                  -np.inf, np.nan, 1e-30, -1e-30], np.float32)])
    for n in (1, 7, 8, 9, 31, len(x)):
        got = np.empty(n, np.float32)
        variant.exp(x[:n].copy(), got)
        want = np.empty(n, np.float32)
        ref.exp(x[:n].copy(), want)
        same_nan = np.isnan(got) == np.isnan(want)
        assert same_nan.all()
        finite = np.isfinite(want)
        assert np.all(got[~finite & ~np.isnan(want)] == want[~finite & ~np.isnan(want)])
        assert np.all(np.abs(got[finite] - want[finite]) <= 2.4e-7 * np.abs(want[finite]) + 1.2e-38)
    exact = np.exp(x.astype(np.float64))
    want = np.empty_like(x)
    ref.exp(x, want)
    normal = (exact > 1.18e-38) & (exact < 3.4e38)
    assert np.all(np.abs(want[normal] - exact[normal]) <= 4e-7 * exact[normal])
    assert np.all(want[exact >= 3.41e38] == np.inf)
    assert np.all(want[exact <= 1.18e-38] <= 1.2e-38)
    assert np.isnan(want[np.isnan(x)]).all()


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 33, 47, 1000])
def test_exp_and_rope_give_refs_bits(variant, ref, n):
    """The shared exp and RoPE's rounded products: every variant has ref's bits, at every
    vector tail length."""
    rng = np.random.default_rng(n)
    x = rng.uniform(-110, 95, n).astype(np.float32)
    got, want = np.empty_like(x), np.empty_like(x)
    variant.exp(x, got)
    ref.exp(x, want)
    assert np.array_equal(got, want)
    half = n % 70 + 1  # rot_dim 2..140, below head_dim
    head_dim = 2 * half + 6
    table = rope_cos_sin(64, 2 * half)
    positions = rng.integers(0, 64, 3).astype(np.int32)
    for style in ("neox", "gptj"):
        x = rand(rng, (3, 2 * head_dim))
        got, want = x.copy(), x.copy()
        variant.rope(got, positions, table, 2, head_dim, 2 * half, style)
        ref.rope(want, positions, table, 2, head_dim, 2 * half, style)
        assert np.array_equal(got, want)


def test_exp_in_place(variant):
    x = np.linspace(-5, 5, 101, dtype=np.float32)
    want = np.empty_like(x)
    variant.exp(x, want)
    variant.exp(x, x)
    assert np.array_equal(x, want)
