"""rerank: a reranker's relevance scores over HTTP.

- `/v1/rerank` (and `/rerank`): the Jina / Cohere v1 shape vLLM and llama.cpp
  serve: `query`, `documents` (strings or `{"text": ...}`), `top_n`,
  `return_documents` (default true); results ranked by `relevance_score`, best
  first (ties in the documents' order), each with its `index`.
- `/v2/rerank`: Cohere v2's (documents as strings, no documents returned unless
  asked, `max_tokens_per_doc`).
- `/v1/score` (and `/score`): vLLM's: `text_1` against each of `text_2` (or
  pairwise, two lists of one length); scores in the input's order.
Each pair is one score request (engine/embedding.py) run batched with whatever
else the engine runs: the documents of one query share its prompt prefix, which
the prefix cache computes once. A model that is no reranker gets a 400."""
from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from armllm.api import AsyncLLM
from armllm.engine.embedding import PoolingParams
from armllm.server import pooled
from armllm.server import protocol as P
from armllm.server.state import ServerState

RERANK_FIELDS = {"model": "str", "query": "str", "documents": "list", "top_n": "int",
                 "return_documents": "bool", "max_tokens_per_doc": "int",
                 "rank_fields": "list", "priority": "int", "user": "str"}
SCORE_FIELDS = {"model": "str", "text_1": "any", "text_2": "any", "priority": "int",
                "user": "str"}
# RequestRejected.field -> the request's parameter
_RERANK_PARAMS = {"prompt": "documents", "model": "model"}
_SCORE_PARAMS = {"prompt": "text_2", "model": "model"}


def routes(state: ServerState) -> list[Route]:
    async def rerank(request: Request, version: int) -> Response:
        endpoint = request.url.path
        llm, req = await state.read_request(request, RERANK_FIELDS, endpoint, "query")
        if "documents" not in req:
            raise P.bad("documents", "is required", "missing_required_parameter")
        documents = _documents(req["documents"], version)
        top_n = req.get("top_n", len(documents))
        if top_n < 1:
            raise P.bad("top_n", f"must be at least 1, got {top_n}")
        fields = req.get("rank_fields")
        if fields is not None and fields != ["text"]:
            raise P.bad("rank_fields", f"armllm ranks documents by their text: rank_fields "
                                       f"may only be [\"text\"], got {fields!r}")
        texts = _truncated(llm, documents, req.get("max_tokens_per_doc"))
        scores, tokens = await _score(state, request, llm, [req["query"]] * len(texts), texts,
                                      req.get("priority", 0), _RERANK_PARAMS)
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
        show = req.get("return_documents", version == 1)
        return JSONResponse({
            "id": f"rerank-{uuid.uuid4().hex}", "model": state.config.served_model_name,
            "results": [{"index": i, "relevance_score": scores[i],
                         **({"document": {"text": documents[i]}} if show else {})}
                        for i in ranked],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank_v1(request: Request) -> Response:
        return await rerank(request, 1)

    async def rerank_v2(request: Request) -> Response:
        return await rerank(request, 2)

    async def score(request: Request) -> Response:
        endpoint = request.url.path
        llm, req = await state.read_request(request, SCORE_FIELDS, endpoint, "text_1")
        if "text_2" not in req:
            raise P.bad("text_2", "is required", "missing_required_parameter")
        first, second = _texts("text_1", req["text_1"]), _texts("text_2", req["text_2"])
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise P.bad("text_1", f"must be one text or as many as text_2 ({len(second)}), "
                                  f"got {len(first)}")
        scores, tokens = await _score(state, request, llm, first, second,
                                      req.get("priority", 0), _SCORE_PARAMS)
        return JSONResponse({
            "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": state.config.served_model_name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    return [Route("/v1/rerank", rerank_v1, methods=["POST"]),
            Route("/rerank", rerank_v1, methods=["POST"]),
            Route("/v2/rerank", rerank_v2, methods=["POST"]),
            Route("/v1/score", score, methods=["POST"]),
            Route("/score", score, methods=["POST"])]


async def _score(state: ServerState, request: Request, llm: AsyncLLM, queries: list[str],
                 documents: list[str], priority: int, params_named: dict[str, str]
                 ) -> tuple[list[float], int]:
    """Each pair's score (in order) and the prompt tokens they took."""
    if not llm.is_reranker:
        raise P.APIError("this model is no reranker: rerank and score need a cross-encoder "
                         "or reranker checkpoint (a one-label sequence classifier, a GGUF "
                         "of pooling type rank, or a causal reranker served with "
                         "--score-from-tokens)", 400, "model", "model_not_supported")
    state.check_capacity(llm, len(documents), 1)
    ids = [llm.score_prompt(q, d) for q, d in zip(queries, documents, strict=True)]
    params = PoolingParams(task="score")
    for one in ids:
        pooled.check(llm, one, params, params_named)
    outs = await pooled.run_all(state, request, llm, "scoring", "score", len(ids),
                                lambda i, rid: llm.score_ids(ids[i], rid, priority))
    return [out.score for out in outs], sum(len(one) for one in ids)


def _documents(value: Any, version: int) -> list[str]:
    """documents: a non-empty list of strings (v1 also `{"text": ...}` objects)."""
    if isinstance(value, list) and value:
        texts = [d.get("text") if isinstance(d, dict) and version == 1 else d for d in value]
        if all(isinstance(t, str) for t in texts):
            return texts
    raise P.bad("documents", "must be a non-empty list of strings"
                + (" or of {\"text\": string} objects" if version == 1 else ""))


def _texts(name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return list(value)
    raise P.bad(name, "must be a string or a non-empty list of strings")


def _truncated(llm: AsyncLLM, documents: list[str], max_tokens: int | None) -> list[str]:
    """Each document cut to its first max_tokens tokens (Cohere's max_tokens_per_doc)."""
    if max_tokens is None:
        return documents
    if max_tokens < 1:
        raise P.bad("max_tokens_per_doc", f"must be at least 1, got {max_tokens}")
    out = []
    for doc in documents:
        ids = llm.tokenizer.encode(doc, add_special_tokens=False)
        out.append(doc if len(ids) <= max_tokens
                   else llm.tokenizer.decode(ids[:max_tokens], skip_special_tokens=False))
    return out
