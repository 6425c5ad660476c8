#!/usr/bin/env python3
"""bench_gguf: armllm beside llama.cpp on GGUF files as stored (K-quant mixes
included), one file after the other, same machine, 2 threads: issue 14's table.

    python tools/bench_gguf.py FILE.gguf [FILE.gguf ...] [--llama-bin DIR]

Per file, one JSON line:
  bound        bytes read per decode step at batch 1 (`armllm plan F --json`) over
               the read bandwidth of armllm bench kernels' probe
  TPOT         armllm, in a child process, --requests batch-1 requests of 128
               prompt + 128 output tokens: tpot_ms the median of their TPOTs.
               Then the same requests again, step by step, each decode step
               between two passes of the probe over its buffer (a pass takes about
               as long as a step): tpot_over_bound is the median over the steps of
               step time / (bytes / the two passes' mean bandwidth), and
               tpot_over_bound_p10_p90 its 10th and 90th percentiles; read_gbs is
               the passes' median. The box is shared: a neighbour's load comes and
               goes within a request's seconds, not within a step's tens of ms, so
               each step is held against the bandwidth it had.
               llama-bench's tg128 (-n 128 -r 3), between two passes of the probe
               (llama_read_gbs): where those differ from read_gbs the box's bandwidth
               moved between the two runs, and tpot_vs_llama compares two levels.
  pp512        armllm `bench latency F --input-len 512 --output-len 2 --greedy`, 512 / TTFT
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
import time
from pathlib import Path

import numpy as np

from armllm import LLM, ops
from armllm.bench.kernels import cold_bytes
from armllm.bench.offline import greedy, random_prompts
from armllm.demo_model import cache_dir

THREADS = "2"


def armllm_latency(path: Path, *flags: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, "-m", "armllm", "bench", "latency", str(path), *flags,
                        "--threads", THREADS, "--greedy", "--json", out.name], check=True,
                       capture_output=True)
        return json.loads(Path(out.name).read_text())


def decode_bytes(path: Path) -> int:
    """Bytes read per batch-1 decode step (weights and KV cache), from `armllm plan`."""
    r = subprocess.run([sys.executable, "-m", "armllm", "plan", str(path), "--json",
                        "--max-model-len", "256", "--max-num-seqs", "1", "--threads", THREADS,
                        "--bandwidth-gbs", "1"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["decode"]["batch_1"]["bytes"]


def read_gbs(buf: np.ndarray) -> float:
    """One pass of the read probe over buf on the kernel pool: GB/s."""
    t0 = time.perf_counter()
    ops.probe_read(buf, ops.get_pool())
    return buf.nbytes / (time.perf_counter() - t0) / 1e9


def tpot_steps(path: Path, requests: int) -> dict:
    """{"tpots": plain requests' TPOTs (s), "steps": [(read GB/s, step s)]: the same
    requests again, each decode step between two passes of the read probe} (see the
    module's docstring)."""
    llm = LLM(path, threads=int(THREADS), max_model_len=256, max_num_seqs=1)
    prompts = random_prompts(np.random.default_rng(0), llm.vocab_size, requests + 1, 128)
    params = greedy(128)
    llm.generate([prompts[0]], params)   # warm-up
    tpots = [llm.generate([p], params)[0].outputs[0].metrics.tpot_s for p in prompts[1:]]
    buf = np.ones(cold_bytes() >> 20 << 20, dtype=np.uint8)
    engine = llm.engine

    steps = []
    for i, prompt in enumerate(prompts[1:]):
        engine.add_request(f"steps-{i}", prompt, params)
        engine.step()   # the prompt and the first token
        before = read_gbs(buf)
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            step = time.perf_counter() - t0
            after = read_gbs(buf)
            steps.append(((before + after) / 2, step))
            before = after
    return {"tpots": tpots, "steps": steps}


def tpot_steps_apart(path: Path, requests: int) -> dict:
    """tpot_steps in a child process, so that its model's memory is the system's again
    before llama.cpp loads the same weights (a 13 GB model twice does not fit)."""
    r = subprocess.run([sys.executable, __file__, str(path), "--requests", str(requests),
                        "--tpot-steps-only"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout.splitlines()[-1])


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
    ap.add_argument("--requests", type=int, default=5,
                    help="batch-1 requests, plain and then step by step (default 5)")
    ap.add_argument("--tpot-steps-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.requests < 1:
        ap.error(f"--requests must be at least 1, got {args.requests}")
    if args.tpot_steps_only:   # the child of tpot_steps_apart
        print(json.dumps(tpot_steps(args.files[0], args.requests)))
        return 0
    for path in args.files:
        nbytes = decode_bytes(path)
        measured = tpot_steps_apart(path, args.requests)
        buf = np.ones(cold_bytes() >> 20 << 20, dtype=np.uint8)
        peer_before = read_gbs(buf)
        peer = llama_bench(args.llama_bin, path)
        peer_after = read_gbs(buf)
        del buf
        pre = armllm_latency(path, "--input-len", "512", "--output-len", "2", "--repetitions",
                             "3", "--warmup", "1")
        bw = statistics.median(b for b, _ in measured["steps"])
        tpot = statistics.median(measured["tpots"]) * 1e3
        ratios = [t * b * 1e9 / nbytes for b, t in measured["steps"]]
        over = statistics.median(ratios)
        deciles = statistics.quantiles(ratios, n=10)
        pp = 512 / statistics.median(r["ttft_s"] for r in pre["runs"])
        bound, peer_tpot = nbytes / (bw * 1e9) * 1e3, 1e3 / peer["tg128"]
        print(json.dumps({
            "file": path.name, "weights": pre["weights"], "bytes_per_token_mb": nbytes / 1e6,
            "read_gbs": round(bw, 1), "bound_ms": round(bound, 2),
            "tpot_ms": round(tpot, 2), "tpot_over_bound": round(over, 2),
            "tpot_over_bound_p10_p90": [round(deciles[0], 2), round(deciles[-1], 2)],
            "steps": len(ratios),
            "llama_tpot_ms": round(peer_tpot, 2), "tpot_vs_llama": round(tpot / peer_tpot, 2),
            "llama_read_gbs": [round(peer_before, 1), round(peer_after, 1)],
            "pp512": round(pp, 1), "llama_pp512": round(peer["pp512"], 1),
            "pp512_vs_llama": round(pp / peer["pp512"], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
