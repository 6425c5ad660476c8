"""tensor_parallel: an engine spread over N rank processes on one machine.

Rank 0 is the engine's own process: it schedules, runs its shard of the model
and samples. Ranks 1..N-1 are worker processes (engine/tp_worker.py), each
bound to its CPU set and NUMA node (engine/topology.py), holding its shard of
the weights and of the KV cache (model/sharding.py). Every step rank 0
broadcasts the batch (flat int32 arrays: StepChannel) through the shared
segment of engine/comm.py, and all ranks run the forward in lockstep, meeting
in its all-reduces and in the gather of the logits onto rank 0.

Life of the group (RankGroup, rank 0's side):
- start: rank 0 creates the segment and spawns the workers, each with a
  control socket; a worker maps the segment, says "attached" (rank 0 then
  unlinks the segment's file: nothing is left in /dev/shm, whatever happens
  later), loads its shard ("loaded"), builds its cache once rank 0 has sized
  it ("ready").
- faults: a thread of rank 0 watches the sockets. A worker that dies (killed,
  out of memory) closes its socket; one that fails writes its error first.
  Either way the segment is aborted, so every rank's collective returns at
  once: rank 0's step raises RankFailed, which ends the engine (every request
  fails with the reason) instead of hanging, and the other workers exit. A
  worker whose rank 0 died sees its socket close and exits.
- stop: rank 0 broadcasts STOP, waits for the workers to exit, and kills any
  that do not within STOP_TIMEOUT_S."""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from armllm import ops
from armllm.engine import topology
from armllm.engine.comm import AllReduce
from armllm.engine.llm_engine import EngineDead
from armllm.engine.request_state import RequestState, SeqKey
from armllm.engine.runner import ModelRunner
from armllm.engine.scheduler import SchedulerOutput
from armllm.engine.sequence import Sequence
from armllm.model.decoder import BatchMeta

log = logging.getLogger("armllm")

STOP_TIMEOUT_S = 10.0   # a worker's time to exit after STOP before it is killed
# the step header: command, rows T, sequences B, logits rows R, block table width, KV
# groups, block copies, state slots (1: the batch carries them), state copies, payload
# length (int32s)
HEADER_INTS = 10
CMD_STEP, CMD_STOP = 1, 2


class RankFailed(EngineDead):
    """A tensor-parallel rank died or failed: the engine cannot go on."""


class StepChannel:
    """Each step's batch from rank 0 to the others: a fixed header, then one flat int32
    payload (ids, positions, each group's slots, query_start, seq_lens, each group's
    block table, logits rows, block copies, and for a hybrid model each sequence's
    state slot and the state slot copies), each broadcast through the segment."""

    def __init__(self, comm: ops.Comm):
        self.comm = comm
        self.header = np.zeros(HEADER_INTS, np.int32)
        self.payload = np.zeros(1 << 12, np.int32)

    def send(self, meta: BatchMeta, copies: list[tuple[int, int, int]],
             state_copies: list[tuple[int, int]] | tuple = ()) -> None:
        groups = ((meta.slot_mapping, meta.block_table), *meta.other_groups)
        states = meta.state_slots is not None
        parts = [meta.input_ids, meta.positions, *(s for s, _ in groups), meta.query_start,
                 meta.seq_lens, *(t.reshape(-1) for _, t in groups),
                 meta.logits_rows.astype(np.int32),
                 np.asarray(copies, np.int32).reshape(-1),
                 *((meta.state_slots,) if states else ()),
                 np.asarray(state_copies, np.int32).reshape(-1)]
        payload = np.concatenate(parts).astype(np.int32, copy=False)
        self.header[:] = (CMD_STEP, len(meta.input_ids), len(meta.seq_lens),
                          len(meta.logits_rows), meta.block_table.shape[1], len(groups),
                          len(copies), states, len(state_copies), len(payload))
        self.comm.broadcast(self.header)
        self.comm.broadcast(payload)

    def send_stop(self) -> None:
        self.header[:] = 0
        self.header[0] = CMD_STOP
        self.comm.broadcast(self.header)

    def receive(self) -> tuple[BatchMeta, list[tuple[int, int, int]], list[tuple[int, int]]
                               ] | None:
        """The next step's batch, block copies and state slot copies (the batch: views of
        this channel's buffers, valid until the next call), or None for STOP."""
        self.comm.broadcast(self.header)
        cmd, t, b, r, width, groups, n_copies, states, n_states, n = \
            (int(x) for x in self.header)
        if cmd == CMD_STOP:
            return None
        if cmd != CMD_STEP:
            raise RuntimeError(f"tensor-parallel step channel: unknown command {cmd}")
        if len(self.payload) < n:
            self.payload = np.zeros(max(n, 2 * len(self.payload)), np.int32)
        payload = self.payload[:n]
        self.comm.broadcast(payload)
        sizes = [t, t, *[t] * groups, b + 1, b, *[b * width] * groups, r, 3 * n_copies,
                 b * states, 2 * n_states]
        parts = np.split(payload, np.cumsum(sizes)[:-1])
        ids, positions, slots = parts[0], parts[1], parts[2:2 + groups]
        query_start, seq_lens = parts[2 + groups], parts[3 + groups]
        tables = [p.reshape(b, width) for p in parts[4 + groups:4 + 2 * groups]]
        logits_rows, copies = parts[4 + 2 * groups].astype(np.int64), parts[5 + 2 * groups]
        state_slots, state_copies = parts[6 + 2 * groups], parts[7 + 2 * groups]
        meta = BatchMeta(ids, positions, slots[0], query_start, seq_lens, tables[0],
                         logits_rows, tuple(zip(slots[1:], tables[1:], strict=True)),
                         state_slots if states else None)
        return (meta, [tuple(c) for c in copies.reshape(-1, 3).tolist()],
                [tuple(c) for c in state_copies.reshape(-1, 2).tolist()])


@dataclass(frozen=True)
class RankSpec:
    """What a worker needs to start (sent as JSON on its control socket)."""
    model: str
    rank: int
    ranks: int
    segment: str
    max_floats: int
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]
    threads: int
    dtype: str
    quantization: str
    quantize_lm_head: bool
    score_from_tokens: str | None
    kv_cache_dtype: str
    block_size: int


class RankGroup:
    """Rank 0's handle on the worker ranks (see the module's docstring). `comm` is
    rank 0's ops.Comm; `failure` the reason the group failed (None while healthy)."""

    def __init__(self, specs: list[RankSpec], allreduce: AllReduce):
        self.allreduce, self.comm = allreduce, allreduce.comm
        self.channel = StepChannel(self.comm)
        self.failure: str | None = None
        self._procs: list[subprocess.Popen] = []
        self._socks: list[socket.socket] = []
        self._files = []
        self._monitor: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = False
        try:
            for spec in specs:
                ours, theirs = socket.socketpair()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "armllm.engine.tp_worker", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), close_fds=True)
                theirs.close()
                self._procs.append(proc)
                self._socks.append(ours)
                self._files.append(ours.makefile("rw", encoding="utf-8"))
                self._send(spec.rank, spec.__dict__)
            self.wait("attached")
        finally:  # attached or failed: the mapping lives on, the file is not needed
            allreduce.path.unlink(missing_ok=True)

    @classmethod
    def start(cls, model: str, ranks: int, cpu_sets: list[tuple[int, ...]],
              node_sets: list[tuple[int, ...]], threads: int | None, fields: dict,
              max_floats: int) -> RankGroup:
        """Creates the segment and spawns ranks 1..ranks-1 of `model`; `fields` are the
        RankSpec fields the engine's arguments give."""
        name = f"armllm-tp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        allreduce = AllReduce(name, 0, ranks, max_floats, create=True)
        specs = [RankSpec(model=str(model), rank=r, ranks=ranks, segment=name,
                          max_floats=max_floats, cpus=cpu_sets[r], nodes=node_sets[r],
                          threads=threads or len(cpu_sets[r]), **fields)
                 for r in range(1, ranks)]
        try:
            group = cls(specs, allreduce)
        except BaseException:
            allreduce.unlink()
            raise
        weakref.finalize(group, group.shutdown)   # at the latest when the interpreter exits
        return group

    # -- startup -------------------------------------------------------------------------

    def _send(self, rank: int, message: dict) -> None:
        f = self._files[rank - 1]
        f.write(json.dumps(message) + "\n")
        f.flush()

    def wait(self, what: str) -> list[dict]:
        """Every worker's next message, which must be `what`; a RankFailed naming the
        first worker that failed or died instead (the group is shut down)."""
        replies = []
        for r, f in enumerate(self._files, 1):
            line = f.readline()
            reply = json.loads(line) if line else None
            if reply is None or reply.get("state") != what:
                self.failure = self._describe(r, reply.get("error") if reply else None,
                                              f"before it was {what}")
                self.shutdown()
                raise RankFailed(self.failure)
            replies.append(reply)
        return replies

    def configure(self, num_blocks: int, num_window_blocks: int | None, max_model_len: int,
                  max_tokens: int, max_logits: int, state_slots: int = 0) -> None:
        """Sends every worker the sizes of rank 0's KV cache and workspace (the same
        blocks, state slots, sequence length, batch rows and logits rows: a batch rank 0
        accepts, every rank accepts) and waits for them to be ready; then starts
        watching them."""
        sizes = {"num_blocks": num_blocks, "num_window_blocks": num_window_blocks,
                 "max_model_len": max_model_len, "max_tokens": max_tokens,
                 "max_logits": max_logits, "state_slots": state_slots}
        for r in range(1, len(self._procs) + 1):
            self._send(r, sizes)
        self.wait("ready")
        self._monitor = threading.Thread(target=self._watch, name="armllm-tp-monitor",
                                         daemon=True)
        self._monitor.start()

    # -- faults --------------------------------------------------------------------------

    def _describe(self, rank: int, error: str | None, when: str = "") -> str:
        proc = self._procs[rank - 1]
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        if error:
            how = f"failed: {error}"
        elif code is None:
            how = "closed its control socket"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return f"tensor-parallel rank {rank} (pid {proc.pid}) {how}" + (f" {when}" if when
                                                                        else "")

    def _watch(self) -> None:
        """Waits for a worker to write (an error) or close its socket, or for shutdown."""
        fds = {s.fileno(): r for r, s in enumerate(self._socks, 1)}
        ready, _, _ = select.select([*fds, self._stop_r], [], [])
        if self._stop_r in ready:
            return
        rank = fds[ready[0]]
        line = self._files[rank - 1].readline()
        error = json.loads(line).get("error") if line else None
        self.failure = self._describe(rank, error)
        log.error("%s; stopping the engine", self.failure)
        self.comm.abort()

    def check(self) -> None:
        if self.failure is not None:
            raise RankFailed(self.failure)

    # -- stop ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stops the workers (STOP, then SIGKILL after STOP_TIMEOUT_S) and releases the
        segment; safe to call more than once, and after a failure."""
        if self._stopped:
            return
        self._stopped = True
        os.write(self._stop_w, b"x")
        if self._monitor is not None:
            self._monitor.join()
        if self.failure is None and self._monitor is not None:
            try:
                self.channel.send_stop()
            except ops.CommAborted:
                pass
        else:   # a worker in a collective gets out; one loading sees its socket close
            self.comm.abort()
            self._close_sockets()
        for proc in self._procs:
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel worker pid %d did not stop; killing it", proc.pid)
                proc.kill()
                proc.wait()
        self._close_sockets()
        os.close(self._stop_r)
        os.close(self._stop_w)
        self.comm = None
        self.channel = None
        self.allreduce.unlink()


    def _close_sockets(self) -> None:
        for f, s in zip(self._files, self._socks, strict=True):
            f.close()
            s.close()
        self._files, self._socks = [], []


class TPModelRunner(ModelRunner):
    """Rank 0's runner: it hands each step's batch to the other ranks and runs its
    model's forward in lockstep with theirs (their all-reduces, the logits' gather);
    a failed rank ends the engine (RankFailed). restore:
    (thread id, CPUs) of the thread bound as rank 0, whose binding close() undoes
    when called on that thread."""

    def __init__(self, model, kv, max_num_batched_tokens: int, max_num_seqs: int,
                 max_model_len: int, group: RankGroup,
                 restore: tuple[int, tuple[int, ...]] | None = None,
                 max_logits: int | None = None, spare_state_slots: tuple[int, ...] = (),
                 keep_hidden: bool = False):
        super().__init__(model, kv, max_num_batched_tokens, max_num_seqs, max_model_len,
                         max_logits, spare_state_slots=spare_state_slots,
                         keep_hidden=keep_hidden)
        self.group, self._restore = group, restore

    @property
    def failure(self) -> str | None:
        return self.group.failure

    def forward(self, meta, copies, state_copies=()) -> np.ndarray:
        """Hands the step's batch (with its block and state slot copies) to the other
        ranks, then runs rank 0's forward in lockstep with theirs."""
        self.group.channel.send(meta, copies, state_copies)
        return super().forward(meta, copies, state_copies)

    def run(self, out: SchedulerOutput, states: Mapping[SeqKey, RequestState]
            ) -> tuple[list[Sequence], np.ndarray]:
        self.group.check()
        try:
            return super().run(out, states)
        except ops.CommAborted:
            raise RankFailed(self.group.failure or "tensor-parallel communication was "
                             "aborted") from None

    def close(self) -> None:
        stop_ranks(self.group, self._restore)


def stop_ranks(group: RankGroup | None, restore: tuple[int, tuple[int, ...]] | None) -> None:
    """Stops the other ranks and, on the thread engine/setup.py's start_ranks bound as
    rank 0 (restore: its id and former CPUs), undoes that binding."""
    if group is not None:
        group.shutdown()
    if restore is not None and restore[0] == threading.get_ident():
        topology.unbind(restore[1])
