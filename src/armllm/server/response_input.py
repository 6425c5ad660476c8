"""response_input: a Responses API request in chat's terms: its `input` items as
chat messages, its fields as a chat request's (so chat's checks, sampling,
structured output and tools apply unchanged), and chat's errors renamed to the
Responses fields they came from.

Input items, as OpenAI's Responses API takes them:
    a string                        one user message
    {"role", "content"}             a message (type "message" may be given); content is
                                    a string or input_text / output_text parts; a
                                    developer message is a system message
    {"type": "function_call"}       the assistant's call (call_id, name, arguments):
                                    calls that follow an assistant message or each other
                                    join one assistant turn
    {"type": "function_call_output"}  the result of a call (call_id, output)
    {"type": "reasoning"}           the assistant's reasoning (its reasoning_text parts,
                                    else its encrypted_content, which armllm fills with
                                    the same text), given to the next assistant turn as
                                    reasoning_content
Images, files, audio and item references are refused (400)."""
from __future__ import annotations

from typing import Any

from armllm.server import protocol as P
from armllm.server.tools import NO_PARAMETERS

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
UNSUPPORTED_PARTS = ("input_image", "input_file", "input_audio", "refusal")
# the chat fields a Responses field becomes (the rest keep their names)
CHAT_NAMES = {"max_output_tokens": "max_completion_tokens"}
# chat's parameter names in errors, back in the Responses fields' names
RESPONSES_NAMES = {"max_completion_tokens": "max_output_tokens",
                   "response_format.json_schema": "text.format",
                   "response_format": "text.format", "messages": "input",
                   "reasoning_effort": "reasoning.effort", ".function.": "."}
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "seed", "stop", "logit_bias", "stream", "priority",
            "parallel_tool_calls", "max_output_tokens", "max_reasoning_tokens",
            *P.EXTRA_SAMPLING)


def input_messages(value: Any) -> list[dict]:
    """The chat messages of a request's `input` (see the module docstring)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise P.bad("input", "must be a string or a non-empty array of items")
    messages: list[dict] = []
    turn: dict | None = None        # the assistant message calls join
    reasoning = ""                  # for the next assistant message
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise P.bad(where, "must be an object (a message or an item with a type)")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise P.bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
            message = {"role": "system" if role == "developer" else role,
                       "content": _text(item.get("content"), f"{where}.content")}
            turn = None
            if role == "assistant":
                if reasoning:
                    message["reasoning_content"], reasoning = reasoning, ""
                turn = message
            messages.append(message)
        elif kind == "function_call":
            call = _call(item, where)
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                if reasoning:
                    turn["reasoning_content"], reasoning = reasoning, ""
                messages.append(turn)
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise P.bad(f"{where}.call_id", "must be the call_id of the call this answers")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _text(item.get("output"), f"{where}.output")})
            turn = None
        elif kind == "reasoning":
            reasoning += _reasoning(item, where)
            turn = None
        elif kind == "item_reference":
            raise P.APIError(f"{where}: item references are not supported by this server "
                             "(send the items, or use previous_response_id)", 400,
                             f"{where}.type", "unsupported_parameter")
        else:
            raise P.bad(f"{where}.type", "must be message, function_call, "
                                         f"function_call_output or reasoning, got {kind!r}")
    return messages


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise P.bad(where, "must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in UNSUPPORTED_PARTS:
            raise P.APIError(f"{where}[{j}]: {kind} parts are not supported by this server "
                             "(text only)", 400, f"{where}[{j}].type", "unsupported_parameter")
        else:
            raise P.bad(f"{where}[{j}]", "must be an input_text or output_text part with text")
    return "".join(texts)


def _call(item: dict, where: str) -> dict:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    for field, value in (("call_id", call_id), ("name", name), ("arguments", arguments)):
        if not isinstance(value, str) or (field != "arguments" and not value):
            raise P.bad(f"{where}.{field}", "must be a string" +
                        (" (the arguments' JSON)" if field == "arguments" else ""))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reasoning(item: dict, where: str) -> str:
    content = item.get("content")
    if content:
        if not isinstance(content, list) or not all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            raise P.bad(f"{where}.content", "must be an array of reasoning_text parts")
        return "".join(p["text"] for p in content)
    encrypted = item.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise P.bad(f"{where}.encrypted_content", "must be a string")
    return encrypted or ""


def chat_request(req: dict) -> dict:
    """The request's fields as a chat completions request's: sampling, reasoning.effort
    as reasoning_effort, text.format as response_format, the function tools in chat's
    shape."""
    chat = {CHAT_NAMES.get(k, k): req[k] for k in SAMPLING if k in req}
    effort = (req.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    text = req.get("text")
    if text is not None:
        chat["response_format"] = _format(text)
    if "tools" in req:
        chat["tools"] = [_tool(i, t) for i, t in enumerate(req["tools"])]
    choice = req.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, dict):
        raise P.APIError(f"tool_choice: {choice.get('type')!r} is not supported by this "
                         'server (none, auto, required or {"type": "function", "name": ...})',
                         400, "tool_choice", "unsupported_parameter")
    if choice is not None:
        chat["tool_choice"] = choice
    return chat


def _format(text: Any) -> dict:
    if not isinstance(text, dict):
        raise P.bad("text", 'must be an object such as {"format": {"type": "json_schema", ...}}')
    verbosity = text.get("verbosity")
    if verbosity not in (None, "low", "medium", "high"):
        raise P.bad("text.verbosity", f"must be low, medium or high, got {verbosity!r}")
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise P.bad("text.format", "must be an object with a type")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"),
                                                       "schema": fmt.get("schema", True)}}
    return {"type": fmt.get("type")}


def _tool(i: int, tool: Any) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise P.APIError(f"tools[{i}]: only function tools are supported by this server, got "
                         f"{kind!r}", 400, f"tools[{i}].type", "unsupported_parameter")
    return {"type": "function", "function": {
        k: tool[k] for k in ("name", "description", "parameters") if k in tool} | (
        {} if "parameters" in tool else {"parameters": NO_PARAMETERS})}


def in_responses_terms(exc: P.APIError) -> P.APIError:
    """Chat's error with the Responses field names (max_output_tokens, text.format,
    tools[i].name, ...)."""
    return P.renamed(exc, RESPONSES_NAMES)
