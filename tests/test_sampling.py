"""SamplingParams' validation, and the numpy forms of the sampler's steps that
speculative decoding's rejection sampling uses (penalties, logit bias) against
their definitions. The sampler itself: tests/kernels/test_sample_rows.py (the
kernel against numpy), tests/engine/test_step_sampler.py (the engine's use of
it), tests/test_sampling_probs.py (its distribution)."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.sampling import SamplingParams, apply_bias, apply_penalties


def test_logit_bias_takes_json_keys_and_adds_in_float32():
    params = SamplingParams(logit_bias={"3": 2.5, 1: -100})
    assert params.logit_bias == {3: 2.5, 1: -100.0}
    row = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    apply_bias(row, params)
    assert row.tolist() == [np.float32(0.1), np.float32(0.2) + np.float32(-100.0),
                            np.float32(0.3), np.float32(0.4) + np.float32(2.5)]


def test_penalties_follow_their_definitions():
    row = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    apply_penalties(row, SamplingParams(repetition_penalty=2.0), [0], [1])
    assert np.allclose(row, [1.0, -4.0, 1.0, 0.5])
    row = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    apply_penalties(row, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [3],
                    [2, 2, 1])
    assert np.allclose(row, [2.0, -2.75, 0.0, 0.5])


@pytest.mark.parametrize("kw,match", [
    ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
    ({"temperature": -1.0}, "temperature must be in"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"top_k": -2}, "top_k must be"),
    ({"min_p": 1.5}, "min_p must be in"),
    ({"presence_penalty": 3.0}, "presence_penalty must be in"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\^64\)"),
    # beyond the sampler's uint64 (schemathesis found it through /v1/responses: a 500)
    ({"seed": 2**64}, r"seed must be an integer in \[0, 2\^64\)"),
    ({"stop": [""]}, "stop must be non-empty strings"),
    ({"logprobs": 50}, "logprobs must be an integer in"),
    ({"logit_bias": {5: 101}}, r"logit_bias values must be numbers in \[-100, 100\], got 101"),
    ({"logit_bias": {"a": 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {-3: 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": [1]}, "logit_bias must be a map"),
    ({"max_reasoning_tokens": -1}, "max_reasoning_tokens must be an integer >= 0"),
    # positive, but 0 in the sampler's float32 (schemathesis found it through a route)
    ({"repetition_penalty": 4.4e-303}, "repetition_penalty must be in"),
    ({"top_p": 1e-50}, "top_p must be in"),
    ({"max_reasoning_tokens": 1.5}, "max_reasoning_tokens must be an integer >= 0"),
])
def test_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)
