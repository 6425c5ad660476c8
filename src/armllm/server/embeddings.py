"""embeddings: /v1/embeddings in OpenAI's shape. `input` is a string, a list of
strings, token ids or a list of token-id lists; `encoding_format` float or
base64 (the vector's little-endian float32 bytes, which OpenAI's clients ask
for by default); `dimensions` truncates where the model was trained for it
(Matryoshka); usage counts the input tokens. Every input runs as one embedding
request through the engine, batched with whatever else it runs, and counts in
flight like a completion until the answer is ready."""
from __future__ import annotations

import base64

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from armllm.engine.embedding import PoolingParams
from armllm.server import pooled
from armllm.server import protocol as P
from armllm.server.state import ServerState

EMBEDDING_FIELDS = {"model": "str", "input": "any", "encoding_format": "str",
                    "dimensions": "int", "user": "str", "add_special_tokens": "bool",
                    "priority": "int"}
ENCODING_FORMATS = ("float", "base64")
# RequestRejected.field -> the request's parameter
_PARAMS = {"prompt": "input", "dimensions": "dimensions", "model": "model"}


def routes(state: ServerState) -> list[Route]:
    async def embeddings(request: Request) -> Response:
        llm, req = await state.read_request(request, EMBEDDING_FIELDS, "/v1/embeddings",
                                            "input")
        encoding = req.get("encoding_format", "float")
        if encoding not in ENCODING_FORMATS:
            raise P.bad("encoding_format", f"must be one of {', '.join(ENCODING_FORMATS)}, "
                                           f"got {encoding!r}")
        inputs = _inputs(req["input"])
        state.check_capacity(llm, len(inputs), 1)
        special = req.get("add_special_tokens", True)
        ids = [llm.tokenizer.encode(p, special) if isinstance(p, str) else p for p in inputs]
        params = PoolingParams(req.get("dimensions"))
        for one in ids:
            pooled.check(llm, one, params, _PARAMS)
        outs = await pooled.run_all(
            state, request, llm, "embedding", "embd", len(ids),
            lambda i, rid: llm.embed(ids[i], params.dimensions, rid, req.get("priority", 0)))
        tokens = sum(len(one) for one in ids)
        return JSONResponse({
            "object": "list", "model": state.config.served_model_name,
            "data": [{"object": "embedding", "index": i,
                      "embedding": _encode(out.embedding, encoding)}
                     for i, out in enumerate(outs)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    return [Route("/v1/embeddings", embeddings, methods=["POST"])]


def _inputs(value) -> list[str | list[int]]:
    """input: a string, a list of strings, token ids, or a list of token-id lists; an
    empty string is refused, as OpenAI's API does."""
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value:
        if all(P.is_int(t) for t in value):
            return [value]
        if all(isinstance(p, str) and p for p in value):
            return list(value)
        if all(isinstance(p, list) and p and all(P.is_int(t) for t in p) for p in value):
            return list(value)
    raise P.bad("input", "must be a non-empty string, a non-empty list of them, a list of "
                         "token ids, or a list of non-empty token-id lists")


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
