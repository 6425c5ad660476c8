"""GGUF files in the tensor-type mixes llama.cpp's quantizer writes (Q4_K_M,
Q5_K_M, Q6_K, Q3_K_M, Q2_K, IQ4_XS, and the Q5_0/Q8_0 fallbacks of rows not a
multiple of 256) run as stored: the logits stay within int8 activation rounding
of the same file dequantized to f32 (quantization "none"), the plan's formats
(metadata alone) equal what loading gives, and the load reports the types."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.model.decoder import BatchMeta, DecoderModel, KVCache, Workspace
from armllm.model.gguf import GGUFFile
from armllm.model.loader import gguf_model_config
from armllm.model.sources import GGUFSource
from armllm.model.weights import linear_formats, load_weights
from tests.tiny_model import write_tiny_gguf

pytest.importorskip("gguf")

LAYER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def mix(default: str, embed: str, **per_tensor: str) -> dict[str, str]:
    """ggml types of a 2-layer model's tensors: `default` unless named."""
    types = {f"blk.{i}.{t}.weight": per_tensor.get(t, default) for i in range(2) for t in LAYER}
    types["token_embd.weight"] = embed
    return types


# (types, hidden, intermediate): K-quants need rows that are multiples of 256
MIXES = {
    "Q4_K_M": (mix("Q4_K", "Q6_K", attn_v="Q6_K", ffn_down="Q6_K"), 256, 512),
    "Q5_K_M": (mix("Q5_K", "Q6_K", attn_v="Q6_K", ffn_down="Q6_K"), 256, 512),
    "Q6_K": (mix("Q6_K", "Q6_K"), 256, 512),
    "Q3_K_M": (mix("Q3_K", "Q6_K", attn_v="Q5_K", attn_output="Q4_K", ffn_down="Q4_K"), 256,
               512),
    "Q2_K": (mix("Q2_K", "Q4_K", attn_v="Q3_K", ffn_down="Q3_K"), 256, 512),
    "IQ4_XS": (mix("IQ4_XS", "IQ4_XS", attn_v="IQ4_NL", ffn_down="Q5_1"), 256, 512),
    # SmolLM2's Q4_K_M: its 576-wide rows fall back to Q5_0 (Q8_0 where Q6_K was asked)
    "Q4_K_M-narrow": (mix("Q5_0", "Q8_0", attn_v="Q8_0", ffn_down="Q6_K"), 96, 256),
    # MXFP4 (what gpt-oss keeps its experts in) beside Q8_0, the gguf package's quantizer
    "MXFP4": (mix("Q8_0", "Q8_0", ffn_gate="MXFP4", ffn_up="MXFP4", ffn_down="MXFP4"), 96,
              256),
}


def prompt_logits(model: DecoderModel, ids: np.ndarray) -> np.ndarray:
    """Log-probabilities of every position of one sequence: its prompt in one chunk."""
    c, t, bs = model.config, len(ids), 8
    kv = KVCache(c, -(-t // bs), bs, "f32")
    ws = Workspace(c, t, t, model.formats, max_seq_len=t)
    table = np.arange(-(-t // bs), dtype=np.int32).reshape(1, -1)
    meta = BatchMeta(ids.astype(np.int32), np.arange(t, dtype=np.int32),
                     np.arange(t, dtype=np.int32), np.array([0, t], np.int32),
                     np.array([t], np.int32), table, np.arange(t, dtype=np.int64))
    logits = model.forward(meta, kv, ws).astype(np.float64)
    shifted = logits - logits.max(1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(1, keepdims=True))


@pytest.fixture(scope="module", params=list(MIXES))
def mixed_file(request, tmp_path_factory):
    types, hidden, inter = MIXES[request.param]
    path = write_tiny_gguf(tmp_path_factory.mktemp("kq") / f"{request.param}.gguf", types,
                           hidden=hidden, inter=inter, seed=len(request.param))
    return request.param, types, path


def test_mixes_run_as_stored_close_to_their_dequantization(mixed_file):
    name, types, path = mixed_file
    g = GGUFFile(path)
    c = gguf_model_config(g)
    stored = load_weights(GGUFSource(g, c), c, "f32")
    floats = load_weights(GGUFSource(g, c), c, "f32", quantization="none")
    # every quantized type runs as stored, the embedding table too
    quantized = {t for t in types.values()}
    assert stored.formats is not None and stored.formats.embed_gguf == types["token_embd.weight"]
    assert stored.formats == linear_formats(GGUFSource(g, c), c)
    for t in quantized - {"Q8_0"}:
        assert f"{t} (GGUF, as stored)" in stored.quantization
    ids = np.random.default_rng(5).integers(0, c.vocab_size, 24)
    a = prompt_logits(DecoderModel(c, stored), ids)
    b = prompt_logits(DecoderModel(c, floats), ids)
    # int8 activations, one scale per 32 columns: the centered log-probabilities differ by
    # 0.9-1.8% (measured over the mixes; a wrong weight or part order gives ~100%)
    ac, bc = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    assert np.linalg.norm(ac - bc) < 0.05 * np.linalg.norm(bc)
    assert np.mean(a.argmax(1) == b.argmax(1)) >= 0.9


def test_type_summary_and_unknown_types(tmp_path):
    types, hidden, inter = MIXES["Q4_K_M"]
    g = GGUFFile(write_tiny_gguf(tmp_path / "m.gguf", types, hidden=hidden, inter=inter))
    # 2 layers x (5 Q4_K + 2 Q6_K) + token_embd; the norms are F32
    assert g.type_summary() == "Q4_K: 10, F32: 5, Q6_K: 5"


def test_embedding_gathers_the_stored_rows(mixed_file):
    """The embedding table stays in its blocks; the gathered rows are its dequantized
    rows bit for bit."""
    _, types, path = mixed_file
    g = GGUFFile(path)
    c = gguf_model_config(g)
    w = load_weights(GGUFSource(g, c), c, "f32")
    from armllm import ops
    ids = np.array([0, 5, c.vocab_size - 1, 5], np.int32)
    got = ops.embedding(ids, w.embed)
    want = g.dequantize("token_embd.weight")[ids]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert w.embed.nbytes == g.tensors["token_embd.weight"].nbytes


def test_bound_layers_are_the_per_op_graph_bit_for_bit(tmp_path):
    """GGUF-block weights through the one-call layers (ops.decoder_layer) and through
    ops.linear / ops.rms_norm_linear give the same bits, prompt chunks and decodes."""
    from tests.model.test_bound_layers import mixed_steps, per_op_forward
    types, hidden, inter = MIXES["Q4_K_M"]
    g = GGUFFile(write_tiny_gguf(tmp_path / "m.gguf", types, hidden=hidden, inter=inter))
    c = gguf_model_config(g)
    model, bs = DecoderModel(c, load_weights(GGUFSource(g, c), c, "f32")), 8
    kv_bound, kv_ref = (KVCache(c, 8, bs, "f32") for _ in range(2))
    ws_bound, ws_ref = (Workspace(c, 32, 2, model.formats, max_seq_len=40) for _ in range(2))
    for meta in mixed_steps(bs):
        np.testing.assert_array_equal(model.forward(meta, kv_bound, ws_bound),
                                      per_op_forward(model, meta, kv_ref, ws_ref))
    np.testing.assert_array_equal(kv_bound.k, kv_ref.k)
