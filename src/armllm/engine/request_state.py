"""request_state: what the engine keeps for each completion beside its Sequence
(which holds only what scheduling needs): how its sampled tokens become output,
its grammar's place, an embedding's pooling, and what its sampling keeps
(its seed, the ids its penalties read, its logit bias, DRY breakers and bad
words as arrays). LLMEngine
owns one RequestState per unfinished sequence, keyed by the sequence's key
(request id, completion index), and lends them to the runner each step."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from armllm.engine.completion import CompletionState
from armllm.engine.embedding import PoolState
from armllm.engine.structured import GrammarState

SeqKey = tuple[str, int]   # Sequence.key: (request id, completion index)


@dataclass(eq=False)
class RequestState:
    completion: CompletionState | None = None   # a generation's stop checks and text so far
    grammar: GrammarState | None = None         # a structured output's matcher
    pool: PoolState | None = None               # an embedding's pooling: it samples nothing
    # sampling (engine/sampler.py): the request's seed, or a random one drawn when the
    # completion first samples; its prompt and output ids for penalties (an int32 buffer,
    # the first history_len of them current); its logit bias as (ids, values) arrays
    seed: int | None = None
    history: np.ndarray | None = None
    history_len: int = 0
    bias: tuple[np.ndarray, np.ndarray] | None = None
    # its DRY breakers and bad words as sequence lists (engine/sample_words.py), or None
    breakers: np.ndarray | None = None
    bad_words: np.ndarray | None = None
    # an encoder-decoder's encoder input, kept until the sequence ends (a preempted
    # sequence runs its encoder again)
    encoder_input: np.ndarray | None = None
    # speculative decoding: the distributions the sequence's draft tokens were drawn
    # from, [drafts, vocab] (None: chosen deterministically)
    draft_probs: np.ndarray | None = None
