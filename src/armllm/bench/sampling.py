"""The sampling part of `armllm bench kernels`: ops.RowSampler's time a row at real
vocabulary sizes, for greedy, temperature 0.8 with top-p 0.95, and temperature 1 with
nothing truncated; one row on one thread, and BATCH rows in one call on the pool (the
call's wall time / BATCH).

The rows are LM-like logits, calibrated on SmolLM2-135M's next-token logits: a normal
bulk (standard deviation 3.8) and a head of HEAD tokens at top - 2.5 ln(1 + rank), the
top about 22 above the bulk's middle (so at temperature 0.8 the median row has about 10
tokens within 1e-3 of the top's probability, as SmolLM2's rows do). The kernel
overwrites its rows: each call gets fresh copies, made outside the timing.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

CASES = {"greedy": {"temperature": 0.0},
         "t0.8 top-p 0.95": {"temperature": 0.8, "top_p": 0.95},
         "t1": {"temperature": 1.0}}
BATCH = 32
# the LM-like rows (SmolLM2-135M's logits, measured: bulk std 3.8, the top 22 above the
# median, rank k of the head at about top - 2.5 ln(1 + k))
BULK_STD = 3.8
HEAD = 100
HEAD_TOP, HEAD_TOP_STD = 22.0, 2.0
HEAD_SLOPE = 2.5
MIN_REPS = 5


def lm_like_logits(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    x = rng.standard_normal((rows, n), dtype=np.float32) * np.float32(BULK_STD)
    rank = np.arange(min(HEAD, n))
    for r in range(rows):
        top = HEAD_TOP + HEAD_TOP_STD * rng.standard_normal()
        head = top - HEAD_SLOPE * np.log1p(rank) + 0.3 * rng.standard_normal(len(rank))
        x[r, rng.choice(n, len(rank), replace=False)] = head.astype(np.float32)
    return x


def _median_us(call, prepare, min_time: float) -> float:
    """The median time of call() in microseconds, prepare() run untimed before each."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MIN_REPS or time.perf_counter() - start < min_time:
        prepare()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


class _Case:
    """One (vocabulary, parameters) case on its rows."""

    def __init__(self, rows: np.ndarray, params: dict, pool, one_pool):
        from armllm import ops
        self.rows, self.params, self.pool, self.one_pool = rows, params, pool, one_pool
        n = rows.shape[1]
        self.work = np.empty_like(rows)
        self.sampler = ops.RowSampler(n, BATCH)
        for name, value in params.items():
            getattr(self.sampler, name)[:] = value
        self.sampler.seed[:] = 1
        self.sampler.counter[:] = np.arange(BATCH)
        self.next = 0

    def _fresh_row(self) -> None:
        self.next = (self.next + 1) % BATCH
        self.work[0] = self.rows[self.next]

    def _fresh_rows(self) -> None:
        self.work[:] = self.rows

    def measure(self, min_time: float) -> dict:
        s = self.sampler
        return {
            "one_row_us": _median_us(lambda: s.run(self.work, 0, 1, pool=self.one_pool),
                                     self._fresh_row, min_time),
            "batch_us_per_row": _median_us(lambda: s.run(self.work, 0, BATCH, pool=self.pool),
                                           self._fresh_rows, min_time) / BATCH,
        }


def run(vocab: list[int], min_time: float, pool) -> list[dict]:
    """Measures every case at every vocabulary size, printing a line for each."""
    from armllm import ops
    print(f"sampling: {BATCH} LM-like rows; threads {pool.num_threads}; load average "
          f"{os.getloadavg()[0]:.2f} (1 min)")
    print(f"{'vocab':>7} {'case':<16} {'1 row us':>9} {'32 rows us/row':>15}")
    one_pool = ops.ThreadPool(1)
    rng = np.random.default_rng(0)
    results = []
    for n in vocab:
        rows = lm_like_logits(rng, BATCH, n)
        for name, params in CASES.items():
            row = {"vocab": n, "case": name, **_Case(rows, params, pool, one_pool).measure(
                min_time)}
            results.append(row)
            print(f"{n:>7} {name:<16} {row['one_row_us']:9.1f} {row['batch_us_per_row']:15.1f}",
                  flush=True)
    one_pool.close()
    print("1 row: one call for one row on a 1-thread pool; 32 rows: one call on the pool, "
          "wall time / 32.")
    return results
