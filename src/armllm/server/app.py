"""app: the OpenAI-compatible ASGI application over one AsyncLLM and its
lifecycle.

The model loads in a background thread after the server starts (/health answers
503 until it is ready); the engine shuts down with the app. The routes are the
endpoint families' (completions, chat, responses, messages, tokenize,
embeddings, rerank and score, audio) and the small ones here: /health,
/version, /v1/models, /metrics, and the web chat page (/ and /static/, the
files in static/). ServerApp wraps them with the API key check (which spares
the page: it asks for the key itself) and the per-route HTTP counters, and
gives the process its one call for shutdown: end_generations(). Errors use
OpenAI's error body, Anthropic's on /v1/messages."""
from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import armllm
from armllm.api import AsyncLLM
from armllm.server import (
    audio,
    chat,
    completions,
    embeddings,
    messages,
    openapi,
    rerank,
    responses,
    tokenize,
)
from armllm.server import protocol as P
from armllm.server.generation import ClientGone
from armllm.server.state import ServerConfig, ServerState

log = logging.getLogger("armllm.server")

__all__ = ["ServerApp", "ServerConfig", "create_app"]

# the routes of Anthropic's API: their errors use its body
ANTHROPIC_PREFIX = "/v1/messages"
# the web chat page and its scripts and styles (installed with the package)
STATIC_DIR = Path(__file__).parent / "static"
STATIC_PREFIX = "/static"
# the page runs only its own files; its Markdown output can carry no script
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                           "object-src 'none'; base-uri 'none'; "
                                           "frame-ancestors 'none'",
                "Cache-Control": "no-cache"}


def create_app(config: ServerConfig, llm: AsyncLLM | None = None) -> ServerApp:
    """The application; without `llm` the model is loaded in a thread at startup."""
    state = ServerState(config, llm)
    openapi_document = openapi.document(config.served_model_name)

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

    @asynccontextmanager
    async def lifespan(app):
        loader = None
        if state.llm is None:
            loader = threading.Thread(target=load, name="armllm-load", daemon=True)
            loader.start()
        ticker = asyncio.create_task(_log_stats(state)) if config.log_interval_s > 0 else None
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
            llm = state.ready_llm()
        except P.APIError as exc:
            return JSONResponse(exc.body(), status_code=503)
        replicas = llm.replica_stats()
        if replicas is None:
            return JSONResponse({"status": "ok"})
        # data parallel: serving while any replica serves; the dead ones named
        return JSONResponse({"status": "ok", "replicas": len(replicas),
                             "replicas_down": [i for i, alive, _ in replicas if not alive]})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": armllm.__version__})

    async def models(request: Request) -> Response:
        llm = state.ready_llm()
        return JSONResponse({"object": "list", "data": [{
            "id": config.served_model_name, "object": "model", "created": state.created,
            "owned_by": "armllm", "root": str(config.model),
            "max_model_len": llm.max_model_len}]})

    async def metrics(request: Request) -> Response:
        text = "" if state.llm is None else \
            state.metrics.render(state.llm.stats(), state.in_flight, state.llm.replica_stats(),
                                 (len(state.responses), state.responses.evictions))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi_document)

    async def chat_page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers=PAGE_HEADERS)

    routes = [Route("/health", health), Route("/version", version),
              Route("/openapi.json", openapi_json),
              Route("/", chat_page), Mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR)),
              Route("/metrics", metrics), Route("/v1/models", models),
              *completions.routes(state), *chat.routes(state), *responses.routes(state),
              *messages.routes(state), *tokenize.routes(state), *embeddings.routes(state),
              *rerank.routes(state), *audio.routes(state)]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={P.APIError: _api_error, HTTPException: _http_error,
                                        ClientDisconnect: _client_gone, ClientGone: _client_gone,
                                        Exception: _server_error})
    return ServerApp(app, state, [r for r in routes if isinstance(r, Route)])


async def _log_stats(state: ServerState) -> None:
    """A line of throughput and occupancy every log_interval_s while there is work
    (work done since the previous line, counted from the engine's start: a request
    that ran between the model becoming ready and the first tick is reported too)."""
    prompt_tokens = generation_tokens = 0   # as of the previous tick
    last_t = time.monotonic()
    while True:
        await asyncio.sleep(state.config.log_interval_s)
        now = time.monotonic()
        if state.llm is None:
            last_t = now
            continue
        s = state.llm.stats()
        if s.num_running or s.num_waiting or s.num_generation_tokens != generation_tokens:
            dt = now - last_t
            log.info("prompt %.1f tok/s, generation %.1f tok/s, running %d, waiting %d, "
                     "KV usage %.1f%%, prefix-cache hit rate %.1f%%",
                     (s.num_prompt_tokens - prompt_tokens) / dt,
                     (s.num_generation_tokens - generation_tokens) / dt,
                     s.num_running, s.num_waiting, 100 * s.kv_usage, 100 * s.prefix_hit_rate)
        prompt_tokens, generation_tokens, last_t = (s.num_prompt_tokens,
                                                    s.num_generation_tokens, now)


def error_response(path: str, exc: P.APIError, headers: dict | None = None) -> JSONResponse:
    """The error in the body of the API family the path belongs to: Anthropic's on
    /v1/messages, else OpenAI's."""
    if exc.status == 503:
        headers = {**(headers or {}), "Retry-After": "1"}
    body = exc.anthropic_body() if path.startswith(ANTHROPIC_PREFIX) else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=headers)


async def _api_error(request: Request, exc: P.APIError) -> Response:
    return error_response(request.url.path, exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    err = P.APIError(exc.detail or "error", exc.status_code,
                     code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code))
    return error_response(request.url.path, err)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    err = P.APIError(f"internal error: {type(exc).__name__}: {exc}", 500)
    return error_response(request.url.path, err)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client went away (ClientDisconnect, ClientGone): nobody reads the answer."""
    return Response(status_code=499)


class ServerApp:
    """The ASGI application: the API key check (every route but /health and the chat
    page's; Bearer or x-api-key) and the per-route HTTP counters around the Starlette
    routes."""

    def __init__(self, app: Starlette, state: ServerState, routes: list[Route]):
        self._app, self._state, self._routes = app, state, routes
        key = state.config.api_key
        self._key = key.encode() if key else None

    @property
    def engine_failure(self) -> str | None:
        """Why the engine stopped on its own (a tensor-parallel rank died), or None."""
        llm = self._state.llm
        return None if llm is None else llm.failure

    def end_generations(self) -> None:
        """Ends every generation still running, each response with an error saying the
        server is shutting down (the process calls this when its grace period is over)."""
        self._state.end_generations()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self._app(scope, receive, send)
        route = next((r.path for r in self._routes if r.path_regex.match(scope["path"])),
                     "other")
        status_seen = []

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        try:
            if self._key is not None and not _without_key(scope["path"]) \
                    and not _key_given(dict(scope["headers"]), self._key):
                err = P.APIError("missing or wrong API key (Authorization: Bearer ..., or "
                                 "x-api-key)", 401, code="invalid_api_key")
                resp = error_response(scope["path"], err, {"WWW-Authenticate": "Bearer"})
                return await resp(scope, receive, counting_send)
            await self._app(scope, receive, counting_send)
        finally:
            self._state.metrics.observe_http(route, status_seen[0] if status_seen else 499)


def _key_given(headers: dict[bytes, bytes], key: bytes) -> bool:
    """Whether the request carries the key: Authorization: Bearer KEY (OpenAI's
    clients), or x-api-key: KEY (Anthropic's), compared in constant time."""
    bearer = headers.get(b"authorization", b"")
    return hmac.compare_digest(bearer, b"Bearer " + key) \
        | hmac.compare_digest(headers.get(b"x-api-key", b""), key)


def _without_key(path: str) -> bool:
    """Whether a path answers without the API key: /health, and the chat page and its
    files (public, and the page asks for the key before calling the API)."""
    return path in ("/health", "/") or path.startswith(STATIC_PREFIX + "/")
