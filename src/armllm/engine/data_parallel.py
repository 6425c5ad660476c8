"""data_parallel: N independent engine replicas behind one AsyncLLM (and so
one HTTP server), for throughput on machines with several NUMA nodes.

Replica 0 is the AsyncLLM's own engine thread; replicas 1..N-1 are processes
(engine/replica_worker.py), each bound to its CPUs and node (one NUMA node per
replica by default; each may itself be tensor-parallel) and reached through a
multiprocessing Connection: requests go in, each step's StepOutputs and the
engine's stats come back.

RemoteReplica and ReplicaRouter are EngineClients (engine/client.py), as the
local EngineThread is. Each request goes to the replica with the fewest
outstanding tokens (prompt tokens plus max_tokens for each completion, less
what has been generated), except that a replica which recently took a prompt
with the same first blocks is preferred when its load is close (within
PREFER_SLACK of the least, plus the request's own cost), so that its prefix
cache serves them. A replica that dies is taken out of rotation: its requests
in flight end with an error naming it, and the others go on."""
from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future
from multiprocessing.connection import Pipe

from armllm.engine import topology
from armllm.engine.args import EngineArgs
from armllm.engine.client import EngineClient, Sink
from armllm.engine.embedding import PoolingParams
from armllm.engine.engine_thread import EngineClosed, take_sink
from armllm.engine.llm_engine import RequestRejected
from armllm.engine.outputs import EngineStats, StepOutput
from armllm.sampling import SamplingParams

log = logging.getLogger("armllm")

PREFIX_BLOCKS = 4       # the prompt's first blocks that key prefix affinity
PREFER_SLACK = 0.2      # a preferred replica may carry this much more than the least
AFFINITY_ENTRIES = 4096  # prefixes remembered (least recently used dropped)
STOP_TIMEOUT_S = 30.0   # a replica's time to stop before it is killed


def remote_error(kind: str, message: str, field: str | None) -> Exception:
    """The exception a replica's add() raised, rebuilt on this side."""
    if kind == "RequestRejected":
        return RequestRejected(message, field or "prompt")
    if kind == "ValueError":
        return ValueError(message)
    return EngineClosed(message)


class RemoteReplica:
    """A replica process, an EngineClient over its Connection. A reader thread
    takes its messages: "accepted" (an add's outcome), "out" (a StepOutput for a
    request's sink), "stats"; the Connection closing means the replica died."""

    def __init__(self, index: int, model: str, engine_args: dict, cpus: str | None):
        self.index = index
        self._conn, theirs = Pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "armllm.engine.replica_worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), close_fds=True)
        theirs.close()
        self._lock = threading.Lock()
        self._sinks: dict[str, tuple[Sink, list[int]]] = {}
        self._pending: dict[str, Future] = {}
        self._stats: EngineStats | None = None
        self._failure: str | None = None
        self._shut_down = False
        self._ready = threading.Event()
        self._send(("start", {"model": model, "engine_args": engine_args, "cpus": cpus,
                              "index": index}))
        self._reader = threading.Thread(target=self._read, name=f"armllm-replica-{index}",
                                        daemon=True)
        self._reader.start()

    def _send(self, message: tuple) -> None:
        with self._lock:
            self._conn.send(message)

    def wait_ready(self) -> None:
        """Returns once the replica's engine runs; an EngineClosed naming why not."""
        self._ready.wait()
        if self.failure is not None:
            raise EngineClosed(self.failure)

    # -- the reader thread ---------------------------------------------------------------

    def _read(self) -> None:
        error = None
        try:
            while True:
                kind, *rest = self._conn.recv()
                if kind == "ready":
                    self._stats = rest[0]
                    self._ready.set()
                elif kind == "failed":   # its engine did not start
                    error = rest[0]
                    break
                elif kind == "accepted":
                    rid, err = rest
                    fut = self._pending.pop(rid, None)
                    if err is not None:
                        self._sinks.pop(rid, None)
                    if fut is not None:
                        fut.set_exception(remote_error(*err)) if err else fut.set_result(None)
                elif kind == "out":
                    self._deliver(rest[0])
                elif kind == "stats":
                    self._stats = rest[0]
                elif kind == "stopped":
                    return
        except (EOFError, OSError):
            pass
        self._fail(error)

    def _deliver(self, out: StepOutput) -> None:
        sink = take_sink(self._sinks, out)
        if sink is not None:
            sink(out)

    def _fail(self, error: str | None) -> None:
        """The replica is gone: its requests end with an error naming it."""
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        how = f"failed: {error}" if error else (
            f"was killed by signal {-code}" if code is not None and code < 0
            else f"exited with code {code}")
        self._failure = f"data-parallel replica {self.index} (pid {self.proc.pid}) {how}"
        if not self._shut_down:
            log.error("%s; taken out of rotation", self.failure)
        self._ready.set()
        for fut in self._pending.values():
            fut.set_exception(EngineClosed(self.failure))
        self._pending.clear()
        for rid, (sink, open_count) in list(self._sinks.items()):
            for index in range(open_count[0]):   # the completions still open
                sink(StepOutput(rid, index, [], "", "error", error=self.failure))
        self._sinks.clear()

    # -- EngineClient ---------------------------------------------------------------------

    def add(self, request_id: str, prompt_ids: list[int],
            params: SamplingParams | PoolingParams, sink: Sink, priority: int = 0,
            encoder_input=None) -> Future:
        fut: Future = Future()
        if self.failure is not None or self._shut_down:
            fut.set_exception(EngineClosed(self.failure or "the engine is shut down"))
            return fut
        self._sinks[request_id] = (sink, [params.n])
        self._pending[request_id] = fut
        try:
            self._send(("add", request_id, prompt_ids, params, priority, encoder_input))
        except (OSError, ValueError):   # the pipe is closed: the reader fails it
            pass
        return fut

    def abort(self, request_id: str) -> None:
        if self.failure is None:
            try:
                self._send(("abort", request_id))
            except (OSError, ValueError):
                pass

    def stats(self) -> EngineStats | None:
        return self._stats

    @property
    def alive(self) -> bool:
        return self.failure is None and self.proc.poll() is None

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def closed_by_shutdown(self) -> bool:
        return self._shut_down

    def shutdown(self, timeout: float | None = None) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        try:
            self._send(("stop",))
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("data-parallel replica %d did not stop; killing it", self.index)
            self.proc.kill()
            self.proc.wait()
        self._conn.close()
        self._reader.join(5.0)


class ReplicaRouter:
    """An EngineClient over replicas (see the module's docstring); `replicas[0]` is
    the local EngineThread."""

    def __init__(self, replicas: list[EngineClient], block_size: int):
        self.replicas = replicas
        self._block = block_size
        self._lock = threading.Lock()
        self._load = [0] * len(replicas)            # outstanding tokens per replica
        self._requests: dict[str, list[int]] = {}   # request -> [replica, tokens left]
        self._affinity: OrderedDict[tuple, int] = OrderedDict()
        self.routed = [0] * len(replicas)           # requests sent to each replica

    def _prefix(self, prompt_ids: list[int]) -> tuple | None:
        """The key of the prompt's first whole blocks (at most PREFIX_BLOCKS), or None
        for a prompt shorter than one block and its next token."""
        blocks = min(PREFIX_BLOCKS, (len(prompt_ids) - 1) // self._block)
        return tuple(prompt_ids[:blocks * self._block]) if blocks else None

    def choose(self, prompt_ids: list[int], cost: int) -> int:
        """The replica a request of `cost` outstanding tokens goes to."""
        alive = [i for i, r in enumerate(self.replicas) if r.alive]
        if not alive:
            raise EngineClosed("every data-parallel replica has stopped")
        least = min(alive, key=lambda i: (self._load[i], self.routed[i]))
        key = self._prefix(prompt_ids)
        preferred = self._affinity.get(key) if key is not None else None
        if preferred in alive and \
                self._load[preferred] <= (1 + PREFER_SLACK) * self._load[least] + cost:
            least = preferred
        if key is not None:
            self._affinity[key] = least
            self._affinity.move_to_end(key)
            if len(self._affinity) > AFFINITY_ENTRIES:
                self._affinity.popitem(last=False)
        return least

    def add(self, request_id: str, prompt_ids: list[int],
            params: SamplingParams | PoolingParams, sink: Sink, priority: int = 0,
            encoder_input=None) -> Future:
        cost = len(prompt_ids) + params.max_tokens * params.n
        with self._lock:
            try:
                index = self.choose(prompt_ids, cost)
            except EngineClosed as exc:
                fut: Future = Future()
                fut.set_exception(exc)
                return fut
            self._load[index] += cost
            self.routed[index] += 1
            self._requests[request_id] = [index, cost, params.n]

        def counted(out: StepOutput) -> None:   # on the replica's thread
            with self._lock:
                entry = self._requests.get(request_id)
                if entry is not None:
                    done = len(out.new_token_ids)
                    if out.finish_reason is not None:
                        entry[2] -= 1
                        if entry[2] == 0:   # the last completion: all it held is free
                            done = entry[1]
                            del self._requests[request_id]
                    done = min(done, entry[1])
                    entry[1] -= done
                    self._load[entry[0]] -= done
            sink(out)

        fut = self.replicas[index].add(request_id, prompt_ids, params, counted, priority,
                                       encoder_input)
        fut.add_done_callback(lambda f: f.exception() and self._forget(request_id))
        return fut

    def _forget(self, request_id: str) -> None:
        with self._lock:
            entry = self._requests.pop(request_id, None)
            if entry is not None:
                self._load[entry[0]] -= entry[1]

    def abort(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is not None:
            self.replicas[entry[0]].abort(request_id)

    def replica_stats(self) -> list[tuple[int, bool, EngineStats | None]]:
        """(index, alive, last stats) of every replica."""
        return [(i, r.alive, r.stats()) for i, r in enumerate(self.replicas)]

    def stats(self) -> EngineStats:
        """Every replica's counters and gauges summed (a dead one's last figures)."""
        parts = [s for _, _, s in self.replica_stats() if s is not None]
        total = parts[0]
        fields = {}
        for name, value in vars(total).items():
            if isinstance(value, dict):
                merged: dict = {}
                for s in parts:
                    for k, v in getattr(s, name).items():
                        merged[k] = merged.get(k, 0) + v
                fields[name] = merged
            else:
                fields[name] = sum(getattr(s, name) for s in parts)
        blocks = fields["num_blocks"]
        fields["kv_usage"] = 1 - fields["num_free_blocks"] / blocks if blocks else 0.0
        return EngineStats(**fields)

    @property
    def alive(self) -> bool:
        """Some replica still serves."""
        return any(r.alive for r in self.replicas)

    @property
    def closed_by_shutdown(self) -> bool:
        return self.replicas[0].closed_by_shutdown

    @property
    def failure(self) -> str | None:
        """Every replica's failure, joined (None: none failed)."""
        return "; ".join(f for r in self.replicas if (f := r.failure)) or None

    def shutdown(self, timeout: float | None = None) -> None:
        threads = [threading.Thread(target=r.shutdown) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def replica_cpus(args: EngineArgs) -> list[str]:
    """Each replica's --cpus: its tensor-parallel ranks' CPU sets, one NUMA node per
    rank by default (topology.placements over every rank of every replica)."""
    tp, dp = args.tensor_parallel_size, args.data_parallel_size
    places = topology.placements(tp * dp, args.cpus)
    for i in range(dp):
        log.info("data-parallel replica %d: CPUs %s", i, " | ".join(
            topology.format_cpulist(c) for c, _ in places[i * tp:(i + 1) * tp]))
    return ["|".join(topology.format_cpulist(c) for c, _ in places[i * tp:(i + 1) * tp])
            for i in range(dp)]


def start_replicas(model: str, args: EngineArgs) -> tuple[EngineArgs, list[RemoteReplica]]:
    """Spawns replicas 1..N-1 of `model` on their CPUs; returns replica 0's arguments
    (the caller's engine) and the replicas, which load while the caller does."""
    cpus = replica_cpus(args)
    each = [dataclasses.replace(args, data_parallel_size=1, cpus=c) for c in cpus]
    return each[0], [RemoteReplica(i, str(model), dataclasses.asdict(each[i]), cpus[i])
                     for i in range(1, len(cpus))]

