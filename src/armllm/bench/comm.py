"""`armllm bench comm`: the shared-memory all-reduce of tensor-parallel ranks
(engine/comm.py), alone: --ranks processes on this machine sum float32 arrays of 1
KB to 16 MB; per size, the median time of one all-reduce on rank 0 and its bandwidth
(bytes / time, and NCCL's bus bandwidth: bytes x 2(N-1)/N / time), and for the sizes
that take the one-barrier path, the time of a staged all-reduce (the values already
in place, as the layers leave them). More ranks than CPUs time the scheduler (ranks
sleep at the barriers) rather than the copies."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
import uuid

import numpy as np

from armllm.cmdline import UsageError

# 1 KB .. 16 MB, with 8 KB and 32 KB: one hidden vector of 2,048 and 8,192 floats
SIZES_BYTES = sorted({1 << k for k in range(10, 25, 2)} | {1 << 13, 1 << 15})
WARMUP = 100  # untimed all-reduces per size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=2, help="processes (default 2)")
    p.add_argument("--reps", type=int, default=200, help="timed all-reduces per size")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def _rank(name: str, rank: int, ranks: int, sizes: list[int], reps: int, out) -> None:
    """One rank: every size (bytes), WARMUP and `reps` timed all-reduces, copied in;
    then, for the sizes that have a staging buffer, staged ones, whose values are
    written into it before the clock starts (in the layers, by the projection itself)."""
    from armllm.engine.comm import AllReduce
    with AllReduce(name, rank, ranks, max(sizes) // 4) as comm:
        times, staged_times = [], []
        for size in sizes:
            data = np.ones(size // 4, np.float32)
            for _ in range(WARMUP):  # the first also waits for the other ranks to start
                comm.allreduce(data)
            per_call = []
            for _ in range(reps):
                t0 = time.perf_counter()
                comm.allreduce(data)
                per_call.append(time.perf_counter() - t0)
            times.append(statistics.median(per_call))
            if comm.comm.staging(data.size) is None:
                staged_times.append(None)
                continue
            per_call = []
            for _ in range(WARMUP + reps):
                comm.comm.staging(data.size)[:] = 1.0
                t0 = time.perf_counter()
                comm.comm.allreduce_staged(data)
                per_call.append(time.perf_counter() - t0)
            staged_times.append(statistics.median(per_call[WARMUP:]))
        if out is not None:
            out.put((times, staged_times))


def time_allreduce(ranks: int, sizes: list[int], reps: int
                   ) -> tuple[list[float], list[float | None]]:
    """The median seconds of one all-reduce of each size (bytes) between `ranks`
    processes of this machine, copied in and staged (None where a size has no
    staging buffer); the other ranks are spawned and joined here."""
    name = f"armllm-bench-comm-{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("spawn")
    from armllm.engine.comm import AllReduce
    with AllReduce(name, 0, ranks, max(sizes) // 4, create=True):
        others = [ctx.Process(target=_rank, args=(name, r, ranks, sizes, reps, None))
                  for r in range(1, ranks)]
        for p in others:
            p.start()
        results = ctx.SimpleQueue()
        _rank(name, 0, ranks, sizes, reps, results)
        times, staged_times = results.get()
        for p in others:
            p.join()
    return times, staged_times


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.ranks <= 64:
        raise UsageError(f"--ranks must be in [2, 64], got {args.ranks}")
    if args.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {args.reps}")
    times, staged_times = time_allreduce(args.ranks, SIZES_BYTES, args.reps)
    n = args.ranks
    rows = [{"bytes": size, "us": t * 1e6, "algbw_gb_s": size / t / 1e9,
             "busbw_gb_s": size * 2 * (n - 1) / n / t / 1e9,
             "staged_us": None if st is None else st * 1e6}
            for size, t, st in zip(SIZES_BYTES, times, staged_times, strict=True)]
    print(f"all-reduce over shared memory, {n} ranks, median of {args.reps}; staged: the "
          "values already in the rank's staging buffer, as a layer's projection leaves them")
    print(f"{'bytes':>10} {'us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} {'staged us':>10}")
    for r in rows:
        staged = "-" if r["staged_us"] is None else f"{r['staged_us']:.1f}"
        print(f"{r['bytes']:>10} {r['us']:10.1f} {r['algbw_gb_s']:11.2f} {r['busbw_gb_s']:11.2f}"
              f" {staged:>10}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": n, "reps": args.reps, "rows": rows}, f, indent=2)
    return 0
