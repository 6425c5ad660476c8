"""The Workspace: every buffer a forward writes is allocated when it is built,
for float and quantized weights alike (one int8-activation scratch per distinct
input), `Workspace.nbytes` is exactly what it allocates, `linear_formats`
predicts from a checkpoint's metadata what loading it gives, and no forward
allocates: not the first one, not a steady-state decode step."""
from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from armllm.model.arch import load_hf_config
from armllm.model.decoder import BatchMeta, KVCache, Workspace
from armllm.model.gguf import GGUFFile
from armllm.model.loader import gguf_model_config, load_model
from armllm.model.quantize import parse_scheme
from armllm.model.sources import GGUFSource, HFSource
from armllm.model.weights import (
    LinearFormats,
    QuantFormat,
    linear_formats,
    load_weights,
)
from tests.tiny_model import write_tiny_gguf, write_tiny_llama

W4G32, W8G32, W8CH = QuantFormat(4, 32), QuantFormat(8, 32), QuantFormat(8, 0)
W4G32_ASYM = QuantFormat(4, 32, act_symmetric=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-ws"))


def allocated(ws: Workspace) -> int:
    arrays = sum(a.nbytes for a in vars(ws).values() if isinstance(a, np.ndarray))
    return arrays + sum(sc.nbytes for sc in ws.scratches)


def uniform(config, fmt: QuantFormat | None, head: QuantFormat | None = None) -> LinearFormats:
    return LinearFormats(((fmt,) * 4,) * config.num_layers, head)


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("formats", [
    "float", "w8a8", "w4a8-g128-asym",
    "mixed",   # float qkv, asymmetric o, channelwise gate/up, group-32 down; quantized head
])
def test_nbytes_is_what_the_workspace_allocates(tiny, formats, qk_norm):
    c = dataclasses.replace(load_hf_config(tiny), qk_norm=qk_norm)
    if formats == "float":
        fmts = None
    elif formats == "mixed":
        fmts = LinearFormats(((None, W4G32_ASYM, W8CH, W4G32),
                              (W8G32, None, QuantFormat(4, 128), None)), W8G32)
    else:
        s = parse_scheme(formats)
        fmts = uniform(c, QuantFormat(s.bits, s.group, s.act_symmetric))
    ws = Workspace(c, 100, 7, fmts, max_seq_len=300)
    assert Workspace.nbytes(c, 100, 7, fmts, max_seq_len=300) == allocated(ws)
    assert (ws.q_normed is not None) == qk_norm
    if fmts is None:
        assert ws.scratches == [] and ws.head_scratch is None
    # every quantized weight has a scratch for max_tokens rows of its K (the head:
    # max_logits rows), every float one none
    shapes = [(c.q_size + 2 * c.kv_size, c.hidden_size), (c.hidden_size, c.q_size),
              (2 * c.intermediate_size, c.hidden_size), (c.hidden_size, c.intermediate_size)]
    for layer, scratches in zip(fmts.layers if fmts else [(None,) * 4] * c.num_layers,
                                ws.layer_scratch, strict=True):
        for fmt, sc, (n, k) in zip(layer, scratches, shapes, strict=True):
            assert (sc is None) == (fmt is None)
            if fmt is not None:
                assert sc.rows == 100 and sc.fits(100, k, fmt.group, True,
                                                  0 if fmt.act_symmetric else n)


def test_inputs_of_one_k_and_group_length_share_a_scratch(tiny):
    """qkv, gate_up and (hidden = q_size here) o read K = hidden: one scratch for all
    layers, sized for the widest asymmetric weight; down (K = intermediate) has its
    own, the head (max_logits rows) its own; channelwise shares with group 128."""
    c = load_hf_config(tiny)
    assert c.hidden_size == c.q_size
    ws = Workspace(c, 64, 4, uniform(c, W4G32_ASYM, W4G32_ASYM))
    assert len(ws.scratches) == 3
    hidden_in, down_in = ws.layer_scratch[0][0], ws.layer_scratch[0][3]
    assert all(s[:3] == (hidden_in,) * 3 and s[3] is down_in for s in ws.layer_scratch)
    assert hidden_in.asym_n == max(c.q_size + 2 * c.kv_size, 2 * c.intermediate_size)
    assert down_in.asym_n == c.hidden_size
    assert ws.head_scratch.rows == 4 and ws.head_scratch.asym_n == c.vocab_size
    mixed = LinearFormats(((W8CH, QuantFormat(4, 128), W4G32, None),) * c.num_layers, None)
    ws = Workspace(c, 64, 4, mixed)
    qkv_in, o_in, gate_up_in, _ = ws.layer_scratch[0]
    assert qkv_in is o_in and gate_up_in is not qkv_in and len(ws.scratches) == 2
    assert qkv_in.asym_n == 0 and qkv_in.zp is None


def test_formats_from_metadata_equal_what_loading_gives(tiny, tmp_path):
    """linear_formats (the plan's view: headers only) against load_weights, for a float
    checkpoint under every choice, a compressed-tensors one and a GGUF of mixed types."""
    from armllm.model.convert import quantize_model
    c = load_hf_config(tiny)
    for quantization in ("auto", "none", "w8a8", "w4a8-g64-asym"):
        for head in (False, True):
            q = parse_scheme(quantization) if quantization not in ("auto", "none") \
                else quantization
            got = load_weights(HFSource(tiny), c, "f32", None, q, head).formats
            assert linear_formats(HFSource(tiny), c, q, head) == got
    assert linear_formats(HFSource(tiny), c, "auto") is None
    assert linear_formats(HFSource(tiny), c, parse_scheme("w4a8-g64-asym"), True) == \
        uniform(c, QuantFormat(4, 64, False), QuantFormat(4, 64, False))
    ct = quantize_model(tiny, tmp_path / "ct", parse_scheme("w8a8-asym"))
    loaded = load_model(ct, "f32")
    assert loaded.model.formats == uniform(c, QuantFormat(8, 0, False))
    assert linear_formats(HFSource(ct, _ct_config(ct)), c) == loaded.model.formats
    # GGUF: Q8_0/Q4_0/Q4_1 run on the int8/int4 GEMM where every part of a fused matrix
    # agrees, on the GGUF-block GEMM (each part as stored) where they differ
    types = {"blk.0.attn_q.weight": "Q8_0", "blk.0.attn_k.weight": "Q8_0",
             "blk.0.attn_v.weight": "Q8_0", "blk.0.attn_output.weight": "Q4_0",
             "blk.0.ffn_gate.weight": "Q4_1", "blk.0.ffn_up.weight": "Q4_0",
             "blk.1.attn_q.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_0",   # mixed
             "blk.1.attn_v.weight": "Q8_0", "blk.1.attn_output.weight": "F16",
             "blk.1.ffn_gate.weight": "Q8_0", "blk.1.ffn_up.weight": "Q8_0",
             "blk.1.ffn_down.weight": "Q4_1", "token_embd.weight": "Q8_0"}
    pytest.importorskip("gguf")
    path = write_tiny_gguf(tmp_path / "mixed.gguf", types)
    g = GGUFFile(path)
    gc = gguf_model_config(g)
    mixed_qkv = QuantFormat(0, 32, gguf=(("Q8_0", gc.q_size), ("Q4_0", gc.kv_size),
                                         ("Q8_0", gc.kv_size)))
    want = LinearFormats(((W8G32, W4G32, W4G32, None), (mixed_qkv, None, W8G32, W4G32)), W8G32,
                         embed_gguf="Q8_0")
    assert linear_formats(GGUFSource(g, gc), gc) == want
    assert load_weights(GGUFSource(g, gc), gc, "f32").formats == want
    assert linear_formats(GGUFSource(g, gc), gc, "none") is None


def _ct_config(path):
    import json

    from armllm.model.compressed_tensors import parse_config
    return parse_config(json.loads((path / "config.json").read_text()), str(path))


def test_forward_refuses_a_workspace_built_for_other_weights(tiny):
    loaded = load_model(tiny, "f32", quantization=parse_scheme("w8a8"))
    model, c = loaded.model, loaded.config
    kv = KVCache(c, 2, 16, "f32")
    meta = _prefill([[5, 6, 7]], 16)
    with pytest.raises(ValueError, match=r"Workspace\(\.\.\., model\.formats\)"):
        model.forward(meta, kv, Workspace(c, 8, 1))
    equal = Workspace(c, 8, 1, uniform(c, W8CH))     # equal formats, another object: fine
    assert model.forward(meta, kv, equal).shape == (1, c.vocab_size)


# -- no allocation in a forward ----------------------------------------------------------

SEQS, PROMPT, DECODES = 32, 4, 4
# Wide enough that one decode step's buffers dwarf the bound: the MLP's gate/up rows
# are SEQS x 2 x INTER x 4 B = 1 MiB, down's int8 input SEQS x INTER = 128 KiB, and
# even the smallest, qkv's int8 input, SEQS x HIDDEN = 16 KiB (+ its scales).
HIDDEN, INTER = 512, 4096
BOUND = 16 << 10   # bytes; a forward's views and call frames take about 5 KiB


def _prefill(prompts: list[list[int]], block_size: int) -> BatchMeta:
    ids, pos, start, seq_lens = [], [], [0], []
    for p in prompts:
        ids += p
        pos += range(len(p))
        start.append(start[-1] + len(p))
        seq_lens.append(len(p))
    blocks = np.arange(len(prompts), dtype=np.int32).reshape(-1, 1)  # one block a sequence
    rows = np.repeat(np.arange(len(prompts)), np.diff(start))
    slots = (blocks[rows, 0] * block_size + np.asarray(pos)).astype(np.int32)
    return BatchMeta(np.asarray(ids, np.int32), np.asarray(pos, np.int32), slots,
                     np.asarray(start, np.int32), np.asarray(seq_lens, np.int32), blocks,
                     np.asarray(start[1:], np.int64) - 1)


def _decode(n: int, length: int, block_size: int) -> BatchMeta:
    """One decode row per sequence, at position length - 1."""
    ids = (np.arange(n, dtype=np.int32) % 100) + 2
    pos = np.full(n, length - 1, np.int32)
    blocks = np.arange(n, dtype=np.int32).reshape(-1, 1)
    return BatchMeta(ids, pos, (blocks[:, 0] * block_size + pos).astype(np.int32),
                     np.arange(n + 1, dtype=np.int32), np.full(n, length, np.int32), blocks,
                     np.arange(n, dtype=np.int64))


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("wide"), hidden=HIDDEN, inter=INTER,
                            heads=8, kv_heads=2)


@pytest.mark.parametrize("quantization", ["none", "w8a8", "w4a8", "w8a8-asym", "w4a8-asym"])
def test_no_forward_allocates(wide, quantization):
    """From the workspace's first use on (a prefill of every sequence, then decode
    steps), forwards allocate nothing sized by the batch: activations, logits and
    the int8 activations with their zero points' correction all live in it."""
    q = parse_scheme(quantization) if quantization != "none" else "none"
    loaded = load_model(wide, "bf16", quantization=q)
    model, c = loaded.model, loaded.config
    assert (model.formats is None) == (quantization == "none")
    block = 16
    kv = KVCache(c, SEQS, block, "bf16")
    # the kernels' first call (the thread pool, lazy tables) happens on another workspace
    model.forward(_prefill([[3, 4]], block), kv, Workspace(c, 2, 1, model.formats))
    ws = Workspace(c, SEQS * PROMPT, SEQS, model.formats, max_seq_len=block)
    rng = np.random.default_rng(0)
    prefill = _prefill([list(map(int, rng.integers(2, 120, PROMPT))) for _ in range(SEQS)],
                       block)
    decodes = [_decode(SEQS, PROMPT + 1 + i, block) for i in range(DECODES)]
    assert ws.gate_up[:SEQS].nbytes >= 16 * BOUND      # a step's activations
    assert SEQS * HIDDEN >= BOUND                       # qkv's int8 input, one call
    tracemalloc.start()
    try:
        model.forward(prefill, kv, ws)
        _, peak_prefill = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for meta in decodes:
            logits = model.forward(meta, kv, ws)
        _, peak_decode = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert logits.shape == (SEQS, c.vocab_size) and np.isfinite(logits).all()
    assert peak_prefill < BOUND, f"the first forward allocated up to {peak_prefill} bytes"
    assert peak_decode < BOUND, f"decode steps allocated up to {peak_decode} bytes"


ENGINE_BOUND = 128 << 10   # bytes; scheduling, sampling and outputs take about 32 KiB


@pytest.mark.parametrize("quantization", ["none", "w8a8", "w4a8-asym"])
def test_steady_state_engine_step_allocates_little(wide, quantization):
    """Whole engine steps (schedule, the runner's batch, forward, sampling) of SEQS
    decoding sequences stay under a bound that one step's activations exceed."""
    from armllm.api import LLM
    from armllm.sampling import SamplingParams
    llm = LLM(wide, dtype="bfloat16", kv_cache_gib=0.05, quantization=quantization,
              max_num_seqs=SEQS)
    engine = llm.engine
    rng = np.random.default_rng(1)
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    for i in range(SEQS):
        engine.add_request(f"r{i}", list(map(int, rng.integers(2, 120, PROMPT))), params)
    for _ in range(3):  # the prefill, then decodes
        engine.step()
    assert SEQS * 2 * INTER * 4 >= 8 * ENGINE_BOUND   # one step's gate/up activations
    tracemalloc.start()
    try:
        for _ in range(DECODES):
            engine.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ENGINE_BOUND, f"decode steps allocated up to {peak} bytes"
