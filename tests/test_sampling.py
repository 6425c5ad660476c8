"""Sampling against its definitions: greedy, temperature/top-k/top-p/min-p
distributions (chi-square against the exact truncated softmax), seeds,
penalties, log-probabilities, and parameter validation."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.sampling import SamplingParams, apply_penalties, sample_row


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
