"""moe: the sparse MLP of a mixture-of-experts layer (Mixtral, Qwen3-MoE, GPT-OSS).

A sparse layer's DecoderLayer.run ends with the MLP's input in the workspace's
`normed` rows; SparseMLP.run then routes every row to its top-k experts and
leaves the weighted sum of their outputs in `hidden`, where the next layer's
residual add picks it up:

    logits = normed @ router.T (+ bias);  p = softmax(logits)
    ids = the k largest p (ties: the lower expert id, as torch.topk on CPU)
    w = p[ids] (/ their sum when the model renormalizes: Mixtral, norm_topk_prob,
        GPT-OSS, whose softmax over the top-k logits is the same weights)
    hidden[r] = sum over e in ids[r], in ascending e: w * down_e(act(gate_e, up_e))

with act = silu(gate) * up, or GPT-OSS's clamped SwiGLU (see ModelConfig), and the
experts' biases (GPT-OSS) added to gate_up and down.

Rows are grouped by expert with one stable sort of the (row, slot) pairs, so
each active expert runs its two GEMMs once over all of its rows, in the
expert's own format (float, w8a8/w4a8 or GGUF as stored) with the same
kernels as the dense layers. The sum goes in the order transformers adds it.
"""
from __future__ import annotations

import numpy as np

from armllm import ops
from armllm.model.config import ModelConfig
from armllm.model.weights import MoEWeights


def route(logits: np.ndarray, top_k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [T, k] int64, weights [T, k] float32) of router logits [T, E]: the
    softmax's k largest, in descending order (ties to the lower id)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z, dtype=np.float32)
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, ids, axis=1)
    if renormalize:
        w /= w.sum(axis=1, keepdims=True)
    return ids, w


class SparseMLP:
    """One sparse layer's experts bound to a Workspace's buffers: run() reads the
    MLP input rows in ws.normed and writes their output to ws.hidden. gate_up_in
    and down_in: the ActScratch of quantized experts' activations (None: float
    experts), as the Workspace plans them for this layer."""

    def __init__(self, config: ModelConfig, weights: MoEWeights, ws,
                 gate_up_in: ops.ActScratch | None, down_in: ops.ActScratch | None):
        self.weights, self.ws = weights, ws
        self.top_k, self.renormalize = config.experts_per_token, config.norm_topk_prob
        self.clamped_swiglu = config.clamped_swiglu
        self.gate_up_in, self.down_in = gate_up_in, down_in

    def _act(self, gate_up: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.clamped_swiglu is None:
            return ops.silu_mul(gate_up, out=out)
        alpha, limit = self.clamped_swiglu
        inter = out.shape[1]
        gate, up = gate_up[:, :inter], gate_up[:, inter:]   # scratch: clamped in place
        np.minimum(gate, limit, out=gate)
        np.clip(up, -limit, limit, out=up)
        up += 1.0
        with np.errstate(over="ignore"):   # exp(-alpha g) -> inf: g * sigmoid = -0
            np.multiply(gate, -alpha, out=out)
            np.exp(out, out=out)
        out += 1.0
        np.divide(gate, out, out=out)
        out *= up
        return out

    def run(self, rows: int) -> None:
        ws, w, k = self.ws, self.weights, self.top_k
        x, out = ws.normed[:rows], ws.hidden[:rows]
        logits = ops.linear(x, w.router, w.router_bias, out=ws.router_logits[:rows])
        ids, weights = route(logits, k, self.renormalize)
        # (row, slot) pairs in expert order, rows ascending within an expert
        order = np.argsort(ids, axis=None, kind="stable")
        counts = np.bincount(ids.reshape(-1), minlength=len(w.gate_up))
        flat_w = weights.reshape(-1)
        out.fill(0.0)
        start = 0
        for e in np.flatnonzero(counts):
            n = int(counts[e])
            pairs = order[start:start + n]
            start += n
            sel = pairs // k
            xin = np.take(x, sel, axis=0, out=ws.expert_in[:n])
            gate_up = ops.linear(xin, w.gate_up[e], _row(w.gate_up_bias, e),
                                 out=ws.expert_gate_up[:n], act_scratch=self.gate_up_in)
            act = self._act(gate_up, ws.expert_act[:n])
            y = ops.linear(act, w.down[e], _row(w.down_bias, e), out=ws.expert_out[:n],
                           act_scratch=self.down_in)
            y *= flat_w[pairs][:, None]
            out[sel] += y


def _row(biases: np.ndarray | None, e: int) -> np.ndarray | None:
    return None if biases is None else biases[e]
