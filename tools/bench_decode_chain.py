#!/usr/bin/env python3
"""bench_decode_chain: how close a model's batch-1 decode GEMMs come to the memory,
with the rest of the step taken away.

    python tools/bench_decode_chain.py MODEL [--reps 7] [--threads 2]

Loads MODEL as `armllm serve` would (--quantization auto) and, --reps times, in
one process and in turn:
  probe   the read-bandwidth probe (armllm bench kernels')
  reads   the probe's reads over every packed linear weight, matrix after matrix
          in a decode step's order: what the memory gives this chain of buffers
  gemms   ops.linear of one row against each of those weights, in that order
          (preallocated outputs and activation scratch): the kernels' chain
and prints the medians in GB/s of the packed bytes, and gemms / reads: the part of
the memory's pace the kernels keep. A decode step is this chain plus attention,
norms and the engine; `armllm bench latency --profile` splits that.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from armllm import ops
from armllm.bench.kernels import probe_machine
from armllm.model.loader import load_model

MIB = 1 << 20


def chain(lm) -> list[ops.PackedWeight]:
    """The packed linear weights a batch-1 decode step reads, in its order (a sparse
    layer: its router and expert 0's, as one token would meet k experts)."""
    out = []
    for lw in lm.model.weights.layers:
        out += [lw.qkv, lw.o]
        out += [lw.moe.router, lw.moe.gate_up[0], lw.moe.down[0]] if lw.moe \
            else [lw.gate_up, lw.down]
    return out + [lm.model.weights.lm_head]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        ops.set_num_threads(args.threads)
    lm = load_model(args.model)
    weights = chain(lm)
    pool = ops.get_pool()
    total = sum(w.nbytes for w in weights)
    # the probe reads whole MiB: each weight's bytes rounded down (small ones skipped)
    views = [w.data.view(np.uint8).reshape(-1)[:w.data.nbytes // MIB * MIB] for w in weights]
    views = [v for v in views if v.nbytes]
    read_bytes = sum(v.nbytes for v in views)
    xs, outs, scratch = {}, {}, {}
    for w in weights:
        xs.setdefault(w.k, np.random.default_rng(0).standard_normal((1, w.k)).astype(np.float32))
        outs.setdefault(w.n, np.empty((1, w.n), np.float32))
        if w.quantized:
            scratch.setdefault((w.k, w.group), ops.ActScratch(1, w.k, w.group, True))
    probe, reads, gemms = [], [], []
    for _ in range(args.reps):
        probe.append(probe_machine(pool, 0.2)["read_gbs"])
        t0 = time.perf_counter()
        for v in views:
            ops.probe_read(v, pool)
        reads.append(read_bytes / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        for w in weights:
            ops.linear(xs[w.k], w, out=outs[w.n],
                       act_scratch=scratch.get((w.k, w.group)) if w.quantized else None)
        gemms.append(total / (time.perf_counter() - t0) / 1e9)
    med = statistics.median
    print(f"{args.model}: {len(weights)} matrices, {total / 1e6:.0f} MB packed, "
          f"{ops.num_threads()} threads ({ops.selected_isa()})")
    by_reads = med(g / r for g, r in zip(gemms, reads, strict=True))
    by_probe = med(g / p for g, p in zip(gemms, probe, strict=True))
    print(f"probe {med(probe):.1f} GB/s, reads {med(reads):.1f} GB/s, gemms {med(gemms):.1f} "
          f"GB/s; gemms / reads {by_reads:.2f}, gemms / probe {by_probe:.2f} "
          f"(medians of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
