#!/usr/bin/env python3
"""bench_parallel: `armllm serve` as one engine, as tensor parallel (-tp N) and
as data-parallel replicas (-dp N), one server at a time in one run, loaded by
`armllm bench serve` at a sweep of concurrencies, and a side-by-side table with
each configuration's output throughput and TPOT as ratios of the single
engine's (this machine is shared and noisy: compare within one run).

    python tools/bench_parallel.py [--model M] [--ranks 2] [--concurrency 1,16] \
        [--num-prompts 32] [--input-len 128] [--output-len 64] [--json FILE] \
        [--greedy | --temperature T ...] [-- extra serve flags]

Each rank (or replica) gets its share of the CPUs (one NUMA node's, or its part
of the one node); the single engine gets them all. On one socket tensor
parallel cannot read faster than one engine (the same memory bandwidth, plus
two all-reduces a layer); its gains come on machines with several NUMA nodes,
where it keeps each rank's reads local.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare_servers import bench  # noqa: E402  (tools/ is not a package)

from armllm.cmdline import resolve_model  # noqa: E402
from armllm.generate_cli import add_model_sampling_arguments  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the demo model (SmolLM2 Q4_1)")
    ap.add_argument("--ranks", type=int, default=2, help="N of -tp N and -dp N")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json", metavar="FILE")
    add_model_sampling_arguments(ap)   # passed on to bench serve
    ap.add_argument("serve_flags", nargs="*", help="after --: flags for every server")
    args = ap.parse_args()
    model = Path(resolve_model(args.model))
    base = [sys.executable, "-m", "armllm", "serve", str(model), "--log-interval", "0",
            "--max-num-seqs", str(max(int(c) for c in args.concurrency.split(","))),
            *args.serve_flags]
    n = args.ranks
    servers = {"one engine": base, f"-tp {n}": [*base, "-tp", str(n)],
               f"-dp {n}": [*base, "-dp", str(n)]}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, cmd) in enumerate(servers.items()):
            results[name] = bench(name, cmd, None, args, model, Path(tmp) / f"{i}.json")
    base_runs = {r["summary"]["max_concurrency"]: r["summary"]
                 for r in results["one engine"]["runs"]}
    print("\n######## side by side (ms; tok/s; ratios to one engine)")
    print(f"{'server':<12} {'conc':>4} {'TTFT p50':>9} {'TPOT p50':>9} {'out tok/s':>10} "
          f"{'tok/s ratio':>11} {'TPOT ratio':>10} {'failed':>6}")
    for name, doc in results.items():
        for run in doc["runs"]:
            s = run["summary"]
            b = base_runs[s["max_concurrency"]]
            print(f"{name:<12} {s['max_concurrency']:>4} {s['ttft_ms']['median']:9.1f} "
                  f"{s['tpot_ms']['median']:9.2f} {s['output_throughput']:10.1f} "
                  f"{s['output_throughput'] / b['output_throughput']:11.3f} "
                  f"{s['tpot_ms']['median'] / b['tpot_ms']['median']:10.3f} {s['failed']:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
