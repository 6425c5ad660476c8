"""Verifying draft tokens keeps the target's distribution: the emitted token's
frequencies over many draws match sample.h's distribution (chi-square), whether the
draft is a point mass or drawn from another distribution q (sampling_probs, the
distribution ops.sample_token draws from, is tested in tests/test_sampling_probs.py)."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.engine.spec.verify import verify_row
from armllm.sampling import SamplingParams, sample_scratch, sampling_probs

VOCAB = 12
DRAWS = 20000
SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=6),
            dict(temperature=1.3, top_p=0.8), dict(temperature=0.9, min_p=0.1, top_p=0.95)]


def logits(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * 1.5).astype(np.float32)


def emitted(row, params, draft, q, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scratch = sample_scratch(VOCAB)
    tokens = np.empty(DRAWS, np.int64)
    accepted = 0
    for i in range(DRAWS):
        # the draft: a point mass (q None) or a draw from q
        d = draft if q is None else int(rng.choice(VOCAB, p=q))
        result, ok = verify_row(row.copy(), params, rng, [], [], d, q, scratch)
        tokens[i] = result.token
        accepted += ok
    return np.bincount(tokens, minlength=VOCAB), accepted / DRAWS


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a df-degree statistic exceeds with probability ~0.001
    (z: the normal quantile), by Wilson and Hilferty's cube-root approximation."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def assert_follows(counts: np.ndarray, p: np.ndarray) -> None:
    support = p > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    expected = p[support] * counts.sum()
    statistic = float(((counts[support] - expected) ** 2 / expected).sum())
    assert statistic < chi_square_critical(int(support.sum()) - 1), (counts, expected)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_point_mass_draft_keeps_the_distribution(setting):
    params = SamplingParams(**setting)
    row = logits(2)
    p = sampling_probs(row, params)
    likely = int(np.argmax(p))
    counts, rate = emitted(row, params, likely, None, seed=3)
    assert_follows(counts, p)
    assert abs(rate - p[likely]) < 0.02    # kept with probability p(draft)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_drawn_draft_keeps_the_distribution(setting):
    params = SamplingParams(**setting)
    row = logits(4)
    p = sampling_probs(row, params)
    q = sampling_probs(logits(5), SamplingParams(temperature=1.0))   # another model's
    counts, rate = emitted(row, params, None, q, seed=6)
    assert_follows(counts, p)
    assert abs(rate - np.minimum(p, q).sum()) < 0.02   # Leviathan et al.'s acceptance


def test_greedy_accepts_exactly_the_argmax():
    row = logits(7)
    params = SamplingParams(temperature=0.0)
    best = int(np.argmax(row))
    rng = np.random.default_rng(0)
    assert verify_row(row.copy(), params, rng, [], [], best, None) == \
        (verify_row(row.copy(), params, rng, [], [], None, None)[0], True)
    result, ok = verify_row(row.copy(), params, rng, [], [], (best + 1) % VOCAB, None)
    assert (result.token, ok) == (best, False)
