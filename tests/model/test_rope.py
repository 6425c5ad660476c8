"""model/rope.py: the cos|sin tables of every rope_scaling kind against the
reference formulas (Llama 3.1's, transcribed; GGUF's frequency divisors) and
against transformers' own rope init functions and rotary embeddings (YaRN as
GPT-OSS configures it, longrope as Phi-3 does, short and long factors)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from armllm.model import rope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_llama3_inv_freq(theta, dim, factor, low, high, old_len):
    """Transcribed from the Llama 3.1 reference formula, independent of model/rope.py."""
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(freq)
        elif wavelen > old_len / low:
            out.append(freq / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


def test_llama3_scaling_table():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    table = rope.rope_cos_sin(1000, 128, theta=500000.0, scaling=scaling)
    inv = hf_llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    pos = np.arange(1000)[:, None]
    np.testing.assert_allclose(table[:, :64], np.cos(pos * inv), atol=2e-7)
    np.testing.assert_allclose(table[:, 64:], np.sin(pos * inv), atol=2e-7)
    # all three regimes are exercised: unscaled, scaled, smoothed
    plain = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    ratio = inv / plain
    assert np.any(ratio == 1.0) and np.any(np.isclose(ratio, 1 / 8)) and \
        np.any((ratio > 1 / 8 + 1e-9) & (ratio < 1 - 1e-9))


def test_linear_scaling_and_bad_scaling():
    linear = rope.rope_cos_sin(10, 8, scaling={"rope_type": "linear", "factor": 2.0})
    plain = rope.rope_cos_sin(10, 8)
    # linear scaling by 2 at position 2p is no scaling at position p
    np.testing.assert_allclose(linear[[0, 2, 4, 6, 8]], plain[[0, 1, 2, 3, 4]], atol=1e-7)
    with pytest.raises(ValueError, match="yarn rope_scaling needs original_max_position"):
        rope.rope_cos_sin(10, 8, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="longrope short_factor: rope_scaling has no"):
        rope.rope_cos_sin(10, 8, scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'dynamic'"):
        rope.rope_cos_sin(10, 8, scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="rot_dim"):
        rope.rope_cos_sin(10, 7)


def test_gguf_frequency_factors():
    factors = np.linspace(1.0, 8.0, 4)
    table = rope.rope_cos_sin(50, 8, theta=10000.0,
                              scaling={"rope_type": "freq_factors", "factors": factors})
    inv = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8) / factors
    pos = np.arange(50)[:, None]
    np.testing.assert_allclose(table[:, :4], np.cos(pos * inv), atol=2e-7)
    np.testing.assert_allclose(table[:, 4:], np.sin(pos * inv), atol=2e-7)
    with pytest.raises(ValueError, match="freq_factors must be 4 positive values"):
        rope.rope_cos_sin(5, 8, scaling={"rope_type": "freq_factors", "factors": [1.0, 2.0]})


def test_yarn_table_matches_transformers():
    """GPT-OSS's real YaRN parameters (theta 150000, factor 32 over 4096, untruncated):
    the frequencies and attention factor equal transformers' rotary embedding's, and
    the cos|sin table its output where float32 angles are exact enough to compare
    (transformers multiplies positions in float32: at 100K its angles are 1e-2 off)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cfg = transformers.GptOssConfig(head_dim=64, hidden_size=64, num_attention_heads=1,
                                    max_position_embeddings=131072)
    cfg.rope_parameters["rope_theta"] = theta = 150000.0
    scaling = dict(cfg.rope_parameters)
    embedding = GptOssRotaryEmbedding(cfg)
    np.testing.assert_allclose(rope.inv_freq(64, theta, scaling), embedding.inv_freq.numpy(),
                               rtol=1e-6)
    assert abs(rope.attention_factor(scaling) - embedding.attention_scaling) < 1e-12
    pos = torch.tensor([[0, 1, 7, 100, 1000]])
    cos, sin = embedding(torch.zeros(1, dtype=torch.float32), pos)
    table = rope.rope_cos_sin(2048, 64, theta, scaling)
    np.testing.assert_allclose(table[pos[0].numpy(), :32], cos[0].numpy(), atol=1e-4)
    np.testing.assert_allclose(table[pos[0].numpy(), 32:], sin[0].numpy(), atol=1e-4)


# ------------------------------------------------------------------ longrope

ORIGINAL_CONTEXT, EXTENDED_CONTEXT = 4096, 131072   # Phi-3-mini-128k's


def phi3_longrope(head_dim: int, theta: float, short: list[float], long: list[float],
                  max_position_embeddings: int = EXTENDED_CONTEXT, **scaling_extra):
    """(transformers' Phi3Config, the rope_scaling dict armllm reads) of one longrope
    configuration, written as Phi-3's config.json has it (original context outside
    rope_scaling; transformers moves it in)."""
    cfg = transformers.Phi3Config(
        hidden_size=head_dim, num_attention_heads=1, rope_theta=theta,
        max_position_embeddings=max_position_embeddings,
        original_max_position_embeddings=ORIGINAL_CONTEXT,
        rope_scaling={"rope_type": "longrope", "short_factor": short, "long_factor": long,
                      **scaling_extra})
    return cfg, dict(cfg.rope_parameters)


def hf_longrope(cfg, long_factors: bool) -> tuple[np.ndarray, float]:
    """(inv_freq float32, attention factor) of transformers' longrope init function, with
    a sequence length that picks the long factors or the short ones."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    seq_len = ORIGINAL_CONTEXT + 1 if long_factors else None
    inv_freq, gain = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu", seq_len=seq_len)
    return inv_freq.numpy(), gain


@pytest.mark.parametrize("long_factors", [False, True])
def test_longrope_table_equals_transformers(long_factors):
    """Every position of the table (into the extended context) equals the cos and sin
    transformers' rotary embedding builds from its longrope init function, to 1e-6:
    theta and factors are powers of two, so that transformers' float32 frequencies
    and angles are exact and both compute the same angles."""
    cfg, scaling = phi3_longrope(8, 65536.0, short=[1.0, 2.0, 4.0, 8.0],
                                 long=[1.0, 4.0, 16.0, 64.0])
    inv_freq, gain = hf_longrope(cfg, long_factors)
    assert gain > 1   # 128K over 4K: sqrt(1 + ln 32 / ln 4096)
    max_pos = 2 * ORIGINAL_CONTEXT
    # as transformers' Phi3RotaryEmbedding.forward: float32 angles, cos and sin times
    # the attention scaling
    angles = torch.arange(max_pos, dtype=torch.float32)[:, None] * torch.from_numpy(inv_freq)
    want = (torch.cat([angles.cos(), angles.sin()], dim=1) * gain).numpy()
    table = rope.rope_cos_sin(max_pos, 8, 65536.0, scaling, long_factors=long_factors,
                              max_position_embeddings=EXTENDED_CONTEXT)
    np.testing.assert_allclose(table, want, rtol=0, atol=1e-6)
    other = rope.rope_cos_sin(max_pos, 8, 65536.0, scaling, long_factors=not long_factors,
                              max_position_embeddings=EXTENDED_CONTEXT)
    assert np.max(np.abs(other - table)) > 0.1   # the factors chosen matter


@pytest.mark.parametrize("long_factors", [False, True])
@pytest.mark.parametrize(("max_position_embeddings", "extra"), [
    (EXTENDED_CONTEXT, {}),                          # factor from the contexts' ratio
    (EXTENDED_CONTEXT, {"factor": 8.0}),             # the config's factor wins
    (EXTENDED_CONTEXT, {"attention_factor": 1.25}),  # the config's attention factor wins
    (ORIGINAL_CONTEXT, {}),                          # no extension: attention factor 1
])
def test_longrope_frequencies_and_attention_factor_equal_transformers(
        long_factors, max_position_embeddings, extra):
    """Phi-3-mini's shape (head_dim 96, theta 10000) with factors like its own: the
    frequencies equal transformers' (to its float32) and the attention factor exactly;
    the table holds cos and sin of them times that factor."""
    rng = np.random.default_rng(7)
    short = list(1.0 + np.sort(rng.uniform(0, 0.2, 48)))
    long = list(1.0 + np.sort(rng.uniform(0, 60.0, 48)))
    cfg, scaling = phi3_longrope(96, 10000.0, short, long, max_position_embeddings, **extra)
    want_freq, want_gain = hf_longrope(cfg, long_factors)
    freq = rope.inv_freq(96, 10000.0, scaling, long_factors=long_factors)
    np.testing.assert_allclose(freq, want_freq, rtol=1e-6)
    gain = rope.attention_factor(scaling, max_position_embeddings)
    assert gain == pytest.approx(want_gain, rel=1e-15, abs=0)
    table = rope.rope_cos_sin(300, 96, 10000.0, scaling, long_factors=long_factors,
                              max_position_embeddings=max_position_embeddings)
    angles = np.arange(300)[:, None] * freq
    np.testing.assert_allclose(table, np.hstack([np.cos(angles), np.sin(angles)]) * gain,
                               rtol=0, atol=1e-6)


def test_longrope_rejects_factors_of_the_wrong_length():
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 3,
               "original_max_position_embeddings": ORIGINAL_CONTEXT}
    rope.rope_cos_sin(4, 8, 10000.0, scaling)
    with pytest.raises(ValueError, match="longrope long_factor must be 4 positive values"):
        rope.rope_cos_sin(4, 8, 10000.0, scaling, long_factors=True)
