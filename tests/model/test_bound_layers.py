"""The model's forward (one bound Cython call per decoder layer, ops.decoder_layer,
running the layer's declared steps, and one for the final norm and lm_head,
ops.norm_head) gives exactly the bits of the same steps run op by op with
armllm.ops' per-op wrappers, for every weight format (f32, bf16, w8/w4 with
symmetric and asymmetric activations), bf16 and f32 KV caches, Qwen3's q/k norms,
Qwen2's biases, Mistral's window, Gemma 3's sandwich norms, GeGLU, query scale,
local RoPE and scaled embeddings, Phi-3's partial rotary, Qwen3.5's Gated DeltaNet
layers (their states in the cache's state pool) and gated attention, over a step
that mixes prompt chunks and decodes of several sequences; bad batch metadata is
refused with the value named."""
from __future__ import annotations

import numpy as np
import pytest

from armllm import ops
from armllm.model.decoder import BatchMeta, KVCache, Workspace
from armllm.model.layer import (
    Act,
    Attention,
    DeltaNet,
    Linear,
    Norm,
    NormLinear,
    OutputGate,
    QKNorm,
    RopeKV,
)
from armllm.model.loader import load_model
from armllm.model.quantize import parse_scheme
from tests.model.test_llama_vs_transformers import make_tiny

pytest.importorskip("transformers")

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3-qk-norm": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 7}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "head_dim": 16, "sliding_window": 7, "query_pre_attn_scalar": 24,
        "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"partial_rotary_factor": 0.75,
                                               "pad_token_id": 0}),
    # two DeltaNet layers (2 key heads, 4 value heads), then a gated attention layer
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {
        "num_hidden_layers": 3, "head_dim": 16, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
        "layer_types": ["linear_attention", "linear_attention", "full_attention"]}),
}


def per_op_forward(model, meta: BatchMeta, kv: KVCache, ws: Workspace) -> np.ndarray:
    """Each layer's steps op by op (what forward ran before its layers were bound)."""
    c, w = model.config, model.weights
    t, r = len(meta.input_ids), len(meta.logits_rows)
    res, x, normed = ws.residual[:t], ws.hidden[:t], ws.normed[:t]
    gate_up, act = ws.gate_up[:t], ws.act[:t]
    ops.embedding(meta.input_ids, w.embed, out=res)
    res *= np.float32(c.embed_scale)
    for i, (lw, scratch) in enumerate(zip(w.layers, ws.layer_scratch, strict=True)):
        qkv_in, o_in, gate_up_in, down_in = scratch
        qkv, attn = ws.qkv[:t, :lw.qkv.n], ws.attn[:t, :lw.o.k]
        # q_proj's rows per head [q | gate] when the output is gated
        q_rows = c.q_size * (2 if c.attn_output_gate else 1)
        q, k, v = (qkv[:, :q_rows], qkv[:, q_rows:q_rows + c.kv_size],
                   qkv[:, q_rows + c.kv_size:q_rows + 2 * c.kv_size])
        if c.attn_output_gate:   # per head [q | gate]: q_normed gathers q (qk_norm)
            heads = q.reshape(t, c.num_heads, -1)
            q, gate = heads[:, :, :c.head_dim], heads[:, :, c.head_dim:]
        pending, q_in, k_in = i > 0, q, k   # pending: x not yet added to res
        for step in lw.steps:
            if isinstance(step, NormLinear):
                weight, bias, out, act_in = (lw.qkv, lw.qkv_bias, qkv, qkv_in) \
                    if step.linear == "qkv" else (lw.gate_up, None, gate_up, gate_up_in)
                ops.rms_norm_linear(x if pending else res, lw.norms[step.norm], c.rms_norm_eps,
                                    weight, bias, res if pending else None, normed, out,
                                    act_in)
                pending = False
            elif isinstance(step, QKNorm):
                q_in, k_in = ws.q_normed[:t], ws.k_normed[:t]
                q_in[...], k_in[...] = q.reshape(t, c.q_size), k
                for heads, n, norm in ((q_in, c.num_heads, lw.q_norm),
                                       (k_in, c.num_kv_heads, lw.k_norm)):
                    flat = heads.reshape(t * n, c.head_dim)
                    ops.rms_norm(flat, norm, c.rms_norm_eps, out=flat)
            elif isinstance(step, RopeKV):
                table = model.rope_table(step.table, ws.max_seq_len)
                ops.rope(q_in, meta.positions, table, c.num_heads, c.head_dim, c.rot_dim)
                ops.rope(k_in, meta.positions, table, c.num_kv_heads, c.head_dim, c.rot_dim)
                ops.kv_write(k_in, v, meta.slot_mapping, kv.k[i], kv.v[i])
            elif isinstance(step, Attention):
                ops.paged_attention(q_in, kv.k[i], kv.v[i], meta.block_table, meta.seq_lens,
                                    meta.query_start, c.num_heads,
                                    step.scale or c.head_dim ** -0.5, out=attn,
                                    sliding_window=step.window, scratch=ws.attn_scratch,
                                    sinks=lw.sinks)
            elif isinstance(step, Linear):
                weight, bias, inp, act_in = (lw.o, lw.o_bias, attn, o_in) \
                    if step.linear == "o" else (lw.down, None, act, down_in)
                ops.linear(inp, weight, bias, out=x, act_scratch=act_in)
                pending = True
            elif isinstance(step, Norm):
                ops.rms_norm(x, lw.norms[step.norm], c.rms_norm_eps, out=x)
            elif isinstance(step, OutputGate):
                for h in range(c.num_heads):
                    cols = slice(h * c.head_dim, (h + 1) * c.head_dim)
                    ops.sigmoid_mul(gate[:, h], attn[:, cols])
            elif isinstance(step, DeltaNet):
                d, dw = c.delta_net, lw.delta
                ba = ops.linear(normed, dw.ba, out=ws.delta_ba[:t])
                conv = ops.gdn_conv(qkv[:, :d.conv_size], dw.conv, kv.conv_state[i],
                                    meta.state_slots, meta.query_start, meta.seq_lens,
                                    out=ws.conv_out[:t])
                ops.gdn_rule(conv, ba[:, d.v_heads:], ba[:, :d.v_heads], dw.a_neg, dw.dt_bias,
                             kv.delta_state[i], meta.state_slots, meta.query_start,
                             meta.seq_lens, d.k_heads, d.v_heads, out=attn, v_tiled=d.v_tiled)
                ops.gated_rmsnorm(attn, qkv[:, d.conv_size:], dw.norm, c.rms_norm_eps, out=attn)
            elif isinstance(step, Act):
                (ops.silu_mul if step.kind == "silu" else ops.gelu_tanh_mul)(gate_up, out=act)
            else:
                raise AssertionError(f"no per-op reference for {step}")
    if r == 0:
        return ws.logits[:0]
    ops.rms_norm(x, w.final_norm, c.rms_norm_eps, residual=res, out=normed)
    selected = normed[meta.logits_rows]
    return ops.linear(selected, w.lm_head, out=np.empty((r, c.vocab_size), np.float32))


def mixed_steps(block_size: int):
    """Two sequences: A's prompt in two chunks, then decodes of A and B (B's prompt
    rides with A's second chunk); each step's BatchMeta over a scrambled block table."""
    table = np.array([[5, 2, 7, 0], [1, 6, 3, 4]], np.int32)
    ids = np.random.default_rng(4).integers(0, 97, (2, 40)).astype(np.int32)

    def meta(parts):  # parts: (seq, start, stop, samples)
        rows = [np.arange(a, b) for _, a, b, _ in parts]
        pos = np.concatenate(rows).astype(np.int32)
        seqs = [s for s, *_ in parts]
        slots = np.concatenate([table[s, r // block_size] * block_size + r % block_size
                                for s, r in zip(seqs, rows, strict=True)]).astype(np.int32)
        qs = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
        logits = [qs[i + 1] - 1 for i, p in enumerate(parts) if p[3]]
        return BatchMeta(np.concatenate([ids[s, r] for s, r in zip(seqs, rows, strict=True)]),
                         pos, slots, qs, np.array([b for _, _, b, _ in parts], np.int32),
                         table[seqs].copy(), np.array(logits, np.int64),
                         state_slots=np.array(seqs, np.int32)[::-1].copy())  # slots 1, 0

    yield meta([(0, 0, 9, False)])
    yield meta([(0, 9, 20, True), (1, 0, 13, True)])
    for i in range(6):
        yield meta([(0, 20 + i, 21 + i, True), (1, 13 + i, 14 + i, True)])


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_tiny(path, *ARCHS[request.param])
    return path


@pytest.mark.parametrize("dtype, quantization, quantized_head, kv_dtype", [
    ("f32", "none", False, "f32"), ("bf16", "none", False, "bf16"),
    ("f32", "w8a8", False, "bf16"), ("f32", "w4a8-g64", True, "f32"),
    ("f32", "w8a8-asym", True, "bf16"), ("bf16", "w4a8-g128-asym", False, "f32"),
])
def test_bound_forward_is_the_per_op_graph_bit_for_bit(arch_dir, dtype, quantization,
                                                       quantized_head, kv_dtype):
    scheme = quantization if quantization == "none" else parse_scheme(quantization)
    lm = load_model(arch_dir, dtype, quantization=scheme, quantize_lm_head=quantized_head)
    assert lm.model.weights.lm_head.quantized == quantized_head
    model, bs = lm.model, 8
    kv_bound, kv_ref = (KVCache(lm.config, 8, bs, kv_dtype, state_slots=2) for _ in range(2))
    ws_bound, ws_ref = (Workspace(lm.config, 32, 2, model.formats, max_seq_len=40)
                        for _ in range(2))
    for meta in mixed_steps(bs):
        got = model.forward(meta, kv_bound, ws_bound)
        want = per_op_forward(model, meta, kv_ref, ws_ref)
        np.testing.assert_array_equal(got, want)
    for a, b in zip([*kv_bound.k, *kv_bound.v, *kv_bound.conv_state, *kv_bound.delta_state],
                    [*kv_ref.k, *kv_ref.v, *kv_ref.conv_state, *kv_ref.delta_state], strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_batch_metadata_is_refused(tmp_path):
    make_tiny(tmp_path, *ARCHS["llama"])
    lm = load_model(tmp_path, "f32")
    kv, ws = KVCache(lm.config, 8, 8, "f32"), Workspace(lm.config, 32, 2)
    good = next(mixed_steps(8))

    def run(**change):
        meta = BatchMeta(**{**vars(good), **change})
        return lm.model.forward(meta, kv, ws)

    positions = good.positions.copy()
    positions[3] = 256  # max_position_embeddings of the tiny config
    with pytest.raises(ValueError, match=r"positions\[3\] = 256 is outside the cos/sin cache "
                                         r"\[0, 256\)"):
        run(positions=positions)
    slots = good.slot_mapping.copy()
    slots[2] = 64
    with pytest.raises(ValueError, match=r"slot_mapping\[2\] = 64 is outside the cache "
                                         r"\[-1, 64\)"):
        run(slot_mapping=slots)
    with pytest.raises(ValueError, match=r"query_start\[-1\] = 9, but the batch has 8 rows"):
        run(input_ids=good.input_ids[:8], positions=good.positions[:8],
            slot_mapping=good.slot_mapping[:8])
    with pytest.raises(ValueError, match="sequence 0: inconsistent attention metadata"):
        run(seq_lens=np.array([3], np.int32))   # 9 query rows in a 3-token sequence
