"""state: what the server's routes share: the configuration, the AsyncLLM once
it has loaded, the admission count that bounds the completions in flight (and
the Admission that holds one request's share of it until its response ends),
the metrics, and the switch that ends every generation (and transcription) still
running when the shutdown grace period is over."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request

from armllm.api import AsyncLLM
from armllm.server import protocol as P
from armllm.server.metrics import ServerMetrics
from armllm.server.parsers import detect_parser
from armllm.server.response_store import ResponseStore
from armllm.server.tools import calls_in_parallel


@dataclass
class ServerConfig:
    model: str | Path
    served_model_name: str
    engine_args: dict = field(default_factory=dict)
    api_key: str | None = None
    max_waiting_requests: int = 256      # completions queued beyond max_num_seqs
    max_request_bytes: int = 4 << 20     # request bodies above this are refused
    log_interval_s: float = 10.0         # 0: no periodic stats line
    shutdown_grace_s: float = 10.0
    body_timeout_s: float = 30.0         # to receive a request body, once its headers are in
    tool_call_parser: str = "auto"       # a name in parsers.PARSERS, or auto (template)
    metrics_labels: dict[str, str] = field(default_factory=dict)  # on every /metrics sample
    max_audio_seconds: float = 3600.0    # longer audio is refused (/v1/audio/*)
    max_audio_bytes: int = 100 << 20     # larger uploads are refused (413)
    responses_store_size: int = 1024     # responses kept for previous_response_id (0: none)
    responses_store_ttl_s: float = 3600.0   # and for how long


class Admission:
    """One request's completions counted in flight, from admission until release()
    (called however its response ends; later calls do nothing)."""

    def __init__(self, state: ServerState, count: int):
        self._state, self.count = state, count
        state.in_flight += count

    def release(self) -> None:
        if self.count:
            self._state.in_flight -= self.count
            self.count = 0


class ServerState:
    def __init__(self, config: ServerConfig, llm: AsyncLLM | None = None):
        self.config = config
        self.llm = llm
        self.load_error: str | None = None
        self.metrics = ServerMetrics(config.served_model_name, config.metrics_labels)
        self.in_flight = 0               # completions admitted and not yet answered
        self.created = int(time.time())
        self.live: set[str] = set()      # engine request ids being generated
        self.stopping = False            # the shutdown grace period is over
        self.tasks: set[asyncio.Task] = set()   # transcriptions running (server/audio.py)
        self._parallel_calls: bool | None = None   # see calls_in_parallel
        self.responses = ResponseStore(config.responses_store_size,
                                       config.responses_store_ttl_s)

    def tool_parser(self, llm: AsyncLLM) -> str | None:
        """The tool-call format of the served model: --tool-call-parser, or the one its
        chat template names."""
        if self.config.tool_call_parser != "auto":
            return self.config.tool_call_parser
        if llm.speaks_harmony:
            return "harmony"
        return detect_parser(llm.tokenizer.chat_template)

    def calls_in_parallel(self, llm: AsyncLLM) -> bool:
        """Whether the served model makes several tool calls in a turn (its chat
        template writes back two; see tools.calls_in_parallel), asked once."""
        if self._parallel_calls is None:
            def render(messages: list[dict]) -> str:
                return llm.tokenizer.apply_chat_template(messages, False, False)
            self._parallel_calls = calls_in_parallel(render)
        return self._parallel_calls

    def ready_llm(self) -> AsyncLLM:
        if self.llm is None:
            msg = (f"the model failed to load: {self.load_error}" if self.load_error
                   else "the model is still loading")
            raise P.APIError(msg, 503, code="model_not_ready")
        if not self.llm.is_running:
            raise P.APIError("the engine has stopped", 503, code="engine_stopped")
        return self.llm

    async def read_request(self, request: Request, fields: dict[str, str], endpoint: str,
                           required: str | None = None) -> tuple[AsyncLLM, dict]:
        """The ready engine and a request's body as a dict of its known fields, checked
        (size, read deadline, types, the model's name, and the `required` field)."""
        llm = self.ready_llm()
        body = await P.read_body(request, self.config.max_request_bytes,
                                 self.config.body_timeout_s)
        req = P.check_fields(body, fields, endpoint)
        self.check_model(req)
        if required is not None and required not in req:
            raise P.bad(required, "is required", "missing_required_parameter")
        return llm, req

    def check_model(self, req: dict) -> None:
        name = req.get("model")
        if name is not None and name != self.config.served_model_name:
            raise P.APIError(f"model {name!r} does not exist; this server serves "
                             f"{self.config.served_model_name!r}", 400, "model",
                             "model_not_found")

    def capacity(self, llm: AsyncLLM) -> int:
        """Completions in flight at most: running plus waiting."""
        return llm.max_num_seqs + self.config.max_waiting_requests

    def check_capacity(self, llm: AsyncLLM, num_prompts: int, n: int) -> None:
        """A 400 for a request with more completions than the server ever holds at once
        (it could never be admitted, however long the client retried)."""
        limit, count = self.capacity(llm), num_prompts * n
        if count > limit:
            raise P.bad("prompt" if num_prompts > limit else "n",
                        f"this request asks for {count} completions ({num_prompts} prompts, "
                        f"n = {n}); this server holds at most {limit} at once "
                        f"(max_num_seqs {llm.max_num_seqs} + max_waiting_requests "
                        f"{self.config.max_waiting_requests})", "exceeds_server_capacity")

    def admit(self, llm: AsyncLLM, count: int) -> Admission:
        """Counts `count` completions in flight, or answers 503 when they do not fit now."""
        if self.stopping:
            raise P.APIError("the server is shutting down", 503, code="server_shutting_down")
        if self.in_flight + count > self.capacity(llm):
            self.metrics.rejected_overload += 1
            raise P.APIError(f"the server is at capacity ({self.in_flight} completions in "
                             "flight); retry later", 503, code="server_overloaded")
        return Admission(self, count)

    def end_generations(self) -> None:
        """Aborts every generation still running (the shutdown grace period is over);
        each response then ends with an error saying so."""
        self.stopping = True
        if self.llm is not None:
            for request_id in self.live:
                self.llm.abort(request_id)
        for task in list(self.tasks):   # on the event loop (the server's timer calls this)
            task.cancel()
