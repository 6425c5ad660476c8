"""proposer: the interface every speculative proposer implements.

Once per engine step, after the step's tokens are sampled, the engine calls
`propose` with one ProposeInput per generating sequence that ran in the step
(prefill chunks included, so a proposer that follows the target's hidden states
sees every position). Each input says how many draft tokens the engine wants
for the sequence's next step (k, 0: none) and the proposer answers with a Draft
of at most k tokens, which continue input.token_ids. The drafts are verified in
the next step; how many were kept shows in the next ProposeInput (token_ids
then holds only the kept ones and the target's own next token).

A draft token chosen deterministically (a lookup, a draft model's argmax) is a
point mass: its probs row is None. A draft token drawn at random from the
draft model's distribution q carries q (the whole vocabulary row), which
rejection sampling needs to keep the target's distribution exact."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:   # annotations only: the lookup proposers stay free of numpy
    import numpy as np

    from armllm.sampling import SamplingParams

SeqKey = tuple[str, int]   # Sequence.key: (request id, completion index)


@dataclass
class ProposeInput:
    key: SeqKey
    token_ids: list[int]       # prompt + every kept output token; when decoding, the last
                               # is the token just sampled (its KV not yet computed)
    num_prompt: int            # of which the prompt
    start: int                 # position of the first row this step computed and kept
    num_kept: int              # rows computed and kept this step: positions start..start+num_kept-1
    k: int                     # draft tokens wanted for the next step (0: none, only observe)
    params: SamplingParams     # the completion's sampling parameters
    # the target's last hidden states (after the final norm) of the kept rows,
    # [num_kept, hidden] float32, given only to a proposer whose wants_hidden is True
    hidden: np.ndarray | None = None


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)   # at most k, continuing token_ids
    # [len(tokens), vocab] float32: the distribution each token was drawn from
    # (None: every token a point mass, chosen deterministically)
    probs: np.ndarray | None = None


NO_DRAFT = Draft()


class Proposer(Protocol):
    """What the engine needs of a proposer."""

    # True: ProposeInput.hidden is filled (the runner keeps the target's last hidden
    # states of every kept row for it: MTP and EAGLE heads)
    wants_hidden: bool

    def propose(self, inputs: list[ProposeInput]) -> list[Draft]:
        """One Draft per input, in order (NO_DRAFT where k is 0 or nothing is found)."""

    def release(self, key: SeqKey, token_ids: list[int], finished: bool) -> None:
        """The sequence left the running set: finished (its tokens may feed a cache of
        recent outputs) or preempted (it comes back and is recomputed from its
        prompt: any draft state of it must go)."""

    @property
    def draft_seconds(self) -> float:
        """Measured seconds one propose call with drafts costs beyond bookkeeping (a
        draft model's forwards; 0 for lookups), which the controller weighs against
        the tokens it expects the drafts to save."""

    def close(self) -> None:
        """Releases what the proposer holds (a draft model's KV cache)."""
