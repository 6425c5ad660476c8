"""history: whether a sequence's token list still continues what a lookup proposer
has read of it. A proposer indexes only the tokens that are new since its previous
call; when the list does not continue (the key came back as another sequence, or
the engine rewrote its tail) the proposer starts that sequence's index afresh."""
from __future__ import annotations

from armllm.engine.spec.config import MAX_SPECULATIVE_TOKENS

# Tokens compared at the end of what was read. The engine only appends kept tokens;
# a rewrite can touch at most the rows one verify step wrote (1 + the most draft
# tokens), and a preempted sequence is released before it comes back. Comparing a
# window, not the whole context, keeps the check O(1) per step.
CHECK_WINDOW = MAX_SPECULATIVE_TOKENS + 1


def continues(token_ids: list[int], seen: list[int]) -> bool:
    """True when token_ids is `seen` followed by zero or more new tokens (checked
    on the last CHECK_WINDOW tokens of `seen`)."""
    num_seen = len(seen)
    if len(token_ids) < num_seen:
        return False
    window_start = max(0, num_seen - CHECK_WINDOW)
    return token_ids[window_start:num_seen] == seen[window_start:]
