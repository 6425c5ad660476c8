"""ReplicaRouter's routing policy, exactly: each request to the replica with the
fewest outstanding tokens (prompt plus max_tokens per completion, less what has
been generated), ties to the one that took fewer requests; prefix affinity
within PREFER_SLACK; dead replicas out of rotation. The replicas here hold
requests without running them, and the test hands back their outputs itself, so
every choice is determined (tests/server/test_data_parallel.py drives the real
replicas over HTTP)."""
from __future__ import annotations

from concurrent.futures import Future

import pytest

from armllm.engine.data_parallel import PREFER_SLACK, PREFIX_BLOCKS, ReplicaRouter
from armllm.engine.engine_thread import EngineClosed
from armllm.engine.outputs import StepOutput
from armllm.sampling import SamplingParams

BLOCK = 4


class HeldReplica:
    """A replica that keeps what it is sent: each request's sink, to deliver its
    outputs when the test says so."""

    def __init__(self):
        self.alive = True
        self.sinks: dict[str, object] = {}

    def add(self, request_id, prompt_ids, params, sink, priority=0, encoder_input=None
            ) -> Future:
        self.sinks[request_id] = sink
        return Future()

    def emit(self, request_id: str, tokens: int, finish: str | None = None, index: int = 0):
        self.sinks[request_id](StepOutput(request_id, index, [7] * tokens, "", finish))


def router(n: int = 2) -> tuple[ReplicaRouter, list[HeldReplica]]:
    replicas = [HeldReplica() for _ in range(n)]
    return ReplicaRouter(replicas, BLOCK), replicas


def send(r: ReplicaRouter, request_id: str, prompt: list[int], max_tokens: int, n: int = 1
         ) -> int:
    """Routes the request; the index of the replica that took it."""
    r.add(request_id, prompt, SamplingParams(max_tokens=max_tokens, n=n), lambda out: None)
    return next(i for i, rep in enumerate(r.replicas) if request_id in rep.sinks)


def distinct(i: int) -> list[int]:
    """A prompt of 2 tokens: shorter than a block, so no prefix affinity."""
    return [1000 + i, 2000 + i]


def test_equal_requests_alternate():
    r, _ = router()
    took = [send(r, f"r{i}", distinct(i), 64) for i in range(64)]
    assert took == [0, 1] * 32


def test_fewest_outstanding_tokens_and_generated_tokens_free_load():
    r, reps = router()
    assert send(r, "big", distinct(0), 200) == 0       # 202 tokens outstanding on 0
    assert [send(r, f"s{i}", distinct(i + 1), 48) for i in range(4)] == [1] * 4   # 4 x 50
    assert send(r, "next", distinct(9), 48) == 1        # 200 < 202
    assert send(r, "then", distinct(10), 48) == 0       # 250 > 202
    reps[1].emit("s0", 40)                              # 1: 250 - 40 = 210 < 252
    assert send(r, "after", distinct(11), 8) == 1
    reps[1].emit("s1", 10, finish="stop")               # all s1 held is free: 220 - 50
    reps[0].emit("big", 1)
    assert r._load == [251, 170]
    assert send(r, "last", distinct(12), 2) == 1


def test_n_completions_hold_their_load_until_the_last_ends():
    r, reps = router()
    assert send(r, "fork", distinct(0), 10, n=3) == 0   # 2 + 3 x 10 = 32
    assert send(r, "one", distinct(1), 10) == 1          # 12
    reps[0].emit("fork", 10, finish="length", index=0)
    reps[0].emit("fork", 10, finish="length", index=1)
    assert r._load == [12, 12]
    reps[0].emit("fork", 10, finish="length", index=2)
    assert r._load == [0, 12]


def test_prefix_affinity_within_the_slack():
    r, reps = router()
    shared = list(range(PREFIX_BLOCKS * BLOCK))
    assert send(r, "a", shared + [1], 20) == 0           # 0: 37 outstanding
    assert send(r, "b", distinct(0), 40) == 1            # 1: 42
    assert send(r, "c", shared + [2], 20) == 0           # 0 is the least: 74
    # the prefix keeps a request on 0 while 0 holds at most (1 + PREFER_SLACK) x the
    # least's load + the request's own cost (37)
    assert 74 <= (1 + PREFER_SLACK) * 42 + 37 < 111
    assert send(r, "d", shared + [3], 20) == 0           # 74 within the slack: 111
    assert send(r, "e", shared + [4], 20) == 1           # 111 beyond it: the least
    assert send(r, "f", shared + [5], 20) == 1           # and the prefix now lives on 1


def test_dead_replica_out_of_rotation():
    r, reps = router()
    reps[0].alive = False
    assert [send(r, f"r{i}", distinct(i), 8) for i in range(3)] == [1, 1, 1]
    reps[1].alive = False
    fut = r.add("none", distinct(9), SamplingParams(max_tokens=8), lambda out: None)
    with pytest.raises(EngineClosed, match="every data-parallel replica has stopped"):
        fut.result(timeout=0)
