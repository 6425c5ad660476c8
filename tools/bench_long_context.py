#!/usr/bin/env python3
"""bench_long_context: batch-1 decode at long context against its bound and
llama.cpp's, per KV cache type (issue 41's benchmark).

    python tools/bench_long_context.py FILE.gguf [FILE.gguf ...]
        [--contexts 1024,4096,16384] [--kv bf16] [--output-len 64]

Per file, context L and KV type, one JSON line and a table row:
  tpot_ms     armllm, in a child process: R requests of an L-token prompt and N
              output tokens, greedy; the median of their TPOTs (the decode
              steps at L .. L + N tokens)
  over_bound  the same requests again, step by step, each decode step between
              two passes of the read probe (as tools/bench_gguf.py does): the
              median over the steps of step time / (bytes the step reads / the
              two passes' mean bandwidth), the bytes being the weights a decode
              step reads plus the KV bytes of its context, both per `armllm
              plan F --json`; bound_ms is the bytes at L + N/2 over the passes'
              median. Contexts past the model's are skipped
  llama_ms    llama.cpp's llama-bench -p 0 -n N -d L -fa 1 with -ctk/-ctv f16
              (beside armllm's bf16), f32, or q8_0 (beside int8), 1 / avg t/s
llama.cpp is tools/build_llama_cpp.sh's build; 2 threads. The box is shared:
compare the ratios of one run, not absolute figures across runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_gguf import read_gbs  # tools/ beside this script

from armllm import LLM
from armllm.bench.kernels import cold_bytes
from armllm.bench.offline import greedy, random_prompts
from armllm.demo_model import cache_dir

THREADS = "2"
# llama.cpp's cache type beside each of ours (an int8 cache goes beside q8_0)
LLAMA_KV = {"bf16": "f16", "f32": "f32", "int8": "q8_0"}


def plan(path: Path, kv: str, model_len: int | None = None) -> dict:
    """`armllm plan F --json` at batch 1 (model_len None: the model's context)."""
    r = subprocess.run([sys.executable, "-m", "armllm", "plan", str(path), "--json",
                        "--max-num-seqs", "1", "--kv-cache-dtype", kv, "--threads", THREADS,
                        *(["--max-model-len", str(model_len)] if model_len else [])],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def decode_steps(path: Path, kv: str, context: int, output_len: int, reps: int) -> dict:
    """{"tpots": the plain requests' TPOTs, "steps": [(read GB/s, tokens in context,
    step s)]: the same requests again, each decode step between two probe passes}."""
    llm = LLM(path, threads=int(THREADS), max_model_len=context + output_len,
              max_num_seqs=1, kv_cache_dtype=kv)
    prompts = random_prompts(np.random.default_rng(0), llm.vocab_size, reps, context)
    params = greedy(output_len)
    llm.generate([prompts[0][:128]], greedy(8))   # warm-up
    tpots = [llm.generate([p], params)[0].outputs[0].metrics.tpot_s for p in prompts]
    buf = np.ones(cold_bytes() >> 20 << 20, dtype=np.uint8)
    engine = llm.engine

    steps = []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"steps-{i}", prompt, params)
        while engine.scheduler.running == [] or \
                engine.scheduler.running[0].num_computed < context:
            engine.step()   # the prompt (in chunks) and the first token
        before, tokens = read_gbs(buf), context + 1
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            step = time.perf_counter() - t0
            after = read_gbs(buf)
            steps.append(((before + after) / 2, tokens, step))
            before, tokens = after, tokens + 1
    return {"tpots": tpots, "steps": steps}


def decode_steps_apart(path: Path, kv: str, context: int, output_len: int,
                       reps: int) -> dict:
    """decode_steps in a child process (its memory is the system's again after)."""
    r = subprocess.run([sys.executable, __file__, str(path), "--kv", kv, "--contexts",
                        str(context), "--output-len", str(output_len), "--repetitions",
                        str(reps), "--steps-only"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout.splitlines()[-1])


def llama_tpot(llama_bin: Path, path: Path, kv: str, context: int, output_len: int,
               reps: int) -> float:
    cache = LLAMA_KV[kv]
    r = subprocess.run([str(llama_bin / "llama-bench"), "-m", str(path), "-p", "0",
                        "-n", str(output_len), "-d", str(context), "-fa", "1", "-ctk", cache,
                        "-ctv", cache, "-t", THREADS, "-r", str(reps), "-o", "json"],
                       check=True, capture_output=True, text=True)
    return 1.0 / json.loads(r.stdout)[0]["avg_ts"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--contexts", default="1024,4096,16384",
                    help="comma-separated prompt lengths (default 1024,4096,16384)")
    ap.add_argument("--kv", default="bf16",
                    help=f"comma-separated KV cache types of {', '.join(LLAMA_KV)} "
                         "(default bf16)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--llama-bin", type=Path,
                    default=cache_dir() / "llama.cpp-0.3.36" / "build" / "bin")
    ap.add_argument("--no-llama", action="store_true", help="armllm alone")
    ap.add_argument("--steps-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        ap.error(f"--contexts must be comma-separated integers, got {args.contexts!r}")
    kvs = args.kv.split(",")
    if bad := [k for k in kvs if k not in LLAMA_KV]:
        ap.error(f"--kv takes {', '.join(LLAMA_KV)}, got {', '.join(bad)}")
    if min(contexts) < 1 or args.output_len < 2 or args.repetitions < 1:
        ap.error("contexts must be >= 1, --output-len >= 2 and --repetitions >= 1")
    if args.steps_only:   # the child of decode_steps_apart
        print(json.dumps(decode_steps(args.files[0], kvs[0], contexts[0], args.output_len,
                                      args.repetitions)))
        return 0
    print(f"{'file':34} {'kv':5} {'context':>7} {'tpot ms':>8} {'bound ms':>8} {'/bound':>6} "
          f"{'llama ms':>8} {'/llama':>6} {'GB/s':>5}", flush=True)
    for path in args.files:
        for kv in kvs:
            longest = plan(path, kv)["max_model_len"]
            for context in contexts:
                if context + args.output_len > longest:
                    print(f"{path.name[:34]:34} {kv:5} {context:7d}  skipped: past the model's "
                          f"{longest} tokens", flush=True)
                    continue
                p = plan(path, kv, context + args.output_len)
                weights = p["decode"]["batch_1"]["weight_bytes"]
                per_token = p["kv_cache"]["bytes_per_token"]
                measured = decode_steps_apart(path, kv, context, args.output_len,
                                              args.repetitions)
                tpot = statistics.median(measured["tpots"])
                over = statistics.median(t * b * 1e9 / (weights + per_token * n)
                                         for b, n, t in measured["steps"])
                bw = statistics.median(b for b, _, _ in measured["steps"])
                nbytes = weights + per_token * (context + args.output_len // 2)
                bound = nbytes / (bw * 1e9)
                peer = None if args.no_llama else llama_tpot(
                    args.llama_bin, path, kv, context, args.output_len, args.repetitions)
                row = {"file": path.name, "kv": kv, "context": context,
                       "tpot_ms": round(tpot * 1e3, 2), "bound_ms": round(bound * 1e3, 2),
                       "tpot_over_bound": round(over, 2), "read_gbs": round(bw, 1),
                       "steps": len(measured["steps"]),
                       "bytes_per_token_mb": round(nbytes / 1e6, 1),
                       "llama_kv": LLAMA_KV[kv],
                       "llama_tpot_ms": None if peer is None else round(peer * 1e3, 2),
                       "tpot_vs_llama": None if peer is None else round(tpot / peer, 2)}
                llama = "" if peer is None else f"{peer * 1e3:8.2f} {tpot / peer:6.2f}"
                print(f"{path.name[:34]:34} {kv:5} {context:7d} {tpot * 1e3:8.2f} "
                      f"{bound * 1e3:8.2f} {over:6.2f} {llama:15} {bw:5.1f}", flush=True)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
