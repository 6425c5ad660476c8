"""engine_thread: one thread that owns an LLMEngine and runs its step loop;
other threads (an asyncio event loop, the server) reach it only through a
command queue, as an EngineClient (engine/client.py), and receive each
completion's StepOutputs through a callback called on the engine thread. The
kernels release the GIL, so the caller's thread keeps running during a forward
pass. An engine that cannot go on (a tensor-parallel rank died:
LLMEngine.failure, looked at every HEALTH_POLL_S while idle) ends every request
with the reason and stops the thread."""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from armllm.engine.client import Sink
from armllm.engine.embedding import PoolingParams
from armllm.engine.llm_engine import LLMEngine
from armllm.engine.outputs import EngineStats, StepOutput
from armllm.sampling import SamplingParams

log = logging.getLogger("armllm")

HEALTH_POLL_S = 1.0   # an idle engine thread looks at the engine's failure this often


def take_sink(sinks: dict[str, tuple[Sink, list[int]]], out: StepOutput) -> Sink | None:
    """The sink of out's request in `sinks` (request -> (sink, [completions open])),
    dropped from it with the request's last completion; None for an unknown request."""
    entry = sinks.get(out.request_id)
    if entry is None:
        return None
    sink, open_count = entry
    if out.finish_reason is not None:
        open_count[0] -= 1
        if open_count[0] == 0:
            del sinks[out.request_id]
    return sink


class EngineClosed(RuntimeError):
    """A request was sent after the engine shut down."""


class EngineThread:
    """The engine's owner thread, an EngineClient: its members may be called from
    any thread; everything else runs on the engine thread."""

    def __init__(self, engine: LLMEngine, name: str = "armllm-engine"):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, tuple[Sink, list[int]]] = {}  # request -> (sink, [open count])
        self._stats = engine.stats()
        self._closed = False
        self._closed_why = "the engine is shut down"
        self._shut_down = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- called from any thread ----------------------------------------------------------

    def add(self, request_id: str, prompt_ids: list[int],
            params: SamplingParams | PoolingParams, sink: Sink, priority: int = 0,
            encoder_input=None) -> Future:
        """Queues a request; the future completes when the engine has accepted it
        (or fails with the engine's ValueError). sink gets its StepOutputs."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(EngineClosed(self._closed_why))
            return fut
        self._commands.put(("add", (request_id, prompt_ids, params, sink, priority,
                                    encoder_input), fut))
        return fut

    def abort(self, request_id: str) -> None:
        """Aborts a request before the next step; unknown or finished ids are ignored."""
        if not self._closed:
            self._commands.put(("abort", request_id, None))

    def stats(self) -> EngineStats:
        """The counters as of the end of the last step or command."""
        return self._stats

    def shutdown(self, timeout: float | None = None) -> None:
        """Aborts what is in flight and stops the thread."""
        self._shut_down = True
        if not self._closed:
            self._closed = True
            self._commands.put(("stop", None, None))
        self._thread.join(timeout)

    @property
    def closed_by_shutdown(self) -> bool:
        """shutdown() was called (rather than the engine failing)."""
        return self._shut_down

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def failure(self) -> str | None:
        return self.engine.failure

    # -- the engine thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            if self.engine.failure is not None:
                self._die()
                return
            idle = not self.engine.has_unfinished()
            while True:  # every queued command, waiting for one when idle
                try:
                    cmd = self._commands.get(timeout=HEALTH_POLL_S) if idle \
                        else self._commands.get_nowait()
                except queue.Empty:
                    if idle and self.engine.failure is None:
                        continue
                    break
                idle = False
                if cmd[0] == "stop":
                    self._stop()
                    return
                self._handle(*cmd)
            if self.engine.failure is not None:
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # the engine isolates request failures; this is a bug
                log.exception("engine step raised; aborting every request in flight")
                outputs = []
                for rid in list(self._sinks):
                    self.engine.abort(rid)
            self._deliver(outputs)
            self._stats = self.engine.stats()

    def _handle(self, kind: str, arg, fut: Future | None) -> None:
        if kind == "add":
            request_id, prompt_ids, params, sink, priority, encoder_input = arg
            if not fut.set_running_or_notify_cancel():
                return
            try:
                self.engine.add_request(request_id, prompt_ids, params, priority,
                                        encoder_input=encoder_input)
            except Exception as exc:
                fut.set_exception(exc)
                return
            self._sinks[request_id] = (sink, [params.n])
            fut.set_result(None)
        elif kind == "abort":
            self.engine.abort(arg)
        self._stats = self.engine.stats()

    def _deliver(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            sink = take_sink(self._sinks, out)
            if sink is None:
                continue
            try:
                sink(out)
            except Exception:  # the consumer is gone (closed event loop): stop its request
                log.warning("request %s: output consumer failed; aborting", out.request_id,
                            exc_info=True)
                self._sinks.pop(out.request_id, None)
                self.engine.abort(out.request_id)

    def _die(self) -> None:
        """The engine cannot go on: every request ends with its failure, and so does
        every later one."""
        failure = self.engine.failure
        log.error("the engine stopped: %s", failure)
        self._closed, self._closed_why = True, f"the engine stopped: {failure}"
        self._deliver(self.engine.fail_all())
        self._refuse_queued()
        self._stats = self.engine.stats()

    def _refuse_queued(self) -> None:
        while True:  # commands that raced with the end
            try:
                kind, _, fut = self._commands.get_nowait()
            except queue.Empty:
                break
            if fut is not None and fut.set_running_or_notify_cancel():
                fut.set_exception(EngineClosed(self._closed_why))

    def _stop(self) -> None:
        for rid in list(self._sinks):
            self.engine.abort(rid)
        self._deliver(self.engine.step() if self.engine.has_unfinished() else [])
        self._refuse_queued()
        self._stats = self.engine.stats()
