"""`armllm bench kernels`: GEMM speed next to this machine's limits and numpy, and
the sampler's time a row (bench/sampling.py).

Measures, in one run: the read bandwidth and fp32 FMA peak (own probes),
then armllm's GEMM for decode (memory-bound: effective GB/s of weights) and
prefill (GFLOP/s) at real model layer shapes, for f32 and bf16 weights and
quantized ones (w8: int8 channelwise, w4: int4 in groups of 32; "w4g128",
"w8g32"... pick the group), beside numpy's `x @ W.T` (OpenBLAS) on the same
shapes and thread count. Quantized rows time what `ops.linear` runs: the
per-token activation quantization plus the int8 GEMM (GOP/s, 2 ops a MAC).
Timings are medians of repeated runs, interleaved with numpy's.

`--isa avx2,avx512` measures several kernel variants side by side: each
variant packs its own copy of the weights, their calls are interleaved
(round-robin, so that a busy machine slows them alike) and each row gets the
ratio of the first variant's time to its own.
"""
from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import time
from functools import partial

import numpy as np

from armllm import _blas_threads
from armllm.bench import sampling
from armllm.cmdline import UsageError

# (model, layer, N, K): y[M, N] = x[M, K] @ W[N, K].T
MODEL_SHAPES = {
    "smollm2-135m": [("qo", 576, 576), ("gate/up", 1536, 576), ("down", 576, 1536),
                     ("lm_head", 49152, 576)],
    "llama-3.1-8b": [("qo", 4096, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336),
                     ("lm_head", 128256, 4096)],
}
PARTS = ("gemm", "sampling")
SAMPLING_VOCAB = "49152,151936"  # SmolLM2 / Llama-style and Qwen2's vocabularies
DECODE_MAX_M = 8  # rows at or below this are reported as memory-bound (GB/s)
MIN_COLD_BYTES = 1 << 30  # decode rotates over weight copies this large (or 4x the last-level
                          # cache, whichever is more): read from DRAM, as in a real decode step
                          # that streams every layer once


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default=",".join(PARTS),
                   help="comma-separated parts to run: " + ", ".join(PARTS))
    p.add_argument("--vocab", default=SAMPLING_VOCAB,
                   help="comma-separated vocabulary sizes for the sampling part")
    p.add_argument("--models", default="smollm2-135m,llama-3.1-8b",
                   help="comma-separated: " + ", ".join(MODEL_SHAPES))
    p.add_argument("--m", default="1,4,128,512", help="comma-separated row counts M")
    p.add_argument("--threads", default=None,
                   help="comma-separated thread counts (default: 1 and the pool's count)")
    p.add_argument("--dtypes", default="f32,bf16",
                   help="weight dtypes: f32, bf16, w8, w4 (w8/w4 take a group: w4g128, "
                        "w8g32; default w8 channelwise, w4 groups of 32)")
    p.add_argument("--isa", default=None,
                   help="comma-separated kernel variants to compare, interleaved (default: the "
                        "selected one; `armllm info` lists those this CPU runs)")
    p.add_argument("--min-time", type=float, default=0.3,
                   help="seconds to spend per measurement (at least 3 repetitions)")
    p.add_argument("--no-numpy", action="store_true", help="skip the numpy comparison")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"--{name} values must be >= 1, got {text!r}")
    return values


def _median_time(fn, min_time: float) -> float:
    return _median_times([fn], min_time)[0]


def _median_times(fns, min_time: float) -> list[float]:
    """Median time of each function, called in turn (round-robin) for about
    min_time seconds each, at least 3 times each."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    budget = min_time * len(fns)
    while len(times[0]) < 3 or (time.perf_counter() - start < budget and len(times[0]) < 1000):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def _isa_list(text: str | None) -> list[str]:
    """The variants to compare (default: the selected one), each runnable here."""
    from armllm import ops
    if text is None:
        return [ops.selected_isa()]
    isas = [v.strip() for v in text.split(",") if v.strip()]
    runnable = ops.available_isas()
    for isa in isas:
        if isa not in runnable:
            raise UsageError(f"--isa {isa!r} is not a kernel variant this CPU runs "
                             f"(available: {', '.join(runnable)})")
    if not isas or len(set(isas)) != len(isas):
        raise UsageError(f"--isa must name distinct variants, got {text!r}")
    return isas


_QUANT = re.compile(r"^w([48])(?:g(0|32|64|128))?$")


def _quant_spec(dtype: str) -> tuple[int, int] | None:
    """(bits, group) of a quantized dtype name, None for f32/bf16."""
    m = _QUANT.match(dtype)
    if not m:
        return None
    bits = int(m.group(1))
    return bits, int(m.group(2)) if m.group(2) else (0 if bits == 8 else 32)


def _quantized_weight(kern, rng, n: int, k: int, bits: int, group: int):
    """A random quantized weight (q, d, o) packed for kern (values do not matter)."""
    from armllm import ops  # the kernels load when the command runs (see cli.py)
    ng = ops.quant_groups(k, group) if group else 1  # channelwise: one scale a row
    lo, hi = (-127, 128) if bits == 8 else (0, 16)
    q = rng.integers(lo, hi, (n, k), dtype=np.int8)
    d = np.full((n, ng), 1e-3, np.float32)
    o = np.full((n, ng), -8e-3, np.float32) if bits == 4 else None
    return lambda: kern.pack_wq(q, d, o, bits, group)


class _QuantLinear:
    """ops.linear's work for a quantized weight: quantize x, then the int8 GEMM."""

    def __init__(self, kern, x, w, y, pool):
        from armllm import ops
        m, k = x.shape
        self.kern, self.x, self.w, self.y, self.pool = kern, x, w, y, pool
        self.scratch = ops.ActScratch(m, k, w.group)  # with sums, as ops.linear

    def __call__(self):
        xq, scale, gsum = self.scratch.views(self.x.shape[0])
        self.kern.quant_act(self.x, xq, scale, gsum, self.w.group, self.pool)
        self.kern.gemm_wq(xq, scale, gsum, self.w, self.y, None, self.pool)


class _Rotate:
    """Calls one function after another from a list, so that each call reads
    weights the previous calls did not leave in cache."""

    def __init__(self, calls):
        self.calls, self.i = calls, 0

    def __call__(self):
        self.calls[self.i]()
        self.i = (self.i + 1) % len(self.calls)


def cold_bytes() -> int:
    """Bytes of buffer that no cache holds: 4x the last-level cache, at least 1 GiB."""
    return max(MIN_COLD_BYTES, 4 * _last_level_cache_bytes())


def _copies(nbytes: int, m: int) -> int:
    return max(1, min(256, -(-cold_bytes() // nbytes))) if m <= DECODE_MAX_M else 1


def _result_row(machine: dict, model: str, layer: str, n: int, k: int, m: int, dtype: str,
                threads: int, isa: str, t: float, weight_bytes: int, ratio: float,
                numpy_t: float | None) -> dict:
    gflops = 2.0 * m * n * k / t / 1e9
    gbs = weight_bytes / t / 1e9
    frac = gbs / machine["read_gbs"] if m <= DECODE_MAX_M else gflops / machine["fma_gflops"]
    return {"model": model, "layer": layer, "n": n, "k": k, "m": m, "dtype": dtype,
            "threads": threads, "isa": isa, "armllm_s": t, "gflops": gflops,
            "weight_gbs": gbs, "fraction_of_limit": frac, "ratio_to_first_isa": ratio,
            "numpy_f32_s": numpy_t}


def _print_row(r: dict) -> None:
    numpy_t = r["numpy_f32_s"]
    speed = f"{numpy_t / r['armllm_s']:7.2f}" if numpy_t else "      -"
    nms = f"{numpy_t * 1e3:9.3f}" if numpy_t else "        -"
    print(f"{r['model']:<13} {r['layer']:<8} {r['n']:>6} {r['k']:>6} {r['m']:>4} "
          f"{r['dtype']:>6} {r['threads']:>3} {r['isa']:>9} {r['armllm_s'] * 1e3:10.3f} "
          f"{r['gflops']:8.1f} {r['weight_gbs']:6.1f} {r['fraction_of_limit'] * 100:6.0f}% "
          f"{r['ratio_to_first_isa']:6.2f} {nms} {speed}", flush=True)


def _last_level_cache_bytes() -> int:
    """The largest CPU cache Linux reports (0 when it reports none)."""
    sizes = [0]
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(index).read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


def probe_machine(pool, min_time: float) -> dict:
    """Read bandwidth (GB/s) over a buffer far larger than the caches, and FMA peak."""
    from armllm import ops
    # in whole MiB, as the probe reads them (some servers have 0.5 GiB of L3)
    size = cold_bytes() >> 20 << 20
    buf = np.ones(size, dtype=np.uint8)
    t = _median_time(partial(ops.probe_read, buf, pool), min_time)
    iters = 2_000_000
    t_fma = _median_time(partial(ops.probe_fma, iters, pool), min_time)
    flops = ops.probe_fma(iters, pool)
    return {"read_gbs": buf.nbytes / t / 1e9, "fma_gflops": flops / t_fma / 1e9}


def run(args: argparse.Namespace) -> int:
    from armllm import ops
    parts = [v.strip() for v in args.parts.split(",") if v.strip()]
    if not parts or not set(parts) <= set(PARTS):
        raise UsageError(f"--parts must name some of {', '.join(PARTS)}, got {args.parts!r}")
    vocab = _int_list(args.vocab, "vocab")
    if args.min_time <= 0:
        raise UsageError(f"--min-time must be > 0, got {args.min_time}")
    results: dict = {"cpu": ops.cpu_info()}
    print(f"armllm bench kernels: {results['cpu']['cpu']}")
    if "gemm" in parts:
        results.update(_run_gemm(args))
    if "sampling" in parts:
        results["sampling"] = sampling.run(vocab, args.min_time, ops.get_pool())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _run_gemm(args: argparse.Namespace) -> dict:
    """The GEMM part: machine probes, then every shape, dtype, thread count and variant."""
    from armllm import ops
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODEL_SHAPES:
            raise UsageError(f"unknown model {m!r} for --models (known: {', '.join(MODEL_SHAPES)})")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in ("f32", "bf16") and not _quant_spec(d):
            raise UsageError(f"--dtypes values must be f32, bf16, w8 or w4 (with an optional "
                             f"group: w4g128), got {d!r}")
    ms = _int_list(args.m, "m")
    threads = _int_list(args.threads, "threads") if args.threads else \
        sorted({1, ops.num_threads()})
    isas = _isa_list(args.isa)
    kerns = {isa: ops.kernels(isa) for isa in isas}
    for isa, kern in kerns.items():
        impl = kern.impl
        print(f"variant {isa}: gemm_f32 {impl['gemm_f32']}, gemm_bf16 {impl['gemm_bf16']} "
              f"(compute {kern.gemm_bf16_compute}), gemm_wq {impl['gemm_wq']}")
    results: dict = {"isas": isas, "machine": {}, "gemm": []}
    pools = {n: ops.ThreadPool(n) for n in threads}
    for n, pool in pools.items():
        probe = probe_machine(pool, args.min_time)
        results["machine"][n] = probe
        print(f"threads {n}: read bandwidth {probe['read_gbs']:.1f} GB/s, "
              f"fp32 FMA peak {probe['fma_gflops']:.0f} GFLOP/s")

    header = (f"{'model':<13} {'layer':<8} {'N':>6} {'K':>6} {'M':>4} {'w':>6} {'thr':>3} "
              f"{'isa':>9} {'armllm ms':>10} {'GFLOP/s':>8} {'GB/s':>6} {'%bw/%pk':>7} "
              f"{'ratio':>6} {'numpy ms':>9} {'speedup':>7}")
    print(header)
    rng = np.random.default_rng(0)
    for model in models:
        for layer, n, k in MODEL_SHAPES[model]:
            w32 = rng.standard_normal((n, k), dtype=np.float32) * np.float32(k ** -0.5)
            packers = {}  # (isa, dtype) -> a function that packs one copy
            for d in dtypes:
                spec = _quant_spec(d)
                wd = None if spec else (w32 if d == "f32" else ops.f32_to_bf16(w32))
                for isa, kern in kerns.items():
                    packers[isa, d] = (_quantized_weight(kern, rng, n, k, *spec) if spec
                                       else partial(kern.pack, wd, d))
            packed = {key: pack() for key, pack in packers.items()}
            for m in ms:
                if layer == "lm_head" and m > DECODE_MAX_M:
                    continue  # logits are computed only for the rows that sample
                x = rng.standard_normal((m, k), dtype=np.float32)
                y = np.empty((m, n), dtype=np.float32)
                w_copies = [w32] + [w32.copy() for _ in range(_copies(w32.nbytes, m) - 1)]
                copies = {key: [pw] + [packers[key]() for _ in range(_copies(pw.nbytes, m) - 1)]
                          for key, pw in packed.items()}
                for n_threads, pool in pools.items():
                    numpy_t = None
                    if not args.no_numpy:
                        _blas_threads.set_blas_threads(n_threads)
                        numpy_t = _median_time(
                            _Rotate([partial(np.matmul, x, w.T) for w in w_copies]), args.min_time)
                        _blas_threads.set_blas_threads(1)
                    for d in dtypes:
                        calls = [_Rotate([_QuantLinear(kerns[isa], x, c, y, pool) if c.quantized
                                          else partial(kerns[isa].gemm, x, c, y, None, pool)
                                          for c in copies[isa, d]]) for isa in isas]
                        times = _median_times(calls, args.min_time)
                        for isa, t in zip(isas, times, strict=True):
                            row = _result_row(results["machine"][n_threads], model, layer, n, k,
                                              m, d, n_threads, isa, t, packed[isa, d].nbytes,
                                              times[0] / t, numpy_t)
                            results["gemm"].append(row)
                            _print_row(row)
    print("%bw/%pk: decode rows (M <= 8; weights cycled through copies of 4x the "
          "last-level cache, at least 1 GiB, so they come from DRAM) as a fraction of read "
          "bandwidth, prefill rows of FMA peak; "
          "ratio = the first --isa variant's time / this variant's (interleaved runs); "
          "speedup = numpy f32 time / armllm time. w8/w4 rows include the activation "
          "quantization; their GFLOP/s are GOP/s of int8 MACs (x2), compared with the same "
          "fp32 peak.")
    for pool in pools.values():
        pool.close()
    return results
