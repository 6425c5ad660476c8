"""replica_worker: a data-parallel replica other than 0, as its own process
(`python -m armllm.engine.replica_worker FD`, spawned by engine/data_parallel.py
with FD its end of a multiprocessing Connection).

It builds an engine as `armllm serve` does (bound to its CPUs; tensor-parallel
itself if asked) and runs it on an EngineThread: requests arrive as ("add",
...) and ("abort", id) messages, every StepOutput goes back as ("out", ...),
each add's outcome as ("accepted", id, error), the engine's stats as ("stats",
...) within STATS_INTERVAL_S of a change. It stops on ("stop",), and when the
Connection closes (the server is gone), so it never outlives the server."""
from __future__ import annotations

import logging
import os
import sys
import threading
from multiprocessing.connection import Connection

STATS_INTERVAL_S = 0.1

log = logging.getLogger("armllm.replica")


def run(fd: int) -> int:
    conn = Connection(fd)
    lock = threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    _, spec = conn.recv()
    try:
        from armllm.engine.args import EngineArgs
        from armllm.engine.engine_thread import EngineThread
        from armllm.engine.setup import build_engine
        # binds this process to args.cpus (its ranks' CPUs) before anything loads
        engine = build_engine(spec["model"], EngineArgs(**spec["engine_args"]))
    except Exception as exc:  # noqa: BLE001 - reported to the server, which raises it
        send(("failed", f"{type(exc).__name__}: {exc}"))
        return 2
    thread = EngineThread(engine, name=f"armllm-engine-{spec['index']}")
    send(("ready", thread.stats()))
    stop = threading.Event()

    def push_stats() -> None:
        last = None
        while not stop.wait(STATS_INTERVAL_S):
            stats = thread.stats()   # a new object after every step or command
            if stats is not last:
                try:
                    send(("stats", stats))
                except OSError:
                    os._exit(1)
                last = stats

    threading.Thread(target=push_stats, daemon=True).start()

    def add(rid: str, prompt_ids: list[int], params, priority: int, encoder_input) -> None:
        def sink(out) -> None:   # on the engine thread
            send(("out", out))

        def accepted(fut) -> None:
            exc = fut.exception()
            send(("accepted", rid, None if exc is None else (
                type(exc).__name__, str(exc), getattr(exc, "field", None))))
        thread.add(rid, prompt_ids, params, sink, priority, encoder_input
                   ).add_done_callback(accepted)

    try:
        while True:
            kind, *rest = conn.recv()
            if kind == "add":
                add(*rest)
            elif kind == "abort":
                thread.abort(rest[0])
            elif kind == "stop":
                break
    except (EOFError, OSError):   # the server is gone
        stop.set()
        thread.shutdown(10.0)
        engine.close()
        return 1
    stop.set()
    thread.shutdown()
    engine.close()
    send(("stats", thread.stats()))
    send(("stopped",))
    return 0


def main() -> None:
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(int(sys.argv[1])))


if __name__ == "__main__":
    main()
