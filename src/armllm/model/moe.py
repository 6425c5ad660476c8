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
(ops.SparseLayer): rows grouped by expert with a counting sort, each active
expert's two GEMMs once over all of its rows in the expert's own format (float,
w8a8/w4a8 or GGUF/MXFP4 as stored) with the same kernels as the dense layers,
and its weighted rows added into `hidden` in the order transformers adds them.
"""
from __future__ import annotations

from armllm import ops
from armllm.model.config import ModelConfig
from armllm.model.weights import MoEWeights


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
         ws.expert_act, ws.expert_out), shared)
