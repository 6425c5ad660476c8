"""generation: what completions and chat share once a request is checked:
its prompts run through AsyncLLM.generate (one per prompt, merged into one
stream of (prompt index, RequestOutput)), the answer built from that stream as
one JSON body raced against the client's disconnect or as server-sent events
(each endpoint family formats its own choices: see Choices), metrics observed
as completions end, and the request's admission (its n completions per prompt)
taken before the answer starts and released however the response ends."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import replace
from typing import Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from armllm.api import (
    AsyncLLM,
    CompletionOutput,
    ContextLengthExceeded,
    EngineClosed,
    RequestOutput,
    RequestRejected,
)
from armllm.sampling import SamplingParams
from armllm.server import protocol as P
from armllm.server.state import Admission, ServerState

log = logging.getLogger("armllm.server")

T = TypeVar("T")
Job = tuple[list[int], SamplingParams]   # a prompt's token ids and its sampling parameters


def prepare_jobs(llm: AsyncLLM, prompts: list[list[int]], opts: P.Options, prompt_param: str,
                 max_tokens_param: str, default_max_tokens: int | None) -> list[Job]:
    """Each prompt with its SamplingParams, checked with AsyncLLM.check_request (a 400
    naming the field otherwise). Without max_tokens in the request a prompt gets
    default_max_tokens (None: the rest of the context), capped by the context left."""
    jobs = []
    for ids in prompts:
        params = opts.params
        if not opts.max_tokens_given:
            room = max(llm.max_model_len - len(ids), 1)  # 1: check_request names the prompt
            params = replace(params, max_tokens=min(room, default_max_tokens or room))
        try:
            llm.check_request(ids, params)
        except RequestRejected as exc:
            param = {"prompt": prompt_param, "max_tokens": max_tokens_param,
                     "structured_output": "response_format"}.get(exc.field, exc.field)
            code = ("context_length_exceeded" if isinstance(exc, ContextLengthExceeded)
                    else "invalid_value")
            raise P.APIError(str(exc), 400, param, code) from None
        jobs.append((ids, params))
    return jobs


class Generation:
    """One HTTP request's prompts running through AsyncLLM.generate. Its engine request
    ids are registered in the server state while they run (so a shutdown can end them);
    closing outputs() early aborts every one still running."""

    def __init__(self, state: ServerState, llm: AsyncLLM, jobs: list[Job], request_id: str,
                 priority: int):
        self.state, self.llm, self.jobs = state, llm, jobs
        self.request_id, self.priority = request_id, priority
        self.ids = [request_id] if len(jobs) == 1 else \
            [f"{request_id}-{i}" for i in range(len(jobs))]
        self.n = jobs[0][1].n
        self._ended: set[tuple[int, int]] = set()

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        if self.state.stopping:  # admitted just before the grace period ended
            raise _shutting_down()
        self.state.live.update(self.ids)
        try:
            if len(self.jobs) == 1:  # the common case: no task, no second queue
                async with aclosing(self._generate(0)) as outs:
                    async for out in outs:
                        yield 0, out
            else:
                async with aclosing(_merge([self._generate(i) for i in range(len(self.jobs))])
                                    ) as outs:
                    async for item in outs:
                        yield item
        finally:
            self.state.live.difference_update(self.ids)

    def _generate(self, i: int) -> AsyncIterator[RequestOutput]:
        ids, params = self.jobs[i]
        return self.llm.generate(ids, params, self.ids[i], self.priority)

    def ended_now(self, i: int, out: RequestOutput) -> set[int]:
        """The completions of prompt i that ended with this update (each reported once),
        after recording their metrics."""
        now = set()
        for c in out.outputs:
            if c.finish_reason is not None and (i, c.index) not in self._ended:
                self._ended.add((i, c.index))
                self.state.metrics.observe_completion(c.metrics, c.index == 0)
                now.add(c.index)
        return now


async def _merge(streams: list[AsyncIterator[RequestOutput]]
                 ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The items of several prompts' streams as they come, tagged with the stream's
    index: one task per stream (not per item). Closing this iterator cancels them,
    which aborts their requests."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with aclosing(stream):
                async for out in stream:
                    queue.put_nowait((i, out))
        except Exception as exc:  # noqa: BLE001 - re-raised by the consumer
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, item = await queue.get()
            if item is done:
                open_streams -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:  # no await: this may run in a cancelled scope (the client went away)
        for task in tasks:
            task.cancel()


class Choices(Protocol):
    """How an endpoint family writes its choices."""
    object: str                     # the JSON body's "object"
    chunk_object: str               # each streamed chunk's "object"

    def opening(self, count: int) -> list[dict] | None:
        """The first chunk's choices (before any token), if the family has one."""

    def delta(self, index: int, c: CompletionOutput, finish_reason: str | None) -> dict:
        """A streamed chunk's choice for this update of completion c."""

    def final(self, index: int, c: CompletionOutput) -> dict:
        """The JSON body's choice for the finished completion c."""


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`, cancelling it if the client goes away first (then raises ClientGone):
    vLLM's with_cancellation. Only for requests whose body has been read."""
    work_task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work_task, listener), return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        work_task.cancel()  # if this handler itself was cancelled
    if not work_task.done() or work_task.cancelled():
        raise ClientGone()
    return work_task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def respond(state: ServerState, request: Request, gen: Generation, choices: Choices,
                  opts: P.Options) -> Response:
    """Admits the request's completions (or answers 503) and answers it, as JSON or as
    server-sent events; its admission ends with the response, however that ends."""
    admission = state.admit(gen.llm, len(gen.jobs) * gen.n)
    model, created = state.config.served_model_name, int(time.time())
    if opts.stream:
        return event_stream(_events(gen, choices, opts, model, created), admission)
    outs = await whole(request, gen, admission)
    body = [choices.final(i * gen.n + c.index, c) for i, out in enumerate(outs)
            for c in out.outputs]
    return JSONResponse({"id": gen.request_id, "object": choices.object, "created": created,
                         "model": model, "choices": body, "usage": usage(outs)})


def event_stream(events: AsyncIterator[str], admission: Admission) -> EventStream:
    """A streamed answer: its server-sent events, holding the admission until it ends."""
    return EventStream(events, admission, media_type="text/event-stream",
                       headers={"Cache-Control": "no-cache"})


async def whole(request: Request, gen: Generation, admission: Admission
                ) -> list[RequestOutput]:
    """The generation's finished outputs, for an answer in one body: raced against the
    client's disconnect (ClientGone, which the app answers 499), the admission
    released however it ends, a failed generation raised as its APIError."""
    try:
        outs = await until_disconnected(request, collect(gen))
    finally:
        admission.release()
    failure = generation_failure(gen.state, outs)
    if failure is not None:
        raise failure
    return outs


async def collect(gen: Generation) -> list[RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    try:
        async with aclosing(gen.outputs()) as outs:
            async for i, out in outs:
                gen.ended_now(i, out)
                if out.finished:
                    finals[i] = out
    except EngineClosed:
        raise engine_stopped() from None
    return [finals[i] for i in range(len(gen.jobs))]


async def _events(gen: Generation, choices: Choices, opts: P.Options, model: str,
                  created: int) -> AsyncIterator[str]:
    usage_field = {"usage": None} if opts.include_usage else {}

    def chunk(body: list) -> str:
        return _event({"id": gen.request_id, "object": choices.chunk_object,
                       "created": created, "model": model, "choices": body, **usage_field})

    opening = choices.opening(len(gen.jobs) * gen.n)
    if opening:
        yield chunk(opening)
    finals: dict[int, RequestOutput] = {}
    try:
        async with aclosing(gen.outputs()) as outs:
            async for i, out in outs:
                ended = gen.ended_now(i, out)
                body = [choices.delta(i * gen.n + c.index, c,
                                      c.finish_reason if c.index in ended else None)
                        for c in out.outputs if c.new_token_ids or c.text_delta
                        or c.index in ended]
                if body:
                    yield chunk(body)
                if out.finished:
                    finals[i] = out
    except EngineClosed:
        yield _event(engine_stopped().body())
    except P.APIError as exc:
        yield _event(exc.body())
    except Exception as exc:  # a bug: the headers are sent, so the error goes in the stream
        log.exception("%s failed", gen.request_id)
        yield _event(P.APIError(f"internal error: {type(exc).__name__}: {exc}", 500).body())
    else:
        failure = generation_failure(gen.state, [finals[i] for i in sorted(finals)])
        if failure is not None:
            yield _event(failure.body())
        elif opts.include_usage:
            yield _event({"id": gen.request_id, "object": choices.chunk_object,
                          "created": created, "model": model, "choices": [],
                          "usage": usage([finals[i] for i in sorted(finals)])})
    yield "data: [DONE]\n\n"


def _event(data: dict) -> str:
    return "data: " + json.dumps(data) + "\n\n"


def generation_failure(state: ServerState, outs: list[RequestOutput]) -> P.APIError | None:
    """Why the generation did not complete: the engine failed a request, or the server
    ended it at shutdown."""
    error = next((o.error for o in outs if o.error), None)
    if error is not None:
        return P.APIError(f"generation failed: {error}", 500, code="generation_error")
    if state.stopping and any(c.finish_reason == "abort" for o in outs for c in o.outputs):
        return _shutting_down()
    return None


def _shutting_down() -> P.APIError:
    return P.APIError("the server is shutting down; the generation was stopped", 503,
                      code="server_shutting_down")


def engine_stopped() -> P.APIError:
    """The engine thread stopped between admission and generation (a shutdown)."""
    return P.APIError("the engine has stopped", 503, code="engine_stopped")


def token_text(llm: AsyncLLM, token: int) -> str:
    """One token's text as logprobs show it (special tokens included)."""
    return llm.tokenizer.decode([token], skip_special_tokens=False)


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(c.metrics.num_cached_prompt_tokens for o in outputs
                 for c in o.outputs[:1] if c.metrics is not None)
    reasoning = sum(c.metrics.num_reasoning_tokens for o in outputs for c in o.outputs
                    if c.metrics is not None)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning}}


class EventStream(StreamingResponse):
    """Server-sent events that release the request's admission and close their event
    iterator however the response ends (a client that went away, or a response that
    never started, included), so the generation's requests are aborted at once, not at
    garbage collection."""

    def __init__(self, events: AsyncIterator[str], admission: Admission, **kw):
        super().__init__(events, **kw)
        self.admission = admission

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.admission.release()
            await self.body_iterator.aclose()
