"""Gated DeltaNet kernels (Qwen3.5 / Qwen3-Next linear attention): gdn_conv,
gdn_rule, gated_rmsnorm and sigmoid_mul. ref against numpy float64 (the rule
once against transformers' torch functions too), every variant against ref.

Tolerances:
- gdn_conv: every variant gives ref's bits (products rounded, summed in tap
  order, the shared exp and an IEEE division); ref is within 1e-6 * sum_j
  |w_j x_j| of float64 (kernel <= 8 float32 roundings, silu's ~4 ulps).
- gdn_rule, ref vs float64 (recurrent rows and 64-row chunks alike): out
  within RULE_TOL = 2e-5 of max|out| and the state within 2e-5 of max|state|.
  Every step is a float32 product or sum of bounded terms (normalized k and
  q, beta and decays in (0, 1]), so the error is a few ulps of the largest
  terms per token, growing slowly with the rows: measured up to 3.4e-7 for
  token-by-token rows and 4.7e-6 for chunks (300 rows, dk = dv = 128, keys
  correlated or not).
- gdn_rule, a variant vs ref: VARIANT_TOL = 5e-6 of the same maxima: the same
  steps in the same order, FMAs where ref rounds twice (measured up to
  5.5e-7); the vector variants also flush subnormals to zero (below 2^-126,
  far below either maximum's tolerance).
- gdn_rule vs transformers' torch float32 functions (they chunk the padded
  sequence, and reduce in their own order): TORCH_TOL = 2e-5 (measured 2.9e-6).
- Splitting a sequence's rows over calls changes which rows run chunked, so
  results differ in roundings only: RULE_TOL of the maxima again. The same
  batch on any thread count, and a sequence alone or in any batch, give the
  same bits.
- gated_rmsnorm: 2e-6 relative + 1e-6 of the row's largest output against
  float64 (the norm's sum in double; x * scale * w * silu(z) in float32);
  every variant within 1e-6 relative of ref (the double sum's order).
- sigmoid_mul: 1e-6 relative against float64; every variant ref's bits.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import examples, rand

fixture_ok = settings(deadline=None, max_examples=examples(12),
                      suppress_health_check=[HealthCheck.function_scoped_fixture])

RULE_TOL = 2e-5
VARIANT_TOL = 5e-6
TORCH_TOL = 2e-5
CHUNK = 64


def silu64(v):
    return v / (1 + np.exp(-v))


def metadata(q_lens, starts):
    """query_start and seq_lens of sequences with q_lens rows after starts tokens."""
    query_start = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return query_start, (np.asarray(starts) + np.asarray(q_lens)).astype(np.int32)


# ---------------------------------------------------------------------- conv


def conv_exact(x, weight, state, state_slots, query_start, seq_lens):
    """(y, state after) in float64: silu(causal depthwise conv) per sequence."""
    x, w, state = x.astype(np.float64), weight.astype(np.float64), state.astype(np.float64)
    kernel = w.shape[1]
    y = np.zeros_like(x)
    for s, slot in enumerate(state_slots):
        r0, r1 = query_start[s], query_start[s + 1]
        if r1 == r0:
            continue
        fresh = seq_lens[s] == r1 - r0
        hist = np.zeros((kernel - 1, x.shape[1])) if fresh else state[slot]
        full = np.concatenate([hist, x[r0:r1]])
        for i in range(r1 - r0):
            y[r0 + i] = np.sum(w.T * full[i:i + kernel], axis=0)
        state[slot] = full[-(kernel - 1):]
    return y, state


def conv_case(rng, channels, kernel, q_lens, starts, spare_slots=2):
    rows = int(sum(q_lens))
    num_slots = len(q_lens) + spare_slots
    query_start, seq_lens = metadata(q_lens, starts)
    return dict(x=rand(rng, (rows, channels)), weight=rand(rng, (channels, kernel)),
                state=rand(rng, (num_slots, kernel - 1, channels)),
                state_slots=rng.permutation(num_slots)[:len(q_lens)].astype(np.int32),
                query_start=query_start, seq_lens=seq_lens)


def run_conv(kern, case, pool=None):
    state = case["state"].copy()
    y = np.full(case["x"].shape, np.nan, np.float32)
    kern.gdn_conv(case["x"], case["weight"], state, case["state_slots"], case["query_start"],
                  case["seq_lens"], y, pool)
    return y, state


@fixture_ok
@given(channels=st.integers(1, 600), kernel=st.integers(2, 8),
       q_lens=st.lists(st.integers(0, 12), min_size=1, max_size=4),
       starts=st.lists(st.integers(0, 20), min_size=4, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_gdn_conv(variant, ref, pool, channels, kernel, q_lens, starts, seed):
    if sum(q_lens) == 0:
        q_lens = [1]
    rng = np.random.default_rng(seed)
    case = conv_case(rng, channels, kernel, q_lens, starts[:len(q_lens)])
    y, state = run_conv(variant, case, pool)
    y_ref, state_ref = run_conv(ref, case)
    assert np.array_equal(y, y_ref, equal_nan=True) and np.array_equal(state, state_ref)
    pre, want_state = conv_exact(**case)
    absx = {**case, "x": np.abs(case["x"]), "weight": np.abs(case["weight"]),
            "state": np.abs(case["state"])}
    magnitude = conv_exact(**absx)[0]
    assert np.all(np.abs(y - silu64(pre)) <= 1e-6 * magnitude + 1e-30)
    assert np.array_equal(state, want_state.astype(np.float32))  # inputs, copied


def test_gdn_conv_split_rows_and_threads_give_the_same_bits(variant, pools):
    rng = np.random.default_rng(7)
    whole = conv_case(rng, 700, 4, [23], [0])
    y_all, state_all = run_conv(variant, whole, pools[2])
    state = whole["state"].copy()
    y = np.empty_like(y_all)
    done = 0
    for n in (1, 2, 7, 13):  # chunked prefill: q_len < kernel - 1 included
        qs, sl = metadata([n], [done])
        variant.gdn_conv(whole["x"][done:done + n], whole["weight"], state,
                         whole["state_slots"], qs, sl, y[done:done + n], pools[1])
        done += n
    assert np.array_equal(y, y_all) and np.array_equal(state, state_all)


# ---------------------------------------------------------------------- rule


def gates_exact(a, b, a_neg, dt_bias):
    x = a.astype(np.float64) + dt_bias
    softplus = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    return a_neg.astype(np.float64) * softplus, 1 / (1 + np.exp(-b.astype(np.float64)))


def k_heads(n_k, n_v, v_tiled):
    """The k head each v head reads."""
    return np.arange(n_v) % n_k if v_tiled else np.arange(n_v) // (n_v // n_k)


def split_qkv(qkv, n_k, n_v, dk, dv, v_tiled):
    """q, k [rows, n_v, dk] (repeated to the v heads) and v [rows, n_v, dv] in float64."""
    qkv = qkv.astype(np.float64)
    rows, kh = qkv.shape[0], k_heads(n_k, n_v, v_tiled)
    q = qkv[:, :n_k * dk].reshape(rows, n_k, dk)[:, kh]
    k = qkv[:, n_k * dk:2 * n_k * dk].reshape(rows, n_k, dk)[:, kh]
    return q, k, qkv[:, 2 * n_k * dk:].reshape(rows, n_v, dv)


def rule_exact(c):
    """(out, state after) in float64: the recurrent gated delta rule, token by token."""
    state = c["state"].astype(np.float64)
    n_v, dk, dv = state.shape[1:]
    q, k, v = split_qkv(c["qkv"], c["n_k_heads"], n_v, dk, dv, c["v_tiled"])
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    g, beta = gates_exact(c["a"], c["b"], c["a_neg"], c["dt_bias"])
    out = np.zeros(v.shape)
    qs, seq_lens = c["query_start"], c["seq_lens"]
    for s, slot in enumerate(c["state_slots"]):
        if qs[s + 1] == qs[s]:
            continue
        S = np.zeros(state.shape[1:]) if seq_lens[s] == qs[s + 1] - qs[s] else state[slot]
        for r in range(qs[s], qs[s + 1]):
            S = S * np.exp(g[r])[:, None, None]
            delta = beta[r][:, None] * (v[r] - np.einsum("hij,hi->hj", S, k[r]))
            S = S + k[r][:, :, None] * delta[:, None, :]
            out[r] = np.einsum("hij,hi->hj", S, q[r])
        state[slot] = S
    return out.reshape(len(out), -1), state


def rule_case(rng, q_lens, starts, n_k=2, n_v=4, dk=32, dv=64, v_tiled=False, spare_slots=1,
              correlated=False):
    """A batch: sequences of q_lens rows after starts tokens (0: fresh), random
    projections, A_log and dt_bias as Qwen3.5's init draws them, a random state."""
    rows = int(sum(q_lens))
    width = 2 * n_k * dk + n_v * dv
    qkv = rand(rng, (rows, width))
    if correlated:  # keys (and queries) near one direction: A close to its bound
        qkv[:, :2 * n_k * dk] = rand(rng, (1, 2 * n_k * dk)) + 0.1 * qkv[:, :2 * n_k * dk]
    ab = rand(rng, (rows, 2 * n_v + 3))  # a and b: column views of one array
    num_slots = len(q_lens) + spare_slots
    query_start, seq_lens = metadata(q_lens, starts)
    return dict(qkv=qkv, a=ab[:, :n_v], b=ab[:, n_v + 1:2 * n_v + 1],
                a_neg=-rng.uniform(0.01, 16, n_v).astype(np.float32),
                dt_bias=rand(rng, n_v), state=rand(rng, (num_slots, n_v, dk, dv), 0.3),
                state_slots=rng.permutation(num_slots)[:len(q_lens)].astype(np.int32),
                query_start=query_start, seq_lens=seq_lens, n_k_heads=n_k, v_tiled=v_tiled)


def run_rule(kern, c, pool=None, state=None):
    """(out, state after) of one gdn_rule call on case c (from c's state unless given)."""
    state = c["state"].copy() if state is None else state
    n_v, dv = state.shape[1], state.shape[3]
    out = np.full((c["qkv"].shape[0], n_v * dv), np.nan, np.float32)
    kern.gdn_rule(c["qkv"], c["a"], c["b"], c["a_neg"], c["dt_bias"], state, c["state_slots"],
                  c["query_start"], c["seq_lens"], c["n_k_heads"], n_v, out, c["v_tiled"], pool)
    return out, state


def assert_close(got, want, tol):
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= tol, f"error {err:.3g} of max |want| is above {tol:.3g}"


def assert_rule(got, want, tol=RULE_TOL):
    """out and state of a call within tol of their maxima."""
    assert_close(got[0], want[0], tol)
    assert_close(got[1], want[1], tol)


@fixture_ok
@given(q_lens=st.lists(st.integers(0, 9), min_size=1, max_size=4),
       starts=st.lists(st.integers(0, 30), min_size=4, max_size=4),
       heads=st.sampled_from([(1, 1), (2, 2), (2, 4), (1, 3)]),
       dims=st.sampled_from([(16, 16), (32, 64), (64, 32), (48, 80)]),
       v_tiled=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_gdn_rule_recurrent(variant, ref, pool, q_lens, starts, heads, dims, v_tiled, seed):
    if sum(q_lens) == 0:
        q_lens = [1]
    c = rule_case(np.random.default_rng(seed), q_lens, starts[:len(q_lens)], *heads, *dims,
                  v_tiled)
    got, want = run_rule(variant, c, pool), rule_exact(c)
    assert_rule(got, want)
    assert_rule(got, run_rule(ref, c), VARIANT_TOL)


@pytest.mark.parametrize("rows,start,dims,correlated", [
    (64, 0, (64, 64), False), (130, 5, (32, 64), True), (200, 0, (64, 32), False),
    (130, 0, (128, 128), True)])
def test_gdn_rule_chunked(variant, ref, pool, rows, start, dims, correlated):
    c = rule_case(np.random.default_rng(rows), [rows], [start], 2, 4, *dims,
                  correlated=correlated)
    got = run_rule(variant, c, pool)
    assert_rule(got, rule_exact(c))
    assert_rule(got, run_rule(ref, c), VARIANT_TOL)


def test_gdn_rule_against_transformers(ref):
    """Qwen3.5's own torch functions (float32) on a prefill of 130 rows (chunked) from
    a state, then a decode step (recurrent), GQA 2 -> 4 heads."""
    torch = pytest.importorskip("torch")
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    c = rule_case(np.random.default_rng(3), [130], [9], 2, 4, 32, 64)
    n_v, dk, dv = 4, 32, 64
    out, state = run_rule(ref, c)
    step = rule_case(np.random.default_rng(4), [1], [139], 2, 4, 32, 64)
    step["state_slots"] = c["state_slots"]
    out1, state1 = run_rule(ref, step, state=state.copy())
    slot = c["state_slots"][0]

    def torch_call(fn, case, initial):
        rows = case["qkv"].shape[0]
        qkv = torch.from_numpy(case["qkv"])
        q = qkv[:, :2 * dk].reshape(1, rows, 2, dk)
        k = qkv[:, 2 * dk:4 * dk].reshape(1, rows, 2, dk)
        v = qkv[:, 4 * dk:].reshape(1, rows, n_v, dv)
        a, b = torch.from_numpy(case["a"].copy()), torch.from_numpy(case["b"].copy())
        g = torch.from_numpy(case["a_neg"]) * torch.nn.functional.softplus(
            a + torch.from_numpy(case["dt_bias"]))
        o, s = fn(q, k, v, g=g[None], beta=b.sigmoid()[None],
                  initial_state=torch.from_numpy(initial)[None], output_final_state=True,
                  use_qk_l2norm_in_kernel=True)
        return o.reshape(rows, n_v * dv).numpy(), s[0].numpy()

    want = torch_call(qwen.torch_chunk_gated_delta_rule, c, c["state"][slot])
    assert_rule((out, state[slot]), want, TORCH_TOL)
    want1 = torch_call(qwen.torch_recurrent_gated_delta_rule, step, want[1])
    assert_rule((out1, state1[slot]), want1, TORCH_TOL)


@pytest.mark.parametrize("pieces", [[1, 63, 70], [100, 37], [64, 64, 5]])
def test_gdn_rule_chunked_prefill_then_decode(variant, pool, pieces):
    """A prompt in several calls (each piece's whole chunks chunked, the rest token by
    token), then three decode steps: as one call, and as float64."""
    rows = sum(pieces) + 3
    whole = rule_case(np.random.default_rng(rows), [rows], [0], 2, 4, 32, 32)
    want = rule_exact(whole)
    state = whole["state"].copy()
    out = np.empty((rows, 4 * 32), np.float32)
    done = 0
    for n in pieces + [1, 1, 1]:
        qs, sl = metadata([n], [done])
        part = {**whole, "qkv": whole["qkv"][done:done + n], "a": whole["a"][done:done + n],
                "b": whole["b"][done:done + n], "query_start": qs, "seq_lens": sl}
        out[done:done + n] = run_rule(variant, part, pool, state)[0]
        done += n
    assert_rule((out, state), want)
    assert_rule((out, state), run_rule(variant, whole, pool))


@pytest.mark.parametrize("heads,dims,v_tiled", [((2, 4), (128, 128), False),
                                                 ((2, 4), (32, 64), True),
                                                 ((3, 3), (64, 32), False)])
def test_gdn_rule_batch_is_each_sequence_alone_on_any_threads(variant, pools, heads, dims,
                                                              v_tiled):
    """Fresh and continuing sequences, decodes and chunked prefills, an empty one: the
    batch on 1 and 2 threads, and each sequence alone, give the same bits."""
    q_lens, starts = [1, 70, 0, 3, 64], [12, 0, 5, 0, 40]
    c = rule_case(np.random.default_rng(11), q_lens, starts, *heads, *dims, v_tiled,
                  spare_slots=2)
    out, state = run_rule(variant, c, pools[2])
    out1, state1 = run_rule(variant, c, pools[1])
    assert np.array_equal(out, out1) and np.array_equal(state, state1)
    qs = c["query_start"]
    for s in range(len(q_lens)):
        r0, r1 = qs[s], qs[s + 1]
        alone = {**c, "qkv": c["qkv"][r0:r1], "a": c["a"][r0:r1], "b": c["b"][r0:r1],
                 "state_slots": c["state_slots"][s:s + 1], "seq_lens": c["seq_lens"][s:s + 1],
                 "query_start": np.array([0, r1 - r0], np.int32)}
        if r1 == r0:
            continue
        out_s, state_s = run_rule(variant, alone, pools[2])
        assert np.array_equal(out_s, out[r0:r1])
        slot = c["state_slots"][s]
        assert np.array_equal(state_s[slot], state[slot])
    untouched = np.setdiff1d(np.arange(len(state)), c["state_slots"][np.diff(qs) > 0])
    assert np.array_equal(state[untouched], c["state"][untouched])


def test_gdn_rejects_bad_metadata_and_writes_nothing(variant):
    c = rule_case(np.random.default_rng(0), [2, 3, 1], [0, 4, 6])
    conv = conv_case(np.random.default_rng(0), 10, 4, [2, 3, 1], [0, 4, 6])
    bad = [("seq_lens", [2, 2, 7], "sequence 1"),        # q_len > seq_len
           ("query_start", [0, 2, 1, 6], "sequence 1"),  # q_len < 0
           ("query_start", [1, 2, 5, 6], "sequence 0"),  # does not start at 0
           ("state_slots", [0, 1, 9], "sequence 2"),     # outside [0, num_slots)
           ("state_slots", [0, -1, 2], "sequence 1")]
    for name, value, match in bad:
        state, conv_state = c["state"].copy(), conv["state"].copy()
        with pytest.raises(ValueError, match=match):
            run_rule(variant, {**c, name: np.array(value, np.int32)}, None, state)
        with pytest.raises(ValueError, match=match):
            broken = {**conv, name: np.array(value, np.int32)}
            variant.gdn_conv(conv["x"], conv["weight"], conv_state, broken["state_slots"],
                             broken["query_start"], broken["seq_lens"], np.empty_like(conv["x"]))
        assert np.array_equal(state, c["state"]) and np.array_equal(conv_state, conv["state"])
    with pytest.raises(ValueError, match="distinct"):
        run_rule(variant, {**c, "state_slots": np.array([1, 1, 0], np.int32)})
    with pytest.raises(ValueError, match="query_start"):
        run_rule(variant, {**c, "query_start": np.array([0, 2, 5, 7], np.int32)})
    with pytest.raises(ValueError, match="state_slots must have dtype int32"):
        run_rule(variant, {**c, "state_slots": c["state_slots"].astype(np.int64)})
    with pytest.raises(ValueError, match="same row stride"):
        run_rule(variant, {**c, "b": c["b"].copy()})
    with pytest.raises(ValueError, match="qkv must have"):
        run_rule(variant, {**c, "qkv": c["qkv"][:, 1:]})
    with pytest.raises(ValueError, match="state is read-only"):
        state = c["state"].copy()
        state.flags.writeable = False
        run_rule(variant, c, None, state)
    with pytest.raises(ValueError, match="kernel size"):
        run_conv(variant, {**conv, "weight": np.ones((10, 9), np.float32)})


@pytest.mark.parametrize("rows", [3, 70])
def test_gdn_fresh_sequences_ignore_their_slots(variant, rows):
    """A sequence at token 0 starts from zeros whatever its slot holds (NaN here)."""
    c = rule_case(np.random.default_rng(rows), [rows], [0])
    conv = conv_case(np.random.default_rng(rows), 40, 4, [rows], [0])
    want, want_conv = run_rule(variant, c), run_conv(variant, conv)
    c["state"][:], conv["state"][:] = np.nan, np.nan
    got, got_conv = run_rule(variant, c), run_conv(variant, conv)
    slot, conv_slot = c["state_slots"][0], conv["state_slots"][0]
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1][slot], want[1][slot])
    assert np.array_equal(got_conv[0], want_conv[0])
    assert np.array_equal(got_conv[1][conv_slot], want_conv[1][conv_slot])


def test_gdn_rule_zero_rows_leave_the_slot_alone(variant):
    c = rule_case(np.random.default_rng(5), [0, 2], [7, 0])
    c["state_slots"] = np.array([-5, 1], np.int32)  # no rows: not even checked
    out, state = run_rule(variant, c)
    assert np.array_equal(state[[0, 2]], c["state"][[0, 2]])
    assert_rule((out, state), rule_exact({**c, "state_slots": np.array([0, 1], np.int32)}))


# -------------------------------------------------------- gated norm, gate


@fixture_ok
@given(t=st.integers(1, 5), heads=st.integers(1, 4), d=st.integers(1, 140),
       inplace=st.booleans(), scale=st.sampled_from([1e-10, 1.0, 1e10]),
       seed=st.integers(0, 2**32 - 1))
def test_gated_rmsnorm(variant, ref, pool, t, heads, d, inplace, scale, seed):
    rng = np.random.default_rng(seed)
    x, z, w = rand(rng, (t, heads * d), scale), rand(rng, (t, heads * d), 3.0), rand(rng, d)
    x64 = x.astype(np.float64).reshape(t, heads, d)
    want = (x64 / np.sqrt(np.mean(x64 * x64, axis=2, keepdims=True) + 1e-6)).reshape(t, -1)
    want = want * np.tile(w, heads) * silu64(z.astype(np.float64))
    x_in = x.copy()
    out = x_in if inplace else np.empty_like(x)
    variant.gated_rmsnorm(x_in, z, w, 1e-6, out, pool)
    row_max = np.max(np.abs(want), axis=1, keepdims=True)
    assert np.all(np.abs(out - want) <= 2e-6 * np.abs(want) + 1e-6 * row_max + 1e-38)
    out_ref = ref.gated_rmsnorm(x, z, w, 1e-6, np.empty_like(x))
    assert np.all(np.abs(out - out_ref) <= 1e-6 * np.abs(out_ref))


@fixture_ok
@given(t=st.integers(1, 5), n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_sigmoid_mul(variant, ref, pool, t, n, seed):
    rng = np.random.default_rng(seed)
    gate, x = rand(rng, (t, n + 3), 8.0)[:, :n], rand(rng, (t, n))
    got = variant.sigmoid_mul(gate, x.copy(), pool)
    want = x / (1 + np.exp(-gate.astype(np.float64)))
    assert np.all(np.abs(got - want) <= 1e-6 * np.abs(want) + 1e-38)
    assert np.array_equal(got, ref.sigmoid_mul(gate, x.copy()))


def test_ops_wrappers_run_the_selected_variant():
    c = rule_case(np.random.default_rng(2), [3], [0])
    want = run_rule(ops.kernels(), c)
    state = c["state"].copy()
    out = ops.gdn_rule(c["qkv"], c["a"], c["b"], c["a_neg"], c["dt_bias"], state,
                       c["state_slots"], c["query_start"], c["seq_lens"], 2, 4)
    assert np.array_equal(out, want[0]) and np.array_equal(state, want[1])
    conv = conv_case(np.random.default_rng(2), 9, 4, [3], [0])
    state = conv["state"].copy()
    y = ops.gdn_conv(conv["x"], conv["weight"], state, conv["state_slots"],
                     conv["query_start"], conv["seq_lens"])
    assert np.array_equal(y, run_conv(ops.kernels(), conv)[0])
    x, z = rand(np.random.default_rng(1), (2, 8)), rand(np.random.default_rng(2), (2, 8))
    w = np.ones(4, np.float32)
    assert np.array_equal(ops.gated_rmsnorm(x, z, w, 1e-6),
                          ops.kernels().gated_rmsnorm(x, z, w, 1e-6, np.empty_like(x)))
    assert np.array_equal(ops.sigmoid_mul(z, x.copy()), ops.kernels().sigmoid_mul(z, x.copy()))
