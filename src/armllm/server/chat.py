"""chat: /v1/chat/completions: a conversation rendered with the model's chat
template (chat_template_kwargs become template variables, except the names the
template call sets itself), n completions as JSON or server-sent events (the
first chunk carries the role), logprobs in the chat format, a reasoning
model's thinking as reasoning_content beside the answer's content. Without
max_tokens / max_completion_tokens a completion may fill the rest of the
context, as vLLM's."""
from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from armllm.api import AsyncLLM, CompletionOutput
from armllm.model.tokenizer import TEMPLATE_OWN_NAMES
from armllm.server import protocol as P
from armllm.server.generation import Generation, prepare_jobs, respond, token_text
from armllm.server.state import ServerState


def routes(state: ServerState) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        llm, req = await state.read_request(request, P.CHAT_FIELDS, "/v1/chat/completions",
                                            "messages")
        P.refuse_unsupported(req)
        messages = P.chat_messages(req["messages"])
        cont = req.get("continue_final_message", False)
        add_gen = req.get("add_generation_prompt", not cont)
        if cont and messages[-1]["role"] != "assistant":
            raise P.bad("continue_final_message", "needs the last message to be the "
                                                  "assistant's")
        opts = P.sampling_options(req, True, llm.default_sampling_params)
        state.check_capacity(llm, 1, opts.params.n)
        ids = render_chat(llm, messages, add_gen, cont, req.get("chat_template_kwargs") or {})
        max_tokens_param = ("max_completion_tokens" if "max_completion_tokens" in req
                            else "max_tokens")
        jobs = prepare_jobs(llm, [ids], opts, "messages", max_tokens_param, None)
        gen = Generation(state, llm, jobs, f"chatcmpl-{uuid.uuid4().hex}", opts.priority)
        return await respond(state, request, gen, ChatChoices(llm, opts.logprobs), opts)

    return [Route("/v1/chat/completions", chat_completions, methods=["POST"])]


def render_chat(llm: AsyncLLM, messages: list[dict], add_generation_prompt: bool,
                continue_final: bool, template_kwargs: dict) -> list[int]:
    """The conversation's prompt token ids; a 400 naming messages or
    chat_template_kwargs when the template cannot render them."""
    clash = sorted(TEMPLATE_OWN_NAMES & template_kwargs.keys())
    if clash:
        raise P.bad("chat_template_kwargs", f"{', '.join(clash)} cannot be set here: the "
                                            "chat template call sets it itself")
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
    with token, logprob, bytes and top_logprobs."""
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, llm: AsyncLLM, logprobs: int | None):
        self.llm, self.logprobs = llm, logprobs

    def opening(self, count: int) -> list[dict]:
        """The role first, for every choice."""
        return [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for i in range(count)]

    def delta(self, index: int, c: CompletionOutput, finish_reason: str | None) -> dict:
        # a token whose text is held back (a possible stop string) still gets its chunk
        delta = ({"content": c.text_delta}
                 if c.new_token_ids and (c.text_delta or not c.reasoning_delta) else {})
        if c.reasoning_delta:
            delta["reasoning_content"] = c.reasoning_delta
        lp = (self._logprobs(c.new_logprobs)
              if self.logprobs is not None and c.new_logprobs else None)
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}

    def final(self, index: int, c: CompletionOutput) -> dict:
        lp = self._logprobs(c.logprobs) if self.logprobs is not None else None
        message = {"role": "assistant", "content": c.text}
        if c.reasoning:
            message["reasoning_content"] = c.reasoning
        return {"index": index, "message": message, "logprobs": lp,
                "finish_reason": c.finish_reason}

    def _logprobs(self, entries: list) -> dict:
        def item(token: int, lp: float) -> dict:
            text = token_text(self.llm, token)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}
        return {"content": [{**item(token, lp), "top_logprobs": [item(t, v) for t, v in top or []]}
                            for token, lp, top in entries]}
