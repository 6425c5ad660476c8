"""completions: /v1/completions (legacy text completions): one or several
prompts (text or token ids), n completions each, as JSON or server-sent events,
with per-token logprobs in the completions format. Without max_tokens a
completion is at most 16 tokens long, as OpenAI's."""
from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from armllm.api import AsyncLLM, CompletionOutput
from armllm.server import protocol as P
from armllm.server.generation import Generation, prepare_jobs, respond, token_text
from armllm.server.state import ServerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def routes(state: ServerState) -> list[Route]:
    async def completions(request: Request) -> Response:
        llm, req = await state.read_request(request, P.COMPLETION_FIELDS, "/v1/completions",
                                            "prompt")
        P.refuse_unsupported(req)
        opts = P.sampling_options(req, False, llm.default_sampling_params)
        prompts = P.completion_prompts(req["prompt"])
        state.check_capacity(llm, len(prompts), opts.params.n)
        ids = [llm.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
        jobs = prepare_jobs(llm, ids, opts, "prompt", "max_tokens", DEFAULT_MAX_TOKENS)
        gen = Generation(state, llm, jobs, f"cmpl-{uuid.uuid4().hex}", opts.priority)
        return await respond(state, request, gen, CompletionChoices(llm, opts.logprobs),
                             opts)

    return [Route("/v1/completions", completions, methods=["POST"])]


class CompletionChoices:
    """Choices with "text"; logprobs as tokens, token_logprobs, top_logprobs and
    text_offset (character offsets into the completion, continued across chunks)."""
    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, llm: AsyncLLM, logprobs: int | None):
        self.llm, self.logprobs = llm, logprobs
        self._offsets: dict[int, int] = {}   # choice index -> text streamed so far

    def opening(self, count: int) -> None:
        return None

    def delta(self, index: int, c: CompletionOutput, finish_reason: str | None) -> dict:
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + len(c.text_delta)
        lp = (self._logprobs(c.new_logprobs, offset)
              if self.logprobs is not None and c.new_logprobs else None)
        return {"index": index, "text": c.text_delta, "logprobs": lp,
                "finish_reason": finish_reason}

    def final(self, index: int, c: CompletionOutput) -> dict:
        lp = self._logprobs(c.logprobs, 0) if self.logprobs is not None else None
        return {"index": index, "text": c.text, "logprobs": lp,
                "finish_reason": c.finish_reason}

    def _logprobs(self, entries: list, offset: int) -> dict:
        tokens, lps, tops, offsets = [], [], [], []
        for token, lp, top in entries:
            text = token_text(self.llm, token)
            tokens.append(text)
            lps.append(lp)
            tops.append({token_text(self.llm, t): v for t, v in top} if top else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
                "text_offset": offsets}
