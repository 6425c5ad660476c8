"""responses: OpenAI's Responses API over the chat machinery: POST /v1/responses,
GET and DELETE /v1/responses/{id}.

A request's `input` (a string, or items: messages of text parts, function_call
and function_call_output items, reasoning items) becomes chat messages
(server/response_input.py); `instructions` is a system message for this turn
only (a continued conversation does not carry it, as OpenAI's); function
`tools`, tool_choice and parallel_tool_calls are chat's (server/tools.py: the
same grammars and parsers); `text.format` is chat's response_format;
max_output_tokens and the sampling fields are chat's; `reasoning.effort` is
chat's reasoning_effort (a reasoning budget, protocol.REASONING_EFFORTS, and the
chat template's variable; "none" also sets enable_thinking false);
`previous_response_id` continues a stored conversation. The output items are
the reasoning (the model's reasoning parser), the message and the function
calls, in the order the model wrote them; with stream=true they arrive as the
Responses events (response.created, response.in_progress, output items added
and done, content parts, reasoning / text / function-call-argument deltas, then
response.completed, response.incomplete or response.failed), numbered by
sequence_number, and the final event's response equals the non-streamed one.
A response cut by max_output_tokens is "incomplete". With `store` (the default)
the response and its conversation are kept in the server's ResponseStore.
Errors use OpenAI's body and name the Responses field."""
from __future__ import annotations

import json
import time
import uuid
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
from armllm.server.response_input import chat_request, in_responses_terms, input_messages
from armllm.server.response_output import Output
from armllm.server.state import ServerState
from armllm.server.tools import ToolRequest, template_messages, tool_request

RESPONSES_FIELDS = {
    "model": "str", "input": "any", "instructions": "str", "tools": "list",
    "tool_choice": "any", "parallel_tool_calls": "bool", "max_tool_calls": "int",
    "text": "obj", "max_output_tokens": "int", "temperature": "num", "top_p": "num",
    "top_k": "int", "min_p": "num", "presence_penalty": "num", "frequency_penalty": "num",
    "repetition_penalty": "num", "seed": "int", "stop": "any", "logit_bias": "obj",
    "stream": "bool", "stream_options": "obj", "store": "bool",
    "previous_response_id": "str", "reasoning": "obj", "include": "list", "metadata": "obj",
    "user": "str", "truncation": "str", "background": "bool", "service_tier": "str",
    "safety_identifier": "str", "prompt_cache_key": "str", "priority": "int",
    "conversation": "any", "prompt": "obj", "top_logprobs": "int",
    "max_reasoning_tokens": "int", **{k: P.CHAT_FIELDS[k] for k in P.EXTRA_SAMPLING},
}
# what `include` may ask for: a reasoning item's text again in encrypted_content (not
# encrypted: armllm keeps no secret), so that a client that stores nothing can send it back
INCLUDABLE = ("reasoning.encrypted_content",)


def routes(state: ServerState) -> list[Route]:
    async def create(request: Request) -> Response:
        llm, req = await state.read_request(request, RESPONSES_FIELDS, "/v1/responses", "input")
        try:
            return await _create(state, request, llm, req)
        except P.APIError as exc:
            raise in_responses_terms(exc) from None

    async def read(request: Request) -> Response:
        stored = state.responses.get(request.path_params["response_id"])
        if stored is None:
            raise _not_found(request.path_params["response_id"])
        return JSONResponse(stored.response)

    async def delete(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        if not state.responses.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    return [Route("/v1/responses", create, methods=["POST"]),
            Route("/v1/responses/{response_id}", read, methods=["GET"]),
            Route("/v1/responses/{response_id}", delete, methods=["DELETE"])]


def _not_found(response_id: str) -> P.APIError:
    return P.APIError(f"no stored response {response_id!r} (never stored, deleted, or "
                      "evicted from the store)", 404, "response_id", "not_found")


async def _create(state: ServerState, request: Request, llm: AsyncLLM, req: dict) -> Response:
    _refuse_unsupported(req)
    if llm.transcribes_speech:
        raise P.APIError("this model transcribes speech (Whisper): it answers "
                         "/v1/audio/transcriptions, not responses", 400, "model",
                         "invalid_value")
    history: list[dict] = []
    previous = req.get("previous_response_id")
    if previous is not None:
        stored = state.responses.get(previous)
        if stored is None:
            raise P.bad("previous_response_id", f"no stored response {previous!r} (never "
                        "stored, deleted, or evicted from the store)",
                        "previous_response_not_found")
        history = stored.messages
    conversation = history + input_messages(req["input"])
    effort = _effort(req.get("reasoning"))
    chat = chat_request(req)
    tools = tool_request(chat, state.tool_parser(llm), state.calls_in_parallel(llm))
    opts = P.sampling_options(chat, True, llm.default_sampling_params)
    if tools is not None:
        opts = with_tools(llm, opts, tools)
    state.check_capacity(llm, 1, 1)
    instructions = req.get("instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    ids = render_chat(llm, template_messages(system + conversation), True, False,
                      P.template_kwargs(chat), tools.template_tools if tools else None)
    jobs = prepare_jobs(llm, [ids], opts, "input", "max_output_tokens", None)
    answer = Answer(state, llm, req, opts, tools, conversation, effort)
    gen = Generation(state, llm, jobs, answer.id, opts.priority)
    admission = state.admit(llm, 1)
    if opts.stream:
        return event_stream(answer.events(gen), admission)
    out = (await whole(request, gen, admission))[0]
    return JSONResponse(answer.finished(out, answer.output_of(out.outputs[0])))


def _refuse_unsupported(req: dict) -> None:
    def no(param: str, what: str) -> P.APIError:
        return P.APIError(f"{param}: {what} is not supported by this server", 400, param,
                          "unsupported_parameter")
    if req.get("background"):
        raise no("background", "background mode")
    if req.get("conversation") is not None:
        raise no("conversation", "a stored conversation (use previous_response_id)")
    if req.get("prompt") is not None:
        raise no("prompt", "a stored prompt template")
    if req.get("truncation", "disabled") != "disabled":
        raise no("truncation", f"truncation {req['truncation']!r} (only disabled: a "
                               "conversation longer than the context is refused)")
    if req.get("top_logprobs"):
        raise no("top_logprobs", "log-probabilities in responses (use /v1/chat/completions)")
    for i, what in enumerate(req.get("include") or []):
        if what not in INCLUDABLE:
            raise no(f"include[{i}]", f"including {what!r}")
    metadata = req.get("metadata")
    if metadata is not None and (len(metadata) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in metadata.items())):
        raise P.bad("metadata", "must hold at most 16 string values (keys up to 64 "
                                "characters, values up to 512)")


def _effort(reasoning: dict | None) -> str | None:
    """reasoning.effort (checked with the sampling fields: protocol.REASONING_EFFORTS)."""
    if reasoning is None:
        return None
    summary = reasoning.get("summary")
    if summary not in (None, "auto", "concise", "detailed"):
        raise P.bad("reasoning.summary", f"must be auto, concise or detailed, got {summary!r}")
    return reasoning.get("effort")


class Answer:
    """One response: its id and echo of the request, the output read from its
    completion (through chat's parser: tool calls and reasoning), the response
    object, and storing it."""

    def __init__(self, state: ServerState, llm: AsyncLLM, req: dict, opts: P.Options,
                 tools: ToolRequest | None, conversation: list[dict], effort: str | None):
        self.state, self.llm, self.req, self.opts = state, llm, req, opts
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.conversation = conversation
        self.effort = effort
        self.tools = tools if tools is not None and tools.parses else None
        self.choices = ChatChoices(llm, None, self.tools)
        self.max_calls = req.get("max_tool_calls")
        self.encrypted = "reasoning.encrypted_content" in (req.get("include") or [])

    def output_of(self, c: CompletionOutput) -> Output:
        """The output items of a finished completion, read whole."""
        message = self.choices.final(0, c)["message"]
        output = Output(self.encrypted)
        output.reasoning(message.get("reasoning_content") or "")
        output.text(message["content"] or "")
        for call in (message.get("tool_calls") or [])[:self.max_calls]:
            output.call(call)
        output.close(c.finish_reason == "length")
        return output

    def response(self, status: str, output: Output, out: RequestOutput | None = None,
                 error: dict | None = None) -> dict:
        """The response object (echoing the request's settings)."""
        req, params = self.req, self.opts.params
        fmt = (req.get("text") or {}).get("format") or {"type": "text"}
        usage = None
        if out is not None:
            c = out.outputs[0]
            reasoning = c.metrics.num_reasoning_tokens if c.metrics is not None else 0
            cached = c.metrics.num_cached_prompt_tokens if c.metrics is not None else 0
            usage = {"input_tokens": len(out.prompt_token_ids),
                     "input_tokens_details": {"cached_tokens": cached},
                     "output_tokens": len(c.token_ids),
                     "output_tokens_details": {"reasoning_tokens": reasoning},
                     "total_tokens": len(out.prompt_token_ids) + len(c.token_ids)}
        incomplete = status == "incomplete"
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": status, "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": req.get("instructions"),
                "max_output_tokens": req.get("max_output_tokens"),
                "max_tool_calls": self.max_calls,
                "model": self.state.config.served_model_name, "output": output.items,
                "parallel_tool_calls": self.tools.parallel if self.tools else
                req.get("parallel_tool_calls", True),
                "previous_response_id": req.get("previous_response_id"),
                "reasoning": {"effort": self.effort, "summary": None},
                "store": req.get("store", True), "temperature": params.temperature,
                "text": {"format": fmt}, "tool_choice": req.get("tool_choice", "auto"),
                "tools": req.get("tools") or [], "top_p": params.top_p,
                "truncation": "disabled", "usage": usage, "user": req.get("user"),
                "metadata": req.get("metadata") or {}}

    def finished(self, out: RequestOutput, output: Output) -> dict:
        """The finished response object, stored when the request says so."""
        c = out.outputs[0]
        response = self.response("incomplete" if c.finish_reason == "length" else "completed",
                                 output, out)
        if self.req.get("store", True):
            self.state.responses.put(self.id, response,
                                     self.conversation + [output.as_message()])
        return response

    async def events(self, gen: Generation) -> AsyncIterator[str]:
        """The response's server-sent events (see the module docstring)."""
        sequence = 0

        def event(kind: str, **fields) -> str:
            nonlocal sequence
            sequence += 1
            return "event: " + kind + "\ndata: " + json.dumps(
                {"type": kind, "sequence_number": sequence - 1, **fields}) + "\n\n"

        output = Output(self.encrypted)
        yield event("response.created", response=self.response("in_progress", output))
        yield event("response.in_progress", response=self.response("in_progress", output))
        final: RequestOutput | None = None
        calls = 0
        try:
            async for delta, reason, out in parts(gen, self.choices):
                output.reasoning(delta.get("reasoning_content") or "")
                output.text(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    if self.max_calls is None or calls < self.max_calls:
                        output.call(call)
                        calls += 1
                if reason is not None:
                    output.close(reason == "length")
                for kind, fields in output.take_events():
                    yield event(kind, **fields)
                if out.finished:
                    final = out
        except EngineClosed:
            yield event("response.failed", response=self.response(
                "failed", output, error=_error_object(engine_stopped())))
            return
        except P.APIError as exc:
            yield event("response.failed", response=self.response(
                "failed", output, error=_error_object(exc)))
            return
        error = generation_failure(self.state, [final]) if final is not None else engine_stopped()
        if error is not None:
            yield event("response.failed", response=self.response(
                "failed", output, error=_error_object(error)))
            return
        response = self.finished(final, output)
        kind = "response.incomplete" if response["status"] == "incomplete" \
            else "response.completed"
        yield event(kind, response=response)


def _error_object(exc: P.APIError) -> dict:
    """A failed response's error: a code and a message."""
    return {"code": exc.code or "server_error", "message": exc.message}
