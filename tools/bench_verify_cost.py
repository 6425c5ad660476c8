#!/usr/bin/env python3
"""bench_verify_cost: what a speculative verify step costs next to a decode step.

    python tools/bench_verify_cost.py MODEL [--threads 2] [--max-rows 9]
        [--context 128] [--repeats 3] [--json]

Loads MODEL (a safetensors directory or a .gguf) as `armllm serve` would
(--quantization auto), then times the forward of one sequence's M query rows
(M = 1..--max-rows) at --context tokens of context with logits for every row:
what verifying M - 1 draft tokens runs. The timing is the engine's own
calibration (engine/spec/speculator.py's calibrate: rounds interleaved over M,
each M's fastest, a cost never below a smaller M's), run --repeats times, each
M's fastest of them. Prints the CPU, the ISA, the thread count, the command, and
per M the milliseconds and the ratio to M = 1 (issue 39's target: M = 5, a
verify of 4 draft tokens, within 1.25x). Check `uptime` first: another
process's work slows some rounds and, when it runs throughout, all of them.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

import armllm
from armllm import ops
from armllm.engine.args import EngineArgs
from armllm.engine.setup import build_engine
from armllm.engine.spec.speculator import calibrate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="safetensors directory or .gguf file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-rows", type=int, default=9, help="rows up to this (k + 1)")
    ap.add_argument("--context", type=int, default=128, help="tokens of context")
    ap.add_argument("--repeats", type=int, default=3,
                    help="calibrations (each at least 5 rounds over every M)")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args(argv)
    rows = args.max_rows
    model_len = args.context + rows + 16   # the context, the rows, a block of slack
    # max_num_seqs = rows: the runner returns a logits row per sequence, and a verify
    # step needs one for each of its rows
    engine = build_engine(args.model, EngineArgs(
        threads=args.threads, max_model_len=model_len, max_num_seqs=rows,
        max_num_batched_tokens=max(rows, 256), enable_prefix_caching=False,
        kv_cache_gib=0.25))
    began = time.perf_counter()
    best: dict[int, float] = {}
    for _ in range(args.repeats):
        # max_draft = rows - 2: calibrate's counts are then exactly 1..rows
        cost = calibrate(engine.runner, rows, rows - 2, model_len, context=args.context)
        for m, seconds in zip(cost.rows, cost.seconds, strict=True):
            best[m] = min(best.get(m, seconds), seconds)
    took = time.perf_counter() - began
    info = ops.cpu_info()
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"cpu: {info['cpu']}; isa {info['isa']}; threads {info['num_threads']}; "
          f"armllm {armllm.__file__}")
    print(f"model: {args.model}; context {args.context}; {args.repeats} calibrations "
          f"in {took:.0f} s")
    print(f"{'M':>3} {'ms':>9} {'x M=1':>7}")
    for m in sorted(best):
        print(f"{m:>3} {best[m] * 1e3:9.2f} {best[m] / best[1]:7.2f}")
    if args.json:
        print(json.dumps({"model": str(args.model), "cpu": info["cpu"], "isa": info["isa"],
                          "threads": info["num_threads"], "context": args.context,
                          "ms": {m: round(best[m] * 1e3, 3) for m in sorted(best)}}))
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
