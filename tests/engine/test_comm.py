"""The tensor-parallel all-reduce (engine/comm.py over _kernels/comm.c) between
real processes: random sizes up to 10^6 floats at 2, 3 and 4 ranks (more than
this machine's CPUs: ranks sleep at the barriers) equal numpy's sum in rank
order on every rank, bit for bit, also where a rank wrote its values straight
into its staging buffer as the layers do; rank 0's broadcast and the gather of every
rank's logits columns onto rank 0; 10^4 back-to-back calls; an abort releasing a
rank that waits for a dead one; bad arguments; the segment is gone from /dev/shm
afterwards. The same kernel runs between forked
processes under qemu aarch64 (LL/SC and LSE) in tests/kernels/c/kernel_check.c."""
from __future__ import annotations

import multiprocessing
import uuid

import numpy as np
import pytest

from armllm import ops
from armllm.engine.comm import SHM_DIR, AllReduce

MAX_FLOATS = 1 << 16     # slices: sizes above it take several
SMALL_FLOATS = 16384     # comm.c: at most this many take the one-barrier path


def rank_data(seed: int, k: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, k, rank]).standard_normal(n).astype(np.float32)


def run_rank(name: str, rank: int, ranks: int, sizes: list[int], seed: int,
             back_to_back: int, out) -> None:
    with AllReduce(name, rank, ranks, MAX_FLOATS) as comm:
        results = []
        for k, n in enumerate(sizes):
            x = rank_data(seed, k, rank, n)
            staging = comm.comm.staging(n)
            if k % 2 and staging is not None:   # as the layers do: written in place
                staging[:] = x
                x[:] = np.nan
                comm.comm.allreduce_staged(x)
            else:
                comm.allreduce(x)
            results.append(x)
        y = np.empty(64, np.float32)
        for i in range(back_to_back):
            y[:] = rank + i
            comm.allreduce(y)
        batch = np.arange(3 * MAX_FLOATS + 5, dtype=np.int32) * (7 if rank == 0 else 0)
        comm.broadcast(batch)    # several slices of the segment
        bounds = np.cumsum([0, *(gather_width(q) for q in range(ranks))])
        block = np.zeros((GATHER_ROWS, bounds[-1] if rank == 0 else gather_width(rank)),
                         np.float32)
        block[:, :gather_width(rank)] = gather_block(rank)
        comm.comm.gather_cols(block, bounds)   # logits' columns, in slices of whole rows
        out.put((rank, results, y.copy(), batch, block))


GATHER_ROWS = 70


def gather_width(rank: int) -> int:
    return 1000 + 37 * rank


def gather_block(rank: int) -> np.ndarray:
    return np.random.default_rng([99, rank]).standard_normal(
        (GATHER_ROWS, gather_width(rank))).astype(np.float32)


def run_ranks(ranks: int, sizes: list[int], seed: int = 0, back_to_back: int = 0):
    name = f"armllm-test-{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with AllReduce(name, 0, ranks, MAX_FLOATS, create=True):
        procs = [ctx.Process(target=run_rank, args=(name, r, ranks, sizes, seed, back_to_back,
                                                    out)) for r in range(ranks)]
        for p in procs:
            p.start()
        got = {item[0]: item for item in (out.get(timeout=300) for _ in procs)}
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    assert not (SHM_DIR / name).exists()
    return got


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sums_equal_numpy_in_rank_order_on_every_rank(ranks):
    rng = np.random.default_rng(ranks)
    # the one-barrier path up to SMALL_FLOATS, staged and copied in alternately
    sizes = [1, 2, 31, 2048, 8192, 8192, SMALL_FLOATS, SMALL_FLOATS, SMALL_FLOATS + 1,
             MAX_FLOATS, MAX_FLOATS + 1, *map(int, rng.integers(1, 10**6, 3)), 10**6]
    got = run_ranks(ranks, sizes, seed=ranks)
    for k, n in enumerate(sizes):
        want = rank_data(ranks, k, 0, n)
        for r in range(1, ranks):
            want += rank_data(ranks, k, r, n)    # ((x0 + x1) + x2) + ...
        for r in range(ranks):
            assert np.array_equal(got[r][1][k], want), (ranks, n, r)
    for r in range(ranks):   # rank 0's batch reached every rank
        assert np.array_equal(got[r][3], np.arange(3 * MAX_FLOATS + 5, dtype=np.int32) * 7)
    # every rank's columns on rank 0, in rank order
    assert np.array_equal(got[0][4], np.concatenate([gather_block(r) for r in range(ranks)],
                                                    axis=1))


def test_abort_releases_a_waiting_rank():
    """A rank waiting in an all-reduce for a rank that will never come (it died)
    raises CommAborted once the segment is aborted, and so does every later call."""
    import threading
    import time
    name = f"armllm-test-{uuid.uuid4().hex}"
    with AllReduce(name, 0, 2, 64, create=True) as comm:
        raised = []

        def wait() -> None:
            try:
                comm.allreduce(np.zeros(8, np.float32))
            except ops.CommAborted as exc:
                raised.append(exc)
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.2)   # asleep on the futex by now
        comm.abort()
        t.join(5)
        assert not t.is_alive() and len(raised) == 1
        with pytest.raises(ops.CommAborted, match="a rank failed"):
            comm.broadcast(np.zeros(4, np.int32))


def test_back_to_back():
    ranks, calls = 2, 10**4
    got = run_ranks(ranks, [], back_to_back=calls)
    last = calls - 1
    for r in range(ranks):
        assert np.all(got[r][2] == sum(q + last for q in range(ranks)))


def test_bad_arguments(tmp_path):
    name = f"armllm-test-{uuid.uuid4().hex}"
    with AllReduce(name, 0, 2, 64, create=True) as comm:
        with pytest.raises(ValueError, match="must have dtype float32"):
            comm.allreduce(np.zeros(4, np.float64))
        with pytest.raises(ValueError, match="holds .* bytes; an all-reduce for 3 ranks"):
            AllReduce(name, 1, 3, 1 << 20)
        with pytest.raises(ValueError, match="not an all-reduce segment for 2 ranks and 32"):
            ops.Comm(np.frombuffer(comm._map, np.uint8), 0, 2, 32)
        with pytest.raises(FileExistsError):
            AllReduce(name, 0, 2, 64, create=True)
    with pytest.raises(ValueError, match="rank must be in"):
        AllReduce(name, 2, 2, 64)
    with pytest.raises(ValueError, match="plain file name"):
        AllReduce("a/b", 0, 2, 64)
    with pytest.raises(ValueError, match="ranks must be in"):
        ops.comm_segment_bytes(0, 64)
    with AllReduce(name, 0, 2, 1 << 20, create=True) as comm:
        assert comm.comm.staging(SMALL_FLOATS).shape == (SMALL_FLOATS,)
        assert comm.comm.staging(SMALL_FLOATS + 1) is None
        with pytest.raises(ValueError, match="all-reduce of 16385 floats has no staging"):
            comm.comm.allreduce_staged(np.zeros(SMALL_FLOATS + 1, np.float32))
        with pytest.raises(ValueError, match="n must be >= 1, got 0"):
            comm.comm.staging(0)
    assert not (SHM_DIR / name).exists()
