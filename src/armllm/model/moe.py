"""moe: the sparse MLP of a mixture-of-experts layer (Mixtral, Qwen3-MoE, GPT-OSS).

A sparse layer's sparse_mlp step (model/layer.py's SparseMLP) leaves the MLP's
input in the workspace's `normed` rows; the layer bind_experts binds then
routes every row to its top-k experts and leaves the weighted sum of their
outputs in `hidden`, where the next layer's residual add picks it up:

    logits = normed @ router.T (+ bias);  p = softmax(logits)
    ids = the k largest p (ties: the lower expert id, as torch.topk on CPU)
    w = p[ids] (/ their sum when the model renormalizes: Mixtral, norm_topk_prob,
        GPT-OSS, whose softmax over the top-k logits is the same weights)
    hidden[r] = sum over e in ids[r], in ascending e: w * down_e(act(gate_e, up_e))

with act = silu(gate) * up, or GPT-OSS's clamped SwiGLU (see ModelConfig), and the
experts' biases (GPT-OSS) added to gate_up and down. The whole MLP is one C call
(ops.SparseLayer, moe.h): rows grouped by expert with a counting sort, each row's
activations quantized once, every active expert's gate/up, activation and down as
two pool jobs over column windows of the GEMM slots in the experts' own format
(float, w8a8/w4a8 or GGUF/MXFP4 as stored: the bits of each expert's GEMMs on its
rows alone), and the weighted rows added into `hidden` in the order transformers
adds them. Its buffers hold the (row, expert) pairs of a pass of up to
pass_rows(...) // (top_k + 1) rows; larger batches run in passes.
"""
from __future__ import annotations

from armllm import ops
from armllm.model.config import ModelConfig
from armllm.model.weights import MoEWeights

PASS_PAIRS = 8192   # pair rows of a sparse layer's buffers, at most (a pass's)


def pass_rows(config: ModelConfig, max_tokens: int) -> int:
    """Pair rows of a sparse layer's buffers for batches of up to max_tokens rows: a
    pass takes up to PASS_PAIRS // (top_k + 1) rows (a longer batch runs in passes),
    each with top_k + 1 pair rows (its routed pairs, then the row itself)."""
    per_row = config.experts_per_token + 1
    return min(max_tokens, max(1, PASS_PAIRS // per_row)) * per_row


def bind_experts(config: ModelConfig, weights: MoEWeights, ws,
                 gate_up_in: ops.ActScratch | None, down_in: ops.ActScratch | None,
                 shared: tuple | None = None) -> ops.SparseLayer:
    """One sparse layer's experts bound to a Workspace's buffers: the layer reads the
    MLP input rows in ws.normed and writes their output to ws.hidden. gate_up_in
    and down_in: the ActScratch of quantized experts' activations (None: float
    experts), as the Workspace plans them for this layer; shared: its shared expert
    (gate_up, down, gate [hidden]) that every row runs, times sigmoid(x . gate)."""
    return ops.bind_sparse_layer(
        weights.router, weights.router_bias, weights.gate_up, weights.gate_up_bias,
        weights.down, weights.down_bias, gate_up_in, down_in, config.experts_per_token,
        config.norm_topk_prob, config.clamped_swiglu,
        (ws.normed, ws.hidden, ws.router_logits, ws.expert_in, ws.expert_gate_up,
         ws.expert_act), shared)
