"""tokenize: /tokenize (a prompt, or messages rendered with the chat template,
to token ids) and /detokenize (token ids to text), as vLLM's."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from armllm.server import protocol as P
from armllm.server.chat import render_chat
from armllm.server.state import ServerState

TOKENIZE_FIELDS = {"model": "str", "prompt": "str", "messages": "list",
                   "add_special_tokens": "bool", "add_generation_prompt": "bool"}
DETOKENIZE_FIELDS = {"model": "str", "tokens": "list"}


def routes(state: ServerState) -> list[Route]:
    async def tokenize(request: Request) -> Response:
        llm, req = await state.read_request(request, TOKENIZE_FIELDS, "/tokenize")
        if ("prompt" in req) == ("messages" in req):
            raise P.bad("prompt", "give exactly one of prompt and messages")
        if "prompt" in req:
            ids = llm.tokenizer.encode(req["prompt"], req.get("add_special_tokens", True))
        else:
            ids = render_chat(llm, P.chat_messages(req["messages"]),
                              req.get("add_generation_prompt", True), False, {})
        return JSONResponse({"count": len(ids), "max_model_len": llm.max_model_len,
                             "tokens": ids})

    async def detokenize(request: Request) -> Response:
        llm, req = await state.read_request(request, DETOKENIZE_FIELDS, "/detokenize")
        tokens, vocab = req.get("tokens"), llm.vocab_size
        if tokens is None or not all(P.is_int(t) and 0 <= t < vocab for t in tokens):
            raise P.bad("tokens", f"must be a list of token ids in [0, {vocab})")
        return JSONResponse({"prompt": llm.tokenizer.decode(tokens)})

    return [Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"])]
