"""verify: keeping a draft token exactly when the target model would have chosen it.

One verified position at a time, left to right: the target's logits row at the
position is prepared as for any token (grammar mask, logits processors,
penalties over the output so far), then

- greedy: the target's argmax is the token; the draft token is accepted when
  it is that token;
- a draft token chosen deterministically (a point mass): the target draws its
  token as it would without speculation, with the same one draw of the
  sequence's generator, and the draft is accepted when they agree. That is
  rejection sampling (Leviathan et al. 2023, Chen et al. 2023) with q a point
  mass: the draft d is kept with probability p(d), otherwise the token is drawn
  from p without d, renormalized; both pick each token with probability p.
  Seeded output is then token for token the output without speculation;
- a draft token x drawn from the draft's distribution q: kept with probability
  min(1, p(x) / q(x)); otherwise the token is drawn from max(p - q, 0),
  renormalized. The emitted token is distributed as p, whatever q is.

Either way the emitted token is the target's: when the draft is rejected, the
verifying row's token replaces it and the rest of the draft is dropped; when
every draft token is kept, the row after the last gives one more token."""
from __future__ import annotations

import numpy as np

from armllm.sampling import (
    SampleResult,
    SamplingParams,
    choose_token,
    prepare_row,
    sampling_probs,
    with_logprobs,
)


def verify_row(row: np.ndarray, params: SamplingParams, rng: np.random.Generator,
               prompt_ids: list[int], output_ids: list[int], draft_token: int | None,
               draft_probs: np.ndarray | None, scratch: np.ndarray | None = None
               ) -> tuple[SampleResult, bool]:
    """The target's token at one position (its logits row, modified in place, with
    any grammar mask already applied) and whether it accepts draft_token (None: no
    draft at this position, the bonus row after a fully accepted draft).
    draft_probs: the distribution q the draft token was drawn from (None: a point
    mass). output_ids: the completion's output before this position."""
    raw_logprobs = prepare_row(row, params, prompt_ids, output_ids)
    if draft_token is None or draft_probs is None or params.greedy:
        token = choose_token(row, params, rng, scratch)
        return with_logprobs(token, params, raw_logprobs), token == draft_token
    p = sampling_probs(row, params)
    q = float(draft_probs[draft_token])
    if q > 0 and rng.random() * q < p[draft_token]:    # u < p(x) / q(x)
        return with_logprobs(draft_token, params, raw_logprobs), True
    residual = np.maximum(p - draft_probs, 0.0)
    total = residual.sum()
    if total <= 0:   # p == q: nothing is left over, and p itself is the residual
        residual, total = p, 1.0
    cdf = np.cumsum(residual)
    token = int(min(np.searchsorted(cdf, rng.random() * total, side="right"), len(cdf) - 1))
    return with_logprobs(token, params, raw_logprobs), False
