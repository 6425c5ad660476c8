"""tool_parsers: a chat completion's text split into content and tool calls, in
the formats models write them, whole or as it streams.

    hermes       Qwen2.5/Qwen3, Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    llama3_json  Llama 3.1/3.2: the answer is {"name": ..., "parameters": {...}} (calls
                 separated by ";"), else it is content
    mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (the marker is a
                 special token: its requests keep special tokens in their text)
    harmony      GPT-OSS: a message "to=functions.NAME" whose body is the arguments
                 (special tokens kept too; the parser also splits off the reasoning)
    qwen3_coder  Qwen3-Coder, Qwen3.5/3.6: <tool_call><function=NAME><parameter=KEY>
                 value</parameter>...</function></tool_call>, in server/qwen3_coder.py
                 (its arguments are built from the parameters, typed by their schemas)

The parsers are named in server/parsers.py's PARSERS (parsers.detect_parser reads
the name from a chat template); each is made with the request's tools.

A parser is fed the completion's text deltas and answers, for each, the content
to emit and OpenAI's tool-call deltas. A call is sent whole, once it has ended
and its arguments parse as a JSON object: one delta with its index, id, type,
name and arguments (the JSON text the model wrote). So a stream never carries
a call that later proves broken, and its calls are those of the same completion
parsed whole, however the text was cut. Text that might still begin a call
marker is held back until it is decided. Markup the parser cannot read as a
call (no name, arguments that are not a JSON object) stays content; a call the
completion's end cut off (`finish(cut=True)`: the token limit or an abort) is
dropped, and the finish reason says the output was cut.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass

ARGUMENT_KEYS = ("arguments", "parameters")
WHITESPACE = " \t\r\n"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def openai_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def mistral_call_id() -> str:
    """Mistral's templates accept tool call ids of exactly 9 letters and digits."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


class CallObject:
    """One call object {"name": "...", "arguments": ...} read as it arrives: where
    its name and its arguments' JSON text are, and where it ends. `bad` once the
    text cannot be such an object."""

    def __init__(self):
        self.text = ""
        self.name: str | None = None
        self.args_start = self.args_end = -1    # the arguments value's span in text
        self.end = -1                           # just past the closing brace
        self.bad = False
        self._i = 0
        self._depth = 0
        self._in_string = self._escape = False
        self._state = "open"                    # open, key, colon, value, next
        self._key = ""
        self._token_start = -1                  # the current key or value
        self._literal = False                   # a number/true/false/null value

    def feed(self, text: str) -> None:
        self.text += text
        while self._i < len(self.text) and self.end < 0 and not self.bad:
            self._step(self.text[self._i])
            self._i += 1

    @property
    def args_so_far(self) -> str:
        """The arguments' JSON text read so far (all of it once args_end is set)."""
        if self.args_start < 0:
            return ""
        return self.text[self.args_start:self.args_end if self.args_end >= 0 else self._i]

    def _step(self, ch: str) -> None:
        i = self._i
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
                if self._depth == 1:
                    self._string_ended(i)
            return
        if self._state == "open":
            if ch == "{":
                self._depth, self._state = 1, "key"
            elif ch not in WHITESPACE:
                self.bad = True
            return
        if self._literal and (ch in ",}" or ch in WHITESPACE):
            self._literal = False
            self._value_ended(i)
        if ch == '"':
            self._in_string = True
            if self._depth == 1:
                if self._state == "key":
                    self._token_start = i
                elif self._state == "value":
                    self._value_started(i)
        elif ch in "{[":
            if self._depth == 1 and self._state == "value":
                self._value_started(i)
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 1 and self._state == "value" and self._token_start >= 0:
                self._value_ended(i + 1)
            elif self._depth == 0:
                if self._state not in ("next", "key"):
                    self.bad = True
                self.end = i + 1
        elif self._depth == 1:
            if ch == ":" and self._state == "colon":
                self._state, self._token_start = "value", -1
            elif ch == "," and self._state == "next":
                self._state = "key"
            elif ch not in WHITESPACE:
                if self._state == "value" and self._token_start < 0:
                    self._value_started(i)
                    self._literal = True
                elif self._state != "value":
                    self.bad = True

    def _string_ended(self, i: int) -> None:
        if self._state == "key":
            self._key = json.loads(self.text[self._token_start:i + 1])
            self._state = "colon"
        elif self._state == "value":
            self._value_ended(i + 1)

    def _value_started(self, i: int) -> None:
        self._token_start = i
        if self._key in ARGUMENT_KEYS and self.args_start < 0:
            self.args_start = i

    def _value_ended(self, end: int) -> None:
        if self._key == "name" and self.name is None:
            value = json.loads(self.text[self._token_start:end])
            if isinstance(value, str):
                self.name = value
        if self._key in ARGUMENT_KEYS and self.args_start == self._token_start:
            self.args_end = end
        self._state, self._token_start = "next", -1


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of text that begins marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolParser(ABC):
    """One completion's text, split into content and tool calls (see the module
    docstring); subclasses say where calls start and how they follow each other."""

    new_id = staticmethod(openai_call_id)

    def __init__(self, tools: list[dict] | None = None):
        # the request's functions' parameter schemas, by name (OpenAI's tools list)
        self.functions: dict[str, dict] = {t["function"]["name"]: t["function"].get(
            "parameters") or {} for t in tools or []}
        self.calls: list[ToolCall] = []     # the calls read whole
        self.cut = False            # the completion's end cut it off (set by finish)
        self._buf = ""              # text not yet decided
        self._call: CallObject | None = None
        self._sent = 0              # calls whose delta is out

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """The content and tool-call deltas that `text` (the next delta) releases."""
        self._buf += text
        content: list[str] = []
        self._advance(content, final=False)
        return "".join(content), self._new_deltas()

    def finish(self, cut: bool = False) -> tuple[str, list[dict]]:
        """What is left once the completion has ended (cut: by its token limit or an
        abort): held-back text as content; a call the end cut off is dropped."""
        self.cut = cut
        content: list[str] = []
        self._advance(content, final=True)
        if self._call is not None:
            self._end_call(content)
        content.append(self._buf)
        self._buf = ""
        return "".join(content), self._new_deltas()

    def parse(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """A whole completion's content and calls."""
        content, _ = self.feed(text)
        rest, _ = self.finish(cut)
        return content + rest, self.calls

    def _new_deltas(self) -> list[dict]:
        """The calls read whole since last asked, as OpenAI's deltas."""
        deltas = [{"index": i, "id": call.id, "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}}
                  for i, call in enumerate(self.calls[self._sent:], self._sent)]
        self._sent = len(self.calls)
        return deltas

    def _add_call(self, name: str, arguments: str) -> bool:
        """Adds a call when its arguments are a JSON object's text (or a JSON string
        holding one, as some models write them); False, and no call, otherwise."""
        try:
            value = json.loads(arguments)
            if isinstance(value, str):
                arguments, value = value, json.loads(value)
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        self.calls.append(ToolCall(self.new_id(), name, arguments))
        return True

    # -- a call written as a JSON object -------------------------------------------------

    def _start_call(self) -> None:
        self._call = CallObject()

    def _feed_call(self) -> str | None:
        """Feeds the buffer to the current call; returns the text after the call once
        it has ended (None while it goes on)."""
        call = self._call
        call.feed(self._buf)
        self._buf = ""
        if call.bad or call.end >= 0:
            return call.text[call.end:] if call.end >= 0 else ""
        return None

    def _end_call(self, content: list[str]) -> bool:
        """Closes the current call; True when it was one: a whole object with a name and
        arguments that are a JSON object (none: {}). A call the end cut off is dropped;
        any other markup is content."""
        call, self._call = self._call, None
        if call.end < 0 and not call.bad and call.name is not None and self.cut:
            return False
        whole = call.end >= 0 and not call.bad and call.name is not None
        if whole and self._add_call(call.name, call.args_so_far if call.args_start >= 0
                                    else "{}"):
            return True
        content.append(self._marker_text + (call.text[:call.end] if call.end >= 0
                                            else call.text))
        return False

    _marker_text = ""   # the text that opened the current call, for content if it was not one

    def _all_content(self, content: list[str]) -> None:
        """What is buffered is content (nothing after it can be a call)."""
        content.append(self._buf)
        self._buf = ""

    def _past_marker(self, marker: str, content: list[str], final: bool) -> bool:
        """Moves the text before `marker` to content and drops the marker (True); with
        no marker, moves all the text but an end that may begin one (False)."""
        at = self._buf.find(marker)
        if at < 0:
            keep = 0 if final else _partial_suffix(self._buf, marker)
            content.append(self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        content.append(self._buf[:at])
        self._buf = self._buf[at + len(marker):]
        return True

    @abstractmethod
    def _advance(self, content: list[str], final: bool) -> None:
        """Moves what the buffer decides into content and calls (final: the text has
        ended, nothing is held back)."""


class HermesParser(ToolParser):
    """<tool_call>{...}</tool_call> blocks anywhere in the text."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _marker_text = OPEN

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._closing = False       # a call has ended: its </tool_call> may follow

    def _advance(self, content, final):
        while True:
            if self._closing:
                stripped = self._buf.lstrip(WHITESPACE)
                if stripped.startswith(self.CLOSE):
                    self._buf, self._closing = stripped[len(self.CLOSE):], False
                elif self.CLOSE.startswith(stripped) and not final:
                    return              # the closing tag may still come
                else:
                    self._closing = False
            if self._call is not None:
                rest = self._feed_call()
                if rest is None:
                    return
                self._closing = self._end_call(content)     # a call: its tag may follow
                self._buf = rest
                continue
            if not self._past_marker(self.OPEN, content, final):
                return
            self._start_call()


class Llama3JsonParser(ToolParser):
    """An answer that is a JSON object with a name (calls separated by ";"); any
    other answer is content."""

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._mode = "start"        # start, calls, content

    def _advance(self, content, final):
        while True:
            if self._mode == "content":
                self._all_content(content)
                return
            if self._call is not None:
                rest = self._feed_call()
                if rest is None:
                    return
                if not self._end_call(content):
                    self._mode = "content"
                    content.append(rest)
                    self._buf = ""
                    return
                self._buf, self._mode = rest, "between"
                continue
            stripped = self._buf.lstrip(WHITESPACE)
            if not stripped:
                if final:
                    content.append(self._buf)
                    self._buf = ""
                return
            if self._mode == "between":
                if stripped[0] == ";":
                    self._buf, self._mode = stripped[1:], "calls"
                    continue
                self._buf, self._mode = stripped, "content"
                continue
            if stripped[0] != "{":
                self._mode = "content"
                continue
            self._marker_text = self._buf[:len(self._buf) - len(stripped)]
            self._buf = stripped
            self._start_call()


class MistralParser(ToolParser):
    """[TOOL_CALLS] followed by a JSON array of call objects."""

    MARKER = "[TOOL_CALLS]"
    new_id = staticmethod(mistral_call_id)

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._mode = "text"         # text, array, between, rest

    def _advance(self, content, final):
        while True:
            if self._mode == "rest":    # after the array: nothing more is a call
                self._all_content(content)
                return
            if self._call is not None:
                rest = self._feed_call()
                if rest is None:
                    return
                self._end_call(content)
                self._buf, self._mode = rest, "between"
                continue
            if self._mode == "text":
                if not self._past_marker(self.MARKER, content, final):
                    return
                self._mode = "array"
                continue
            stripped = self._buf.lstrip(WHITESPACE)
            if not stripped:
                return
            expected = "[" if self._mode == "array" else ","
            if stripped[0] == expected:
                self._buf = stripped[1:]
                self._marker_text = ""
                self._start_call()
            else:           # "]" or anything else ends the calls
                self._buf = stripped[1:] if stripped[0] == "]" else stripped
                self._mode = "rest"


class HarmonyParser(ToolParser):
    """GPT-OSS's harmony output, read from its text with the special tokens kept:
    a message to a function (a header "to=functions.NAME") is a call whose body is
    its arguments, the analysis channel is reasoning (`take_reasoning`), the final
    channel and messages to no one are content, headers are dropped."""

    MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>",
               "<|call|>", "<|return|>")
    RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._state = "body"        # header or body
        self._kind = "content"      # the body's: content, reasoning, call, hidden
        self._header = ""
        self._reasoning: list[str] = []
        self._name, self._args = "", ""     # the call being read: its function, arguments

    def take_reasoning(self) -> str:
        """The reasoning text read since the last call."""
        text, self._reasoning = "".join(self._reasoning), []
        return text

    def _advance(self, content, final):
        self._read(content, final)
        if final and self._state == "body" and self._kind == "call":
            if self.cut:        # cut off: dropped
                self._kind = "hidden"
            else:               # GPT-OSS stops at <|call|>, an end token the text lacks
                self._end_body()

    def _read(self, content: list[str], final: bool) -> None:
        while self._buf:
            at = self._buf.find("<|")
            end = self._buf.find("|>", at) if at >= 0 else -1
            if at < 0 or end < 0:   # no whole marker: all text, less a marker's start
                keep = 0 if final or at < 0 else len(self._buf) - at
                if at < 0 and not final and self._buf.endswith("<"):
                    keep = 1
                self._text(self._buf[:len(self._buf) - keep], content)
                self._buf = self._buf[len(self._buf) - keep:]
                return
            self._text(self._buf[:at], content)
            marker, self._buf = self._buf[at:end + 2], self._buf[end + 2:]
            if marker not in self.MARKERS:
                self._text(marker, content)
            elif marker == "<|message|>":
                self._open_body()
            elif marker == "<|constrain|>" and self._state == "header":
                self._header += " "
            else:           # <|start|>, <|channel|>, <|end|>, <|call|>: a header (re)starts
                if self._state == "body" and self._kind == "call":
                    self._end_body()
                if marker != "<|channel|>" or self._state != "header":
                    self._header = ""
                self._state = "header"
                self._header += "<|channel|>" if marker == "<|channel|>" else ""

    def _open_body(self) -> None:
        header, self._state = self._header, "body"
        recipient = self.RECIPIENT.search(header)
        channel = header.split("<|channel|>", 1)[1].split()[:1] if "<|channel|>" in header \
            else []
        if recipient:
            self._kind, self._name, self._args = "call", recipient.group(1), ""
        elif channel == ["analysis"]:
            self._kind = "reasoning"
        else:               # final, or commentary to no one (a preamble): the answer
            self._kind = "content"

    def _end_body(self) -> None:
        """A call's body has ended: a call if its arguments are a JSON object."""
        self._add_call(self._name, self._args)
        self._kind = "hidden"

    def _text(self, text: str, content: list[str]) -> None:
        if not text:
            return
        if self._state == "header":
            self._header += text
        elif self._kind == "content":
            content.append(text)
        elif self._kind == "reasoning":
            self._reasoning.append(text)
        elif self._kind == "call":
            self._args += text
