"""ngram: prompt lookup decoding (vLLM's `ngram` method, llama.cpp's lookup). For n
from prompt_lookup_max down to prompt_lookup_min, find the most recent earlier
occurrence of the sequence's last n tokens in its own prompt and output, and draft
the tokens that followed it (a match closer to the end than k tokens means the
sequence is repeating itself: the draft goes on repeating that period).

Per sequence, a dict maps every n-gram to the position just after its latest
occurrence. Each call adds only the tokens that are new since the previous one, so
a step costs O(new tokens), whatever the context length; a token list that does
not continue what was indexed (history.continues) is indexed afresh."""
from __future__ import annotations

from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.history import continues
from armllm.engine.spec.proposer import NO_DRAFT, Draft, ProposeInput, SeqKey


class _SeqIndex:
    """One sequence's n-grams: tuple of n tokens -> the position right after its
    latest occurrence that has a token after it (its continuation starts there)."""
    __slots__ = ("seen", "latest")

    def __init__(self):
        self.seen: list[int] = []           # the tokens indexed so far
        self.latest: dict[tuple[int, ...], int] = {}


class NgramProposer:
    """Drafts from the sequence's own history; no model, deterministic drafts."""

    wants_hidden = False

    def __init__(self, config: SpeculativeConfig):
        self._max_draft = config.num_speculative_tokens
        self._sizes = range(config.prompt_lookup_min, config.prompt_lookup_max + 1)
        self._indexes: dict[SeqKey, _SeqIndex] = {}

    @property
    def draft_seconds(self) -> float:
        return 0.0

    def propose(self, inputs: list[ProposeInput]) -> list[Draft]:
        return [self._propose_one(inp) for inp in inputs]

    def release(self, key: SeqKey, token_ids: list[int], finished: bool) -> None:
        self._indexes.pop(key, None)

    def close(self) -> None:
        self._indexes.clear()

    def _propose_one(self, inp: ProposeInput) -> Draft:
        token_ids = inp.token_ids
        index = self._indexes.get(inp.key)
        if index is None or not continues(token_ids, index.seen):
            index = self._indexes[inp.key] = _SeqIndex()
        self._add_new_tokens(index, token_ids)
        num_draft = min(inp.k, self._max_draft)
        if num_draft <= 0:
            return NO_DRAFT
        draft = self._lookup(index, token_ids, num_draft)
        return Draft(draft) if draft else NO_DRAFT

    def _add_new_tokens(self, index: _SeqIndex, token_ids: list[int]) -> None:
        seen, latest = index.seen, index.latest
        num_seen, length = len(seen), len(token_ids)
        if length == num_seen:
            return
        seen.extend(token_ids[num_seen:])
        smallest = self._sizes[0]
        # an n-gram ending at `end` is indexed once token `end` (its continuation's
        # first token) exists: the previous call indexed every end up to num_seen - 1
        for end in range(max(num_seen, smallest), length):
            for n in self._sizes:
                if n > end:
                    break
                latest[tuple(token_ids[end - n:end])] = end

    def _lookup(self, index: _SeqIndex, token_ids: list[int], num_draft: int) -> list[int]:
        length = len(token_ids)
        latest = index.latest
        for n in reversed(self._sizes):
            if n >= length:
                continue
            end = latest.get(tuple(token_ids[length - n:]))
            if end is not None:
                return continuation(token_ids, end, num_draft)
        return []


def continuation(token_ids: list[int], start: int, num_draft: int) -> list[int]:
    """The num_draft tokens that follow a match whose continuation begins at `start`.
    When the match is so recent that fewer than num_draft tokens follow it, the
    sequence is repeating with period len(token_ids) - start, and the draft goes on
    repeating that period (what the sequence itself would be if the repeat held)."""
    period = len(token_ids) - start
    if period >= num_draft:
        return token_ids[start:start + num_draft]
    repeats = -(-num_draft // period)     # ceil
    return (token_ids[start:] * repeats)[:num_draft]
