"""Verifying a draft token drawn from another distribution q (verify_drawn) keeps
the target's distribution: the emitted token's frequencies over many draws match
sample.h's distribution (chi-square), and the acceptance rate is Leviathan et
al.'s. (sampling_probs, the distribution the kernel draws from, is tested in
tests/test_sampling_probs.py; point-mass drafts are kept exactly when the
kernel's own token equals them, tests/engine/spec/test_speculative_engine.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from armllm.engine.spec.verify import verify_drawn
from armllm.sampling import SamplingParams, sampling_probs

VOCAB = 12
DRAWS = 20000
SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=6),
            dict(temperature=1.3, top_p=0.8), dict(temperature=0.9, min_p=0.1, top_p=0.95)]


def logits(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * 1.5).astype(np.float32)


def emitted(row, params, q, seed) -> tuple[np.ndarray, float]:
    """The tokens verify_drawn emits for drafts drawn from q, one draw per counter."""
    rng = np.random.default_rng(seed)
    tokens = np.empty(DRAWS, np.int64)
    accepted = 0
    for i in range(DRAWS):
        d = int(rng.choice(VOCAB, p=q))
        result, ok = verify_drawn(row.copy(), params, [], [], None, d, q, seed, 0, i)
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
def test_a_drawn_draft_keeps_the_distribution(setting):
    params = SamplingParams(**setting)
    row = logits(4)
    p = sampling_probs(row, params)
    q = sampling_probs(logits(5), SamplingParams(temperature=1.0))   # another model's
    counts, rate = emitted(row, params, q, seed=6)
    assert_follows(counts, p)
    assert abs(rate - np.minimum(p, q).sum()) < 0.02   # Leviathan et al.'s acceptance


def test_the_row_after_a_kept_draft_draws_from_p():
    params = SamplingParams(temperature=0.8, top_p=0.9)
    row = logits(8)
    p = sampling_probs(row, params)
    counts = np.bincount([verify_drawn(row.copy(), params, [], [], None, None, None, 4, 0, i)[0]
                          .token for i in range(DRAWS)], minlength=VOCAB)
    assert_follows(counts, p)
