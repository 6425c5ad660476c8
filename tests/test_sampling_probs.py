"""sampling_probs (armllm/sampling.py) against the kernel it describes: for each of
many uniform draws (one counter each), ops.RowSampler's token is the one whose
interval of the probabilities' running sum holds the draw (away from the
intervals' edges, where the two sums' rounding may differ), under temperature,
top-k (ties at the k-th value included), top-p and min-p, alone and together."""
from __future__ import annotations

import numpy as np
import pytest

from armllm import ops
from armllm.sampling import SamplingParams, sampling_probs

SETTINGS = [dict(temperature=1.0), dict(temperature=0.3), dict(temperature=2.0, top_k=7),
            dict(temperature=0.7, top_p=0.8), dict(temperature=1.0, min_p=0.05),
            dict(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02),
            dict(temperature=1.5, top_k=1), dict(temperature=1.0, top_p=0.3)]
DRAWS = 2000


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
@pytest.mark.parametrize("vocab", [300, 5000])
def test_the_kernel_draws_from_these_probabilities(setting, vocab):
    rng = np.random.default_rng(vocab)
    row = (rng.standard_normal(vocab) * 3).astype(np.float32)
    row[rng.choice(vocab, 20, replace=False)] = row.max()   # ties at the top
    params = SamplingParams(**setting)
    probs = sampling_probs(row, params)
    assert probs.dtype == np.float32 and abs(probs.sum() - 1) < 1e-5
    if params.top_k:
        assert np.count_nonzero(probs) <= params.top_k
    cdf = np.cumsum(probs, dtype=np.float64)
    sampler = ops.RowSampler(vocab, DRAWS)
    sampler.temperature[:] = params.temperature
    sampler.top_k[:] = params.top_k
    sampler.top_p[:] = params.top_p
    sampler.min_p[:] = params.min_p
    sampler.seed[:] = 9
    sampler.counter[:] = np.arange(DRAWS)
    sampler.run(np.tile(row, (DRAWS, 1)), 0, DRAWS)
    for counter, theirs in enumerate(sampler.token.tolist()):
        u = ops.sample_uniform(9, 0, counter)
        ours = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        if ours != theirs:
            assert np.min(np.abs(cdf - u * cdf[-1])) < 1e-5, (u, ours, theirs)


def test_greedy_has_no_distribution():
    with pytest.raises(ValueError, match="temperature > 0"):
        sampling_probs(np.zeros(4, np.float32), SamplingParams(temperature=0.0))
