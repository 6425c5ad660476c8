#!/usr/bin/env python3
"""bench_gguf: armllm beside llama.cpp on GGUF files as stored (K-quant mixes
included), one file after the other, same machine, 2 threads: issue 14's table.

    python tools/bench_gguf.py FILE.gguf [FILE.gguf ...] [--llama-bin DIR]

Per file, one JSON line:
  bound        bytes read per decode step at batch 1 (`armllm plan F --json`) over
               the read bandwidth (armllm bench kernels' probe)
  TPOT         armllm, in a child process: --pairs batch-1 requests of 128 prompt
               + 128 output tokens, each between two bandwidth probes (one before,
               one after: the next request's before), its bound from their mean;
               tpot_over_bound is the median of each pair's TPOT / bound (the box
               is shared: a neighbour's load moves both halves of a pair, not a
               ratio of figures taken minutes apart), tpot_over_bound_range the
               pairs' lowest and highest; tpot_ms and read_gbs are the pairs'
               medians. llama-bench's tg128 (-n 128 -r 3).
  pp512        armllm `bench latency F --input-len 512 --output-len 2`, 512 / TTFT
               (median of 3), and llama-bench's pp512 (-p 512 -r 3)
llama.cpp is tools/build_llama_cpp.sh's build. Compare the ratios of one run,
not absolute figures across runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from armllm import LLM, ops
from armllm.bench.kernels import probe_machine
from armllm.bench.offline import greedy, random_prompts
from armllm.bench.plan import PROBE_MIN_TIME
from armllm.demo_model import cache_dir

THREADS = "2"


def armllm_latency(path: Path, *flags: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, "-m", "armllm", "bench", "latency", str(path), *flags,
                        "--threads", THREADS, "--json", out.name], check=True,
                       capture_output=True)
        return json.loads(Path(out.name).read_text())


def decode_bytes(path: Path) -> int:
    """Bytes read per batch-1 decode step (weights and KV cache), from `armllm plan`."""
    r = subprocess.run([sys.executable, "-m", "armllm", "plan", str(path), "--json",
                        "--max-model-len", "256", "--max-num-seqs", "1", "--threads", THREADS,
                        "--bandwidth-gbs", "1"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["decode"]["batch_1"]["bytes"]


def tpot_pairs(path: Path, pairs: int) -> list[tuple[float, float]]:
    """(read GB/s, TPOT s) pairs: a batch-1 request, and the mean of the probes right
    before and right after it (a request takes seconds; a neighbour's load comes and
    goes within them)."""
    llm = LLM(path, threads=int(THREADS), max_model_len=256, max_num_seqs=1)
    prompts = random_prompts(np.random.default_rng(0), llm.vocab_size, pairs + 1, 128)
    params = greedy(128)
    llm.generate([prompts[0]], params)   # warm-up
    out = []
    before = probe_machine(ops.get_pool(), PROBE_MIN_TIME)["read_gbs"]
    for prompt in prompts[1:]:
        tpot = llm.generate([prompt], params)[0].outputs[0].metrics.tpot_s
        after = probe_machine(ops.get_pool(), PROBE_MIN_TIME)["read_gbs"]
        out.append(((before + after) / 2, tpot))
        before = after
    return out


def tpot_pairs_apart(path: Path, pairs: int) -> list[tuple[float, float]]:
    """tpot_pairs in a child process, so that its model's memory is the system's again
    before llama.cpp loads the same weights (a 13 GB model twice does not fit)."""
    r = subprocess.run([sys.executable, __file__, str(path), "--pairs", str(pairs),
                        "--tpot-pairs-only"], check=True, capture_output=True, text=True)
    return [tuple(p) for p in json.loads(r.stdout.splitlines()[-1])]


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
    ap.add_argument("--pairs", type=int, default=7,
                    help="requests, each between two probes (default 7)")
    ap.add_argument("--tpot-pairs-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tpot_pairs_only:   # the child of tpot_pairs_apart
        print(json.dumps(tpot_pairs(args.files[0], args.pairs)))
        return 0
    for path in args.files:
        nbytes = decode_bytes(path)
        pairs = tpot_pairs_apart(path, args.pairs)
        peer = llama_bench(args.llama_bin, path)
        pre = armllm_latency(path, "--input-len", "512", "--output-len", "2", "--repetitions",
                             "3", "--warmup", "1")
        bw = statistics.median(b for b, _ in pairs)
        tpot = statistics.median(t for _, t in pairs) * 1e3
        ratios = [t * b * 1e9 / nbytes for b, t in pairs]
        over = statistics.median(ratios)
        pp = 512 / statistics.median(r["ttft_s"] for r in pre["runs"])
        bound, peer_tpot = nbytes / (bw * 1e9) * 1e3, 1e3 / peer["tg128"]
        print(json.dumps({
            "file": path.name, "weights": pre["weights"], "bytes_per_token_mb": nbytes / 1e6,
            "read_gbs": round(bw, 1), "bound_ms": round(bound, 2),
            "tpot_ms": round(tpot, 2), "tpot_over_bound": round(over, 2),
            "tpot_over_bound_range": [round(min(ratios), 2), round(max(ratios), 2)],
            "llama_tpot_ms": round(peer_tpot, 2), "tpot_vs_llama": round(tpot / peer_tpot, 2),
            "pp512": round(pp, 1), "llama_pp512": round(peer["pp512"], 1),
            "pp512_vs_llama": round(pp / peer["pp512"], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
