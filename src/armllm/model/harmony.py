"""harmony: the channels of GPT-OSS's output (OpenAI's harmony format).

A harmony completion is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>(reasoning)<|end|>
    <|start|>assistant<|channel|>final<|message|>(the answer)<|return|>

(a chat prompt ends with "<|start|>assistant", so the completion starts at its
first <|channel|>). Only the final channel is the answer: HarmonyChannels follows
a completion's token ids and says which tokens' text belongs to it, so that chat
content never holds the analysis channel (the model's reasoning) or a header.
Text before any harmony token (a plain completion prompt) stays visible.
"""
from __future__ import annotations

from dataclasses import dataclass

from armllm.model.tokenizer import TextTokenizer

FINAL_CHANNEL = "final"


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


class HarmonyChannels:
    """One completion's place in the harmony structure: visible(token) says whether
    the token's text is the final channel's (or plain text before any structure)."""

    __slots__ = ("_t", "_tok", "_state", "_name")

    def __init__(self, tokens: HarmonyTokens, tokenizer: TextTokenizer):
        self._t, self._tok = tokens, tokenizer
        self._state = "text"       # text, header, channel, message, final
        self._name: list[int] = []

    def visible(self, token: int) -> bool:
        t = self._t
        if token == t.channel:
            self._state, self._name = "channel", []
        elif token == t.message:
            name = self._tok.decode(self._name).split()
            self._state = "final" if name and name[0] == FINAL_CHANNEL else "message"
        elif token in (t.start, t.end, t.constrain):
            # a new message's header, or the end of one, or a content type
            self._state = "header"
        elif self._state == "channel":
            self._name.append(token)
        else:
            return self._state in ("text", "final")
        return False
