"""pooled: one HTTP request's pooling requests (the inputs of /v1/embeddings, the
pairs of /v1/rerank and /v1/score) run together through the engine: checked
first (a 400 naming the parameter for one that could never run), counted in
flight like completions, ended when the client goes, and an engine failure
answered in the API's error shape."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request

from armllm.api import AsyncLLM, ContextLengthExceeded, EngineClosed, RequestRejected
from armllm.engine.embedding import PoolingParams
from armllm.server import protocol as P
from armllm.server.generation import until_disconnected
from armllm.server.state import ServerState

Result = TypeVar("Result")


def check(llm: AsyncLLM, ids: list[int], params: PoolingParams, fields: dict[str, str]
          ) -> None:
    """A 400 for a prompt the engine could never pool; `fields` renames the engine's
    field (RequestRejected.field) to the request's parameter."""
    try:
        llm.check_request(ids, params)
    except RequestRejected as exc:
        code = ("context_length_exceeded" if isinstance(exc, ContextLengthExceeded)
                else "invalid_value")
        raise P.APIError(str(exc), 400, fields.get(exc.field, exc.field), code) from None


async def run_all(state: ServerState, request: Request, llm: AsyncLLM, what: str,
                  prefix: str, count: int, start: Callable[[int, str], Awaitable[Result]]
                  ) -> list[Result]:
    """start(i, request_id) for i < count (request ids `prefix`-...), awaited together;
    raises ClientGone when the client disconnects (the requests are aborted) and
    APIError for a failure ("`what` failed: ...")."""
    admission = state.admit(llm, count)
    base_id = f"{prefix}-{uuid.uuid4().hex}"
    request_ids = [f"{base_id}-{i}" for i in range(count)]
    state.live.update(request_ids)
    try:
        return await until_disconnected(request, asyncio.gather(
            *(start(i, rid) for i, rid in enumerate(request_ids))))
    except EngineClosed:
        raise P.APIError("the engine has stopped", 503, code="engine_stopped") from None
    except RuntimeError as exc:   # the engine ended one (a failure, or the shutdown)
        if state.stopping:
            raise P.APIError("the server is shutting down; the request was stopped", 503,
                             code="server_shutting_down") from None
        raise P.APIError(f"{what} failed: {exc}", 500, code="generation_error") from None
    finally:
        admission.release()
        state.live.difference_update(request_ids)
