"""completion: what one completion's sampled tokens mean as output.

CompletionState decides whether a token ends the completion (EOS or a stop
token id, a stop string in the text, max_tokens, the end of the context) and
which text it adds; IncrementalDetokenizer turns the growing token list into
text deltas that never split a UTF-8 character. As in vLLM v1, stop strings
belong to detokenization: text that may be the start of a stop string is held
back until it is decided, so emitted text never holds a whole stop string."""
from __future__ import annotations

from typing import Any

from armllm.model.reasoning import CONTENT, HIDDEN, REASONING
from armllm.model.tokenizer import TextTokenizer
from armllm.sampling import SamplingParams

REPLACEMENT = "\ufffd"  # what a decoder emits for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Text deltas for a growing token list.

    Decodes a short window of recent tokens (so a multi-token character or a
    byte-fallback sequence is decoded whole) and holds back text while it ends
    in an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: list[int],
                 skip_special_tokens: bool = True):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids = list(prompt_ids[-6:])  # a little left context for merges like leading spaces
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        if full.endswith(REPLACEMENT) or len(full) <= len(prefix):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix):]

    def flush(self) -> str:
        """The text held back, as it decodes now (an incomplete character as U+FFFD),
        for a token run that has ended."""
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):]


class CompletionState:
    """One completion's stop conditions and the text not yet emitted.

    A token in the stop ids (EOS unless ignore_eos, and stop_token_ids) ends the
    completion with "stop" and adds no text; a stop string ends it with "stop" and
    is cut from the text with whatever follows; the max_tokens-th token, or the
    one that fills the context (max_model_len), ends it with "length". With a
    `router` (a reasoning model's completion: model/reasoning.py, GPT-OSS's
    harmony) only its CONTENT tokens add text; its REASONING tokens add
    reasoning text, decoded on their own; markers add neither. `last_route` is
    where the last token went; num_reasoning_tokens counts the REASONING ones, and
    at max_reasoning_tokens of them forced_token() ends the reasoning."""

    __slots__ = ("_detok", "_stop_ids", "_stop", "_hold", "_tokens_left", "_pending",
                 "_router", "_reasoning", "last_route", "num_reasoning_tokens",
                 "_budget", "_closing", "stop_string")

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: list[int],
                 params: SamplingParams, eos_token_ids: frozenset[int], max_model_len: int,
                 router: Any = None):
        skip = params.skip_special_tokens
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip)
        self._router = router
        self._reasoning = IncrementalDetokenizer(tokenizer, [], skip) if router else None
        self.last_route = CONTENT
        self.num_reasoning_tokens = 0   # the tokens routed to the reasoning
        self._budget = params.max_reasoning_tokens if router is not None else None
        self._closing: list[int] = []   # forced tokens still to come (the budget is spent)
        self.stop_string: str | None = None   # the stop string that ended the completion
        stop_ids = frozenset(params.stop_token_ids)
        self._stop_ids = stop_ids if params.ignore_eos else stop_ids | eos_token_ids
        self._stop = tuple(params.stop)
        # text that may be the start of a stop string: at most one character short of one
        self._hold = max(map(len, self._stop), default=1) - 1
        self._tokens_left = min(params.max_tokens, max_model_len - len(prompt_ids))
        self._pending = ""  # decoded text held back for stop strings

    @property
    def phase(self) -> str:
        """Where the completion stands: "content" (its answer), "reasoning", or
        "undecided" (the router's `opener` token would start reasoning)."""
        return CONTENT if self._router is None else self._router.phase

    @property
    def opener(self) -> int | None:
        return None if self._router is None else self._router.opener

    def forced_token(self) -> int | None:
        """The token the completion must take next, or None: once its reasoning has
        max_reasoning_tokens tokens, the router's closing tokens (</think>, or
        harmony's end of analysis and final header), one a step."""
        if not self._closing and self._budget is not None \
                and self.num_reasoning_tokens >= self._budget:
            self._closing = self._router.closing_ids() or []
        return self._closing[0] if self._closing else None

    def add(self, token: int) -> tuple[str, str, str | None]:
        """The text and the reasoning text the next sampled token releases, and the
        finish reason it causes (None: the completion goes on)."""
        self._tokens_left -= 1
        if self._closing:
            self._closing = self._closing[1:] if token == self._closing[0] else []
        if token in self._stop_ids:
            return self._release(self._pending + self._detok.flush()), self._end_reasoning(), \
                "stop"
        route = CONTENT if self._router is None else self._router.route(token)
        self.num_reasoning_tokens += route == REASONING
        reasoning = self._reasoning.add(token) if route == REASONING else self._end_reasoning()
        self.last_route = route
        text = self._pending + (self._detok.add(token) if route == CONTENT else "")
        if self._stop:
            found = [(at, stop) for stop in self._stop if (at := text.find(stop)) >= 0]
            if found:
                cut, self.stop_string = min(found)
                return self._release(text[:cut]), reasoning, "stop"
        if self._tokens_left <= 0:  # what is held back decodes as it is
            return (self._release(text + self._detok.flush()),
                    reasoning + self._end_reasoning(), "length")
        if not self._hold:
            return text, reasoning, None
        emit = max(len(text) - self._hold, 0)
        self._pending = text[emit:]
        return text[:emit], reasoning, None

    def flush(self) -> str:
        """The text held back, for a completion that ends for another reason (its
        structured output is complete)."""
        return self._release(self._pending + self._detok.flush())

    def _end_reasoning(self) -> str:
        """The reasoning text held back, once the reasoning has ended."""
        if self.last_route != REASONING:
            return ""
        self.last_route = HIDDEN
        return self._reasoning.flush()

    def _release(self, text: str) -> str:
        self._pending = ""
        return text
