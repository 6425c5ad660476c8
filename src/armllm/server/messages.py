"""messages: Anthropic's Messages API over the chat machinery: POST /v1/messages
and POST /v1/messages/count_tokens, for clients such as Claude Code that speak
it to a local base URL.

A request (system, messages of content blocks, max_tokens, stop_sequences,
temperature / top_p / top_k, tools with tool_choice, thinking, output_config)
becomes a chat request (server/message_input.py), so the same template,
grammars, tool parser and reasoning budget apply: thinking.budget_tokens is
max_reasoning_tokens, thinking disabled sets enable_thinking false,
output_config.effort is a reasoning effort and its format a JSON schema the
text must match. cache_control is accepted and needs nothing: the prefix cache
is automatic. The answer is a message whose
content blocks are the thinking (the reasoning parser's; its signature is
empty: armllm signs nothing), the text and the tool_use calls (input: the
arguments object), with stop_reason end_turn, max_tokens, stop_sequence (and
which) or tool_use; usage counts prompt tokens served from the prefix cache as
cache_read_input_tokens. With stream=true the same blocks arrive as Anthropic's
events: message_start, per block content_block_start, its deltas (thinking_delta,
text_delta, input_json_delta) and content_block_stop, then message_delta (the
stop reason and output tokens) and message_stop. Errors on these routes use
Anthropic's body ({"type": "error", "error": {"type", "message"}}: see
protocol.APIError.anthropic_body)."""
from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from armllm.api import AsyncLLM, CompletionOutput, EngineClosed, RequestOutput
from armllm.server import protocol as P
from armllm.server.chat import ChatChoices, parts, render_chat, with_tools
from armllm.server.generation import (
    Generation,
    engine_stopped,
    event_stream,
    generation_failure,
    prepare_jobs,
    whole,
)
from armllm.server.message_input import chat_messages, chat_request, in_messages_terms
from armllm.server.state import ServerState
from armllm.server.tools import template_messages, tool_request

MESSAGES_FIELDS = {
    "model": "str", "max_tokens": "int", "messages": "list", "system": "any",
    "stop_sequences": "list", "stream": "bool", "temperature": "num", "top_p": "num",
    "top_k": "int", "metadata": "obj", "tools": "list", "tool_choice": "obj",
    "thinking": "obj", "service_tier": "str", "container": "any", "mcp_servers": "list",
    "output_config": "obj", "cache_control": "obj",
    # armllm's (vLLM's) sampling extensions, as on the OpenAI routes
    "seed": "int", "min_p": "num", "repetition_penalty": "num", "priority": "int",
    **{k: P.CHAT_FIELDS[k] for k in P.EXTRA_SAMPLING},
}
COUNT_FIELDS = {k: MESSAGES_FIELDS[k] for k in ("model", "messages", "system", "tools",
                                                "tool_choice", "thinking", "output_config")}


def routes(state: ServerState) -> list[Route]:
    async def create(request: Request) -> Response:
        try:
            llm, req = await state.read_request(request, MESSAGES_FIELDS, "/v1/messages",
                                                "messages")
            if "max_tokens" not in req:
                raise P.bad("max_tokens", "is required")
            return await _create(state, request, llm, req)
        except P.APIError as exc:
            raise in_messages_terms(exc) from None

    async def count_tokens(request: Request) -> Response:
        try:
            llm, req = await state.read_request(request, COUNT_FIELDS,
                                                "/v1/messages/count_tokens", "messages")
            ids, _, _ = _prompt(state, llm, {**req, "max_tokens": 1})
            return JSONResponse({"input_tokens": len(ids)})
        except P.APIError as exc:
            raise in_messages_terms(exc) from None

    return [Route("/v1/messages", create, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]


def _prompt(state: ServerState, llm: AsyncLLM, req: dict):
    """The request's prompt ids, sampling options and tools."""
    for name in ("container", "mcp_servers"):
        if req.get(name):
            raise P.APIError(f"{name}: not supported by this server", 400, name,
                             "unsupported_parameter")
    if llm.transcribes_speech:
        raise P.APIError("this model transcribes speech (Whisper): it answers "
                         "/v1/audio/transcriptions, not messages", 400, "model",
                         "invalid_value")
    messages = chat_messages(req.get("system"), req["messages"])
    chat = chat_request(req)
    tools = tool_request(chat, state.tool_parser(llm), state.calls_in_parallel(llm))
    opts = P.sampling_options(chat, True, llm.default_sampling_params)
    if tools is not None:
        opts = with_tools(llm, opts, tools)
    prefill = messages[-1]["role"] == "assistant"
    ids = render_chat(llm, template_messages(messages), not prefill, prefill,
                      P.template_kwargs(chat), tools.template_tools if tools else None)
    return ids, opts, tools


async def _create(state: ServerState, request: Request, llm: AsyncLLM, req: dict) -> Response:
    ids, opts, tools = _prompt(state, llm, req)
    state.check_capacity(llm, 1, 1)
    jobs = prepare_jobs(llm, [ids], opts, "messages", "max_tokens", None)
    reply = Reply(state, llm, opts, tools if tools is not None and tools.parses else None)
    gen = Generation(state, llm, jobs, reply.id, opts.priority)
    admission = state.admit(llm, 1)
    if opts.stream:
        return event_stream(reply.events(gen), admission)
    out = (await whole(request, gen, admission))[0]
    c = out.outputs[0]
    message = reply.choices.final(0, c)["message"]
    blocks = Blocks()
    blocks.thinking(message.get("reasoning_content") or "")
    blocks.text(message["content"] or "")
    for call in message.get("tool_calls") or []:
        blocks.tool_use(call)
    blocks.close()
    return JSONResponse(reply.message(blocks.content, out))


class Reply:
    """One message: its id, its completion read through chat's parser, the message
    object and its stream."""

    def __init__(self, state: ServerState, llm: AsyncLLM, opts: P.Options, tools):
        self.state, self.llm, self.opts = state, llm, opts
        self.id = f"msg_{secrets.token_hex(12)}"
        self.choices = ChatChoices(llm, None, tools)
        self.created = time.time()

    def message(self, content: list[dict], out: RequestOutput | None) -> dict:
        reason, stop = self.stop_reason(out.outputs[0], content) if out else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant",
                "model": self.state.config.served_model_name, "content": content,
                "stop_reason": reason, "stop_sequence": stop, "usage": _usage(out)}

    @staticmethod
    def stop_reason(c: CompletionOutput, content: list[dict]) -> tuple[str, str | None]:
        if c.finish_reason == "length":
            return "max_tokens", None
        if any(block["type"] == "tool_use" for block in content):
            return "tool_use", None
        if c.stop_reason is not None:
            return "stop_sequence", c.stop_reason
        return "end_turn", None

    async def events(self, gen: Generation) -> AsyncIterator[str]:
        """The message's server-sent events (see the module docstring)."""
        def event(kind: str, **fields) -> str:
            return f"event: {kind}\ndata: " + json.dumps({"type": kind, **fields}) + "\n\n"

        blocks = Blocks()
        start = self.message([], None)
        start["usage"] = {"input_tokens": len(gen.jobs[0][0]), "output_tokens": 0}
        yield event("message_start", message=start)
        final: RequestOutput | None = None
        try:
            async for delta, reason, out in parts(gen, self.choices):
                blocks.thinking(delta.get("reasoning_content") or "")
                blocks.text(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    blocks.tool_use(call)
                if reason is not None:
                    blocks.close()
                for kind, fields in blocks.take_events():
                    yield event(kind, **fields)
                if out.finished:
                    final = out
        except EngineClosed:
            yield event("error", error=engine_stopped().anthropic_body()["error"])
            return
        except P.APIError as exc:
            yield event("error", error=exc.anthropic_body()["error"])
            return
        error = generation_failure(self.state, [final]) if final is not None \
            else engine_stopped()
        if error is not None:
            yield event("error", error=error.anthropic_body()["error"])
            return
        reason, stop = self.stop_reason(final.outputs[0], blocks.content)
        yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": stop},
                    usage=_usage(final))
        yield event("message_stop")


def _usage(out: RequestOutput | None) -> dict:
    if out is None:
        return {"input_tokens": 0, "output_tokens": 0}
    c = out.outputs[0]
    cached = c.metrics.num_cached_prompt_tokens if c.metrics is not None else 0
    return {"input_tokens": len(out.prompt_token_ids) - cached,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
            "output_tokens": len(c.token_ids)}


class Blocks:
    """A message's content blocks as the completion arrives (thinking, text, whole
    tool calls, in the model's order) and the stream events that say so. White space
    alone opens no text block until more text follows; a message with no text and no
    call still gets a text block."""

    def __init__(self):
        self.content: list[dict] = []
        self._open: dict | None = None
        self._space = ""
        self._events: list[tuple[str, dict]] = []
        self._closed = False

    def take_events(self) -> list[tuple[str, dict]]:
        events, self._events = self._events, []
        return events

    def thinking(self, text: str) -> None:
        if text:
            if self._open is None or self._open["type"] != "thinking":
                self._start({"type": "thinking", "thinking": "", "signature": ""})
            self._append(text, "thinking", "thinking_delta")

    def text(self, text: str) -> None:
        if not text:
            return
        if self._open is None or self._open["type"] != "text":
            if not text.strip():
                self._space += text
                return
            text, self._space = self._space + text, ""
            self._start({"type": "text", "text": ""})
        self._append(text, "text", "text_delta")

    def tool_use(self, call: dict) -> None:
        """A whole tool call ({"id", "function": {"name", "arguments"}})."""
        self._space = ""
        fn = call["function"]
        self._start({"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
                     "name": fn["name"], "input": {}})
        self._events.append(("content_block_delta", {
            "index": len(self.content) - 1,
            "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}}))
        self._open["input"] = json.loads(fn["arguments"])
        self._stop()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not any(block["type"] in ("text", "tool_use") for block in self.content):
            self._start({"type": "text", "text": ""})
            if self._space:
                self._append(self._space, "text", "text_delta")
        self._stop()

    def _start(self, block: dict) -> None:
        self._stop()
        self.content.append(block)
        self._events.append(("content_block_start", {"index": len(self.content) - 1,
                                                     "content_block": dict(block)}))
        self._open = block

    def _append(self, text: str, key: str, delta: str) -> None:
        self._open[key] += text
        self._events.append(("content_block_delta", {"index": len(self.content) - 1,
                                                     "delta": {"type": delta, key: text}}))

    def _stop(self) -> None:
        if self._open is not None:
            self._events.append(("content_block_stop", {"index": len(self.content) - 1}))
            self._open = None
