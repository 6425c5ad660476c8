"""Sampling against its definitions: greedy, temperature/top-k/top-p/min-p
distributions (chi-square against the exact truncated softmax), seeds,
penalties, log-probabilities, and parameter validation."""
from __future__ import annotations

import numpy as np
import pytest

from armllm import ops
from armllm.sampling import SamplingParams, apply_penalties, sample_row, sample_scratch


def frequencies(logits, params, n=20000, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(logits))
    for _ in range(n):
        counts[sample_row(logits.copy(), params, rng, [], []).token] += 1
    return counts / n


def expected(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    keep = np.ones_like(p, dtype=bool)
    order = np.argsort(-p)
    if top_k:
        keep[order[top_k:]] = False
    if min_p:
        keep &= p >= min_p * p.max()
    if top_p < 1:
        q = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
        cum = np.cumsum(q[order])
        cut = np.searchsorted(cum, top_p) + 1
        mask = np.zeros_like(keep)
        mask[order[:cut]] = True
        keep &= mask
    out = np.where(keep, p, 0)
    return out / out.sum()


LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.5}, {"temperature": 2.0}, {"top_k": 3},
                                {"top_p": 0.7}, {"min_p": 0.2}, {"top_k": 5, "top_p": 0.8}])
def test_sampled_distribution(kw):
    params = SamplingParams(**{"temperature": 1.0, **kw})
    got = frequencies(LOGITS, params)
    want = expected(LOGITS.astype(np.float64), **{"temperature": 1.0, **kw})
    assert np.all(got[want == 0] == 0)
    # within 5 standard errors for every token
    assert np.all(np.abs(got - want) <= 5 * np.sqrt(want * (1 - want) / 20000) + 1e-9)


def test_greedy_and_seeds():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(1000).astype(np.float32)
    assert sample_row(logits.copy(), SamplingParams(temperature=0), rng, [], []).token == \
        int(np.argmax(logits))
    a = [sample_row(logits.copy(), SamplingParams(seed=7), np.random.default_rng(7), [], []).token
         for _ in range(5)]
    assert len(set(a)) == 1


def test_penalties_follow_their_definitions():
    row = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    apply_penalties(row, SamplingParams(repetition_penalty=2.0), [0], [1])
    assert np.allclose(row, [1.0, -4.0, 1.0, 0.5])
    row = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    apply_penalties(row, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [3],
                    [2, 2, 1])
    assert np.allclose(row, [2.0, -2.75, 0.0, 0.5])


def test_logprobs_are_raw_model_logprobs():
    row = np.array([3.0, 1.0, 0.0, -1.0], np.float32)
    lp = row - np.log(np.exp(row.astype(np.float64)).sum())
    res = sample_row(row.copy(), SamplingParams(temperature=0, logprobs=2), None, [], [])
    assert res.token == 0 and np.isclose(res.logprob, lp[0])
    assert [t for t, _ in res.top_logprobs] == [0, 1]
    assert np.allclose([v for _, v in res.top_logprobs], lp[:2])


def numpy_sampler(row: np.ndarray, params: SamplingParams, u: float) -> int:
    """The numpy sampler armllm ran before its C path (argsort of the whole
    vocabulary), for the draw u; top-k candidates in ascending id, ties at the k-th
    value to the lower ids (argpartition's order was unspecified)."""
    x = row.astype(np.float64) / params.temperature
    cand = np.arange(x.shape[0])
    if 0 < params.top_k < x.shape[0]:
        cand = np.sort(np.lexsort((cand, -x))[:params.top_k])
    logits = x[cand]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    keep = np.ones(len(cand), dtype=bool)
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cut = int(np.searchsorted(np.cumsum(probs[order]), params.top_p)) + 1
        top = np.zeros(len(cand), dtype=bool)
        top[order[:cut]] = True
        keep &= top
    cdf = np.cumsum(np.where(keep, probs, 0.0))
    idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(cand[min(idx, len(cand) - 1)])


@pytest.mark.parametrize("kw", [
    {}, {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05}, {"temperature": 0.3},
    {"top_k": 50}, {"top_k": 1}, {"top_k": 40, "top_p": 0.5, "temperature": 1.5},
    {"top_p": 0.95}, {"top_p": 0.01}, {"min_p": 0.2}, {"top_k": 49151, "min_p": 0.01},
])
def test_c_sampler_picks_the_numpy_samplers_token_for_each_draw(kw):
    """The C path gives the numpy sampler's token for the same draw, on rows of a real
    vocabulary's size (49,152, SmolLM2's) with ties, spread and flat regions."""
    rng = np.random.default_rng(11)
    scratch = sample_scratch(49152)
    params = SamplingParams(**kw)
    for trial in range(12):
        row = (rng.standard_normal(49152) * (1 + 3 * (trial % 3))).astype(np.float32)
        row[rng.integers(0, 49152, 30)] = row.max()  # ties at the top (and at the k-th)
        row[:1000] = np.round(row[:1000])             # more ties
        for u in rng.random(25):
            got = ops.sample_token(row, params.temperature, params.top_k, params.top_p,
                                   params.min_p, u, scratch)
            assert got == numpy_sampler(row, params, u), (kw, trial, u)
        assert sample_row(row.copy(), params, np.random.default_rng(trial), [], [],
                          scratch).token == numpy_sampler(
                              row, params, np.random.default_rng(trial).random())


def test_sample_token_refuses_bad_arguments():
    row, scratch = np.zeros(8, np.float32), sample_scratch(8)
    with pytest.raises(ValueError, match="scratch must be 8-byte aligned and hold"):
        ops.sample_token(row, 1.0, 0, 1.0, 0.0, 0.5, scratch[:10])
    with pytest.raises(ValueError, match="temperature must be > 0, got 0.0"):
        ops.sample_token(row, 0.0, 0, 1.0, 0.0, 0.5, scratch)
    with pytest.raises(ValueError, match="u must be in"):
        ops.sample_token(row, 1.0, 0, 1.0, 0.0, 1.0, scratch)
    with pytest.raises(ValueError, match="row must have dtype float32"):
        ops.sample_token(row.astype(np.float64), 1.0, 0, 1.0, 0.0, 0.5, scratch)


@pytest.mark.parametrize("kw,match", [
    ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
    ({"temperature": -1.0}, "temperature must be in"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"top_k": -2}, "top_k must be"),
    ({"min_p": 1.5}, "min_p must be in"),
    ({"presence_penalty": 3.0}, "presence_penalty must be in"),
    ({"seed": -1}, "seed must be a non-negative integer"),
    ({"stop": [""]}, "stop must be non-empty strings"),
    ({"logprobs": 50}, "logprobs must be an integer in"),
])
def test_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)
