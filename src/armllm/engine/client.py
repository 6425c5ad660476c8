"""client: EngineClient, the one protocol through which AsyncLLM reaches an
engine, whichever it is: the in-process engine thread (engine/engine_thread.py),
a data-parallel replica process, or the router over the replicas
(engine/data_parallel.py). A request goes in with a sink, a callable that
receives each of its StepOutputs on the client's own thread; the rest is
aborting, counters, health and shutdown. Every member may be called from any
thread."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol, runtime_checkable

import numpy as np

from armllm.engine.embedding import PoolingParams
from armllm.engine.outputs import EngineStats, StepOutput
from armllm.sampling import SamplingParams

Sink = Callable[[StepOutput], None]


@runtime_checkable
class EngineClient(Protocol):
    def add(self, request_id: str, prompt_ids: list[int],
            params: SamplingParams | PoolingParams, sink: Sink, priority: int = 0,
            encoder_input: np.ndarray | None = None) -> Future:
        """Queues a request; the future completes when the engine has taken it, or
        fails with why not (a ValueError such as RequestRejected, or EngineClosed).
        encoder_input: an encoder-decoder's (Whisper's) input, one window's features.
        `sink` gets the request's StepOutputs, the last of each completion with its
        finish reason."""

    def abort(self, request_id: str) -> None:
        """Ends a request at the engine's next step (finish reason "abort"); unknown
        or finished ids are ignored."""

    def stats(self) -> EngineStats | None:
        """The counters as of the engine's last step or command (None: a replica
        process that has not started yet)."""

    def shutdown(self, timeout: float | None = None) -> None:
        """Aborts what is in flight and stops the engine."""

    @property
    def alive(self) -> bool:
        """The engine still serves."""

    @property
    def closed_by_shutdown(self) -> bool:
        """shutdown() was called (rather than the engine failing)."""

    @property
    def failure(self) -> str | None:
        """Why the engine cannot serve (a tensor-parallel rank or a replica died), or
        None."""
