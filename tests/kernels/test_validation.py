"""Bad input to the kernels: a clear ValueError naming the argument, never a
crash or a silent wrong result, and nothing written."""
from __future__ import annotations

import numpy as np
import pytest

from armllm import ops
from armllm.model.rope import rope_cos_sin


@pytest.fixture(scope="module")
def kern():
    return ops.kernels()


@pytest.fixture(scope="module")
def packed(kern):
    return kern.pack(np.ones((8, 16), np.float32), "f32")


def test_gemm_wrong_dtype(kern, packed):
    with pytest.raises(ValueError, match="x must have dtype float32, got float64"):
        kern.gemm(np.ones((2, 16)), packed, np.empty((2, 8), np.float32))


def test_gemm_non_contiguous_rows(kern, packed):
    x = np.ones((2, 32), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="x must have contiguous rows"):
        kern.gemm(x, packed, np.empty((2, 8), np.float32))


def test_gemm_fortran_order(kern, packed):
    with pytest.raises(ValueError, match="x must have contiguous rows"):
        kern.gemm(np.asfortranarray(np.ones((3, 16), np.float32)), packed,
                  np.empty((3, 8), np.float32))


def test_gemm_shape_mismatch(kern, packed):
    with pytest.raises(ValueError, match="x has 15 columns but w has K=16"):
        kern.gemm(np.ones((2, 15), np.float32), packed, np.empty((2, 8), np.float32))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 8\), got \(2, 9\)"):
        kern.gemm(np.ones((2, 16), np.float32), packed, np.empty((2, 9), np.float32))
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        kern.gemm(np.ones((2, 16), np.float32), packed, np.empty((2, 8), np.float32),
                  np.ones(7, np.float32))


def test_zero_size_dimensions(kern, packed):
    with pytest.raises(ValueError, match="x has a zero-size dimension"):
        kern.gemm(np.ones((0, 16), np.float32), packed, np.empty((0, 8), np.float32))
    with pytest.raises(ValueError, match="w has a zero-size dimension"):
        kern.pack(np.ones((0, 4), np.float32), "f32")
    with pytest.raises(ValueError, match="ids has a zero-size dimension"):
        kern.embed(np.array([], np.int32), np.ones((3, 4), np.float32),
                   np.empty((0, 4), np.float32))


def test_wrong_ndim_and_non_arrays(kern, packed):
    with pytest.raises(ValueError, match="x must be 2-D"):
        kern.gemm(np.ones(16, np.float32), packed, np.empty((1, 8), np.float32))
    with pytest.raises(ValueError, match="x must be a numpy array, got list"):
        kern.gemm([[1.0] * 16], packed, np.empty((1, 8), np.float32))
    with pytest.raises(ValueError, match="weight must be a PackedWeight"):
        ops.linear(np.ones((1, 16), np.float32), np.ones((8, 16), np.float32))


def test_read_only_output(kern, packed):
    out = np.empty((2, 8), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        kern.gemm(np.ones((2, 16), np.float32), packed, out)


def test_overlapping_output(kern):
    buf = np.ones((4, 32), np.float32)
    pw = kern.pack(np.ones((16, 16), np.float32), "f32")
    with pytest.raises(ValueError, match="out and x must not overlap"):
        kern.gemm(buf[:, :16], pw, buf[:, 16:])
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="out and residual must not overlap"):
        kern.rmsnorm(np.ones((2, 8), np.float32), np.ones(8, np.float32), 1e-5, x, residual=x)


def test_weight_packed_by_another_layout_is_refused():
    isas = ops.available_isas()
    layouts = {isa: ops.kernels(isa).gemm_layouts["f32"] for isa in isas}
    pairs = [(a, b) for a in isas for b in isas if layouts[a] != layouts[b]]
    if not pairs:
        pytest.skip("all runnable variants share one f32 layout")
    a, b = pairs[0]
    pw = ops.kernels(a).pack(np.ones((4, 4), np.float32), "f32")
    with pytest.raises(ValueError, match="pack it with this table"):
        ops.kernels(b).gemm(np.ones((1, 4), np.float32), pw, np.empty((1, 4), np.float32))


def test_pack_bad_dtype(kern):
    with pytest.raises(ValueError, match="dtype must be 'f32' or 'bf16', got 'int8'"):
        kern.pack(np.ones((2, 2), np.float32), "int8")
    with pytest.raises(ValueError, match="w must have dtype uint16"):
        kern.pack(np.ones((2, 2), np.float32), "bf16")


def test_elementwise_argument_errors(kern):
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        kern.rmsnorm(x, np.ones(7, np.float32), 1e-5, np.empty_like(x))
    with pytest.raises(ValueError, match="eps must be > 0"):
        kern.rmsnorm(x, np.ones(8, np.float32), 0.0, np.empty_like(x))
    with pytest.raises(ValueError, match="gate_up must have an even number of columns"):
        kern.silu_mul(np.ones((2, 7), np.float32), np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="gate_up must have an even number of columns"):
        kern.gelu_tanh_mul(np.ones((2, 7), np.float32), np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 4\), got \(2, 3\)"):
        kern.gelu_tanh_mul(np.ones((2, 8), np.float32), np.empty((2, 3), np.float32))
    gate_up = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="out and gate_up must not overlap"):
        kern.gelu_tanh_mul(gate_up, gate_up[:, 1:5])
    assert np.all(gate_up == 1.0)
    with pytest.raises(ValueError, match="positions must have dtype int32"):
        kern.rope(x, np.zeros(2, np.int64), rope_cos_sin(4, 8), 1, 8)
    with pytest.raises(ValueError, match="rot_dim must be even"):
        kern.rope(x, np.zeros(2, np.int32), rope_cos_sin(4, 8), 1, 8, 3)
    with pytest.raises(ValueError, match="fewer than n_heads\\*head_dim"):
        kern.rope(x, np.zeros(2, np.int32), rope_cos_sin(4, 8), 2, 8)
    with pytest.raises(ValueError, match="style must be 'neox' or 'gptj'"):
        kern.rope(x, np.zeros(2, np.int32), rope_cos_sin(4, 8), 1, 8, 8, "xpos")
    with pytest.raises(ValueError, match="table must have dtype float32"):
        kern.embed(np.zeros(2, np.int32), np.ones((3, 4), np.float64), np.empty((2, 4), np.float32))


def test_gdn_aliasing_and_layouts(kern):
    """The Gated DeltaNet wrappers refuse outputs over their inputs or the state, and
    states that are not C-contiguous; gated_rmsnorm wants whole heads."""
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    qkv = np.ones((2, 2 * 8 + 2 * 8), np.float32)
    ab, state = np.ones((2, 4), np.float32), np.zeros((1, 2, 8, 8), np.float32)
    args = (ab[:, :2], ab[:, 2:], -np.ones(2, np.float32), np.ones(2, np.float32))
    meta = (i32(0), i32(0, 2), i32(2))
    with pytest.raises(ValueError, match="out and qkv must not overlap"):
        kern.gdn_rule(qkv, *args, state, *meta, 1, 2, qkv[:, :16])
    with pytest.raises(ValueError, match="state must be C-contiguous"):
        kern.gdn_rule(qkv, *args, np.zeros((1, 2, 16, 8), np.float32)[:, :, ::2], *meta, 1, 2,
                      np.empty((2, 16), np.float32))
    with pytest.raises(ValueError, match="n_v_heads must be a positive multiple"):
        kern.gdn_rule(qkv, *args, state, *meta, 3, 2, np.empty((2, 16), np.float32))
    x, conv_state = np.ones((2, 6), np.float32), np.zeros((1, 3, 6), np.float32)
    with pytest.raises(ValueError, match="out and state must not overlap"):
        kern.gdn_conv(x, np.ones((6, 4), np.float32), conv_state, *meta, conv_state[0, :2])
    with pytest.raises(ValueError, match=r"state must have shape \(num_slots, 3, 6\)"):
        kern.gdn_conv(x, np.ones((6, 4), np.float32), np.zeros((1, 2, 6), np.float32), *meta,
                      np.empty_like(x))
    with pytest.raises(ValueError, match="not whole heads"):
        kern.gated_rmsnorm(x, x.copy(), np.ones(4, np.float32), 1e-6, np.empty_like(x))
    with pytest.raises(ValueError, match="out and z must not overlap"):
        z = x.copy()
        kern.gated_rmsnorm(x, z, np.ones(3, np.float32), 1e-6, z)
    with pytest.raises(ValueError, match="x and gate must not overlap"):
        kern.sigmoid_mul(x, x)


def test_layernorm_gelu_and_bidirectional_attention_validation(kern):
    x, w = np.ones((2, 6), np.float32), np.ones(6, np.float32)
    with pytest.raises(ValueError, match=r"bias must have shape \(6,\), got \(5,\)"):
        kern.layernorm(x, w, np.ones(5, np.float32), 1e-5, np.empty_like(x))
    with pytest.raises(ValueError, match="out and x must not overlap"):
        buf = np.ones((3, 6), np.float32)
        kern.layernorm(buf[:2], w, None, 1e-5, buf[1:])
    with pytest.raises(ValueError, match="eps must be > 0"):
        kern.layernorm(x, w, None, 0.0, np.empty_like(x))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 6\), got \(6, 2\)"):
        kern.gelu(x, np.empty((6, 2), np.float32))
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        kern.gelu(x[:, ::2], np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="out and x must not overlap"):
        kern.gelu(x.reshape(-1)[:6], x.reshape(-1)[1:7])
    with pytest.raises(ValueError, match="x must have dtype float32"):
        kern.gelu(np.ones(3), np.empty(3))
    kc = np.zeros((1, 2, 4, 8), np.float32)
    meta = (np.zeros((1, 1), np.int32), np.array([4], np.int32), np.array([0, 2], np.int32))
    with pytest.raises(ValueError, match="a sliding window needs causal attention"):
        kern.attention(np.ones((2, 8), np.float32), kc, kc.copy(), *meta, 1, 0.5,
                       np.empty((2, 8), np.float32), 3, causal=False)
    out = np.full((2, 8), 5.0, np.float32)
    with pytest.raises(ValueError, match="sequence 0: inconsistent attention metadata"):
        kern.attention(np.ones((2, 8), np.float32), kc, kc.copy(), meta[0],
                       np.array([0], np.int32), meta[2], 1, 0.5, out, causal=False)
    assert np.all(out == 5.0)  # rows with no key: refused, nothing written


def test_unknown_and_foreign_variants():
    with pytest.raises(ValueError, match=r"unknown kernel variant 'avx9' \(known: .*ref\)"):
        ops.kernels("avx9")
    foreign = "neon" if ops.cpu_info()["arch"] == "x86_64" else "avx2"
    with pytest.raises(ValueError, match=f"kernel variant '{foreign}' is for"):
        ops.kernels(foreign)


def test_closed_pool_is_refused(kern, packed):
    pool = ops.ThreadPool(2)
    pool.close()
    with pytest.raises(ValueError, match="the thread pool is closed"):
        kern.gemm(np.ones((2, 16), np.float32), packed, np.empty((2, 8), np.float32), None, pool)
