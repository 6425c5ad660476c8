"""serving: the app under uvicorn, with the limits a public server needs and a
graceful stop.

- At most `limit_concurrency` connections (and requests) at once: beyond it
  uvicorn answers 503.
- A connection idle after a response is closed after `timeout_keep_alive`.
- A client gets `timeout_request_read` seconds to send a request's headers,
  counted from when it connected or its previous response ended, however
  slowly the bytes trickle in; then the connection is closed. uvicorn has no
  such deadline of its own (its keep-alive timer only runs between requests and
  restarts with every byte), so a small subclass of its HTTP protocol adds it.
- SIGINT/SIGTERM: stop accepting, let in-flight requests finish within the
  grace period, then end the generations still running (each response ends
  with an error saying so) and exit 0.
- An engine that stops on its own (a tensor-parallel rank died; its requests
  have ended with the reason, and /health answers 503) ends the server too,
  with exit status 1, within a tick (0.1 s), so that a supervisor restarts it."""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from armllm.server.app import ServerApp

log = logging.getLogger("armllm.server")

# after the grace period, the time responses get to send their closing error before
# uvicorn cancels what is left
_CLOSING_S = 5.0


@dataclass
class Limits:
    limit_concurrency: int
    timeout_keep_alive: float
    timeout_request_read: float


def serve(app: ServerApp, host: str, port: int, limits: Limits, shutdown_grace_s: float,
          log_level: str) -> int:
    """Runs until SIGINT/SIGTERM; the exit status (1 if the server could not start or
    its engine stopped on its own)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            http=_header_deadline_protocol(limits.timeout_request_read),
                            limit_concurrency=limits.limit_concurrency,
                            timeout_keep_alive=limits.timeout_keep_alive,
                            timeout_graceful_shutdown=shutdown_grace_s + _CLOSING_S)
    server = _Server(config, app, shutdown_grace_s)
    server.run()
    if server.engine_failure is not None:
        return 1
    return 0 if server.started or server.should_exit else 1


class _Server(uvicorn.Server):
    """Exits 0 on SIGINT/SIGTERM (uvicorn itself re-raises a caught signal after
    shutdown) and ends the app's generations when the grace period is over."""

    def __init__(self, config: uvicorn.Config, app: ServerApp, grace_s: float):
        super().__init__(config)
        self.app, self.grace_s = app, grace_s
        self.engine_failure: str | None = None

    async def on_tick(self, counter: int) -> bool:
        failure = self.app.engine_failure
        if failure is not None and not self.should_exit:
            log.error("the engine stopped (%s): shutting the server down", failure)
            self.engine_failure, self.should_exit = failure, True
        return await super().on_tick(counter)

    def handle_exit(self, sig, frame):
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
        self.should_exit = True

    async def shutdown(self, sockets=None):
        ending = asyncio.get_running_loop().call_later(self.grace_s, self.app.end_generations)
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()


def _header_deadline_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (h11 or httptools) closing a connection whose request
    headers are not complete `timeout_s` after it connected or after its previous
    response ended. Both protocols start `self.cycle` anew when a request's headers
    are complete and call on_response_complete when its response is sent."""

    class HeaderDeadline(AutoHTTPProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a request's headers are in
                self._disarm()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle:  # no pipelined request started meanwhile
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self._deadline = self.loop.call_later(timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return HeaderDeadline
