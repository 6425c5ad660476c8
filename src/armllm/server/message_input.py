"""message_input: an Anthropic Messages request in chat's terms: its system
prompt and messages (content blocks) as chat messages, its fields as a chat
request's (so chat's checks, sampling, tools, grammars and reasoning budgets
apply unchanged), and chat's errors renamed to the Messages fields.

Content blocks, as Anthropic's Messages API takes them:
    text                     text (a user's, an assistant's)
    tool_use (assistant)     a call: id, name, input (an object) -> tool_calls
    tool_result (user)       a call's result: tool_use_id, content (text or text
                             blocks), is_error -> a tool message, before the user's text
    thinking (assistant)     the assistant's reasoning -> reasoning_content
    redacted_thinking        dropped (armllm never writes one)
Images and documents are refused (400). A last assistant message is a prefill:
the answer continues it."""
from __future__ import annotations

import json
from typing import Any

from armllm.server import protocol as P

UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "server_tool_use",
                      "web_search_tool_result", "container_upload")
# output_config.effort as chat's reasoning_effort (a reasoning budget: protocol.py)
OUTPUT_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                  "max": "high"}
# chat's parameter names in errors, back in the Messages fields' names
MESSAGES_NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences",
                  "response_format.json_schema.schema": "output_config.format.schema",
                  "response_format": "output_config.format",
                  "max_reasoning_tokens": "thinking.budget_tokens",
                  ".function.parameters": ".input_schema", ".function.": "."}


def chat_messages(system: Any, messages: Any) -> list[dict]:
    """The chat messages of a request's system prompt and messages."""
    out = []
    if system is not None:
        text = _text(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    if not isinstance(messages, list) or not messages:
        raise P.bad("messages", "must be a non-empty array of messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise P.bad(f"{where}.role", "must be user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise P.bad(f"{where}.content", "must be a string or an array of content blocks")
        out += (_user if m["role"] == "user" else _assistant)(content, f"{where}.content")
    return out


def _user(blocks: list, where: str) -> list[dict]:
    results, texts = [], []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_block_text(block, f"{where}[{j}]"))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise P.bad(f"{where}[{j}].tool_use_id", "must be the id of the tool_use this "
                                                          "answers")
            result = _text(block.get("content", ""), f"{where}[{j}].content")
            results.append({"role": "tool", "tool_call_id": call_id,
                            "content": f"Error: {result}" if block.get("is_error") else result})
        else:
            raise P.bad(f"{where}[{j}].type", f"a user's block is text or tool_result, got "
                                              f"{kind!r}")
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results
                      else [])


def _assistant(blocks: list, where: str) -> list[dict]:
    message: dict = {"role": "assistant", "content": ""}
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "text":
            message["content"] += _block_text(block, f"{where}[{j}]")
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise P.bad(f"{where}[{j}].thinking", "must be a string")
            message["reasoning_content"] = message.get("reasoning_content", "") + thinking
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not isinstance(name, str) \
                    or not isinstance(arguments, dict):
                raise P.bad(f"{where}[{j}]", 'a tool_use block needs an "id", a "name" and '
                                             'an "input" object')
            message.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments)}})
        elif kind != "redacted_thinking":
            raise P.bad(f"{where}[{j}].type", "an assistant's block is text, thinking or "
                                              f"tool_use, got {kind!r}")
    return [message]


def _kind(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in UNSUPPORTED_BLOCKS:
        raise P.APIError(f"{where}: {kind} blocks are not supported by this server (text "
                         "only)", 400, f"{where}.type", "unsupported_parameter")
    if not isinstance(kind, str):
        raise P.bad(where, "must be a content block with a type")
    return kind


def _block_text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise P.bad(f"{where}.text", "must be a string")
    return block["text"]


def _text(value: Any, where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise P.bad(where, "must be a string or an array of text blocks")
    texts = []
    for j, block in enumerate(value):
        if _kind(block, f"{where}[{j}]") != "text":
            raise P.bad(f"{where}[{j}].type", "must be text")
        texts.append(_block_text(block, f"{where}[{j}]"))
    return "\n".join(texts)


def chat_request(req: dict) -> dict:
    """The request's fields as a chat completions request's: max_tokens, sampling,
    stop_sequences as stop, tools and tool_choice in chat's shape, thinking as a
    reasoning budget (disabled: enable_thinking false and a budget of 0),
    output_config's effort as reasoning_effort and its format as response_format."""
    chat = {k: req[k] for k in ("temperature", "top_p", "top_k", "stream", "seed", "min_p",
                                "repetition_penalty", "priority", *P.EXTRA_SAMPLING)
            if k in req}
    chat["max_completion_tokens"] = req["max_tokens"]
    if "stop_sequences" in req:
        chat["stop"] = req["stop_sequences"]
    if req.get("tools"):
        chat["tools"] = [_tool(i, t) for i, t in enumerate(req["tools"])]
    choice = req.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice))
    output = req.get("output_config") or {}
    effort = output.get("effort")
    if effort is not None:
        if effort not in OUTPUT_EFFORTS:
            raise P.bad("output_config.effort", f"must be one of {', '.join(OUTPUT_EFFORTS)}, "
                                                f"got {effort!r}")
        chat["reasoning_effort"] = OUTPUT_EFFORTS[effort]
    if output.get("format") is not None:
        fmt = output["format"]
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" \
                or not isinstance(fmt.get("schema"), dict):
            raise P.bad("output_config.format", 'must be {"type": "json_schema", "schema": '
                                                "{...}}")
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": fmt["schema"]}}
    thinking = req.get("thinking")
    if thinking is not None:
        kind = thinking.get("type")
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if not P.is_int(budget) or budget < 1:
                raise P.bad("thinking.budget_tokens", f"must be an integer >= 1, got {budget!r}")
            chat["max_reasoning_tokens"] = budget
        elif kind == "disabled":
            chat["max_reasoning_tokens"] = 0
            chat["chat_template_kwargs"] = {"enable_thinking": False}
        elif kind not in ("adaptive", "between_tools"):
            raise P.bad("thinking.type", "must be enabled, disabled, adaptive or between_tools, "
                                         f"got {kind!r}")
    return chat


def _tool(i: int, tool: Any) -> dict:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise P.APIError(f"tools[{i}]: {kind!r} (a server tool) is not supported by this "
                         "server: client tools only (name, description, input_schema)", 400,
                         f"tools[{i}].type", "unsupported_parameter")
    fn = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
    if "description" in tool:
        fn["description"] = tool["description"]
    if not isinstance(fn["parameters"], dict):
        raise P.bad(f"tools[{i}].input_schema", "must be a JSON schema object")
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> dict:
    kind = choice.get("type") if isinstance(choice, dict) else None
    named = {"auto": "auto", "any": "required", "none": "none"}
    if kind == "tool":
        out = {"tool_choice": {"type": "function", "function": {"name": choice.get("name")}}}
    elif kind in named:
        out = {"tool_choice": named[kind]}
    else:
        raise P.bad("tool_choice", 'must be {"type": "auto"}, {"type": "any"}, {"type": '
                                   '"none"} or {"type": "tool", "name": ...}, got '
                                   f"{choice!r}")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


def in_messages_terms(exc: P.APIError) -> P.APIError:
    """Chat's error with the Messages field names (max_tokens, stop_sequences,
    tools[i].input_schema, ...)."""
    return P.renamed(exc, MESSAGES_NAMES)
