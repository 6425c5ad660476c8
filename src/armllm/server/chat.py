"""chat: /v1/chat/completions: a conversation rendered with the model's chat
template (chat_template_kwargs become template variables, except the names the
template call sets itself), n completions as JSON or server-sent events (the
first chunk carries the role), logprobs in the chat format, a reasoning
model's thinking as reasoning_content beside the answer's content. Without
max_tokens / max_completion_tokens a completion may fill the rest of the
context, as vLLM's."""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from armllm.api import AsyncLLM, CompletionOutput, RequestOutput
from armllm.model.tokenizer import TEMPLATE_OWN_NAMES
from armllm.server import protocol as P
from armllm.server.generation import Generation, prepare_jobs, respond, token_text
from armllm.server.state import ServerState
from armllm.server.tool_parsers import ToolParser
from armllm.server.tools import ToolRequest, calls_grammar, template_messages, tool_request

CUT_OFF = ("length", "abort")   # finish reasons that may cut a call off mid-way


def routes(state: ServerState) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        llm, req = await state.read_request(request, P.CHAT_FIELDS, "/v1/chat/completions",
                                            "messages")
        P.refuse_unsupported(req)
        if llm.transcribes_speech:   # before its (missing) chat template is asked for
            raise P.APIError("this model transcribes speech (Whisper): it answers "
                             "/v1/audio/transcriptions and /v1/audio/translations, not chat",
                             400, "model", "invalid_value")
        messages = P.chat_messages(req["messages"])
        cont = req.get("continue_final_message", False)
        add_gen = req.get("add_generation_prompt", not cont)
        if cont and messages[-1]["role"] != "assistant":
            raise P.bad("continue_final_message", "needs the last message to be the "
                                                  "assistant's")
        tools = tool_request(req, state.tool_parser(llm), state.calls_in_parallel(llm))
        opts = P.sampling_options(req, True, llm.default_sampling_params)
        if tools is not None:
            opts = with_tools(llm, opts, tools)
        state.check_capacity(llm, 1, opts.params.n)
        ids = render_chat(llm, template_messages(messages), add_gen, cont,
                          P.template_kwargs(req), tools.template_tools if tools else None)
        max_tokens_param = ("max_completion_tokens" if "max_completion_tokens" in req
                            else "max_tokens")
        jobs = prepare_jobs(llm, [ids], opts, "messages", max_tokens_param, None)
        gen = Generation(state, llm, jobs, f"chatcmpl-{uuid.uuid4().hex}", opts.priority)
        return await respond(state, request, gen,
                             ChatChoices(llm, opts.logprobs,
                                         tools if tools is not None and tools.parses else None),
                             opts)

    return [Route("/v1/chat/completions", chat_completions, methods=["POST"])]


def with_tools(llm: AsyncLLM, opts: P.Options, tools: ToolRequest) -> P.Options:
    """The sampling options of a request with tools: the calls' grammar (which a
    response_format cannot join: a required call's is refused with one, an "auto"
    call's gives way to it), and special tokens kept in the text of a format whose
    markers are such tokens (Mistral's [TOOL_CALLS], GPT-OSS's harmony headers)."""
    grammar = calls_grammar(tools, llm.tokenizer.token_id)
    params = opts.params
    if grammar is not None and params.structured_output is not None \
            and tools.choice != "auto":
        raise P.bad("tool_choice", "a required tool call cannot be combined with a "
                                   "response_format or structured_outputs")
    if grammar is not None and params.structured_output is None:
        params = replace(params, structured_output=grammar)
    if tools.parses and tools.parser in ("mistral", "harmony"):   # markers are special tokens
        params = replace(params, skip_special_tokens=False)
    return replace(opts, params=params)


def render_chat(llm: AsyncLLM, messages: list[dict], add_generation_prompt: bool,
                continue_final: bool, template_kwargs: dict,
                tools: list[dict] | None = None) -> list[int]:
    """The conversation's prompt token ids (the tools, if any, in the template's
    `tools` variable); a 400 naming messages or chat_template_kwargs when the
    template cannot render them."""
    clash = sorted(TEMPLATE_OWN_NAMES & template_kwargs.keys())
    if clash:
        raise P.bad("chat_template_kwargs", f"{', '.join(clash)} cannot be set here: the "
                                            "chat template call sets it itself")
    if tools is not None:
        template_kwargs = {**template_kwargs, "tools": tools}
    try:
        text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt,
                                                 continue_final, **template_kwargs)
    except ValueError as exc:
        raise P.bad("messages", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the template choked on a variable's value
        if not template_kwargs:
            raise
        raise P.bad("chat_template_kwargs", f"the chat template failed with these "
                                            f"variables: {type(exc).__name__}: {exc}") from None
    return llm.tokenizer.encode(text, add_special_tokens=False)


class ChatChoices:
    """Choices with a message (a delta when streamed); logprobs as content entries
    with token, logprob, bytes and top_logprobs; with tools, the completion read by
    the model's tool parser into content and tool_calls (finish_reason "tool_calls"
    when it made any and was not cut off; one at most without parallel_tool_calls;
    a call is streamed whole once it has ended)."""
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, llm: AsyncLLM, logprobs: int | None, tools: ToolRequest | None = None):
        self.llm, self.logprobs, self.tools = llm, logprobs, tools
        self._parsers: dict[int, ToolParser] = {}   # choice index -> its stream's parser

    def opening(self, count: int) -> list[dict]:
        """The role first, for every choice."""
        return [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for i in range(count)]

    def delta(self, index: int, c: CompletionOutput, finish_reason: str | None) -> dict:
        text, calls, reasoning = c.text_delta, [], c.reasoning_delta
        if self.tools is not None:
            parser = self._parsers.setdefault(index, self.tools.new_parser())
            text, calls = parser.feed(text)
            if finish_reason is not None:
                rest, more = parser.finish(cut=finish_reason in CUT_OFF)
                text, calls = text + rest, calls + more
                finish_reason = self._finish_reason(finish_reason, parser.calls)
            calls = [d for d in calls if self.tools.parallel or d["index"] == 0]
            reasoning += _parser_reasoning(parser)
        # a token whose text is held back (a possible stop string) still gets its chunk
        delta = ({"content": text}
                 if c.new_token_ids and (text or not (reasoning or calls)) else {})
        if reasoning:
            delta["reasoning_content"] = reasoning
        if calls:
            delta["tool_calls"] = calls
        lp = (self._logprobs(c.new_logprobs)
              if self.logprobs is not None and c.new_logprobs else None)
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}

    def final(self, index: int, c: CompletionOutput) -> dict:
        lp = self._logprobs(c.logprobs) if self.logprobs is not None else None
        message = {"role": "assistant", "content": c.text}
        finish_reason, reasoning = c.finish_reason, c.reasoning
        if self.tools is not None:
            parser = self.tools.new_parser()
            content, calls = parser.parse(c.text, cut=c.finish_reason in CUT_OFF)
            reasoning += _parser_reasoning(parser)
            message["content"] = content
            calls = calls if self.tools.parallel else calls[:1]
            if calls:
                message["content"] = content if content.strip() else None
                message["tool_calls"] = [call.as_dict() for call in calls]
                finish_reason = self._finish_reason(finish_reason, calls)
        if reasoning:
            message["reasoning_content"] = reasoning
        return {"index": index, "message": message, "logprobs": lp,
                "finish_reason": finish_reason}

    @staticmethod
    def _finish_reason(reason: str, calls: list) -> str:
        """A completion that ended with its calls made ends with "tool_calls"."""
        return "tool_calls" if calls and reason == "stop" else reason

    def _logprobs(self, entries: list) -> dict:
        def item(token: int, lp: float) -> dict:
            text = token_text(self.llm, token)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}
        return {"content": [{**item(token, lp), "top_logprobs": [item(t, v) for t, v in top or []]}
                            for token, lp, top in entries]}


async def parts(gen: Generation, choices: ChatChoices
                ) -> AsyncIterator[tuple[dict, str | None, RequestOutput]]:
    """A one-completion generation's updates read through chat's parser (the
    Responses and Messages streams build on them): each update's delta (content,
    reasoning_content, tool_calls), its finish reason once it has ended, and the
    update itself. Closing this iterator aborts the generation."""
    async with aclosing(gen.outputs()) as outs:
        async for _, out in outs:
            gen.ended_now(0, out)
            c = out.outputs[0]
            yield choices.delta(0, c, c.finish_reason)["delta"], c.finish_reason, out


def _parser_reasoning(parser: ToolParser) -> str:
    """The reasoning a parser that reads it (harmony's) split off since last asked."""
    take = getattr(parser, "take_reasoning", None)
    return take() if take is not None else ""
