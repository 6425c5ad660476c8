"""ops.RowSampler's bad words, DRY and XTC (sample.h steps 1b, 4b and 6) against
sample_spec's numpy reading of vLLM's and llama.cpp's definitions: tokens, logprobs and
top lists equal to the bit, on every variant this CPU runs; the window and breaker
edge cases of DRY, XTC with none, one or several tokens above its threshold, and the
checks on the new columns and sequence lists."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import RUNNABLE_ISAS, examples
from tests.kernels import sample_spec as spec
from tests.kernels.sample_spec import RowParams
from tests.kernels.test_sample_rows import (
    assert_matches_spec,
    check_rows_match_the_spec,
    check_variant_gives_refs_outputs,
    logits_rows,
    row_params,
    run_rows,
)

F32 = np.float32


@st.composite
def word_params(draw, n: int) -> RowParams:
    """Row params with bad words, DRY and XTC over histories of a few ids, so that
    repeats, breakers and bad-word prefixes occur."""
    p = draw(row_params(n))
    alphabet = st.integers(0, min(n, 4) - 1)
    p.history = draw(st.lists(alphabet, max_size=40))
    p.prompt_len = draw(st.integers(0, len(p.history)))
    p.bad_words = draw(st.lists(st.lists(alphabet, min_size=1, max_size=3), max_size=4))
    p.dry_multiplier = draw(st.sampled_from([0.0, 0.8, 0.8, 2.5, 1e-3, 1e30]))
    # 1e10: llama.cpp's exponent bound is 3; 1 and 1 + 5e-7: no bound
    p.dry_base = draw(st.sampled_from([1.75, 1.75, 1.0, 1.0000005, 3.0, 1e10]))
    p.dry_allowed_length = draw(st.integers(0, 5))
    p.dry_last_n = draw(st.sampled_from([-1, -1, 0, 1, 3, 8, 20, 100]))
    p.dry_breakers = draw(st.lists(st.lists(alphabet, min_size=1, max_size=3), max_size=3))
    p.xtc_probability = draw(st.sampled_from([0.0, 0.5, 1.0, 1.0]))
    p.xtc_threshold = draw(st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5, 0.6]))
    return p


@settings(deadline=None, max_examples=examples(150),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(n=st.sampled_from([1, 2, 5, 17, 100]), data=st.data(),
       kind=st.sampled_from(["spread", "peaked", "ties", "specials", "flat"]),
       seed=st.integers(0, 2**32 - 1))
def test_words_dry_and_xtc_match_the_spec(n, data, kind, seed):
    check_rows_match_the_spec(word_params, n, data, kind, seed, masks=False)


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
@settings(deadline=None, max_examples=examples(25))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_every_variant_gives_refs_outputs(isa, data, seed):
    check_variant_gives_refs_outputs(isa, word_params, data, seed, [5, 64, 300],
                                     ["spread", "peaked"], masks=False)


# ------------------------------------------------------------------ DRY


def dry_row(history: list[int], n: int = 8, **kw) -> np.ndarray:
    """The logits a greedy DRY row leaves: 0 everywhere, minus the penalties (the row
    is kept as scratch: read it back through a keep_row entry)."""
    s = ops.RowSampler(n, 1, "ref")
    p = RowParams(temperature=0.0, history=history, prompt_len=0, **kw)
    spec.fill(s, 0, p)
    s.keep_row[0] = 1
    row = np.zeros((1, n), F32)
    s.run(row, 0, 1)
    return row[0]


def test_dry_penalizes_the_id_that_extends_a_repeat():
    # a b c c b c y a b c: "a b c" repeats from 0, so "c" (after it) would extend it to 4;
    # "b c" at 4..5 proposes "y" with 2; "c" at 3 proposes "b" with 1 (llama.cpp's example)
    a, b, c, y = 0, 1, 2, 3
    history = [a, b, c, c, b, c, y, a, b, c]
    got = dry_row(history, dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2)
    want = np.zeros(8, F32)
    for t, penalty in spec.dry_penalties(history, RowParams(
            dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2)).items():
        want[t] -= penalty
    assert np.array_equal(got, want)
    # by the definition: "c" extends a b c (3 - 2 = 1: 2^1), "y" extends b c (2^0)
    assert got[c] == -2.0 and got[y] == -1.0 and got[b] == 0.0 and got[a] == 0.0


@pytest.mark.parametrize("allowed", [0, 1, 2, 3, 4])
def test_dry_allowed_length_boundaries(allowed):
    history = [1, 2, 3, 1, 2, 3, 1, 2]   # "1 2" then 3 would repeat "1 2 3 1 2" (5)
    kw = dict(dry_multiplier=0.5, dry_base=1.75, dry_allowed_length=allowed)
    want = np.zeros(8, F32)
    for t, penalty in spec.dry_penalties(history, RowParams(**kw)).items():
        want[t] -= penalty
    assert np.array_equal(dry_row(history, **kw), want)
    assert want[3] == -F32(0.5 * 1.75 ** (5 - allowed))


def test_dry_window_edge_and_breakers():
    history = [4, 1, 2, 3, 5, 1, 2]
    # the whole history: "1 2" repeats, so 3 is proposed
    assert dry_row(history, dry_multiplier=1.0, dry_allowed_length=2)[3] < 0
    # a window of the last 3 ids (5 1 2) holds no earlier "1 2"
    assert not dry_row(history, dry_multiplier=1.0, dry_allowed_length=2, dry_last_n=3).any()
    # a window of 6 (1 2 3 5 1 2) still does; 0 turns DRY off
    assert dry_row(history, dry_multiplier=1.0, dry_allowed_length=2, dry_last_n=6)[3] < 0
    assert not dry_row(history, dry_multiplier=1.0, dry_allowed_length=2, dry_last_n=0).any()
    # a breaker 5 two ids from the end: L = 2 keeps "1 2" (2 >= 2)
    assert dry_row(history, dry_multiplier=1.0, dry_allowed_length=2,
                   dry_breakers=[[5]])[3] < 0
    # the breaker "5 1" ends one id from the end: L = 1 < 2, no penalty at all
    assert not dry_row(history, dry_multiplier=1.0, dry_allowed_length=2,
                       dry_breakers=[[5, 1]]).any()
    # a one-id breaker is never penalized itself
    assert dry_row(history, dry_multiplier=1.0, dry_allowed_length=2,
                   dry_breakers=[[3]])[3] == 0


def test_dry_exponent_bound():
    history = [1, 2] * 20   # 2 then 1 repeats for 38 ids
    for base in (1e10, 3.0, 1.0, 1.0000005):
        kw = dict(dry_multiplier=1e-30, dry_base=base, dry_allowed_length=2)
        want = np.zeros(8, F32)
        for t, penalty in spec.dry_penalties(history, RowParams(**kw)).items():
            want[t] -= penalty
        assert np.array_equal(dry_row(history, **kw), want), base
    # base 1e10: llama.cpp's bound int(88.72 / ln 1e10) = 3 caps 1e10^36 at 1e30
    assert dry_row(history, dry_multiplier=1.0, dry_base=1e10)[1] == -F32(1e30)


def test_dry_scratch_grows_to_long_windows():
    rng = np.random.default_rng(0)
    n = 50
    history = list(rng.integers(0, 3, 5000))
    params = [RowParams(temperature=t, dry_multiplier=0.7, history=history, prompt_len=100,
                        seed=i, counter=7) for i, t in enumerate([0.0, 1.0, 0.8])]
    rows = logits_rows(rng, len(params), n, "spread")
    assert_matches_spec(rows, params, run_rows(rows, params))


def test_dry_logprobs_are_of_the_raw_row():
    # logprobs stay those before the penalties and DRY (as for the penalties)
    history = [1, 2, 3, 1, 2]
    p = RowParams(temperature=0.0, num_logprobs=3, history=history, dry_multiplier=50.0)
    row = np.linspace(0, 1, 8, dtype=F32)[None, :]
    got = run_rows(row, [p])
    assert got["token"][0] != 3   # DRY took 3 (the argmax of the raw row) down
    assert_matches_spec(row, [p], got)


# ------------------------------------------------------------------ XTC


def xtc_token(probs: list[float], threshold: float, **kw) -> int:
    """The token of a row whose softmax is probs, with XTC always on."""
    logits = np.log(np.asarray(probs, np.float64)).astype(F32)[None, :]
    p = RowParams(xtc_probability=1.0, xtc_threshold=threshold, **kw)
    got = run_rows(logits, [p])
    assert_matches_spec(logits, [p], got)
    return int(got["token"][0])


@pytest.mark.parametrize("seed", range(20))
def test_xtc_none_or_one_above_threshold_changes_nothing(seed):
    probs = [0.6, 0.05, 0.2, 0.15]   # only id 0 at or above 0.3
    plain = run_rows(np.log(np.asarray(probs)).astype(F32)[None, :], [RowParams(seed=seed)])
    assert xtc_token(probs, 0.3, seed=seed) == plain["token"][0]
    probs = [0.3, 0.25, 0.2, 0.25]   # none reaches 0.45
    plain = run_rows(np.log(np.asarray(probs)).astype(F32)[None, :], [RowParams(seed=seed)])
    assert xtc_token(probs, 0.45, seed=seed) == plain["token"][0]


@pytest.mark.parametrize("seed", range(20))
def test_xtc_keeps_only_the_least_of_the_top_choices(seed):
    probs = [0.35, 0.05, 0.4, 0.2]   # 0, 2 and 3 reach 0.19: 0 and 2 go, 3 stays
    assert xtc_token(probs, 0.19, seed=seed) in (1, 3)
    assert xtc_token(probs, 0.04, seed=seed) == 1   # all reach it: the least stays


def test_xtc_ties_keep_the_highest_id():
    probs = [0.25, 0.25, 0.25, 0.25]   # every id reaches 0.1: only id 3 is left
    assert all(xtc_token(probs, 0.1, seed=s) == 3 for s in range(10))


def test_xtc_probability_draws_on_its_own_stream():
    probs = [0.5, 0.5]
    runs = [xtc_token(probs, 0.1, seed=s, counter=0) for s in range(400)]
    # with probability 1 id 1 (the higher id among equals) is always left
    assert set(runs) == {1}
    half = [run_rows(np.log(np.asarray(probs)).astype(F32)[None, :],
                     [RowParams(seed=s, xtc_probability=0.5, xtc_threshold=0.1)])["token"][0]
            for s in range(400)]
    removed = sum(spec.uniform(s, 4 << 32, 0) < 0.5 for s in range(400))
    # where XTC ran id 1 came out; elsewhere the plain draw
    plain = [run_rows(np.log(np.asarray(probs)).astype(F32)[None, :],
                      [RowParams(seed=s)])["token"][0] for s in range(400)]
    for s in range(400):
        if spec.uniform(s, 4 << 32, 0) < 0.5:
            assert half[s] == 1
        else:
            assert half[s] == plain[s]
    assert 150 < removed < 250


def test_xtc_leaves_greedy_rows_alone():
    probs = [0.5, 0.3, 0.2]
    assert xtc_token(probs, 0.1, temperature=0.0) == 0


# ------------------------------------------------------------------ bad words


def test_bad_words_of_one_and_several_ids():
    n = 6
    row = np.zeros((1, n), F32)
    row[0, 4] = 5.0   # the argmax unless banned
    # one id: always banned
    assert run_rows(row, [RowParams(temperature=0.0, bad_words=[[4]])])["token"][0] != 4
    # 2 4: banned after an output ending with 2, not after one ending elsewhere
    p = RowParams(temperature=0.0, bad_words=[[2, 4]], history=[9 % n, 2], prompt_len=1)
    assert run_rows(row, [p])["token"][0] != 4
    p = RowParams(temperature=0.0, bad_words=[[2, 4]], history=[2, 1], prompt_len=1)
    assert run_rows(row, [p])["token"][0] == 4
    # the prefix in the prompt does not count: only the output
    p = RowParams(temperature=0.0, bad_words=[[2, 4]], history=[2], prompt_len=1)
    assert run_rows(row, [p])["token"][0] == 4


def test_sequence_list_layout_and_checks():
    got = ops.sequence_list([[3, 4], [3], [1, 2, 3], [3]])
    assert got.tolist() == [3, 4, 8, 10, 3, 1, 2, 3, 1, 3, 2, 3, 4]
    s = ops.RowSampler(5, 1)
    with pytest.raises(ValueError, match=r"bad words of row 0 must be in \[0, 5\)"):
        s.set_bad_words(0, ops.sequence_list([[7]]))
    with pytest.raises(ValueError, match="sorted by"):
        s.set_breakers(0, np.array([2, 3, 5, 1, 4, 1, 1], np.int32))
    with pytest.raises(ValueError, match="outside the list"):
        s.set_bad_words(0, np.array([1, 2, 5], np.int32))
    with pytest.raises(ValueError, match="at least one id"):
        ops.sequence_list([[]])


@pytest.mark.parametrize("column,value,match", [
    ("dry_multiplier", -1.0, r"dry_multiplier\[0\] must be finite and >= 0"),
    ("dry_multiplier", np.inf, r"dry_multiplier\[0\]"),
    ("dry_base", 0.5, r"dry_base\[0\] must be finite and >= 1"),
    ("dry_allowed_length", -1, r"dry_allowed_length\[0\] must be >= 0"),
    ("dry_last_n", -2, r"dry_last_n\[0\] must be >= -1"),
    ("xtc_probability", 1.5, r"xtc_probability\[0\]"),
    ("xtc_threshold", -0.1, r"xtc_threshold\[0\]"),
])
def test_run_names_the_bad_column(column, value, match):
    s = ops.RowSampler(4, 1)
    getattr(s, column)[0] = value
    with pytest.raises(ValueError, match=match):
        s.run(np.zeros((1, 4), F32), 0, 1)
