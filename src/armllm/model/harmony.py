"""harmony: the channels of GPT-OSS's output (OpenAI's harmony format).

A harmony completion is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>(reasoning)<|end|>
    <|start|>assistant<|channel|>final<|message|>(the answer)<|return|>

(a chat prompt ends with "<|start|>assistant", so the completion starts at its
first <|channel|>). Only the final channel is the answer: HarmonyRouter follows a
completion's token ids and routes each token's text to the answer, to the
reasoning (the analysis channel) or nowhere (headers, commentary), so that chat
content never holds the model's reasoning or a header. Text before any harmony
token (a plain completion prompt) is the answer.
"""
from __future__ import annotations

from dataclasses import dataclass

from armllm.model.reasoning import CONTENT, HIDDEN, REASONING
from armllm.model.tokenizer import TextTokenizer

FINAL_CHANNEL = "final"
ANALYSIS_CHANNEL = "analysis"


@dataclass(frozen=True)
class HarmonyTokens:
    start: int
    channel: int
    message: int
    end: int
    constrain: int | None


def harmony_tokens(tokenizer: TextTokenizer) -> HarmonyTokens | None:
    """The harmony special tokens of a tokenizer that has them all (o200k_harmony),
    else None."""
    ids = [tokenizer.token_id(t) for t in ("<|start|>", "<|channel|>", "<|message|>",
                                           "<|end|>")]
    if any(i is None for i in ids):
        return None
    return HarmonyTokens(*ids, tokenizer.token_id("<|constrain|>"))


class HarmonyRouter:
    """One completion's place in the harmony structure, as a reasoning router
    (model/reasoning.py): the final channel's body and plain text before any
    structure are CONTENT, the analysis channel's body REASONING, the rest
    (headers, commentary) HIDDEN. Its phase is "undecided" before any structure
    (the next token may open a channel, `opener`), "content" in a final message,
    "reasoning" elsewhere."""

    __slots__ = ("_t", "_tok", "_state", "_name")

    def __init__(self, tokens: HarmonyTokens, tokenizer: TextTokenizer):
        self._t, self._tok = tokens, tokenizer
        self._state = "text"       # text, header, channel, message, analysis, final
        self._name: list[int] = []

    @property
    def opener(self) -> int:
        return self._t.channel

    @property
    def phase(self) -> str:
        return {"text": "undecided", "final": CONTENT}.get(self._state, REASONING)

    def closing_ids(self) -> list[int] | None:
        """In an analysis message: its <|end|>, then a final message's header
        (<|start|>assistant<|channel|>final<|message|>); None elsewhere (a header, a
        call to a tool: those are not thinking)."""
        if self._state != "analysis":
            return None
        t, tok = self._t, self._tok
        return [t.end, t.start, *tok.encode("assistant", add_special_tokens=False),
                t.channel, *tok.encode(FINAL_CHANNEL, add_special_tokens=False), t.message]

    def route(self, token: int) -> str:
        t = self._t
        if token == t.channel:
            self._state, self._name = "channel", []
        elif token == t.message:
            name = self._tok.decode(self._name).split()
            channel = name[0] if name else ""
            self._state = {FINAL_CHANNEL: "final", ANALYSIS_CHANNEL: "analysis"}.get(
                channel, "message")
        elif token in (t.start, t.end, t.constrain):
            # a new message's header, or the end of one, or a content type
            self._state = "header"
        elif self._state == "channel":
            self._name.append(token)
        elif self._state in ("text", "final"):
            return CONTENT
        elif self._state == "analysis":
            return REASONING
        return HIDDEN
