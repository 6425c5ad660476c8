"""app: the OpenAI-compatible Starlette application over one AsyncLLM.

Routes: /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE
streaming), /tokenize, /detokenize, /health, /metrics, /version. The model
loads in a background thread after the server starts (/health answers 503
until it is ready). Every generation races the client's disconnect: a client
that goes away aborts its requests, which frees their KV blocks at the
engine's next step. Errors use OpenAI's error body."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import armllm
from armllm.api import AsyncLLM
from armllm.engine.outputs import OutputCollector, RequestOutput
from armllm.server import protocol as P
from armllm.server.metrics import ServerMetrics

log = logging.getLogger("armllm.server")


@dataclass
class ServerConfig:
    model: str | Path
    served_model_name: str
    engine_args: dict = field(default_factory=dict)
    api_key: str | None = None
    max_waiting_requests: int = 256      # engine requests queued beyond max_num_seqs
    max_request_bytes: int = 4 << 20     # request bodies above this are refused
    log_interval_s: float = 10.0         # 0: no periodic stats line
    shutdown_grace_s: float = 10.0


class _State:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.llm: AsyncLLM | None = None
        self.load_error: str | None = None
        self.metrics = ServerMetrics(config.served_model_name)
        self.in_flight = 0          # engine requests (prompts) being served
        self.created = int(time.time())

    def ready_llm(self) -> AsyncLLM:
        if self.llm is None:
            msg = (f"the model failed to load: {self.load_error}" if self.load_error
                   else "the model is still loading")
            raise P.APIError(msg, 503, code="model_not_ready")
        if not self.llm.engine_thread.alive:
            raise P.APIError("the engine has stopped", 503, code="engine_stopped")
        return self.llm


# -- request plumbing -----------------------------------------------------------------------

async def _read_json(request: Request, limit: int):
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise P.APIError(f"Content-Type must be application/json, got {ctype or 'none'!r}",
                         code="invalid_content_type")
    declared = request.headers.get("content-length")
    too_big = P.APIError(f"the request body exceeds the limit of {limit} bytes", 400,
                         code="request_too_large")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise P.APIError(f"the request body is not valid JSON: {exc}",
                         code="invalid_json") from None


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client has gone away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _Disconnected(Exception):
    pass


class Generation:
    """The engine requests of one HTTP request (one per prompt), merged into one
    stream of (prompt index, RequestOutput); aborts them all if the client leaves
    or the consumer stops early. Talks to the engine thread directly: its outputs
    and the client's disconnect arrive on one queue."""

    def __init__(self, state: _State, request: Request, jobs: list[tuple[list[int], object]],
                 request_id: str, priority: int):
        self.state, self.request, self.jobs = state, request, jobs
        self.request_id, self.priority = request_id, priority

    async def events(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        engine = self.state.llm.engine_thread
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        gone = object()
        rids = [self.request_id if len(self.jobs) == 1 else f"{self.request_id}-{i}"
                for i in range(len(self.jobs))]
        collectors = [OutputCollector(rid, ids, p.n, p.logprobs is not None)
                      for rid, (ids, p) in zip(rids, self.jobs, strict=True)]

        def sink(i: int):
            return lambda out: loop.call_soon_threadsafe(inbox.put_nowait, (i, out))

        self.state.in_flight += len(self.jobs)
        watch = asyncio.create_task(_wait_disconnect(self.request))
        watch.add_done_callback(lambda t: t.cancelled() or inbox.put_nowait(gone))
        try:
            accepted = [asyncio.wrap_future(engine.add(rid, ids, p, sink(i), self.priority))
                        for i, (rid, (ids, p)) in enumerate(zip(rids, self.jobs, strict=True))]
            await asyncio.gather(*accepted)
            remaining = len(self.jobs)
            while remaining:
                item = await inbox.get()
                if item is gone:
                    raise _Disconnected()
                i, step = item
                out = collectors[i].add(step)
                remaining -= out.finished
                yield i, out
        finally:  # no await here: this may run inside a cancelled scope (client gone)
            self.state.in_flight -= len(self.jobs)
            watch.cancel()
            for rid, c in zip(rids, collectors, strict=True):
                if not c.output.finished:
                    engine.abort(rid)  # unknown (never accepted) or finished ids are ignored


# -- building requests ----------------------------------------------------------------------

def _check_model(state: _State, req: dict) -> None:
    name = req.get("model")
    if name is not None and name != state.config.served_model_name:
        raise P.APIError(f"model {name!r} does not exist; this server serves "
                         f"{state.config.served_model_name!r}", 400, "model",
                         "model_not_found")


def _jobs(llm: AsyncLLM, prompts: list[list[int]], opts: P.Options, param: str
          ) -> list[tuple[list[int], object]]:
    """(prompt ids, SamplingParams) per prompt, each checked against the model's limits."""
    vocab, max_len = llm.loaded.config.vocab_size, llm.max_model_len
    jobs = []
    for ids in prompts:
        bad_id = next((t for t in ids if not 0 <= t < vocab), None)
        if bad_id is not None:
            raise P.bad(param, f"token id {bad_id} is outside the vocabulary [0, {vocab})")
        if not ids:
            raise P.bad(param, "the prompt is empty")
        if len(ids) >= max_len:
            raise P.APIError(f"this model's maximum context length is {max_len} tokens; the "
                             f"prompt has {len(ids)}", 400, param, "context_length_exceeded")
        params = opts.params
        if not opts.max_tokens_given:
            params = replace(params, max_tokens=max_len - len(ids))
        elif len(ids) + params.max_tokens > max_len:
            raise P.APIError(f"this model's maximum context length is {max_len} tokens; you "
                             f"asked for {len(ids) + params.max_tokens} ({len(ids)} in the "
                             f"prompt, {params.max_tokens} to generate)", 400, "max_tokens",
                             "context_length_exceeded")
        try:
            llm.engine.scheduler.check_fits(len(ids), params.max_tokens, params.n)
        except ValueError as exc:
            raise P.APIError(str(exc), 400, "max_tokens", "context_length_exceeded") from None
        jobs.append((ids, params))
    return jobs


def _admit(state: _State, llm: AsyncLLM, count: int) -> None:
    limit = llm.engine.scheduler.max_num_seqs + state.config.max_waiting_requests
    if state.in_flight + count > limit:
        state.metrics.rejected_overload += 1
        raise P.APIError(f"the server is at capacity ({state.in_flight} requests in flight); "
                         "retry later", 503, code="server_overloaded")


def _token_text(llm: AsyncLLM, token: int) -> str:
    return llm.tokenizer.decode([token], skip_special_tokens=False)


def _completion_logprobs(llm: AsyncLLM, entries: list, offset: int) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    for token, lp, top in entries:
        text = _token_text(llm, token)
        tokens.append(text)
        lps.append(lp)
        tops.append({_token_text(llm, t): v for t, v in top} if top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


def _chat_logprobs(llm: AsyncLLM, entries: list) -> dict:
    def item(token: int, lp: float) -> dict:
        text = _token_text(llm, token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**item(token, lp), "top_logprobs": [item(t, v) for t, v in top or []]}
                        for token, lp, top in entries]}


def _usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(c.metrics.num_cached_prompt_tokens for o in outputs
                 for c in o.outputs[:1] if c.metrics is not None)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


# -- the app --------------------------------------------------------------------------------

def create_app(config: ServerConfig, llm: AsyncLLM | None = None) -> Starlette:
    """The application; without `llm` the model is loaded in a thread at startup."""
    state = _State(config)
    state.llm = llm

    def load() -> None:
        try:
            loaded = AsyncLLM(config.model, **config.engine_args)
        except Exception as exc:  # noqa: BLE001 - reported by /health and every request
            log.exception("loading %s failed", config.model)
            state.load_error = f"{type(exc).__name__}: {exc}"
            return
        state.llm = loaded
        log.info("serving %s as %r (max_model_len %d)", config.model,
                 config.served_model_name, loaded.max_model_len)

    async def log_stats() -> None:
        last, last_t = None, time.monotonic()
        while True:
            await asyncio.sleep(config.log_interval_s)
            if state.llm is None:
                continue
            s, now = state.llm.stats(), time.monotonic()
            if last is not None and (s.num_running or s.num_waiting
                                     or s.num_generation_tokens != last.num_generation_tokens):
                dt = now - last_t
                log.info("prompt %.1f tok/s, generation %.1f tok/s, running %d, waiting %d, "
                         "KV usage %.1f%%, prefix-cache hit rate %.1f%%",
                         (s.num_prompt_tokens - last.num_prompt_tokens) / dt,
                         (s.num_generation_tokens - last.num_generation_tokens) / dt,
                         s.num_running, s.num_waiting, 100 * s.kv_usage,
                         100 * s.prefix_hit_rate)
            last, last_t = s, now

    @asynccontextmanager
    async def lifespan(app):
        loader = None
        if state.llm is None:
            loader = threading.Thread(target=load, name="armllm-load", daemon=True)
            loader.start()
        ticker = asyncio.create_task(log_stats()) if config.log_interval_s > 0 else None
        try:
            yield
        finally:
            if ticker:
                ticker.cancel()
            if loader is not None:
                await asyncio.to_thread(loader.join)
            if state.llm is not None:
                await asyncio.to_thread(state.llm.shutdown)

    async def health(request: Request) -> Response:
        try:
            state.ready_llm()
        except P.APIError as exc:
            return JSONResponse(exc.body(), status_code=503)
        return JSONResponse({"status": "ok"})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": armllm.__version__})

    async def models(request: Request) -> Response:
        llm = state.ready_llm()
        return JSONResponse({"object": "list", "data": [{
            "id": config.served_model_name, "object": "model", "created": state.created,
            "owned_by": "armllm", "root": str(config.model),
            "max_model_len": llm.max_model_len}]})

    async def metrics(request: Request) -> Response:
        if state.llm is None:
            return PlainTextResponse("", media_type="text/plain; version=0.0.4")
        text = state.metrics.render(state.llm.stats(), state.in_flight)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def tokenize(request: Request) -> Response:
        llm = state.ready_llm()
        body = await _read_json(request, config.max_request_bytes)
        req = P.check_fields(body, {"model": "str", "prompt": "str", "messages": "list",
                                    "add_special_tokens": "bool",
                                    "add_generation_prompt": "bool"}, "/tokenize")
        _check_model(state, req)
        if ("prompt" in req) == ("messages" in req):
            raise P.bad("prompt", "give exactly one of prompt and messages")
        if "prompt" in req:
            ids = llm.tokenizer.encode(req["prompt"], req.get("add_special_tokens", True))
        else:
            ids = _render_chat(llm, P.chat_messages(req["messages"]),
                               req.get("add_generation_prompt", True), False, {})
        return JSONResponse({"count": len(ids), "max_model_len": llm.max_model_len,
                             "tokens": ids})

    async def detokenize(request: Request) -> Response:
        llm = state.ready_llm()
        body = await _read_json(request, config.max_request_bytes)
        req = P.check_fields(body, {"model": "str", "tokens": "list"}, "/detokenize")
        _check_model(state, req)
        tokens = req.get("tokens")
        vocab = llm.loaded.config.vocab_size
        if tokens is None or not all(P._int(t) and 0 <= t < vocab for t in tokens):
            raise P.bad("tokens", f"must be a list of token ids in [0, {vocab})")
        return JSONResponse({"prompt": llm.tokenizer.decode(tokens)})

    async def generation_request(request: Request, fields: dict, endpoint: str,
                                 required: str) -> tuple[AsyncLLM, dict]:
        """The ready engine and the checked body of a completions/chat request."""
        llm = state.ready_llm()
        body = await _read_json(request, config.max_request_bytes)
        req = P.check_fields(body, fields, endpoint)
        _check_model(state, req)
        P.refuse_unsupported(req)
        if required not in req:
            raise P.bad(required, "is required", "missing_required_parameter")
        return llm, req

    async def completions(request: Request) -> Response:
        llm, req = await generation_request(request, P.COMPLETION_FIELDS, "/v1/completions",
                                            "prompt")
        opts = P.sampling_options(req, False, llm.default_sampling_params)
        prompts = [llm.tokenizer.encode(p) if isinstance(p, str) else p
                   for p in P.completion_prompts(req["prompt"])]
        jobs = _jobs(llm, prompts, opts, "prompt")
        _admit(state, llm, len(jobs))
        gen = Generation(state, request, jobs, f"cmpl-{uuid.uuid4().hex}", opts.priority)
        return await _respond(state, llm, gen, opts, chat=False)

    async def chat_completions(request: Request) -> Response:
        llm, req = await generation_request(request, P.CHAT_FIELDS, "/v1/chat/completions",
                                            "messages")
        messages = P.chat_messages(req["messages"])
        cont = req.get("continue_final_message", False)
        add_gen = req.get("add_generation_prompt", not cont)
        if cont and messages[-1]["role"] != "assistant":
            raise P.bad("continue_final_message", "needs the last message to be the "
                                                  "assistant's")
        opts = P.sampling_options(req, True, llm.default_sampling_params)
        ids = _render_chat(llm, messages, add_gen, cont, req.get("chat_template_kwargs") or {})
        jobs = _jobs(llm, [ids], opts, "messages")
        _admit(state, llm, len(jobs))
        gen = Generation(state, request, jobs, f"chatcmpl-{uuid.uuid4().hex}", opts.priority)
        return await _respond(state, llm, gen, opts, chat=True)

    async def api_error(request: Request, exc: P.APIError) -> Response:
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        err = P.APIError(exc.detail or "error", exc.status_code,
                         code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code))
        return JSONResponse(err.body(), status_code=exc.status_code)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        err = P.APIError(f"internal error: {type(exc).__name__}: {exc}", 500)
        return JSONResponse(err.body(), status_code=500)

    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=499)

    routes = [Route("/health", health), Route("/version", version),
              Route("/metrics", metrics), Route("/v1/models", models),
              Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={P.APIError: api_error, HTTPException: http_error,
                                        ClientDisconnect: client_gone,
                                        Exception: server_error})
    app.state.armllm = state
    known = {r.path for r in routes}
    return _Guard(app, state, config.api_key, known)


def _render_chat(llm: AsyncLLM, messages: list[dict], add_generation_prompt: bool,
                 continue_final: bool, template_kwargs: dict) -> list[int]:
    try:
        text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt,
                                                 continue_final, **template_kwargs)
    except ValueError as exc:
        raise P.bad("messages", str(exc)) from None
    return llm.tokenizer.encode(text, add_special_tokens=False)


async def _respond(state: _State, llm: AsyncLLM, gen: Generation, opts: P.Options,
                   chat: bool) -> Response:
    model, created = state.config.served_model_name, int(time.time())
    n = opts.params.n
    if opts.stream:
        return _SSEResponse(_sse(state, llm, gen, opts, chat, model, created),
                            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    finals: dict[int, RequestOutput] = {}
    ended: set = set()
    try:
        async with aclosing(gen.events()) as events:
            async for i, out in events:
                _observe(state, i, out, ended)
                if out.finished:
                    finals[i] = out
    except _Disconnected:
        return Response(status_code=499)
    outs = [finals[i] for i in range(len(gen.jobs))]
    failed = next((o.error for o in outs if o.error), None)
    if failed:
        raise P.APIError(f"generation failed: {failed}", 500, code="generation_error")
    choices = []
    for i, out in enumerate(outs):
        for c in out.outputs:
            choice = {"index": i * n + c.index, "finish_reason": c.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
                choice["logprobs"] = (_chat_logprobs(llm, c.logprobs)
                                      if opts.logprobs is not None else None)
            else:
                choice["text"] = c.text
                choice["logprobs"] = (_completion_logprobs(llm, c.logprobs, 0)
                                      if opts.logprobs is not None else None)
            choices.append(choice)
    return JSONResponse({"id": gen.request_id, "object": "chat.completion" if chat
                         else "text_completion", "created": created, "model": model,
                         "choices": choices, "usage": _usage(outs)})


def _observe(state: _State, i: int, out: RequestOutput, ended: set) -> set[int]:
    """Records metrics for the completions of prompt i that ended in this update (each
    once; `ended` remembers them) and returns their indices."""
    now = set()
    for c in out.outputs:
        if c.finish_reason is not None and (i, c.index) not in ended:
            ended.add((i, c.index))
            state.metrics.observe_completion(c.metrics, c.index == 0)
            now.add(c.index)
    return now


async def _sse(state: _State, llm: AsyncLLM, gen: Generation, opts: P.Options, chat: bool,
               model: str, created: int) -> AsyncIterator[str]:
    n = opts.params.n
    kind = "chat.completion.chunk" if chat else "text_completion"
    usage_field = {"usage": None} if opts.include_usage else {}
    offsets: dict[int, int] = {}

    def chunk(choices: list) -> str:
        return "data: " + json.dumps({"id": gen.request_id, "object": kind, "created": created,
                                      "model": model, "choices": choices, **usage_field}) + "\n\n"

    finals: dict[int, RequestOutput] = {}
    if chat:  # the role first, for every choice
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                      "logprobs": None, "finish_reason": None}
                     for i in range(len(gen.jobs) * n)])
    ended: set = set()
    try:
        async with aclosing(gen.events()) as events:
            async for i, out in events:
                ended_now = _observe(state, i, out, ended)
                choices = []
                for c in out.outputs:
                    if not (c.text_delta or c.new_token_ids) and c.index not in ended_now:
                        continue
                    index = i * n + c.index
                    lp = None
                    if opts.logprobs is not None and c.new_logprobs:
                        lp = (_chat_logprobs(llm, c.new_logprobs) if chat else
                              _completion_logprobs(llm, c.new_logprobs, offsets.get(index, 0)))
                    offsets[index] = offsets.get(index, 0) + len(c.text_delta)
                    reason = c.finish_reason if c.index in ended_now else None
                    if chat:
                        # a token whose text is held back still gets its chunk ("")
                        delta = {"content": c.text_delta} if c.new_token_ids else {}
                        choices.append({"index": index, "delta": delta, "logprobs": lp,
                                        "finish_reason": reason})
                    else:
                        choices.append({"index": index, "text": c.text_delta, "logprobs": lp,
                                        "finish_reason": reason})
                if choices:
                    yield chunk(choices)
                if out.finished:
                    finals[i] = out
                    if out.error:
                        err = P.APIError(f"generation failed: {out.error}", 500,
                                         code="generation_error")
                        yield "data: " + json.dumps(err.body()) + "\n\n"
    except _Disconnected:
        return
    if opts.include_usage:
        outs = [finals[i] for i in sorted(finals)]
        yield "data: " + json.dumps({"id": gen.request_id, "object": kind, "created": created,
                                     "model": model, "choices": [],
                                     "usage": _usage(outs)}) + "\n\n"
    yield "data: [DONE]\n\n"


class _SSEResponse(StreamingResponse):
    """Closes its event generator however the response ends (a client that went away
    included), so the generation's requests are aborted at once, not at garbage
    collection."""

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


class _Guard:
    """ASGI middleware: the API key (all routes but /health) and per-route HTTP counters."""

    def __init__(self, app: Starlette, state: _State, api_key: str | None, known: set[str]):
        self.app, self.state, self.known = app, state, known
        self.key = f"Bearer {api_key}".encode() if api_key else None

    def __getattr__(self, name):  # app.state, app.routes, ... for tests and tools
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in self.known else "other"
        status_seen = []

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        try:
            if self.key is not None and scope["path"] != "/health":
                given = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(given, self.key):
                    err = P.APIError("missing or wrong API key (Authorization: Bearer ...)",
                                     401, code="invalid_api_key")
                    resp = JSONResponse(err.body(), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                    return await resp(scope, receive, counting_send)
            await self.app(scope, receive, counting_send)
        finally:
            self.state.metrics.observe_http(route, status_seen[0] if status_seen else 499)
