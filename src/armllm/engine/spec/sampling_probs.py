"""sampling_probs: the whole distribution a random token is drawn from, as numpy
probabilities: what _kernels/sample.h defines for one logits row (temperature,
then top-k, then min-p and top-p on the candidates' softmax), where the kernel
only returns the token. A draft model's sampled drafts are drawn from it and
carry it (Draft.probs) for rejection sampling, which needs the exact
distribution each draft token came from."""
from __future__ import annotations

import numpy as np

from armllm.sampling import SamplingParams

# sample.h's ARMLLM_SAMPLE_EXP_CUT: a token more than this below the maximum (after the
# temperature) gets probability 0
EXP_CUT = 80.0
# sample.c's top-p shortcut: only tokens of p >= tau can be in the kept set once the
# tokens at or above tau hold top_p (+ a margin far above the rounding of the sums);
# tau starts at pmax * FLOOR_STEP and shrinks by that factor
TOP_P_FLOOR_STEP = 1e-3
TOP_P_MARGIN = 1e-9


def sampling_probs(row: np.ndarray, params: SamplingParams, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """The probabilities (float32, summing to 1) with which sample.h draws each token
    of the float32 logits row under params' temperature (> 0), top_k, top_p and min_p;
    written into `out` (as long as row) when given. The computation is sample.h's in
    float64 (its sums in numpy's order: equal up to rounding)."""
    if not params.temperature > 0:
        raise ValueError(f"sampling_probs needs a temperature > 0, got {params.temperature}")
    n = len(row)
    out = np.empty(n, np.float32) if out is None else out
    top_k = params.top_k
    if 0 < top_k < n:
        # the top_k largest, ties at the k-th value going to the lower ids
        kth = np.partition(row, n - top_k)[n - top_k]
        above = np.flatnonzero(row > kth)
        ties = np.flatnonzero(row == kth)[:top_k - len(above)]
        candidates = np.sort(np.concatenate([above, ties]))
    else:
        candidates = None
    x = (row if candidates is None else row[candidates]).astype(np.float64) / params.temperature
    d = x - x.max()
    p = np.where(d >= -EXP_CUT, np.exp(np.maximum(d, -EXP_CUT)), 0.0)
    p /= p.sum()
    keep = p >= params.min_p * p.max() if params.min_p > 0 else np.ones(len(p), bool)
    if params.top_p < 1.0:
        keep &= _top_p_set(p, params.top_p)
    q = np.where(keep, p, 0.0)
    q /= q.sum()
    out[:] = 0
    if candidates is None:
        out[:] = q
    else:
        out[candidates] = q
    return out


def _top_p_set(p: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of the highest p (ties: lower index first) whose sum, added in
    that order, reaches top_p (every token when rounding keeps it from doing so)."""
    pmax = p.max()
    tau = pmax * TOP_P_FLOOR_STEP
    while tau > 0 and p[p >= tau].sum() < top_p + TOP_P_MARGIN:
        tau = tau * TOP_P_FLOOR_STEP if tau > 1e-300 else 0.0
    heads = np.flatnonzero((p > 0) & (p >= tau))
    order = heads[np.argsort(-p[heads], kind="stable")]   # heads ascend: ties by index
    cum = np.cumsum(p[order])
    reached = np.flatnonzero(cum >= top_p)
    keep = np.zeros(len(p), bool)
    if len(reached):
        keep[order[:reached[0] + 1]] = True
    else:
        keep[:] = True
    return keep
