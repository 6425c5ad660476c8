"""qwen3_coder: the XML tool calls of Qwen3-Coder, Qwen3.5/3.6 and Nemotron 3
Nano (vLLM's qwen3_coder, llama.cpp's Qwen3-Coder XML), read whole or as they
stream:

    optional text (content)
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A parameter's value is the text between its tags less one leading and one
trailing newline, typed by the function's JSON schema for that parameter
(`value_types`): a string stays text; any other type is read as JSON (a boolean
also as Python's True/False, which is how the chat templates write one back),
and stays text when it is not JSON; a union with string keeps the JSON value
only when it has one of the union's types; a parameter the schema does not
type is JSON when it parses, else text. A call's arguments are the JSON object
of its parameters (json.dumps' separators), sent once the call has ended.

A value ends at its </parameter>, or at the next tag when that is missing (so
no value holds one of these tags; the required-call grammar in server/tools.py
keeps them out). What models get wrong is read as far as it goes, never
raised: text between a call's parameters is dropped; a call missing
</function> ends at </tool_call> or at the end of the completion (its JSON
closed), unless that end cut it off (the token limit: then it is dropped); a
<tool_call> not followed by <function=NAME> is content; a <function=NAME>
without <tool_call> (Qwen3-Coder sometimes drops it) is a call
when NAME is one of the request's functions, else content. A call to a
function the request did not offer is still a call, as with the other parsers.
"""
from __future__ import annotations

import json
import re

from armllm.server.tool_parsers import WHITESPACE, ToolParser, _partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
BODY_TAGS = (PARAMETER, FUNCTION_END, CLOSE)        # what a call's body may hold next
VALUE_ENDS = (PARAMETER_END, *BODY_TAGS)            # where a value ends
NAME = re.compile(r"[^\s<>]+")          # a function's name
PARAM_NAME = re.compile(r"[^<>\n]+")    # a parameter's (a JSON schema's keys may hold spaces)
MAX_NAME = 128                          # a longer name without its ">" is not one


def value_types(schema) -> frozenset[str] | None:
    """The JSON types a parameter's schema allows ("type", else the types of its enum
    or const, else the union of its anyOf/oneOf branches); None when it does not say."""
    if not isinstance(schema, dict):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list) and declared:
        return frozenset(t for t in declared if isinstance(t, str))
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list) and values:
        return frozenset(json_type(v) for v in values)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches:
        types = [value_types(b) for b in branches]
        return None if None in types else frozenset().union(*types)
    return None


def json_type(value) -> str:
    """The JSON Schema type of a value json.loads gave."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), "null")


def convert(text: str, types: frozenset[str] | None):
    """A parameter's text as the value its types say (see the module docstring)."""
    if types == {"string"}:
        return text
    try:
        value = json.loads(text, parse_constant=_not_json)
    except ValueError:
        if types is not None and "boolean" in types and text in ("True", "False"):
            return text == "True"
        return text
    if types is None:
        return value
    kind = json_type(value)
    fits = kind in types or (kind == "integer" and "number" in types)
    return value if fits or "string" not in types else text


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


class Qwen3CoderParser(ToolParser):
    """<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>
    blocks anywhere in the text."""

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._mode = "text"         # text, body, parameter, value, closing
        self._properties: dict = {}  # the current call's parameter schemas
        self._params = 0            # the current call's parameters begun
        self._types: frozenset[str] | None = None   # the current value's
        self._value = ""            # the current value read so far (unless streamed)
        self._lead = True           # the current value's leading newline is still to come
        self._name, self._args = "", ""     # the current call's function and arguments

    def _advance(self, content, final):
        step = {"text": self._text, "body": self._body, "parameter": self._parameter,
                "value": self._read_value, "closing": self._closing}
        while step[self._mode](content, final):
            pass

    # -- outside calls -------------------------------------------------------------------

    def _text(self, content, final) -> bool:
        """Content up to an opener; True once the text after it is to be read."""
        openers = (OPEN, FUNCTION) if self.functions else (OPEN,)
        found = [at for at in (self._buf.find(m) for m in openers) if at >= 0]
        if not found:
            keep = 0 if final else max(_partial_suffix(self._buf, m) for m in openers)
            content.append(self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        at = min(found)
        content.append(self._buf[:at])
        self._buf = self._buf[at:]
        return self._open(content, final)

    def _open(self, content, final) -> bool:
        """At an opener: starts a call, gives the opener to content when no call can
        follow (True either way), or waits for more text (False)."""
        wrapped = self._buf.startswith(OPEN)
        rest = self._buf[len(OPEN):].lstrip(WHITESPACE) if wrapped else self._buf
        known = self.functions if not wrapped else None    # a bare opener needs a known name
        if rest.startswith(FUNCTION):
            end = rest.find(">", len(FUNCTION))
            name = rest[len(FUNCTION):end if end >= 0 else len(rest)]
            if end >= 0 and NAME.fullmatch(name) and (known is None or name in known):
                self._buf = rest[end + 1:]
                self._start_call(name)
                return True
            maybe = (end < 0 and len(name) <= MAX_NAME and (not name or NAME.fullmatch(name))
                     and (known is None or any(f.startswith(name) for f in known)))
        else:
            maybe = FUNCTION.startswith(rest)
        if maybe and not final:
            return False
        marker = OPEN if wrapped else FUNCTION
        content.append(marker)
        self._buf = self._buf[len(marker):]
        return True

    def _start_call(self, name: str) -> None:
        self._name, self._args = name, ""
        properties = self.functions.get(name, {}).get("properties")
        self._properties = properties if isinstance(properties, dict) else {}
        self._params, self._mode = 0, "body"

    # -- inside a call -------------------------------------------------------------------

    def _body(self, content, final) -> bool:
        """Between parameters: the next tag, past any stray text."""
        self._buf = self._buf.lstrip(WHITESPACE)
        for tag, mode in ((PARAMETER, "parameter"), (FUNCTION_END, "closing"), (CLOSE, "text")):
            if self._buf.startswith(tag):
                self._buf = self._buf[len(tag):]
                if mode != "parameter":
                    self._close_call()
                self._mode = mode
                return True
        found = [at for at in (self._buf.find(t) for t in BODY_TAGS) if at >= 0]
        if found:                   # stray text: dropped
            self._buf = self._buf[min(found):]
            return True
        if final:
            self._buf = ""
            if not self.cut:        # a call missing its end tags ends with the text
                self._close_call()
            self._mode = "text"
            return False
        keep = max(_partial_suffix(self._buf, t) for t in BODY_TAGS)
        self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _parameter(self, content, final) -> bool:
        """<parameter= read: its name, up to ">"."""
        end = self._buf.find(">")
        name = self._buf[:end] if end >= 0 else self._buf
        maybe = len(name) <= MAX_NAME and (not name or PARAM_NAME.fullmatch(name))
        if end < 0 and maybe and not final:
            return False
        self._mode = "body"
        if end < 0 or not PARAM_NAME.fullmatch(name):
            return True             # not a parameter: stray text
        self._buf = self._buf[end + 1:]
        self._types = value_types(self._properties[name]) if name in self._properties else None
        key = ("{" if self._params == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        self._emit(key + ('"' if self._streams else ""))
        self._params, self._value, self._lead, self._mode = self._params + 1, "", True, "value"
        return True

    @property
    def _streams(self) -> bool:
        """Whether the current value is text, sent as it arrives."""
        return self._types == {"string"}

    def _read_value(self, content, final) -> bool:
        if self._lead:
            if not self._buf and not final:
                return False
            self._buf = self._buf.removeprefix("\n")
            self._lead = False
        found = [at for at in (self._buf.find(t) for t in VALUE_ENDS) if at >= 0]
        if not found and not final:    # hold back what may begin an end tag or be its newline
            keep = max(_partial_suffix(self._buf, t) for t in VALUE_ENDS)
            if self._buf[:len(self._buf) - keep].endswith("\n"):
                keep += 1
            self._take(self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        at = min(found) if found else len(self._buf)
        text = self._buf[:at]
        self._take(text[:-1] if text.endswith("\n") else text)
        self._buf = self._buf[at:].removeprefix(PARAMETER_END)
        if self._streams:
            self._emit('"')
        else:
            self._emit(json.dumps(convert(self._value, self._types), ensure_ascii=False))
        self._mode = "body"
        return True

    def _take(self, text: str) -> None:
        if self._streams:
            if text:
                self._emit(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self._value += text

    def _closing(self, content, final) -> bool:
        """After </function>: its </tool_call>, if it follows."""
        stripped = self._buf.lstrip(WHITESPACE)
        if stripped.startswith(CLOSE):
            self._buf = stripped[len(CLOSE):]
        elif CLOSE.startswith(stripped) and not final:
            return False
        self._mode = "text"
        return True

    def _close_call(self) -> None:
        self._emit("}" if self._params else "{}")
        self._add_call(self._name, self._args)

    def _emit(self, fragment: str) -> None:
        """The next fragment of the current call's arguments."""
        self._args += fragment
