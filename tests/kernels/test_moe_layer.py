"""The sparse MLP kernel (SparseLayer: routing, grouping by expert, every active
expert's gate/up -> act -> down as two pool jobs over GEMM column windows, the
weighted add) on every variant and every expert format (f32, bf16, w8 channelwise
and group 32, w4 with offsets, w4 with asymmetric activations, GGUF Q4_0, Q8_0,
K-quants in two parts, MXFP4):

- bit for bit the per-expert composition SparseLayer ran before (each active
  expert in ascending order: its rows copied, quantized in its format, the whole
  gate_up GEMM, the activation, quantized again, the whole down GEMM, its weighted
  rows added into the output; then the shared expert), built here from the
  variant's own slots;
- float experts against numpy in float64 of the same routing; quantized ones near
  the float model of their weights;
- forced routings (every row on one expert, all others empty; k = the number of
  experts), batches longer than a pass, a shared expert, GPT-OSS's clamped SwiGLU;
- a row's result does not depend on its batch; routing ties; bad arguments.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
from armllm._kernels._ext import SparseLayer

from armllm import ops
from tests.conftest import rand
from tests.gguf_blocks import TYPE_IDS, random_blocks

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.restype, _libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]


def expf(a: np.ndarray) -> np.ndarray:
    """The C library's expf (the one the kernels' portable C calls), elementwise."""
    return np.array([_libm.expf(float(v)) for v in np.ravel(a)], np.float32).reshape(np.shape(a))


def silu_mul_ref(gu):
    inter = gu.shape[1] // 2
    g, u = gu[:, :inter], gu[:, inter:]
    return g / (1 + np.exp(-g)) * u


def swiglu_clamped_ref(gu, alpha, limit):
    inter = gu.shape[1] // 2
    g, u = np.minimum(gu[:, :inter], limit), np.clip(gu[:, inter:], -limit, limit)
    return g / (1 + np.exp(-alpha * g)) * (u + 1)


def swiglu_clamped32(gu, alpha, limit):
    """moe.h's armllm_swiglu_clamped in float32, bit for bit."""
    inter = gu.shape[1] // 2
    g = np.where(gu[:, :inter] < limit, gu[:, :inter], np.float32(limit))
    u = np.clip(gu[:, inter:], np.float32(-limit), np.float32(limit))
    return (g / (np.float32(1) + expf(np.float32(-alpha) * g)) * (u + np.float32(1))).astype(
        np.float32)


def route_ref(logits, k, renormalize):
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    return ids, w / w.sum(axis=1, keepdims=True) if renormalize else w


# format -> (hidden, inter): inter off the float panels (16, 12), the activation groups'
# multiples where the format needs them, K-quants' 256
FORMATS = {"f32": (64, 196), "bf16": (64, 196), "w8": (64, 196), "w8g32": (96, 196),
           "w4g32": (64, 196), "w4asym": (64, 196), "q4_0": (64, 224), "q8_0": (96, 160),
           "kquant": (256, 256), "mxfp4": (64, 224)}
GGUF_TYPES = {"q4_0": ("Q4_0", "Q4_0", "Q4_0"), "q8_0": ("Q8_0", "Q8_0", "Q8_0"),
              "kquant": ("Q4_K", "Q6_K", "Q4_K"), "mxfp4": ("MXFP4", "MXFP4", "MXFP4")}


class Experts:
    """A random router and experts in one format (`fmt`, FORMATS), their exact float
    values, packed for a variant by packed(variant, name); shared: a shared expert
    (index n) and its gate."""

    def __init__(self, rng, n, fmt, router_bias=None, biases=False, shared=False):
        self.n, self.fmt = n, fmt
        self.h, self.inter = FORMATS[fmt]
        h, inter = self.h, self.inter
        self.router = rand(rng, (n, h), 0.3)
        self.router_bias = router_bias
        self.gu_bias = rand(rng, (n, 2 * inter)) if biases else None
        self.down_bias = rand(rng, (n, h)) if biases else None
        self.shared_gate = rand(rng, h, 0.1) if shared else None
        self.raw, self.float = {}, {}
        for name, shape in (("gate_up", (2 * inter, h)), ("down", (h, inter))):
            for e in range(n + shared):
                self.raw[name, e], self.float[name, e] = self._weight(rng, name, shape)

    def _weight(self, rng, name, shape):
        """(what packed() packs, the float64 values it stands for) of one matrix."""
        n, k = shape
        if self.fmt in GGUF_TYPES:
            gate, up, down = GGUF_TYPES[self.fmt]
            parts = [(gate, n // 2), (up, n // 2)] if name == "gate_up" else [(down, n)]
            if len({t for t, _ in parts}) == 1:   # one type: one part
                parts = [(parts[0][0], n)]
            raws = [random_blocks(rng, t, r * k // 32 if t in ("Q4_0", "Q8_0", "MXFP4") else
                                  r * k // 256, 0.05 / np.sqrt(k)) for t, r in parts]
            w = np.concatenate([ops.gguf_dequantize(TYPE_IDS[t], raw, r, k)
                                for (t, r), raw in zip(parts, raws, strict=True)])
            return (np.concatenate([r.reshape(-1) for r in raws]), parts), w.astype(np.float64)
        if self.fmt in ("f32", "bf16"):
            w = rand(rng, shape, 1 / np.sqrt(k))
            if self.fmt == "bf16":
                bits = ops.f32_to_bf16(w)
                return bits, ops.bf16_to_f32(bits).astype(np.float64)
            return w, w.astype(np.float64)
        bits, group = (8, 0) if self.fmt == "w8" else (8, 32) if self.fmt == "w8g32" else (4, 32)
        ng = ops.quant_groups(k, group) if group else 1
        if bits == 8:
            q, o = rng.integers(-127, 128, shape).astype(np.int8), None
        else:
            q = rng.integers(0, 16, shape).astype(np.int8)
            o = rand(rng, (n, ng), 0.02 / np.sqrt(k))
        d = (rng.random((n, ng)) * 0.02 + 1e-3).astype(np.float32) / np.float32(np.sqrt(k))
        gl = ops.quant_group_len(group) if group else ops.quant_kpad(k)
        cols = np.minimum(np.arange(k) // gl, ng - 1)
        w = q * d[:, cols].astype(np.float64) + (0 if o is None else o[:, cols])
        return (q, d, o, bits, group), w

    def packed(self, variant, name):
        out = []
        for e in range(self.n + (self.shared_gate is not None)):
            raw = self.raw[name, e]
            k = self.h if name == "gate_up" else self.inter
            if self.fmt in GGUF_TYPES:
                blocks, parts = raw
                out.append(variant.pack_gguf(blocks, k, [TYPE_IDS[t] for t, _ in parts],
                                             [r for _, r in parts]))
            elif self.fmt in ("f32", "bf16"):
                out.append(variant.pack(raw, self.fmt))
            else:
                q, d, o, bits, group = raw
                pw = variant.pack_wq(q, d, o, bits, group)
                if self.fmt == "w4asym":
                    pw.zp_correction = variant.pack(ops._zp_correction(q, d, o, group), "f32")
                out.append(pw)
        return out

    def scratch(self, variant, name, rows):
        """The ActScratch of quantized experts' activations for `name`'s input (None:
        float)."""
        if self.fmt in ("f32", "bf16"):
            return None
        pw = self.packed(variant, name)[0]
        asym = pw.zp_correction.n if pw.zp_correction is not None else 0
        return ops.ActScratch(rows, pw.k, pw.group, True, asym)

    def layer(self, variant, rows, k, renormalize=True, clamped=None, pairs=None):
        """(SparseLayer, its buffers: normed, hidden, router_logits, expert_in,
        expert_gate_up, expert_act) for batches of `rows` rows, pair buffers of `pairs`
        rows (default: one pass of them all)."""
        h, inter = self.h, self.inter
        pairs = pairs or rows * (k + 1)
        quantized = self.fmt not in ("f32", "bf16")
        bufs = (np.zeros((rows, h), np.float32), np.zeros((rows, h), np.float32),
                np.zeros((rows, self.n), np.float32),
                None if quantized else np.zeros((pairs, h), np.float32),
                np.zeros((pairs, max(2 * inter, h)), np.float32),
                None if quantized else np.zeros((pairs, inter), np.float32))
        shared = None
        if self.shared_gate is not None:
            shared = (self.packed(variant, "gate_up")[-1], self.packed(variant, "down")[-1],
                      self.shared_gate)
        layer = SparseLayer(variant, variant.pack(self.router, "f32"), self.router_bias,
                            self.packed(variant, "gate_up")[:self.n], self.gu_bias,
                            self.packed(variant, "down")[:self.n], self.down_bias,
                            self.scratch(variant, "gate_up", pairs),
                            self.scratch(variant, "down", pairs), k, renormalize, clamped, bufs,
                            shared)
        return layer, bufs

    def reference(self, x, logits, k, renormalize, clamped=None):
        """float64 numpy of the MLP, routed from the layer's own router logits."""
        ids, w = route_ref(logits.astype(np.float64), k, renormalize)
        out = np.zeros((len(x), self.h))
        for r in range(len(x)):
            for e, we in sorted(zip(ids[r], w[r], strict=True)):
                gu = x[r:r + 1].astype(np.float64) @ self.float["gate_up", e].T
                if self.gu_bias is not None:
                    gu += self.gu_bias[e]
                act = silu_mul_ref(gu) if clamped is None else swiglu_clamped_ref(gu, *clamped)
                y = act @ self.float["down", e].T
                if self.down_bias is not None:
                    y += self.down_bias[e]
                out[r] += we * y[0]
        return out, ids


def linear_per_call(variant, pool, pw, x, bias):
    """x @ W.T (+ bias) as a bound linear layer runs it in one call: the rows quantized
    in the weight's groups (asymmetric: with zero points, whose correction is then
    taken off), the whole GEMM on the pool."""
    m = len(x)
    y = np.empty((m, pw.n), np.float32)
    if not pw.quantized:
        variant.gemm(x, pw, y, bias, pool)
        return y
    ng = ops.quant_groups(pw.k, pw.group)
    xq = np.empty((m, ops.quant_kpad(pw.k)), np.int8)
    scale, gsum = np.empty((m, ng), np.float32), np.empty((m, ng), np.int32)
    zp = np.empty((m, ng), np.int32) if pw.zp_correction is not None else None
    variant.quant_act(np.ascontiguousarray(x), xq, scale, gsum, pw.group, pool, zp)
    if pw.dtype == "gguf":
        variant.gemm_gguf(xq, scale, gsum, pw, y, bias, pool)
        return y
    variant.gemm_wq(xq, scale, gsum, pw, y, bias, pool)
    if zp is not None:
        corr = np.empty_like(y)
        variant.gemm(zp.astype(np.float32) * scale, pw.zp_correction, corr, None, pool)
        y = y - corr
    return y


def per_expert(variant, pool, ex, x, logits, k, renormalize=True, clamped=None):
    """The layer as SparseLayer ran it before its two jobs: expert by expert in
    ascending order, each on its own rows with whole GEMM calls, the weighted rows
    added into the output; the shared expert last."""
    ids, w = ops.moe_route(logits, k, renormalize)
    gate_up, down = ex.packed(variant, "gate_up"), ex.packed(variant, "down")
    out = np.zeros((len(x), ex.h), np.float32)

    def expert(e, rows):
        gub = None if ex.gu_bias is None or e == ex.n else ex.gu_bias[e]
        db = None if ex.down_bias is None or e == ex.n else ex.down_bias[e]
        gu = linear_per_call(variant, pool, gate_up[e], x[rows], gub)
        act = np.empty((len(gu), ex.inter), np.float32)
        if clamped is None or e == ex.n:
            variant.silu_mul(gu, act, pool)
        else:
            act = swiglu_clamped32(gu, *clamped)
        return linear_per_call(variant, pool, down[e], act, db)

    for e in range(ex.n):
        rows, slots = np.nonzero(ids == e)   # rows ascending
        if len(rows):
            ops.moe_accumulate(expert(e, rows), rows.astype(np.int32), w[rows, slots], out)
    if ex.shared_gate is not None:
        dot = np.zeros(len(x), np.float32)
        for j in range(ex.h):   # a sequential float sum, as the kernel's
            dot = dot + x[:, j] * ex.shared_gate[j]
        scale = (1.0 / (1.0 + expf(-dot).astype(np.float64))).astype(np.float32)
        ops.moe_accumulate(expert(ex.n, np.arange(len(x))), None, scale, out)
    return out


def run(layer, bufs, x, pool):
    bufs[0][:len(x)] = x
    layer.run(len(x), pool)
    return bufs[1][:len(x)].copy()


ROUTINGS = {
    # (experts, k, router bias): random; every row on expert 2, the others empty;
    # rows on experts 1 and 3 only; k = the number of experts
    "random": (6, 2, None),
    "one-expert": (4, 1, np.array([0, 0, 30, 0], np.float32)),
    "two-experts": (5, 2, np.array([0, 30, 0, 30, 0], np.float32)),
    "k-is-e": (4, 4, None),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_layer_is_the_per_expert_composition(variant, pool, fmt, routing):
    """Bit for bit what each active expert's whole GEMMs on its own rows give, summed
    in ascending expert order: decode (1 row) and batched (19 rows) on the pool, and
    19 rows in passes of 4 without one."""
    n, k, bias = ROUTINGS[routing]
    rng = np.random.default_rng(1)
    ex = Experts(rng, n, fmt, bias, biases=fmt in ("f32", "mxfp4", "w8"))
    x = rand(rng, (19, ex.h))
    for rows, pairs, p in ((1, None, pool), (19, None, pool), (19, 4 * (k + 1), None)):
        layer, bufs = ex.layer(variant, 19, k, pairs=pairs)
        got = run(layer, bufs, x[:rows], p)
        want = per_expert(variant, pool, ex, x[:rows], bufs[2][:rows], k)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (rows, pairs)
    if bias is not None:
        assert set(ops.moe_route(bufs[2][:19], k, True)[0].ravel()) == set(np.flatnonzero(bias))


@pytest.mark.parametrize("fmt", ["f32", "bf16", "w4asym", "kquant", "mxfp4"])
@pytest.mark.parametrize("clamped", [None, (1.702, 1.5)])
def test_shared_expert_and_clamped_swiglu(variant, pool, fmt, clamped):
    """A shared expert on every row (after the routed ones), GPT-OSS's clamped SwiGLU on
    the routed experts (the shared one keeps silu_mul), biases: the per-expert bits."""
    rng = np.random.default_rng(5)
    ex = Experts(rng, 6, fmt, biases=True, shared=True)
    x = rand(rng, (11, ex.h))
    layer, bufs = ex.layer(variant, 11, 2, clamped=clamped)
    got = run(layer, bufs, x, pool)
    want = per_expert(variant, pool, ex, x, bufs[2][:11], 2, clamped=clamped)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("clamped", [None, (1.702, 1.5)])
def test_float_experts_match_numpy(variant, pool, routing, clamped):
    n, k, bias = ROUTINGS[routing]
    rng = np.random.default_rng(1)
    ex = Experts(rng, n, "f32", bias, biases=clamped is not None)
    layer, bufs = ex.layer(variant, 19, k, clamped=clamped)
    x = rand(rng, (19, ex.h))
    got = run(layer, bufs, x, pool)
    want, ids = ex.reference(x, bufs[2][:19], k, True, clamped)
    assert np.max(np.abs(got - want)) <= 2e-5 * max(1.0, np.abs(want).max())
    if bias is not None:
        assert set(ids.ravel()) == set(np.flatnonzero(bias))


@pytest.mark.parametrize("fmt", ["mxfp4", "w8", "w4asym", "kquant"])
def test_quantized_experts_near_their_float_model(fmt):
    """The int8 activations' rounding is all that parts a quantized layer (on ref)
    from the float model of the same weights."""
    rng = np.random.default_rng(2)
    ex = Experts(rng, 6, fmt)
    x = rand(rng, (23, ex.h))
    layer, bufs = ex.layer(ops.kernels("ref"), 23, 2)
    got = run(layer, bufs, x, None)
    exact, _ = ex.reference(x, bufs[2][:23], 2, True)
    assert np.max(np.abs(got - exact)) <= 0.03 * max(1.0, np.abs(exact).max())


@pytest.mark.parametrize("fmt", ["f32", "mxfp4", "w4g32"])
def test_rows_do_not_depend_on_their_batch(variant, pool, fmt):
    rng = np.random.default_rng(3)
    ex = Experts(rng, 6, fmt, biases=True)
    layer, bufs = ex.layer(variant, 16, 3, clamped=(1.702, 7.0))
    x = rand(rng, (16, ex.h))
    together = run(layer, bufs, x, pool)
    for rows in (slice(0, 1), slice(5, 6), slice(3, 9)):
        assert np.array_equal(run(layer, bufs, x[rows], pool), together[rows])


def test_route_ties_and_weights():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 1.0, 2.0, 2.0]], np.float32)
    ids, w = ops.moe_route(logits, 2, False)
    assert ids.tolist() == [[1, 2], [2, 3]]
    p = np.exp(logits[0] - 3.0) / np.exp(logits[0] - 3.0).sum()
    np.testing.assert_allclose(w[0], p[[1, 2]], rtol=1e-6)
    ids, w = ops.moe_route(logits[:1], 4, True)
    assert ids.tolist() == [[1, 2, 0, 3]] and abs(w.sum() - 1.0) < 1e-6


def test_accumulate_adds_weighted_rows_in_place():
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.ones((3, 3), np.float32)
    ops.moe_accumulate(y, np.array([2, 0], np.int32), np.array([2.0, -1.0], np.float32), out)
    assert out.tolist() == [[-2, -3, -4], [1, 1, 1], [1, 3, 5]]
    ops.moe_accumulate(y, None, np.array([1.0, 1.0], np.float32), out)
    assert out.tolist() == [[-2, -2, -2], [4, 5, 6], [1, 3, 5]]


def test_bad_arguments():
    variant = ops.kernels("ref")
    ex = Experts(np.random.default_rng(4), 3, "f32")
    with pytest.raises(ValueError, match="top_k must be in"):
        ex.layer(variant, 4, 4)
    with pytest.raises(ValueError, match="top_k must be in"):
        ops.moe_route(np.zeros((2, 3), np.float32), 0, True)
    layer, bufs = ex.layer(variant, 4, 2)
    with pytest.raises(ValueError, match="router must be a float weight"):
        wq = variant.pack_wq(np.ones((3, ex.h), np.int8), np.ones((3, 1), np.float32), None, 8, 0)
        SparseLayer(variant, wq, None, ex.packed(variant, "gate_up"), None,
                    ex.packed(variant, "down"), None, None, None, 2, True, None, bufs)
    with pytest.raises(ValueError, match="hold no pass"):
        ex.layer(variant, 4, 2, pairs=2)
    qx = Experts(np.random.default_rng(4), 3, "w8")
    one = qx.scratch(variant, "gate_up", 12)   # hidden 64 is not inter 196: any scratch
    with pytest.raises(ValueError, match="scratches of their own"):
        SparseLayer(variant, variant.pack(qx.router, "f32"), None, qx.packed(variant, "gate_up"),
                    None, qx.packed(variant, "down"), None, one, one, 2, True, None,
                    qx.layer(variant, 4, 2)[1])
    with pytest.raises(ValueError, match="rows must be in"):
        layer.run(5)
