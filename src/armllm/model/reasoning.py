"""reasoning: which of a completion's tokens are its reasoning, which its answer.

A reasoning model thinks before it answers; a reasoning parser (vLLM's name)
routes each output token to one of three places: CONTENT (the answer: text,
stop strings, structured-output grammars), REASONING (reasoning_content) or
HIDDEN (the markers between them). Routing follows token ids, not text, so a
"</think>" written inside an answer's string is not a marker.

    qwen3        <think> reasoning </think> answer: the model opens the block
                 itself, or the prompt leaves it open; a prompt that ends with a
                 closed, empty block (enable_thinking=false) answers at once
    deepseek_r1  reasoning </think> answer: the chat template opens the block,
                 so the output starts in it (a <think> the model writes anyway
                 is a marker too)
    harmony      GPT-OSS's channels (model/harmony.py): analysis is reasoning,
                 final is the answer, headers are markers; chosen for any model
                 whose tokenizer has the harmony tokens

A router also says where the completion stands (`phase`): "reasoning" (no
answer yet), "content", or "undecided" (the next token either opens a
reasoning block, `opener`, or starts the answer); and `closing_ids()`, the
tokens that end the reasoning from where it stands (a reasoning budget forces
them: engine/completion.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # EngineArgs reads REASONING_PARSERS without loading the tokenizer
    from armllm.model.tokenizer import TextTokenizer

CONTENT, REASONING, HIDDEN = "content", "reasoning", "hidden"
THINK_PARSERS = {"qwen3": False, "deepseek_r1": True}   # name -> the output starts inside
REASONING_PARSERS = (*THINK_PARSERS, "harmony")


@dataclass(frozen=True)
class ThinkTags:
    start: int          # <think>
    end: int            # </think>
    starts_open: bool   # the output starts inside the block (deepseek_r1)


def think_tags(tokenizer: TextTokenizer, parser: str) -> ThinkTags:
    """The marker ids of a <think> parser; a ValueError naming what the tokenizer
    lacks."""
    if parser not in THINK_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                         f"got {parser!r}")
    ids = [tokenizer.token_id(t) for t in ("<think>", "</think>")]
    if None in ids:
        raise ValueError(f"reasoning_parser {parser!r} needs the tokens <think> and </think>, "
                         "which this model's tokenizer does not have")
    return ThinkTags(*ids, THINK_PARSERS[parser])


class ThinkRouter:
    """One completion's place with respect to its <think> block."""

    __slots__ = ("_tags", "phase")

    def __init__(self, tags: ThinkTags, tokenizer: TextTokenizer, prompt_ids: list[int]):
        self._tags = tags
        last_start = _last_index(prompt_ids, tags.start)
        last_end = _last_index(prompt_ids, tags.end)
        if tags.starts_open or last_start > last_end:
            self.phase = REASONING        # the template opened the block
        elif last_end > last_start and not tokenizer.decode(prompt_ids[last_end + 1:]).strip():
            self.phase = CONTENT          # a closed block ends the prompt: no thinking
        else:
            self.phase = "undecided"

    @property
    def opener(self) -> int:
        return self._tags.start

    def closing_ids(self) -> list[int] | None:
        """</think> inside the block; None elsewhere."""
        return [self._tags.end] if self.phase == REASONING else None

    def route(self, token: int) -> str:
        if token == self._tags.start and self.phase != CONTENT:
            self.phase = REASONING
            return HIDDEN
        if token == self._tags.end and self.phase == REASONING:
            self.phase = CONTENT
            return HIDDEN
        if self.phase == "undecided":
            self.phase = CONTENT
        return REASONING if self.phase == REASONING else CONTENT


def _last_index(ids: list[int], token: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1
