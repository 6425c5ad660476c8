"""verify: keeping a draft token exactly when the target model would have chosen it.

A verify step gives a drafting sequence a logits row for its last token and one
for each draft token. Each row is prepared as for any token (grammar mask,
logits processors, logit bias, penalties over the output so far with the
drafts before it taken as kept), then, left to right:

- greedy, or a draft chosen deterministically (a point mass: n-gram, suffix,
  self-draft and MTP proposals, a draft model's greedy or seeded drafts): the
  target draws its token exactly as it would without speculation, with the
  same uniform draw (the row's output position picks it, engine/sampler.py),
  and the draft is kept when they agree. That is rejection sampling (Leviathan
  et al. 2023, Chen et al. 2023) with q a point mass: the draft d is kept with
  probability p(d), otherwise the token is drawn from p without d,
  renormalized; both pick each token with probability p. Greedy and seeded
  output is then token for token the output without speculation. The engine's
  batched sampler does these rows with all the others (StepSampler._collect);
- a draft token x drawn from the draft's distribution q (a draft model's
  unseeded sampling): kept with probability min(1, p(x) / q(x)); otherwise
  the token is drawn from max(p - q, 0), renormalized (verify_drawn). The
  emitted token is distributed as p, whatever q is.

Either way the emitted token is the target's: when the draft is rejected, the
verifying row's token replaces it and the rest of the draft is dropped; when
every draft token is kept, the row after the last gives one more token."""
from __future__ import annotations

import numpy as np

from armllm import ops
from armllm.sampling import (
    SampleResult,
    SamplingParams,
    apply_bias,
    apply_penalties,
    raw_logprobs,
    sampling_probs,
)

# the uniform streams of a drawn draft's test and of its residual draw: apart from
# every completion's own (its index, below 2^32)
ACCEPT_STREAM = 1 << 32
RESIDUAL_STREAM = 2 << 32


def verify_drawn(row: np.ndarray, params: SamplingParams, prompt_ids: list[int],
                 output_ids: list[int], mask: np.ndarray | None, draft_token: int | None,
                 draft_probs: np.ndarray | None, seed: int, stream: int, counter: int
                 ) -> tuple[SampleResult, bool]:
    """The target's token at one position (its float32 logits row, modified in place)
    and whether it accepts draft_token, drawn from draft_probs (q); draft_token None:
    the row after a fully kept draft, drawn from p. output_ids: the completion's
    output before this position; mask: its grammar's bitmask words or None. The
    draws are ops.sample_uniform's for (seed, stream, counter) on streams of their
    own."""
    for processor in params.logits_processors:
        processor(output_ids, row)
    if mask is not None:
        ops.mask_logits(row, mask)
    apply_bias(row, params)
    raw = raw_logprobs(row) if params.logprobs is not None else None
    apply_penalties(row, params, prompt_ids, output_ids)
    p = sampling_probs(row, params).astype(np.float64)
    if draft_token is not None:
        q = float(draft_probs[draft_token])
        u = ops.sample_uniform(seed, stream + ACCEPT_STREAM, counter)
        if q > 0 and u * q < p[draft_token]:    # u < p(x) / q(x)
            return with_logprobs(draft_token, params, raw), True
        residual = np.maximum(p - draft_probs, 0.0)
        total = residual.sum()
        if total <= 0:   # p == q: nothing is left over, and p itself is the residual
            residual, total = p, 1.0
    else:
        residual, total = p, p.sum()
    cdf = np.cumsum(residual)
    u = ops.sample_uniform(seed, stream + RESIDUAL_STREAM, counter)
    token = int(min(np.searchsorted(cdf, u * total, side="right"), len(cdf) - 1))
    return with_logprobs(token, params, raw), False


def with_logprobs(token: int, params: SamplingParams, raw: np.ndarray | None) -> SampleResult:
    """The SampleResult of a chosen token, with the log-probabilities asked for."""
    if raw is None:
        return SampleResult(token)
    top = []
    if params.logprobs:
        best = np.lexsort((np.arange(len(raw)), -raw))[:params.logprobs]
        top = [(int(t), float(raw[t])) for t in best]
    return SampleResult(token, float(raw[token]), top)
