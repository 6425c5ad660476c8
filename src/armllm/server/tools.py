"""tools: a chat request's OpenAI tools: checked where they enter (tools,
tool_choice, parallel_tool_calls, whose default is whether the model's chat
template writes back two calls of one turn), handed to the chat template as
transformers' apply_chat_template(tools=...) does, enforced by a grammar when a
call is required (tool_choice "required" or a named function: the output must
be calls, in the model's format, to those functions with arguments that match
their parameters' JSON schemas) or when "auto" allows one call (text, then at
most one such call, then the end), and read back from the completion by the
model's tool parser (server/parsers.py's PARSERS), which the server names with
--tool-call-parser or detect_parser finds in the chat template."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from armllm.server.parsers import PARSERS
from armllm.server.protocol import APIError, bad
from armllm.server.qwen3_coder import value_types
from armllm.server.tool_parsers import ToolParser
from armllm.structured_output import StructuredOutput

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")   # what OpenAI accepts
NO_PARAMETERS = {"type": "object", "properties": {}}
# the JSON of a forced call, as models write it (json.dumps' separators)
CALL_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ",
                     "key_separator": ": "}


@dataclass
class ToolRequest:
    tools: list[dict]           # OpenAI's [{"type": "function", "function": {...}}]
    choice: str                 # none, auto, required, or named
    named: str | None           # the function a named tool_choice forces
    parallel: bool              # more than one call allowed
    parser: str | None          # the model's tool-call format

    @property
    def parses(self) -> bool:
        """Whether the completion is read for calls."""
        return self.choice != "none" and bool(self.tools)

    def new_parser(self) -> ToolParser:
        return PARSERS[self.parser](self.tools)

    @property
    def template_tools(self) -> list[dict] | None:
        """What the chat template's `tools` variable holds: the tools, with tool_choice
        "none" too (the model knows them but calls none, as OpenAI's and vLLM's: an
        agent's last turn keeps its conversation's prefix, and its prefix cache)."""
        return self.tools or None


def tool_request(req: dict, parser: str | None, parallel: bool = True) -> ToolRequest | None:
    """The request's tools checked (a 400 naming the field otherwise), or None when it
    has none. `parser` is the server's tool-call format for this model, `parallel`
    whether the model makes several calls in a turn (parallel_tool_calls' default)."""
    tools, choice = req.get("tools"), req.get("tool_choice")
    if req.get("functions") or req.get("function_call") not in (None, "none", "auto"):
        raise APIError("functions and function_call (deprecated by OpenAI) are not supported "
                       "by this server: use tools and tool_choice", 400,
                       "functions" if req.get("functions") else "function_call",
                       "unsupported_parameter")
    if not tools and choice in (None, "none", "auto"):
        return None
    checked = [_tool(i, t) for i, t in enumerate(tools or [])]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise bad("tools", f"function names must be distinct, got {names}")
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad("tool_choice", 'must be "none", "auto", "required" or {"type": '
                                     '"function", "function": {"name": ...}}')
        named, choice = fn["name"], "named"
        if named not in names:
            raise bad("tool_choice", f"names function {named!r}, which is not among the "
                                     f"tools ({', '.join(names) or 'none'})")
    elif choice not in ("none", "auto", "required"):
        raise bad("tool_choice", f'must be "none", "auto", "required" or a named function, '
                                 f"got {choice!r}")
    if choice == "required" and not checked:
        raise bad("tool_choice", '"required" needs tools')
    if choice != "none" and parser is None:
        raise APIError("tools: this model's tool-call format is not known (its chat template "
                       "names none armllm reads); start the server with --tool-call-parser",
                       400, "tools", "unsupported_parameter")
    return ToolRequest(checked, choice, named, req.get("parallel_tool_calls", parallel), parser)


def _tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad(where, 'must be {"type": "function", "function": {...}}')
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad(f"{where}.function", "must be an object with a name")
    name = fn.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise bad(f"{where}.function.name", "must be 1-64 letters, digits, _ . or -, got "
                                            f"{name!r}")
    params = fn.get("parameters", NO_PARAMETERS)
    if not isinstance(params, dict):
        raise bad(f"{where}.function.parameters", "must be a JSON schema object")
    if not isinstance(fn.get("description", ""), str):
        raise bad(f"{where}.function.description", "must be a string")
    return {"type": "function", "function": {**fn, "parameters": params}}


def calls_grammar(tools: ToolRequest, token_id) -> StructuredOutput | None:
    """The grammar of a request's calls, in the parser's format: with tool_choice
    "required" or named, the output is calls to the allowed functions; with "auto"
    and one call at most, it is free text that may end in one call, after which the
    output ends (llguidance's lazy trigger: the call's opener starts the call's
    grammar); None otherwise (parallel "auto" calls are read as the model writes
    them, and GPT-OSS ends its turn at a call by itself).
    token_id(text) is the model's id of a token, or None: a marker that is one token
    of its own (Qwen's <tool_call>, Mistral's [TOOL_CALLS]) is that token in the
    grammar (llguidance reads added tokens as tokens, not as their text)."""
    forced = tools.choice in ("required", "named")
    if not forced and (tools.choice != "auto" or tools.parallel or not tools.tools
                       or tools.parser == "harmony"):
        return None
    allowed = [t["function"] for t in tools.tools
               if tools.named is None or t["function"]["name"] == tools.named]
    many = forced and tools.parallel and tools.named is None

    def marker(text: str) -> str:
        tid = token_id(text)
        return f"<[{tid}]>" if tid is not None else json.dumps(text)

    if tools.parser == "harmony":   # one call per turn: the model stops at <|call|>
        calls = [f"call_{i}" for i in range(len(allowed))]
        lark = f"start: {' | '.join(calls)}\n" + "".join(
            f'{c}: {marker("<|channel|>")} "commentary to=functions.{fn["name"]} " '
            f'{marker("<|constrain|>")} "json" {marker("<|message|>")} args_{i}\n'
            f"args_{i}: %json {json.dumps({**fn['parameters'], 'x-guidance': CALL_JSON_OPTIONS})}\n"
            for i, (c, fn) in enumerate(zip(calls, allowed, strict=True)))
        return _grammar(lark)
    if tools.parser == "llama3_json":   # no opener: an answer that begins with { is a call
        calls = 'body ("; " body)*' if many else "body"
        start = (f"start: {calls}\n" if forced else
                 "start: TEXT | body\nTEXT: /(?s:.*)/ & ~/[ \\t\\r\\n]*\\{(?s:.*)/\n")
        return _grammar(start + _body_rule(allowed, "parameters"))
    if tools.parser == "qwen3_coder":
        opener, rules = "<tool_call>", _xml_calls(allowed, marker)
    elif tools.parser == "hermes":
        opener = "<tool_call>"
        rules = f'rest: "\\n" body "\\n" {marker("</tool_call>")}\n' + \
            _body_rule(allowed, "arguments")
    else:       # mistral: the calls are one JSON array after the marker
        opener = "[TOOL_CALLS]"
        rules = 'rest: "[" body' + (' (", " body)*' if many else "") + ' "]"\n' + \
            _body_rule(allowed, "arguments")
    if forced:
        call = f"call: {marker(opener)} rest\n"
        repeat = ' ("\\n" call)*' if many and tools.parser != "mistral" else ""
        return _grammar(f"start: call{repeat}\n{call}{rules}")
    if token_id(opener) is not None:    # text, then the opener's token, then the call
        start = f"start: TEXT | TEXT {marker(opener)} rest\n"
    else:       # text up to the opener's first occurrence is one lazy lexeme
        start = f"start: TEXT | head rest\nhead[lazy]: TEXT {marker(opener)}\n"
    return _grammar(start + "TEXT: /(?s:.*)/\n" + rules)


def _body_rule(allowed: list[dict], args_key: str) -> str:
    """A call object's rule: one of the allowed functions' names with arguments that
    match its parameters' schema."""
    body = {"anyOf": [{"type": "object",
                       "properties": {"name": {"const": fn["name"]},
                                      args_key: fn["parameters"]},
                       "required": ["name", args_key], "additionalProperties": False}
                      for fn in allowed],
            "x-guidance": CALL_JSON_OPTIONS}
    return "body: %json " + json.dumps(body) + "\n"


# what a raw-text parameter value may not hold: the tags that would end it early
XML_VALUE_TEXT = r"~/(?s:.*)(<\/parameter>|<parameter=|<\/function>|<\/tool_call>)(?s:.*)/"


def _xml_calls(allowed: list[dict], marker) -> str:
    """Qwen3-Coder's XML calls after their <tool_call>, as its chat template writes
    them: each function's parameters in its schema's order (the required ones always,
    no others), a string value as raw text, any other value as JSON that matches the
    parameter's schema."""
    functions = " | ".join(f"fn_{i}" for i in range(len(allowed)))
    lines = [f'rest: "\\n" ({functions}) "</function>\\n" {marker("</tool_call>")}']
    for i, fn in enumerate(allowed):
        schema, name = fn["parameters"], fn["name"]
        required = set(schema.get("required") or ())
        params = []
        for j, (param, prop) in enumerate((schema.get("properties") or {}).items()):
            if prop is False:       # a parameter that may not be given
                continue
            prop = prop if isinstance(prop, dict) else {}
            rule = f"param_{i}_{j}"
            params.append(rule if param in required else rule + "?")
            lines += _xml_parameter(rule, name, param, prop, schema)
        lines.append(f"fn_{i}: {_literal(f'<function={name}>')} " + '"\\n" ' + " ".join(params))
    return "\n".join(lines) + "\n"


def _xml_parameter(rule: str, function: str, param: str, prop: dict, schema: dict
                   ) -> list[str]:
    """The rules of one <parameter=param> block, whose schema is prop in the function's
    parameters `schema` (value_types says how the parser reads the value back)."""
    where = f"{function}.{param}"
    if any(c in param for c in "<>\n"):
        raise bad("tools", f"{where}: a parameter name with <, > or a newline cannot be "
                           "written in this model's (qwen3_coder) tool calls")
    open_tag, close_tag = _literal(f"<parameter={param}>\n"), _literal("\n</parameter>\n")
    if value_types(prop) != {"string"}:
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        value = json.dumps({**defs, **prop, "x-guidance": CALL_JSON_OPTIONS})
        return [f"{rule}: {open_tag} %json {value} {close_tag}"]
    values = [prop["const"]] if "const" in prop else prop.get("enum")
    if values:
        return [f"{rule}: {open_tag} ({' | '.join(_literal(v) for v in values)}) {close_tag}"]
    for keyword in ("pattern", "format"):
        if keyword in prop:
            raise bad("tools", f"{where}: a string's {keyword} cannot be enforced on the raw "
                               "text of this model's (qwen3_coder) tool calls; drop it or use "
                               'tool_choice "auto"')
    low, high = (prop.get(k) if isinstance(prop.get(k), int) else None
                 for k in ("minLength", "maxLength"))
    token = rule.upper()    # one lexeme with its closing tag: where the text ends is certain
    return [f"{rule}: {open_tag} {token}",
            f"{token}: (/(?s:.{{{low or 0},{'' if high is None else high}}})/ & {XML_VALUE_TEXT}) "
            f"{close_tag}"]


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _grammar(lark: str) -> StructuredOutput:
    try:
        return StructuredOutput(grammar=lark)
    except ValueError as exc:
        raise bad("tools", "the functions' parameters do not compile to a grammar: "
                  + str(exc).removeprefix("structured_output.grammar: ")) from None


# two calls an assistant turn makes, to see whether a chat template writes both back
PROBE_CALLS = [{"id": f"probe000{i}", "type": "function",
                "function": {"name": f"probe_{i}", "arguments": {"value": f"armllm-probe-{i}"}}}
               for i in (1, 2)]


def calls_in_parallel(render) -> bool:
    """Whether a model makes several calls in one turn, as far as its chat template
    tells: it writes back both calls of an assistant turn that made two. A template
    that drops calls (SmolLM2's) or refuses two (Llama 3.1's "only supports single
    tool-calls") gets one call a turn by default. render(messages) is the template's
    text for a conversation."""
    conversation = [{"role": "user", "content": "probe"},
                    {"role": "assistant", "content": "", "tool_calls": PROBE_CALLS}]
    try:
        text = render(conversation)
    except Exception:  # noqa: BLE001 - a template that refuses the turn: one call
        return False
    return all(f"armllm-probe-{i}" in text for i in (1, 2))


def template_messages(messages: list[dict]) -> list[dict]:
    """Assistant tool calls as chat templates read them: each call's arguments as an
    object (the request carries them as a JSON string), as vLLM passes them."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_template_call(c) for c in calls]}
        out.append(m)
    return out


def _template_call(call: dict) -> dict:
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            pass  # not JSON: the template gets the text
    return {**call, "function": fn}
