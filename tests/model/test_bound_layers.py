"""The model's forward (one bound Cython call per decoder layer, ops.decoder_layer,
and one for the final norm and lm_head, ops.norm_head) gives exactly the bits of
the same graph written op by op with armllm.ops' per-op wrappers, for every
weight format (f32, bf16, w8/w4 with symmetric and asymmetric activations),
bf16 and f32 KV caches, Qwen3's q/k norms, Qwen2's biases and Mistral's window,
over a step that mixes prompt chunks and decodes of several sequences; bad batch
metadata is refused with the value named."""
from __future__ import annotations

import numpy as np
import pytest

from armllm import ops
from armllm.model.decoder import BatchMeta, KVCache, Workspace
from armllm.model.loader import load_model
from armllm.model.quantize import parse_scheme
from tests.model.test_llama_vs_transformers import make_tiny

pytest.importorskip("transformers")

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3-qk-norm": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 7}),
}


def per_op_forward(model, meta: BatchMeta, kv: KVCache, ws: Workspace) -> np.ndarray:
    """The Llama-family graph op by op (what forward ran before its layers were bound)."""
    c, w = model.config, model.weights
    t, r = len(meta.input_ids), len(meta.logits_rows)
    res, x, normed = ws.residual[:t], ws.hidden[:t], ws.normed[:t]
    qkv, attn = ws.qkv[:t], ws.attn[:t]
    q, k, v = (qkv[:, :c.q_size], qkv[:, c.q_size:c.q_size + c.kv_size],
               qkv[:, c.q_size + c.kv_size:])
    ops.embedding(meta.input_ids, w.embed, out=res)
    for i, (lw, scratch) in enumerate(zip(w.layers, ws.layer_scratch, strict=True)):
        qkv_in, o_in, gate_up_in, down_in = scratch
        ops.rms_norm_linear(res if i == 0 else x, lw.input_norm, c.rms_norm_eps, lw.qkv,
                            lw.qkv_bias, None if i == 0 else res, normed, qkv, qkv_in)
        q_in, k_in = q, k
        if c.qk_norm:
            q_in, k_in = ws.q_normed[:t], ws.k_normed[:t]
            q_in[...], k_in[...] = q, k
            for heads, n, norm in ((q_in, c.num_heads, lw.q_norm),
                                   (k_in, c.num_kv_heads, lw.k_norm)):
                flat = heads.reshape(t * n, c.head_dim)
                ops.rms_norm(flat, norm, c.rms_norm_eps, out=flat)
        ops.rope(q_in, meta.positions, model.cos_sin, c.num_heads, c.head_dim)
        ops.rope(k_in, meta.positions, model.cos_sin, c.num_kv_heads, c.head_dim)
        ops.kv_write(k_in, v, meta.slot_mapping, kv.k[i], kv.v[i])
        ops.paged_attention(q_in, kv.k[i], kv.v[i], meta.block_table, meta.seq_lens,
                            meta.query_start, c.num_heads, model.scale, out=attn,
                            sliding_window=c.sliding_window, scratch=ws.attn_scratch)
        ops.linear(attn, lw.o, out=x, act_scratch=o_in)
        ops.rms_norm_linear(x, lw.post_norm, c.rms_norm_eps, lw.gate_up, residual=res,
                            normed=normed, out=ws.gate_up[:t], act_scratch=gate_up_in)
        ops.silu_mul(ws.gate_up[:t], out=ws.act[:t])
        ops.linear(ws.act[:t], lw.down, out=x, act_scratch=down_in)
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
                         table[seqs].copy(), np.array(logits, np.int64))

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
    kv_bound, kv_ref = (KVCache(lm.config, 8, bs, kv_dtype) for _ in range(2))
    ws_bound, ws_ref = (Workspace(lm.config, 32, 2, model.formats, max_seq_len=40)
                        for _ in range(2))
    for meta in mixed_steps(bs):
        got = model.forward(meta, kv_bound, ws_bound)
        want = per_op_forward(model, meta, kv_ref, ws_ref)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(kv_bound.k + kv_bound.v, kv_ref.k + kv_ref.v)


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
