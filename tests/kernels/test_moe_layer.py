"""The sparse MLP kernel (SparseLayer: routing, grouping by expert, each expert's
GEMMs, the weighted add) on every variant: float experts against numpy in float64
of the same routing; MXFP4 (GGUF-block) and w8 experts against the ref variant's
(the quantized GEMMs give ref's bits); forced routings (every row on one
expert, all others empty; k = the number of experts); a row's result does not
depend on its batch; GPT-OSS's clamped SwiGLU; routing ties; bad arguments.
"""
from __future__ import annotations

import numpy as np
import pytest
from armllm._kernels._ext import SparseLayer

from armllm import ops
from tests.conftest import rand
from tests.gguf_blocks import random_blocks

H, INTER = 64, 32   # multiples of the GGUF blocks' 32


def silu_mul_ref(gu):
    g, u = gu[:, :INTER], gu[:, INTER:]
    return g / (1 + np.exp(-g)) * u


def swiglu_clamped_ref(gu, alpha, limit):
    g, u = np.minimum(gu[:, :INTER], limit), np.clip(gu[:, INTER:], -limit, limit)
    return g / (1 + np.exp(-alpha * g)) * (u + 1)


def route_ref(logits, k, renormalize):
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    return ids, w / w.sum(axis=1, keepdims=True) if renormalize else w


class Experts:
    """Random router and experts: float weights (f32), or MXFP4 / w8 blocks with
    their exact float values, packed for a variant by pack(variant)."""

    def __init__(self, rng, n, fmt, router_bias=None, biases=False):
        self.n, self.fmt = n, fmt
        self.router = rand(rng, (n, H), 0.3)
        self.router_bias = router_bias
        self.gu_bias = rand(rng, (n, 2 * INTER)) if biases else None
        self.down_bias = rand(rng, (n, H)) if biases else None
        self.raw, self.float = {}, {}
        for name, shape in (("gate_up", (2 * INTER, H)), ("down", (H, INTER))):
            for e in range(n):
                if fmt == "mxfp4":
                    raw = random_blocks(rng, "MXFP4", shape[0] * shape[1] // 32, 0.2)
                    w = ops.gguf_dequantize(39, raw, *shape)
                elif fmt == "w8":
                    q = rng.integers(-127, 128, shape).astype(np.int8)
                    d = (np.abs(rng.standard_normal((shape[0], 1))) * 2e-3 + 1e-3).astype(
                        np.float32)
                    raw, w = (q, d), q * d
                else:
                    w = raw = rand(rng, shape, 0.2)
                self.raw[name, e], self.float[name, e] = raw, w.astype(np.float64)

    def packed(self, variant, name):
        out = []
        for e in range(self.n):
            raw = self.raw[name, e]
            if self.fmt == "mxfp4":
                k = H if name == "gate_up" else INTER
                out.append(variant.pack_gguf(raw, k, [39], [raw.shape[0] * 32 // k]))
            elif self.fmt == "w8":
                out.append(variant.pack_wq(raw[0], raw[1], None, 8, 0))
            else:
                out.append(variant.pack(raw, "f32"))
        return out

    def scratch(self, rows, k):
        if self.fmt == "float":
            return None
        group = ops.GGUF_ACT_GROUP if self.fmt == "mxfp4" else 0
        return ops.ActScratch(rows, k, group)

    def layer(self, variant, rows, k, renormalize=True, clamped=None):
        """(SparseLayer, its buffers: normed, hidden, router_logits, ...)."""
        bufs = tuple(np.zeros((rows, c), np.float32)
                     for c in (H, H, self.n, H, 2 * INTER, INTER, H))
        layer = SparseLayer(variant, variant.pack(self.router, "f32"), self.router_bias,
                            self.packed(variant, "gate_up"), self.gu_bias,
                            self.packed(variant, "down"), self.down_bias,
                            self.scratch(rows, H), self.scratch(rows, INTER), k, renormalize,
                            clamped, bufs)
        return layer, bufs

    def reference(self, x, logits, k, renormalize, clamped=None):
        """float64 numpy of the MLP, routed from the layer's own router logits."""
        ids, w = route_ref(logits.astype(np.float64), k, renormalize)
        out = np.zeros((len(x), H))
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


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("clamped", [None, (1.702, 1.5)])
def test_float_experts_match_numpy(variant, pool, routing, clamped):
    n, k, bias = ROUTINGS[routing]
    rng = np.random.default_rng(1)
    ex = Experts(rng, n, "float", bias, biases=clamped is not None)
    layer, bufs = ex.layer(variant, 19, k, clamped=clamped)
    x = rand(rng, (19, H))
    got = run(layer, bufs, x, pool)
    want, ids = ex.reference(x, bufs[2][:19], k, True, clamped)
    assert np.max(np.abs(got - want)) <= 2e-5 * max(1.0, np.abs(want).max())
    if bias is not None:
        assert set(ids.ravel()) == set(np.flatnonzero(bias))


@pytest.mark.parametrize("fmt", ["mxfp4", "w8"])
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_quantized_experts_match_ref(variant, pool, fmt, routing):
    """The quantized GEMMs are ref's bits on every variant; silu_mul's exp is within
    its bound; so the layer is ref's within float rounding."""
    n, k, bias = ROUTINGS[routing]
    rng = np.random.default_rng(2)
    ex = Experts(rng, n, fmt, bias)
    x = rand(rng, (23, H))
    got = run(*ex.layer(variant, 23, k), x, pool)
    want = run(*ex.layer(ops.kernels("ref"), 23, k), x, None)
    assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, np.abs(want).max())
    # and near the float model of the same weights: int8 activations' rounding
    layer, bufs = ex.layer(ops.kernels("ref"), 23, k)
    run(layer, bufs, x, None)
    exact, _ = ex.reference(x, bufs[2][:23], k, True)
    assert np.max(np.abs(want - exact)) <= 0.03 * max(1.0, np.abs(exact).max())


@pytest.mark.parametrize("fmt", ["float", "mxfp4"])
def test_rows_do_not_depend_on_their_batch(variant, pool, fmt):
    rng = np.random.default_rng(3)
    ex = Experts(rng, 6, fmt, biases=True)
    layer, bufs = ex.layer(variant, 16, 3, clamped=(1.702, 7.0))
    x = rand(rng, (16, H))
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


def test_bad_arguments():
    variant = ops.kernels("ref")
    ex = Experts(np.random.default_rng(4), 3, "float")
    with pytest.raises(ValueError, match="top_k must be in"):
        ex.layer(variant, 4, 4)
    with pytest.raises(ValueError, match="top_k must be in"):
        ops.moe_route(np.zeros((2, 3), np.float32), 0, True)
    with pytest.raises(ValueError, match="router must be a float weight"):
        bufs = tuple(np.zeros((4, c), np.float32) for c in (H, H, 3, H, 2 * INTER, INTER, H))
        wq = variant.pack_wq(np.ones((3, H), np.int8), np.ones((3, 1), np.float32), None, 8, 0)
        SparseLayer(variant, wq, None, ex.packed(variant, "gate_up"), None,
                    ex.packed(variant, "down"), None, None, None, 2, True, None, bufs)
    layer, _ = ex.layer(variant, 4, 2)
    with pytest.raises(ValueError, match="rows must be in"):
        layer.run(5)
