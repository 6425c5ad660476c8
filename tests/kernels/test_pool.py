"""The thread pool: every chunk exactly once, no hang under many dispatches,
safe concurrent and nested use, thread count from the environment."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from armllm import ops


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_every_item_runs_exactly_once_under_contention(threads):
    pool = ops.ThreadPool(threads)
    try:
        for grain in (1, 2, 7):
            counts = pool.count_items(100_000, grain)
            assert counts.min() == 1 and counts.max() == 1
    finally:
        pool.close()


def test_thousands_of_back_to_back_dispatches():
    pool = ops.ThreadPool(3)
    try:
        for i in range(5000):
            counts = pool.count_items(3 + i % 50, 1)
            assert counts.sum() == 3 + i % 50 and counts.max() == 1
    finally:
        pool.close()


def test_back_to_back_jobs_of_changing_shape_on_an_oversubscribed_pool():
    # More threads than CPUs: workers are often descheduled mid-job, and a late one's
    # first claim lands on a later job, whose chunks (of another size and grain) it
    # must then run as that job's, exactly once.
    pool = ops.ThreadPool(2 * len(os.sched_getaffinity(0)) + 1)
    rng = np.random.default_rng(0)
    try:
        for n, grain in zip(rng.integers(1, 600, 3000), rng.integers(1, 9, 3000), strict=True):
            counts = pool.count_items(int(n), int(grain))
            assert counts.min() == 1 and counts.max() == 1, (n, grain)
    finally:
        pool.close()


def _task_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_many_pools_created_and_closed_do_not_leak_threads():
    # Compare thread ids, not counts: a thread that existed before (another
    # test's helper, qemu's own) may exit meanwhile. A joined worker can stay
    # listed for a moment while the kernel reaps it, so allow a short grace.
    before = _task_ids()
    for _ in range(200):
        pool = ops.ThreadPool(4)
        pool.count_items(100, 1)
        pool.close()
    deadline = time.monotonic() + 5.0
    while (leaked := _task_ids() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not leaked, f"{len(leaked)} threads outlived their pools"


def test_two_python_threads_share_a_pool():
    pool = ops.ThreadPool(3)
    errors = []

    def hammer():
        for _ in range(2000):
            c = pool.count_items(257, 3)
            if c.max() != 1 or c.min() != 1:
                errors.append(c)
                return

    workers = [threading.Thread(target=hammer) for _ in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    pool.close()
    assert not any(t.is_alive() for t in workers), "deadlock"
    assert errors == []


def test_nested_jobs_run_inline_without_deadlock():
    pool = ops.ThreadPool(3)
    try:
        counts = pool.count_items_nested(50, 40)
        assert counts.min() == 1 and counts.max() == 1
    finally:
        pool.close()


def test_idle_workers_sleep():
    """After a job, workers spin briefly and then sleep: no CPU burnt while idle."""
    pool = ops.ThreadPool(3)
    try:
        pool.count_items(10, 1)
        import time
        t0 = time.process_time()
        time.sleep(0.5)
        busy = time.process_time() - t0
        assert busy < 0.1, f"idle pool used {busy:.2f} s of CPU in 0.5 s"
    finally:
        pool.close()


def test_a_job_does_not_wait_for_a_worker_that_cannot_run():
    # Both threads on one CPU: while the caller runs, the worker cannot, so the caller
    # runs every chunk itself and must return then, not spin (SPIN_NS, 0.2 ms) and
    # sleep until the worker gets a turn to check in (> 0.2 ms every job).
    # The baseline is the same jobs on a pool without workers, timed in the same
    # process. Medians per job, not totals: under qemu on a busy runner a few jobs
    # are preempted for milliseconds (totals have differed by 0.08 s without any
    # waiting), but waiting would slow every job.
    code = ("import os, time; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from armllm import ops\n"
            "def run(pool):\n"
            "    pool.count_items(36, 5); ok = True; times = []\n"
            "    for _ in range(500):\n"
            "        t0 = time.perf_counter(); ok &= bool(pool.count_items(36, 5).max() == 1)\n"
            "        times.append(time.perf_counter() - t0)\n"
            "    return ok, sorted(times)[len(times) // 2]\n"
            "ok1, alone = min(run(ops.ThreadPool(1)) for _ in range(3))\n"
            "ok2, paired = min(run(ops.ThreadPool(2)) for _ in range(3))\n"
            "print(ok1 and ok2, alone, paired)")
    r = _run(code)
    ok, alone, paired = r.stdout.split()
    assert ok == "True", r.stderr
    # waiting out the spin costs a job at least SPIN_NS (0.2 ms); half of it is the bound
    assert float(paired) - float(alone) < 1e-4, f"median job: {paired} s, alone {alone} s"


def test_bad_thread_counts():
    with pytest.raises(ValueError, match="thread count must be between 1 and 4096, got 0"):
        ops.ThreadPool(0)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_thread_count_from_environment():
    r = _run("from armllm import ops; print(ops.num_threads(), ops.get_pool().num_threads)",
             ARMLLM_NUM_THREADS="3")
    assert r.stdout.split() == ["3", "3"], r.stderr
    r = _run("from armllm import ops", ARMLLM_NUM_THREADS="lots")
    assert "ARMLLM_NUM_THREADS must be an integer from 1 to 4096, got 'lots'" in r.stderr
    r = _run("import os; from armllm import ops; "
             "print(ops.num_threads() == len(os.sched_getaffinity(0)))", ARMLLM_NUM_THREADS="")
    assert r.stdout.strip() == "True"


def test_importing_armllm_leaves_no_blas_threads():
    code = ("import os; before = len(os.listdir('/proc/self/task')); "
            "import armllm, numpy; from armllm import ops; "
            "print(len(os.listdir('/proc/self/task')) - before)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.stdout.strip() == "0", r.stderr  # no new thread; the pool starts lazily


def test_blas_limited_when_numpy_came_first():
    code = ("import numpy, os; from armllm import _blas_threads as b; "
            "print(b.blas_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    if r.stdout.strip() == "None":
        pytest.skip("numpy's BLAS here is not OpenBLAS (no BLAS threads to limit)")
    assert r.stdout.strip() == "1", r.stderr


def test_results_identical_whatever_the_thread_count(ref):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 300)).astype(np.float32)
    w = rng.standard_normal((500, 300)).astype(np.float32)
    kern = ops.kernels()
    pw = kern.pack(w, "f32")
    outs = []
    for n in range(1, 6):
        pool = ops.ThreadPool(n)
        y = np.empty((7, 500), np.float32)
        kern.gemm(x, pw, y, None, pool)
        pool.close()
        outs.append(y)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_read_probe_reads_every_whole_mebibyte(threads):
    """The bandwidth probe's checksum is the XOR of every 64-bit word of the whole
    1 MiB chunks, whatever the thread count; bytes past them are not read."""
    rng = np.random.default_rng(threads)
    mib = 1 << 20
    buf = rng.integers(0, 256, size=5 * mib, dtype=np.uint8)
    want = int(np.bitwise_xor.reduce(buf.view(np.uint64)))
    pool = ops.ThreadPool(threads)
    try:
        assert ops.probe_read(buf, pool) == want
        buf[5 * mib - 1] ^= 1  # a flipped bit anywhere changes the checksum
        assert ops.probe_read(buf, pool) != want
    finally:
        pool.close()
    with pytest.raises(ValueError, match="1 MiB"):
        ops.probe_read(buf[: mib + 64])
