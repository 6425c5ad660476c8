"""sample_spec: sample.h's batched sampler written again in numpy, one row at a time and
as plainly as the definition reads (float32 where it says float, sequential float64
sums where it says double, a full sort where the kernel avoids one), for the tests to
hold the kernel to. The exp is the ref table's (the shared exp, tested on its own).
Bad words, DRY and XTC follow vLLM's and llama.cpp's definitions directly (DRY's
repeats by comparing suffixes, not the kernel's Z-algorithm)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from armllm import ops

BLOCK = 16
D_MIN = np.float32(-80.0)
MAX_LOGPROBS = 20
F32 = np.float32
F64 = np.float64
U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
MASK64 = (1 << 64) - 1


@dataclass
class RowParams:
    """One entry of the RowSampler's columns (and its history, bias and mask)."""
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0
    num_logprobs: int = -1
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    stream: int = 0
    counter: int = 0
    history: list[int] = field(default_factory=list)
    prompt_len: int = 0
    bias: list[tuple[int, float]] = field(default_factory=list)
    mask: np.ndarray | None = None  # int32 words of llguidance's bitmask
    bad_words: list[list[int]] | None = None
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = -1
    dry_breakers: list[list[int]] | None = None
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1


@dataclass
class RowResult:
    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray


def _mix(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> U64(30))
    z = z * U64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> U64(27))
    z = z * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def uniform(seed, stream, counter) -> np.ndarray:
    """The draws of arrays of (seed, stream, counter), in uint64 numpy arithmetic."""
    seed, stream, counter = (np.asarray(v, U64) for v in (seed, stream, counter))
    with np.errstate(over="ignore"):
        key = _mix(seed ^ _mix(stream + GOLDEN))
        x = _mix(key + (counter + U64(1)) * GOLDEN)
    return (x >> U64(11)).astype(F64) * 2.0**-53


def shared_exp(d: np.ndarray) -> np.ndarray:
    out = np.empty_like(d)
    return ops.kernels("ref").exp(np.ascontiguousarray(d, F32), out)


def e_values(x: np.ndarray, m: float, inv_t: float) -> np.ndarray:
    """e = d >= -80 ? exp(d) : 0, d = (x - m) * inv_t in float32."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = (x.astype(F32) - F32(m)) * F32(inv_t)
    keep = d >= D_MIN
    e = np.zeros(len(x), F32)
    if keep.any():
        e[keep] = shared_exp(d[keep])
    return e


def block_sums(v: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The block sums (float32 trees) of v under the floor, and their running sums
    in float64 (sequential: numpy's cumsum)."""
    blocks = -(-len(v) // BLOCK)
    w = np.zeros(blocks * BLOCK, F32)
    w[:len(v)] = np.where(v >= F32(floor), v, F32(0))
    w = w.reshape(blocks, BLOCK)
    s8 = w[:, :8] + w[:, 8:]
    s4 = s8[:, :4] + s8[:, 4:]
    s2 = s4[:, :2] + s4[:, 2:]
    sums = s2[:, 0] + s2[:, 1]
    return sums, np.cumsum(sums.astype(F64))


def running(values: np.ndarray, start: float = 0.0) -> np.ndarray:
    """start + v0, + v1, ... in float64, one addition at a time."""
    return np.cumsum(np.concatenate([[F64(start)], values.astype(F64)]))[1:]


def largest_first(x: np.ndarray) -> np.ndarray:
    """Ids ordered by x descending, NaN after every number, ties to the lower id."""
    nan = np.isnan(x)
    key = np.where(nan, F32(0), -x.astype(F64))
    return np.lexsort((np.arange(len(x)), key, nan))


def greedy(x: np.ndarray) -> int:
    if np.isnan(x).all():
        return 0
    return int(np.flatnonzero(x == np.nanmax(x))[0])


def _draw_blocks(e: np.ndarray, min_p: float, u: float) -> int:
    """The position drawn from e (the vocabulary's, or a list's) by the block walk."""
    kept = e >= F32(min_p)
    sums, cum = block_sums(e, min_p)
    target = u * cum[-1]
    hit = np.flatnonzero(cum > target)
    drawable = kept & (e > 0)
    if not len(hit):
        return int(np.flatnonzero(drawable)[-1])
    b = hit[0]
    lo, hi = b * BLOCK, min((b + 1) * BLOCK, len(e))
    at = np.arange(lo, hi)[drawable[lo:hi]]
    run = running(e[at], cum[b - 1] if b else 0.0)
    inside = np.flatnonzero(run > target)
    return int(at[inside[0]] if len(inside) else at[-1])


def _top_p(e: np.ndarray, kept: np.ndarray, total: float, top_p: float) -> np.ndarray:
    """Positions of the top-p set, ascending: a full sort of the kept e > 0."""
    cand = np.flatnonzero(kept & (e > 0))
    order = cand[np.argsort(-e[cand].astype(F64), kind="stable")]
    hit = np.flatnonzero(running(e[order]) >= F64(F32(top_p)) * total)
    return np.sort(order[:hit[0] + 1]) if len(hit) else cand


def sample_row(x: np.ndarray, p: RowParams) -> RowResult:
    """Row p's result for logits x (not modified)."""
    n = len(x)
    x = x.astype(F32).copy()
    if p.mask is not None:
        bits = np.unpackbits(np.asarray(p.mask, np.int32).view(np.uint8), bitorder="little")
        x[~bits[:n].astype(bool)] = -np.inf
    _ban_words(x, p)
    for i, v in p.bias:
        x[i] = x[i] + F32(v)
    raw = x.copy()
    top_ids = np.full(MAX_LOGPROBS, -1, np.int32)
    top_lp = np.full(MAX_LOGPROBS, np.nan, F32)
    lse = np.nan
    if p.num_logprobs >= 0:
        m = F32(np.nanmax(x)) if not np.isnan(x).all() else F32(-np.inf)
        with np.errstate(invalid="ignore", divide="ignore"):
            lse = F64(m) + np.log(block_sums(e_values(x, m, 1.0), 0.0)[1][-1])
        best = largest_first(x)[:p.num_logprobs]
        top_ids[:len(best)] = best
        with np.errstate(invalid="ignore"):
            top_lp[:len(best)] = (x[best].astype(F64) - lse).astype(F32)
    _penalize(x, p)
    _dry(x, p)
    token = _choose(x, p)
    with np.errstate(invalid="ignore"):
        logprob = F32(F64(raw[token]) - lse) if p.num_logprobs >= 0 else F32(np.nan)
    return RowResult(token, float(logprob), top_ids, top_lp)


def _ban_words(x: np.ndarray, p: RowParams) -> None:
    """vLLM's bad words: a word's last id is banned when the output ends with the rest."""
    output = list(p.history[p.prompt_len:])
    for word in p.bad_words or []:
        prefix = list(word[:-1])
        if len(prefix) <= len(output) and (not prefix or output[-len(prefix):] == prefix):
            x[word[-1]] = -np.inf


def dry_penalties(history: list[int], p: RowParams) -> dict[int, float]:
    """llama.cpp's DRY: token -> the float32 penalty subtracted from its logit."""
    if not (p.dry_multiplier > 0 and p.dry_last_n != 0):
        return {}
    w = list(history) if p.dry_last_n < 0 else list(history[-p.dry_last_n:]) \
        if p.dry_last_n <= len(history) else list(history)
    W, A = len(w), p.dry_allowed_length
    if W <= A:
        return {}
    breakers = [list(b) for b in p.dry_breakers or []]
    limit = W
    for i in range(W):   # the breaker nearest the end, its longest match
        tails = [len(b) - 1 for b in breakers
                 if b[0] == w[W - 1 - i] and len(b) - 1 <= i and w[W - i:W - i + len(b) - 1]
                 == b[1:]]
        if tails:
            limit = i - max(tails)
            break
    if limit < A:
        return {}
    longest: dict[int, int] = {}
    for j in range(W - 1):   # the longest suffix of the window that also ends at j
        length = 0
        while length < j + 1 and w[j - length] == w[W - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= A:
            longest[w[j + 1]] = max(longest.get(w[j + 1], -1), length)
    single = {b[0] for b in breakers if len(b) == 1}
    base = float(F32(p.dry_base))
    bound = int(88.7228391 / math.log(base)) if F32(p.dry_base) > F32(1.000001) else 0
    out = {}
    for t, length in longest.items():
        if t in single:
            continue
        e = length - A
        if bound > 0:
            e = min(e, bound)
        with np.errstate(over="ignore"):   # a penalty past float's range is inf, as in C
            out[t] = F32(float(F32(p.dry_multiplier)) * math.pow(base, e))
    return out


def _dry(x: np.ndarray, p: RowParams) -> None:
    for t, penalty in dry_penalties(p.history, p).items():
        x[t] = x[t] - penalty


def _xtc(e: np.ndarray, min_p: float, p: RowParams) -> np.ndarray:
    """llama.cpp's XTC over the kept e (their own uniform draw decides whether it runs):
    every kept token whose probability reaches the threshold goes but the least
    probable of them (the highest id among equals), when at least two reach it."""
    if not (F32(p.xtc_probability) > 0 and F32(p.xtc_threshold) <= F32(0.5)):
        return e
    u = float(uniform(p.seed, (p.stream + (4 << 32)) & MASK64, p.counter))
    if not u < float(F32(p.xtc_probability)):
        return e
    total = block_sums(e, min_p)[1][-1]
    kept = (e >= F32(min_p)) & (e > 0)
    above = np.flatnonzero(kept & (e.astype(F64) >= F64(F32(p.xtc_threshold)) * total))
    if len(above) < 2:
        return e
    least = above[np.lexsort((-above, e[above]))[0]]
    e = e.copy()
    e[above[above != least]] = 0
    return e


def _penalize(x: np.ndarray, p: RowParams) -> None:
    hist = np.asarray(p.history, np.int64)
    rp = F32(p.repetition_penalty)
    if rp != 1 and len(hist):
        for i in np.unique(hist):
            x[i] = x[i] / rp if x[i] > 0 else x[i] * rp
    pres, freq = F32(p.presence_penalty), F32(p.frequency_penalty)
    if (pres or freq) and len(hist) > p.prompt_len:
        ids, counts = np.unique(hist[p.prompt_len:], return_counts=True)
        for i, c in zip(ids, counts, strict=True):
            x[i] = x[i] - (pres + freq * F32(c))


def _choose(x: np.ndarray, p: RowParams) -> int:
    n = len(x)
    if not p.temperature > 0:
        return greedy(x)
    m = F32(np.nanmax(x)) if not np.isnan(x).all() else F32(-np.inf)
    if not np.isfinite(m):
        return greedy(x)
    with np.errstate(over="ignore"):
        inv_t = F32(1.0 / F64(F32(p.temperature)))
    inv_t = min(inv_t, F32(np.finfo(F32).max))
    u = float(uniform(p.seed, p.stream, p.counter))
    min_p = F32(p.min_p)
    ids = np.arange(n)
    if 0 < p.top_k < n:
        ids = np.sort(largest_first(np.where(np.isnan(x), F32(-np.inf), x))[:p.top_k])
    e = e_values(x[ids], m, inv_t)
    if F32(p.top_p) < 1:
        sel = _top_p(e, e >= min_p, block_sums(e, min_p)[1][-1], p.top_p)
        ids, e = ids[sel], e[sel]
    e = _xtc(e, min_p, p)
    return int(ids[_draw_blocks(e, min_p, u)])


def fill(sampler: ops.RowSampler, at: int, p: RowParams) -> None:
    """Writes row params p into entry `at` of sampler's columns."""
    for name in ("temperature", "top_p", "min_p", "top_k", "num_logprobs",
                 "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
                 "stream", "counter"):
        getattr(sampler, name)[at] = getattr(p, name)
    if p.history:
        sampler.set_history(at, np.asarray(p.history, np.int32), len(p.history), p.prompt_len)
    else:
        sampler.clear_history(at)
    if p.bias:
        sampler.set_bias(at, np.array([i for i, _ in p.bias], np.int32),
                         np.array([v for _, v in p.bias], F32))
    else:
        sampler.clear_bias(at)
    for name in ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_last_n",
                 "xtc_probability", "xtc_threshold"):
        getattr(sampler, name)[at] = getattr(p, name)
    if p.bad_words:
        sampler.set_bad_words(at, ops.sequence_list(p.bad_words))
    else:
        sampler.clear_bad_words(at)
    if p.dry_breakers:
        sampler.set_breakers(at, ops.sequence_list(p.dry_breakers))
    else:
        sampler.clear_breakers(at)
