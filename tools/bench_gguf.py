#!/usr/bin/env python3
"""bench_gguf: armllm beside llama.cpp on GGUF files as stored (K-quant mixes
included), one file after the other, same machine, 2 threads: issue 14's table.

    python tools/bench_gguf.py FILE.gguf [FILE.gguf ...] [--llama-bin DIR]

Per file, one JSON line:
  bound        `armllm plan F --json`: bytes read per decode step at batch 1 over
               the read bandwidth (probed before and after the runs, averaged)
  TPOT         armllm `bench latency F --input-len 128 --output-len 128
               --repetitions 3` (median), and llama-bench's tg128 (-n 128 -r 3)
  pp512        armllm `bench latency F --input-len 512 --output-len 2`, 512 / TTFT
               (median of 3), and llama-bench's pp512 (-p 512 -r 3)
llama.cpp is tools/build_llama_cpp.sh's build. The box is shared: compare the
ratios of one run, not absolute figures across runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from armllm.demo_model import cache_dir

THREADS = "2"


def armllm_latency(path: Path, *flags: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, "-m", "armllm", "bench", "latency", str(path), *flags,
                        "--threads", THREADS, "--json", out.name], check=True,
                       capture_output=True)
        return json.loads(Path(out.name).read_text())


def armllm_bound(path: Path) -> tuple[int, float]:
    """(bytes read per batch-1 decode step, read GB/s) from `armllm plan`."""
    r = subprocess.run([sys.executable, "-m", "armllm", "plan", str(path), "--json",
                        "--max-model-len", "256", "--max-num-seqs", "1", "--threads", THREADS],
                       check=True, capture_output=True, text=True)
    decode = json.loads(r.stdout)["decode"]
    return decode["batch_1"]["bytes"], decode["bandwidth_gbs"]


def llama_bench(llama_bin: Path, path: Path) -> dict[str, float]:
    r = subprocess.run([str(llama_bin / "llama-bench"), "-m", str(path), "-p", "512", "-n", "128",
                        "-t", THREADS, "-r", "3", "-o", "json"], check=True, capture_output=True,
                       text=True)
    return {("pp512" if row["n_prompt"] else "tg128"): row["avg_ts"]
            for row in json.loads(r.stdout)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--llama-bin", type=Path,
                    default=cache_dir() / "llama.cpp-0.3.36" / "build" / "bin")
    args = ap.parse_args(argv)
    for path in args.files:
        nbytes, bw_before = armllm_bound(path)
        lat = armllm_latency(path, "--input-len", "128", "--output-len", "128",
                             "--repetitions", "3")
        peer = llama_bench(args.llama_bin, path)
        pre = armllm_latency(path, "--input-len", "512", "--output-len", "2", "--repetitions",
                             "3", "--warmup", "1")
        bw = (bw_before + armllm_bound(path)[1]) / 2
        tpot = statistics.median(r["tpot_s"] for r in lat["runs"]) * 1e3
        pp = 512 / statistics.median(r["ttft_s"] for r in pre["runs"])
        bound, peer_tpot = nbytes / (bw * 1e9) * 1e3, 1e3 / peer["tg128"]
        print(json.dumps({
            "file": path.name, "weights": lat["weights"], "bytes_per_token_mb": nbytes / 1e6,
            "read_gbs": round(bw, 1), "bound_ms": round(bound, 2),
            "tpot_ms": round(tpot, 2), "tpot_over_bound": round(tpot / bound, 2),
            "llama_tpot_ms": round(peer_tpot, 2), "tpot_vs_llama": round(tpot / peer_tpot, 2),
            "pp512": round(pp, 1), "llama_pp512": round(peer["pp512"], 1),
            "pp512_vs_llama": round(pp / peer["pp512"], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
