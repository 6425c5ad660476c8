"""Paged KV write and varlen paged attention: every variant against ref, ref
against softmax attention computed densely in float64 from the same K/V.

Tolerance: 2e-6 * max|V| per output element (f32 math over contexts of a
few hundred keys); bf16 caches are compared with the bf16-rounded K/V they
hold, and int8 caches with the K/V = row * scale they hold (quantized here
by numpy, and kv_write checked against it to the bit) and the q quantized
alike, within I8_TOL (their weights meet V as int16s); variants that declare
attention_bf16_compute "bf16" (they round q, and with BFMMLA the softmax
weights, to bf16 for the dot products) get 2^-5 * max|V| with a bf16 cache.
Split-KV (scratch given, several threads) must equal the unsplit run to the
bit. Bidirectional attention (causal=False: Whisper's encoder self-attention
and cross-attention) is held to the same bounds, with block sizes up to one
block per sequence (1500).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import examples

TOL = 2e-6
BF16_COMPUTE_TOL = 2.0 ** -5  # variants that round q (and maybe the softmax weights) to bf16
# int8 caches: attention of the int8-quantized q (as the cache's rows), whose softmax
# weights meet V as int16s of a partition's largest: each weight off by at most 2^-16 of
# the largest, so at most 256 * 2^-16 = 2^-8 of max|V| over a partition (measured
# 1e-5 to 3e-5 on random K/V)
I8_TOL = 2.0 ** -8


KV_DTYPES = ["f32", "bf16", "i8"]


def bf16_up(x):
    """bf16 bits of float32 x >= 0 rounded toward +inf."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return (np.where(bits & 0xFFFF, bits + 0x10000, bits) >> 16).astype(np.uint16)


def quantize_i8(x):
    """int8 rows and their bf16 scales of x [..., head_dim] as the int8 cache holds them:
    scale = max|x| / 127 rounded up to bf16, row = x / scale (times its float32
    reciprocal) rounded to nearest even."""
    x = np.asarray(x, np.float32)
    scale = bf16_up(np.abs(x).max(-1) / np.float32(127))
    s = (scale.astype(np.uint32) << 16).view(np.float32)
    inv = np.divide(np.float32(1), s, out=np.zeros_like(s), where=s > 0)
    return np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8), scale


def dequantize_i8(rows, scale):
    return rows.astype(np.float32) * (scale.astype(np.uint32) << 16).view(np.float32)[..., None]


def new_cache(shape, kv):
    """(k, v, k_scale, v_scale) zeroed caches of [n_kv, num_blocks, block_size, head_dim]."""
    dtype = {"f32": np.float32, "bf16": np.uint16, "i8": np.int8}[kv]
    scales = [np.zeros(shape[:3], np.uint16) for _ in range(2)] if kv == "i8" else [None] * 2
    return (np.zeros(shape, dtype), np.zeros(shape, dtype), *scales)


def attend(variant, q, cache, *args, **kw):
    """variant.attention over a new_cache (its scales passed for int8)."""
    k, v, ks, vs = cache
    return variant.attention(q, k, v, *args, k_scale=ks, v_scale=vs, **kw)


def make_case(rng, seqs, n_heads, n_kv, head_dim, block_size, kv):
    """A cache (new_cache) holding random K/V for each sequence's tokens in scrambled
    blocks."""
    blocks_per = [-(-seq_len // block_size) for _, seq_len in seqs]
    num_blocks = sum(blocks_per) + 2
    order = rng.permutation(num_blocks)
    table = np.full((len(seqs), max(blocks_per)), -1, np.int32)
    used = 0
    for b, n in enumerate(blocks_per):
        table[b, :n] = order[used:used + n]
        used += n
    cache = new_cache((n_kv, num_blocks, block_size, head_dim), kv)
    dense = []  # per sequence: (K, V) [seq_len, n_kv, head_dim] as the cache holds them
    for b, (_, seq_len) in enumerate(seqs):
        k = rng.standard_normal((seq_len, n_kv * head_dim)).astype(np.float32)
        v = rng.standard_normal((seq_len, n_kv * head_dim)).astype(np.float32)
        slots = (table[b, np.arange(seq_len) // block_size] * block_size
                 + np.arange(seq_len) % block_size).astype(np.int32)
        ops.kernels("ref").kv_write(k, v, slots, *cache[:2], k_scale=cache[2],
                                    v_scale=cache[3])
        if kv == "bf16":
            k, v = ops.bf16_to_f32(ops.f32_to_bf16(k)), ops.bf16_to_f32(ops.f32_to_bf16(v))
        elif kv == "i8":
            k, v = (dequantize_i8(*quantize_i8(x.reshape(seq_len, n_kv, head_dim)))
                    for x in (k, v))
        dense.append((k.reshape(seq_len, n_kv, head_dim), v.reshape(seq_len, n_kv, head_dim)))
    query_start = np.concatenate([[0], np.cumsum([q for q, _ in seqs])]).astype(np.int32)
    seq_lens = np.array([s for _, s in seqs], np.int32)
    q = rng.standard_normal((query_start[-1], n_heads * head_dim)).astype(np.float32)
    return q, cache, table, seq_lens, query_start, dense


def exact_attention(q, dense, seqs, n_heads, head_dim, scale, window, sinks=None, causal=True):
    """Softmax attention in float64; sinks: each head's logit in the denominator;
    causal False: every row sees all of its sequence's keys."""
    out = np.zeros((q.shape[0], n_heads * head_dim))
    group = n_heads // dense[0][0].shape[1]
    row = 0
    for (q_len, seq_len), (k, v) in zip(seqs, dense, strict=True):
        pos = seq_len - q_len + np.arange(q_len)[:, None]  # [q_len, 1]
        keys = np.arange(seq_len)[None, :]
        lo = np.maximum(0, pos - window + 1) if window else 0
        visible = (keys <= pos) & (keys >= lo) if causal else np.ones((q_len, seq_len), bool)
        for h in range(n_heads):
            qh = q[row:row + q_len, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            kh, vh = k[:, h // group].astype(np.float64), v[:, h // group].astype(np.float64)
            s = np.where(visible, qh @ kh.T * scale, -np.inf)
            m = s.max(axis=1, keepdims=True)
            if sinks is not None:   # as transformers' GPT-OSS: the max over scores and sink
                m = np.maximum(m, float(sinks[h]))
            p = np.exp(s - m)
            denom = p.sum(axis=1, keepdims=True)
            if sinks is not None:
                denom += np.exp(float(sinks[h]) - m)
            out[row:row + q_len, h * head_dim:(h + 1) * head_dim] = p @ vh / denom
        row += q_len
    return out


seq_lists = st.lists(st.tuples(st.integers(1, 9), st.integers(0, 300)), min_size=1, max_size=4)


# (n_heads, n_kv_heads, head_dim): GQA 1/3/4/12/16 (more query heads than a
# tile holds), head dims that are and are not multiples of 16 and 32 (80, 36,
# an odd 17), SmolLM2's 9/3 x 64 and Llama-8B's 4:1 x 128
ATTN_DIMS = [(2, 2, 8), (6, 2, 64), (3, 1, 80), (4, 4, 36), (9, 3, 64), (8, 2, 128),
             (12, 1, 17), (16, 1, 32)]


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=seq_lists, dims=st.sampled_from(ATTN_DIMS),
       block_size=st.sampled_from([1, 5, 16, 32]), kv=st.sampled_from(KV_DTYPES),
       window=st.sampled_from([0, 7, 100]), sinks=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_attention_matches_exact(variant, pool, raw, dims, block_size, kv, window, sinks,
                                 seed):
    seqs = [(q_len, q_len + ctx) for q_len, ctx in raw]  # prefill chunks after ctx cached tokens
    n_heads, n_kv, head_dim = dims
    rng = np.random.default_rng(seed)
    q, cache, table, lens, qs, dense = make_case(rng, seqs, n_heads, n_kv, head_dim,
                                                  block_size, kv)
    scale = head_dim ** -0.5
    # sink logits around the scores' range, so that they move the weights
    sink = (rng.standard_normal(n_heads) * 2).astype(np.float32) if sinks else None
    out = np.full((q.shape[0], n_heads * head_dim + 2), 9.0, np.float32)
    attend(variant, q, cache, table, lens, qs, n_heads, scale, out[:, :n_heads * head_dim],
                      window, None, pool, sink)
    check_against_exact(variant, out[:, :n_heads * head_dim], q, dense, seqs, dims, kv,
                        window, sink)
    assert np.all(out[:, -2:] == 9.0)


def reference_q_and_tol(variant, q, kv, n_heads, head_dim):
    """The q whose float64 attention the variant's output is held to with this cache,
    and the bound (times max|V|)."""
    if kv == "i8":
        rows = q.reshape(q.shape[0], n_heads, head_dim)
        return dequantize_i8(*quantize_i8(rows)).reshape(q.shape), I8_TOL
    if kv == "bf16" and variant.isa in Q_ONLY_BF16:
        return ops.bf16_to_f32(ops.f32_to_bf16(q)), TOL
    if kv == "bf16" and variant.attention_bf16_compute == "bf16":
        return q, BF16_COMPUTE_TOL
    return q, TOL


def check_against_exact(variant, out, q, dense, seqs, dims, kv, window=0, sinks=None,
                        causal=True):
    """out within the module's bound of float64 attention (reference_q_and_tol)."""
    n_heads, _, hd = dims
    q_ref, tol = reference_q_and_tol(variant, q, kv, n_heads, hd)
    want = exact_attention(q_ref, dense, seqs, n_heads, hd, hd ** -0.5, window, sinks, causal)
    vmax = max(np.abs(v).max() for _, v in dense)
    assert np.max(np.abs(out - want)) <= tol * vmax


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 300)), min_size=1, max_size=4),
       dims=st.sampled_from(ATTN_DIMS), block_size=st.sampled_from([1, 5, 16, 32, 300]),
       kv=st.sampled_from(KV_DTYPES), sinks=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_bidirectional_attention_matches_exact(variant, pool, raw, dims, block_size, kv,
                                               sinks, seed):
    """causal=False: each row over all seq_len keys of its sequence, q_len above or below
    seq_len (cross-attention rows need no position among the keys)."""
    rng = np.random.default_rng(seed)
    q, cache, table, lens, qs, dense = make_case(rng, raw, *dims, block_size, kv)
    sink = (rng.standard_normal(dims[0]) * 2).astype(np.float32) if sinks else None
    out = np.empty((q.shape[0], dims[0] * dims[2]), np.float32)
    attend(variant, q, cache, table, lens, qs, dims[0], dims[2] ** -0.5, out, 0, None, pool,
                      sink, causal=False)
    check_against_exact(variant, out, q, dense, raw, dims, kv, 0, sink, causal=False)


# Whisper-tiny's attention (6 heads of 64; GQA 8:2 as a variant): the encoder's
# self-attention (600 rows over their 600 keys: several 256-key partitions, as the 1500
# frames of a window, at a sixth of the cost, which the Arm runs under emulation need)
# and cross-attention (a decode, a prompt and a few rows over each request's 1500 encoder
# keys, of different lengths), with the keys in 16-token blocks or one 1500-token block
# per sequence ([heads, slots, 1500, 64])
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("block_size", [16, 1500])
@pytest.mark.parametrize(("dims", "seqs"), [
    ((6, 6, 64), [(600, 600)]),
    ((6, 6, 64), [(1, 1500), (4, 1500), (9, 1500)]),
    ((8, 2, 64), [(1, 1500), (4, 1000), (9, 7)]),
])
def test_whisper_encoder_and_cross_attention(variant, pools, kv, block_size, dims, seqs):
    rng = np.random.default_rng(12)
    q, cache, table, lens, qs, dense = make_case(rng, seqs, *dims, block_size, kv)
    if block_size == 1500:
        assert table.shape[1] == 1  # one block per sequence
    rows = int(qs[-1])
    scratch = np.empty(ops.attn_scratch_len(rows, dims[0], dims[2], 1500), np.float32)
    out = np.empty((rows, dims[0] * dims[2]), np.float32)
    args = (q, cache, table, lens, qs, dims[0], dims[2] ** -0.5)
    attend(variant, *args, out, 0, scratch, pools[4], causal=False)
    check_against_exact(variant, out, q, dense, seqs, dims, kv, causal=False)
    if rows < 100:  # split-KV or not, any thread count: the same bits
        for pool, sc in ((None, None), (pools[2], scratch), (pools[3], None)):
            again = np.empty_like(out)
            attend(variant, *args, again, 0, sc, pool, causal=False)
            assert np.array_equal(again, out)


def test_causal_is_the_default(variant, pool):
    seqs, dims = [(5, 40), (1, 300), (70, 70)], (9, 3, 64)
    q, cache, table, lens, qs, _ = make_case(np.random.default_rng(2), seqs, *dims, 16, "f32")
    outs = [np.empty((int(qs[-1]), 9 * 64), np.float32) for _ in range(3)]
    for out, causal in zip(outs, (None, True, False), strict=True):
        kw = {} if causal is None else {"causal": causal}
        attend(variant, q, cache, table, lens, qs, 9, 0.125, out, 0, None, pool, **kw)
    assert np.array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0][:5], outs[2][:5])  # the prefill rows see their future


# variants whose "bf16" attention rounds only q (the softmax weights and PV stay f32):
# rounding the weights too moved tests/model's quantize-at-load logprobs past their bound
Q_ONLY_BF16 = {"avx512", "amx"}


@settings(max_examples=examples(15), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=seq_lists, dims=st.sampled_from(ATTN_DIMS),
       block_size=st.sampled_from([1, 16]), window=st.sampled_from([0, 7]),
       seed=st.integers(0, 2**32 - 1))
def test_bf16_compute_rounds_only_q(variant, pool, raw, dims, block_size, window, seed):
    """With a bf16 cache, such a variant is f32-exact attention of the bf16-rounded q."""
    if variant.isa not in Q_ONLY_BF16:
        pytest.skip(f"{variant.isa} does not round only q")
    assert variant.attention_bf16_compute == "bf16"
    seqs = [(q_len, q_len + ctx) for q_len, ctx in raw]
    n_heads, n_kv, head_dim = dims
    rng = np.random.default_rng(seed)
    q, cache, table, lens, qs, dense = make_case(rng, seqs, n_heads, n_kv, head_dim,
                                                  block_size, "bf16")
    scale = head_dim ** -0.5
    out = np.empty((q.shape[0], n_heads * head_dim), np.float32)
    attend(variant, q, cache, table, lens, qs, n_heads, scale, out, window, None, pool)
    q_bf16 = ops.bf16_to_f32(ops.f32_to_bf16(q))
    want = exact_attention(q_bf16, dense, seqs, n_heads, head_dim, scale, window)
    vmax = max(np.abs(v).max() for _, v in dense)
    assert np.max(np.abs(out - want)) <= TOL * vmax


# (n_heads, n_kv_heads, head_dim) x chunks long enough for several 16-query blocks per tile
# and several 16-key blocks per partition, over cached context (prefill after a prefix),
# with block sizes that keep 16 keys in one block (in place) or not (copied)
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize(("dims", "chunks", "window"), [
    ((9, 3, 64), [(150, 170), (70, 70), (1, 40)], 0),  # SmolLM2's heads: 63-query tiles
    ((8, 2, 128), [(40, 300)], 100),  # 4:1 GQA, a window inside partitions
    ((16, 1, 32), [(33, 0), (5, 260)], 0),  # 16 heads a row: whole query blocks
    ((4, 4, 96), [(70, 200)], 0),  # MHA, head_dim 96 (three 32-dim steps)
])
def test_long_prefill_chunks_match_exact(variant, pool, kv, block_size, dims, chunks, window):
    seqs = [(q_len, q_len + ctx) for q_len, ctx in chunks]  # chunks after ctx cached tokens
    n_heads, n_kv, hd = dims
    rng = np.random.default_rng(11)
    q, cache, table, lens, qs, dense = make_case(rng, seqs, n_heads, n_kv, hd, block_size, kv)
    out = np.empty((q.shape[0], n_heads * hd), np.float32)
    attend(variant, q, cache, table, lens, qs, n_heads, hd ** -0.5, out, window, None, pool)
    check_against_exact(variant, out, q, dense, seqs, dims, kv, window)


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize(("dims", "seqs", "window"), [
    ((4, 2, 64), [(1, 1000), (1, 777)], 0),  # two decodes: few rows x heads, many partitions
    ((8, 2, 128), [(1, 900)], 0),  # one decode of a 4:1 GQA group
    ((9, 3, 80), [(3, 700), (1, 300)], 300),  # a prefill chunk and a decode, sliding window
    ((2, 1, 17), [(1, 600)], 0),  # an odd head_dim
])
def test_split_kv_is_bit_identical_for_any_thread_count(variant, pools, kv, dims, seqs,
                                                         window):
    n_heads, n_kv, hd = dims
    rng = np.random.default_rng(3)
    q, cache, table, lens, qs, _ = make_case(rng, seqs, n_heads, n_kv, hd, 16, kv)
    rows, max_len = int(qs[-1]), max(s for _, s in seqs)
    scratch = np.empty(ops.attn_scratch_len(rows, n_heads, hd, max_len), np.float32)
    # GPT-OSS's layout: sinks with the sliding window (the denominator after the merge)
    sinks = rng.standard_normal(n_heads).astype(np.float32) if window else None
    outs = []
    for pool in [None, *pools.values()]:
        for use_scratch in (False, True):
            out = np.empty((rows, n_heads * hd), np.float32)
            attend(variant, q, cache, table, lens, qs, n_heads, hd ** -0.5, out, window,
                              scratch if use_scratch else None, pool, sinks)
            outs.append(out)
    for out in outs[1:]:
        assert np.array_equal(out, outs[0])


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_sinks_out_of_exp_range(variant, pool, kv):
    """A sink far above every score takes all the weight (the row is 0, no NaN); one far
    below takes none (the row is attention without it)."""
    seqs, (n_heads, n_kv, hd) = [(3, 40), (1, 300)], (4, 2, 64)
    q, cache, table, lens, qs, dense = make_case(np.random.default_rng(8), seqs, n_heads,
                                                  n_kv, hd, 16, kv)
    plain, out = (np.empty((int(qs[-1]), n_heads * hd), np.float32) for _ in range(2))
    attend(variant, q, cache, table, lens, qs, n_heads, hd ** -0.5, plain, 0, None, pool)
    sinks = np.array([200.0, -200.0, 1e30, -1e30], np.float32)
    attend(variant, q, cache, table, lens, qs, n_heads, hd ** -0.5, out, 0, None, pool, sinks)
    for h, gone in enumerate((True, False, True, False)):
        cols = slice(h * hd, (h + 1) * hd)
        assert np.array_equal(out[:, cols], np.zeros_like(out[:, cols]) if gone
                              else plain[:, cols])


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("dims", [(9, 3, 64), (8, 2, 128), (12, 1, 17)])
@pytest.mark.parametrize("seqs", [[(5, 40), (1, 300), (3, 3), (1, 17)],
                                  [(70, 100), (1, 300), (33, 33), (2, 500)]])
def test_rows_do_not_depend_on_their_batch(variant, pool, kv, dims, seqs):
    """Each sequence attended alone gives the bits it gets in a mixed batch (kernels tile
    rows and query heads together; a query's result must not depend on its tile-mates)."""
    n_heads, n_kv, hd = dims
    rng = np.random.default_rng(5)
    q, cache, table, lens, qs, _ = make_case(rng, seqs, n_heads, n_kv, hd, 16, kv)
    together = np.empty((int(qs[-1]), n_heads * hd), np.float32)
    attend(variant, q, cache, table, lens, qs, n_heads, hd ** -0.5, together, 7, None, pool)
    for b, (q_len, _) in enumerate(seqs):
        rows = slice(int(qs[b]), int(qs[b + 1]))
        alone = np.empty((q_len, n_heads * hd), np.float32)
        attend(variant, q[rows].copy(), cache, table[b:b + 1].copy(), lens[b:b + 1].copy(),
                          np.array([0, q_len], np.int32), n_heads, hd ** -0.5, alone, 7, None,
                          pool)
        assert np.array_equal(alone, together[rows])


def test_kv_write_then_attention_is_dense_causal_attention(variant):
    """A whole prompt written through kv_write, then attended: standard causal attention."""
    rng = np.random.default_rng(4)
    t, n_heads, n_kv, hd, bs = 23, 4, 2, 16, 4
    k_cache = np.zeros((n_kv, 8, bs, hd), np.float32)
    v_cache = np.zeros_like(k_cache)
    table = np.array([[5, 0, 7, 2, 3, 1]], np.int32)
    slots = (table[0, np.arange(t) // bs] * bs + np.arange(t) % bs).astype(np.int32)
    k = rng.standard_normal((t, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((t, n_kv * hd)).astype(np.float32)
    q = rng.standard_normal((t, n_heads * hd)).astype(np.float32)
    variant.kv_write(k, v, slots, k_cache, v_cache)
    out = np.empty((t, n_heads * hd), np.float32)
    variant.attention(q, k_cache, v_cache, table, np.array([t], np.int32),
                      np.array([0, t], np.int32), n_heads, hd ** -0.5, out)
    qh = q.reshape(t, n_heads, hd).transpose(1, 0, 2).astype(np.float64)
    kh = np.repeat(k.reshape(t, n_kv, hd).transpose(1, 0, 2), n_heads // n_kv, axis=0)
    vh = np.repeat(v.reshape(t, n_kv, hd).transpose(1, 0, 2), n_heads // n_kv, axis=0)
    s = qh @ kh.transpose(0, 2, 1) * hd ** -0.5 + np.triu(np.full((t, t), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vh
    np.testing.assert_allclose(out, want.transpose(1, 0, 2).reshape(t, -1), atol=1e-5)


def test_kv_write_bf16_rounds_to_nearest_even(variant):
    k = np.array([[1.0, 1.00390625, 1.01171875, -2.5e-8]], np.float32)  # ties and tiny
    k_cache = np.zeros((1, 1, 2, 4), np.uint16)
    v_cache = np.zeros_like(k_cache)
    variant.kv_write(k, k, np.array([1], np.int32), k_cache, v_cache)
    assert np.array_equal(k_cache[0, 0, 1], ops.f32_to_bf16(k[0]))
    assert np.all(k_cache[0, 0, 0] == 0)


def test_kv_write_int8_is_the_numpy_quantizer(variant):
    """int8 rows and bf16 scales to the bit of quantize_i8: rows of every magnitude, a
    zero row, one value far above the rest, and scales that round up (row 1's 127 / 127)."""
    rng = np.random.default_rng(9)
    n_kv, hd, bs, t = 3, 40, 4, 9
    x = rng.standard_normal((2, t, n_kv * hd)).astype(np.float32)
    x *= np.float32(10.0) ** rng.integers(-6, 6, (2, t, 1)).astype(np.float32)
    x[:, 2] = 0.0
    x[0, 1, :hd] = np.linspace(-127, 127, hd)
    x[1, 3, 5] = 3e4
    cache = new_cache((n_kv, 4, bs, hd), "i8")
    slots = np.array([13, 0, 5, -1, 2, 7, 11, 1, 8], np.int32)
    variant.kv_write(x[0], x[1], slots, *cache[:2], k_scale=cache[2], v_scale=cache[3])
    for src, rows, scales in ((x[0], cache[0], cache[2]), (x[1], cache[1], cache[3])):
        want_rows, want_scales = quantize_i8(src.reshape(t, n_kv, hd))
        for i, slot in enumerate(slots):
            if slot < 0:
                continue
            assert np.array_equal(rows[:, slot // bs, slot % bs], want_rows[i])
            assert np.array_equal(scales[:, slot // bs, slot % bs], want_scales[i])
        assert np.all(rows[:, 0, 3] == 0) and np.all(scales[:, 0, 3] == 0)  # unwritten
    assert np.all(cache[0][:, 1, 1] == 0) and np.all(cache[2][:, 1, 1] == 0)  # x[0, 2] = 0


def test_int8_cache_scale_errors(variant):
    k, v, ks, vs = new_cache((2, 4, 4, 8), "i8")
    rows = np.zeros((1, 16), np.float32)
    slot = np.array([0], np.int32)
    with pytest.raises(ValueError, match="an int8 KV cache needs k_scale and v_scale"):
        variant.kv_write(rows, rows, slot, k, v)
    with pytest.raises(ValueError, match=r"k_scale must be a uint16 \(bf16 bits\) array of "
                                         r"shape \(2, 4, 4\)"):
        variant.kv_write(rows, rows, slot, k, v, k_scale=ks[:, :, :2], v_scale=vs)
    with pytest.raises(ValueError, match="v_scale must be a uint16"):
        variant.kv_write(rows, rows, slot, k, v, k_scale=ks, v_scale=vs.astype(np.float32))
    f32 = new_cache((2, 4, 4, 8), "f32")
    with pytest.raises(ValueError, match="k_scale and v_scale belong to int8 caches"):
        variant.kv_write(rows, rows, slot, *f32[:2], k_scale=ks, v_scale=vs)
    q, out = np.zeros((1, 32), np.float32), np.empty((1, 32), np.float32)
    meta = (np.array([[0]], np.int32), np.array([1], np.int32), np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match="an int8 KV cache needs k_scale and v_scale"):
        variant.attention(q, k, v, *meta, 4, 0.3, out, k_scale=ks)
    attend(variant, q, (k, v, ks, vs), *meta, 4, 0.3, out)


def test_attention_and_kv_write_errors(variant):
    kc = np.zeros((2, 4, 4, 8), np.float32)
    vc = np.zeros_like(kc)
    q = np.zeros((3, 32), np.float32)
    out = np.empty((3, 32), np.float32)
    table = np.array([[0, 1]], np.int32)
    args = (np.array([5], np.int32), np.array([0, 3], np.int32))
    variant.attention(q, kc, vc, table, *args, 4, 0.3, out)
    with pytest.raises(ValueError, match="sequence 0: inconsistent attention metadata"):
        variant.attention(q, kc, vc, np.array([[0, 9]], np.int32), *args, 4, 0.3, out)
    with pytest.raises(ValueError, match="sequence 0: inconsistent"):  # 3 queries, 2 tokens
        variant.attention(q, kc, vc, table, np.array([2], np.int32), args[1], 4, 0.3, out)
    with pytest.raises(ValueError, match="n_heads must be a positive multiple of n_kv_heads=2"):
        variant.attention(q, kc, vc, table, *args, 3, 0.3, out)
    with pytest.raises(ValueError, match=r"q and out must have query_start\[-1\] = 3 rows"):
        variant.attention(q[:2], kc, vc, table, *args, 4, 0.3, out[:2])
    with pytest.raises(ValueError, match="k_cache and v_cache must match"):
        variant.attention(q, kc, np.zeros((2, 3, 4, 8), np.float32), table, *args, 4, 0.3, out)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 16 is outside the cache"):
        variant.kv_write(np.zeros((2, 16), np.float32), np.zeros((2, 16), np.float32),
                         np.array([0, 16], np.int32), kc, vc)
    with pytest.raises(ValueError, match="k_cache must be 4-D"):
        variant.kv_write(np.zeros((2, 16), np.float32), np.zeros((2, 16), np.float32),
                         np.array([0, 1], np.int32), kc[0], vc[0])
