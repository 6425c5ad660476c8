"""rope: the cos|sin table rotary position embeddings read, for every scaling kind.

Owns the rotary frequencies of each `rope_scaling` kind armllm runs, as Hugging
Face's transformers computes them (modeling_rope_utils): default, linear, llama3
(Llama 3.1), yarn (with DeepSeek's mscale), longrope (Phi-3: short or long
per-frequency factors), and GGUF's freq_factors (llama.cpp's rope_freqs tensor);
and the attention factor yarn and longrope scale cos and sin by. The model builds
its table once at load; the RoPE kernel (ops.rope) reads it. Frequencies and
angles are computed in float64, the table stored as float32.
"""
from __future__ import annotations

import math

import numpy as np

ROPE_CHUNK = 4096   # positions of rope_cos_sin's table computed at a time

SUPPORTED_KINDS = ("default", "linear", "llama3", "yarn", "longrope", "freq_factors")


def rope_cos_sin(max_pos: int, rot_dim: int, theta: float = 10000.0,
                 scaling: dict | None = None, *, long_factors: bool = False,
                 max_position_embeddings: int | None = None) -> np.ndarray:
    """The (max_pos, rot_dim) table the RoPE kernel reads: per position, the cos of
    its rot_dim / 2 angles, then their sin, times the kind's attention factor.

    scaling follows Hugging Face's rope_scaling: None, {"rope_type": "linear",
    "factor"}, {"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}, {"rope_type": "yarn",
    "factor", "original_max_position_embeddings", optional "beta_fast", "beta_slow",
    "truncate", "attention_factor", "mscale", "mscale_all_dim"} or {"rope_type":
    "longrope", "short_factor", "long_factor" (rot_dim / 2 divisors each),
    "original_max_position_embeddings", optional "factor", "attention_factor"}; or
    GGUF's {"rope_type": "freq_factors", "factors": [...]} (rot_dim / 2 divisors).

    long_factors: longrope's long_factor rather than short_factor. The caller
    chooses: long when the context it serves exceeds original_max_position_embeddings
    (as llama.cpp does); transformers switches per forward on the sequence's length.
    max_position_embeddings: the model's extended context, whose ratio to
    original_max_position_embeddings is longrope's scale factor when scaling gives
    no "factor" (default max_pos).
    """
    if max_pos < 1:
        raise ValueError(f"max_pos must be >= 1, got {max_pos}")
    freqs = inv_freq(rot_dim, theta, scaling, long_factors=long_factors)
    gain = attention_factor(scaling, max_position_embeddings or max_pos)
    table = np.empty((max_pos, rot_dim), np.float32)
    # positions a chunk at a time: a 128K-position table's float64 temporaries would be
    # several times the table, at the end of loading a model
    for p0 in range(0, max_pos, ROPE_CHUNK):
        angles = np.arange(p0, min(p0 + ROPE_CHUNK, max_pos), dtype=np.float64)[:, None] \
            * freqs[None, :]
        table[p0:p0 + ROPE_CHUNK, :rot_dim // 2] = np.cos(angles) * gain
        table[p0:p0 + ROPE_CHUNK, rot_dim // 2:] = np.sin(angles) * gain
    return table


def inv_freq(rot_dim: int, theta: float, scaling: dict | None = None, *,
             long_factors: bool = False) -> np.ndarray:
    """The rot_dim / 2 rotary frequencies (radians per position, float64) of the
    scaling kind (see rope_cos_sin)."""
    if rot_dim < 2 or rot_dim % 2:
        raise ValueError(f"rot_dim must be even and >= 2, got {rot_dim}")
    if not theta > 0:
        raise ValueError(f"theta must be > 0, got {theta}")
    base = 1.0 / theta ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    kind = rope_kind(scaling)
    if kind == "default":
        return base
    if kind == "longrope":   # its own per-frequency divisors, no single factor
        key = "long_factor" if long_factors else "short_factor"
        return base / _divisors(scaling, key, len(base), f"longrope {key}")
    if kind == "freq_factors":  # GGUF rope_freqs: one divisor per frequency (llama.cpp)
        return base / _divisors(scaling, "factors", len(base), "freq_factors")
    factor = float(scaling.get("factor", 1.0))
    if not factor > 0:
        raise ValueError(f"rope_scaling factor must be > 0, got {factor}")
    if kind == "linear":
        return base / factor
    if kind == "yarn":
        return _yarn_inv_freq(base, scaling, theta, factor)
    if kind == "llama3":
        return _llama3_inv_freq(base, scaling, factor)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: "
                     f"{', '.join(SUPPORTED_KINDS)})")


def attention_factor(scaling: dict | None, max_position_embeddings: int | None = None
                     ) -> float:
    """The factor the kind scales cos and sin by (1 but for yarn and longrope): the
    config's attention_factor when it gives one; else for yarn 0.1 ln(factor) + 1
    (with DeepSeek's mscale ratio), for longrope sqrt(1 + ln(factor) / ln(original
    context)), factor being the config's or max_position_embeddings over the
    original context (1 when factor <= 1)."""
    kind = rope_kind(scaling)
    if kind not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    if kind == "yarn":
        factor = float(scaling.get("factor", 1.0))
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
        return _yarn_mscale(factor)
    old_len = _original_context(scaling, kind)
    factor = scaling.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError("longrope rope_scaling without a factor needs the model's "
                             "max_position_embeddings")
        factor = max_position_embeddings / old_len
    factor = float(factor)
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_len))


def rope_kind(scaling: dict | None) -> str:
    """The scaling's kind: its rope_type (older configs: type), "default" without one."""
    return scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"


def _original_context(scaling: dict, kind: str) -> float:
    if "original_max_position_embeddings" not in scaling:
        raise ValueError(f"{kind} rope_scaling needs original_max_position_embeddings, got "
                         f"{sorted(scaling)}")
    return float(scaling["original_max_position_embeddings"])


def _divisors(scaling: dict, key: str, n: int, what: str) -> np.ndarray:
    """scaling[key]: n positive per-frequency divisors (`what`, for errors)."""
    if key not in scaling:
        raise ValueError(f"rope {what}: rope_scaling has no {key}, got {sorted(scaling)}")
    factors = np.asarray(scaling[key], dtype=np.float64)
    if factors.shape != (n,) or not np.all(factors > 0):
        raise ValueError(f"rope {what} must be {n} positive values, got shape "
                         f"{factors.shape}")
    return factors


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(base: np.ndarray, scaling: dict, theta: float, factor: float
                   ) -> np.ndarray:
    """YaRN (transformers' _compute_yarn_parameters): frequencies that turn fewer than
    beta_slow times over the original context are interpolated (/ factor), those
    turning more than beta_fast times kept, a linear ramp over the dimensions between."""
    dim = 2 * len(base)
    old_len = _original_context(scaling, "yarn")
    # transformers' defaults (the YaRN paper's alpha and beta)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # as transformers: no division by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    return base / factor * ramp + base * (1 - ramp)


def _llama3_inv_freq(base: np.ndarray, scaling: dict, factor: float) -> np.ndarray:
    """Llama 3.1: wavelengths shorter than the original context / high_freq_factor kept,
    longer than it / low_freq_factor interpolated (/ factor), smoothed between."""
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    if not high > low:
        raise ValueError(f"llama3 rope_scaling needs high_freq_factor > low_freq_factor, "
                         f"got {high} and {low}")
    wavelen = 2 * math.pi / base
    smooth = (old_len / wavelen - low) / (high - low)
    medium = (1 - smooth) * base / factor + smooth * base
    return np.where(wavelen < old_len / high, base,
                    np.where(wavelen > old_len / low, base / factor, medium))
