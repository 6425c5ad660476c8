#!/usr/bin/env python3
"""bench_ray: what running armllm on Ray costs, on one machine.

Serving: `armllm serve --ray` (N Ray Serve replicas of one thread each, on a new
local Ray instance), one `armllm serve` with N threads, and `armllm serve -dp N`
(N replicas of one thread, without Ray), one server at a time in one run, each
given the same closed-loop load over HTTP (httpx): --concurrency clients sending
chat requests, greedy, ignore_eos, --max-tokens each, after a warm-up round;
--repeats runs per server, the median compared.
Batch: Ray Data (N Generator actors of one thread, on a new local Ray instance)
against in-process LLM.generate with N threads, over the same chat prompts.
Side-by-side tables give output throughput and ratios to the plain engine's
(this machine is shared and noisy: compare within one run).

    python tools/bench_ray.py [--model M] [--replicas 2] [--concurrency 32] \
        [--requests 96] [--repeats 3] [--max-tokens 128] [--batch-prompts 128] \
        [--kv-cache-gib 0.5] [--json FILE]

Every engine gets the same small KV cache (--kv-cache-gib): by default each would
size its own from the free memory, and N of them at once would push the model
file out of the page cache (minutes to reread on a slow disk), which is no
measure of Ray.

On one machine Ray can only cost (its proxy and router share the CPUs with the
engines); what it buys is the same app over many machines.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from compare_servers import free_port, wait_ready  # noqa: E402  (tools/ is not a package)

from armllm.cmdline import resolve_model  # noqa: E402

TOPICS = ["a robot", "the sea", "a lighthouse", "winter", "a city at night", "a garden",
          "the moon", "an old map"]


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} "
                                        f"(number {i})."}]


async def _closed_loop(url: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    """`concurrency` clients, each sending its next request when its previous one is
    answered, until `requests` have been sent."""
    next_index = itertools.count()
    latencies: list[float] = []
    tokens = failed = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits,
                                 trust_env=False) as client:
        async def client_loop() -> None:
            nonlocal tokens, failed
            while (i := next(next_index)) < requests:
                start = time.perf_counter()
                r = await client.post("/v1/chat/completions", json={
                    "messages": messages(i), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True})
                if r.status_code != 200:
                    failed += 1
                    continue
                tokens += r.json()["usage"]["completion_tokens"]
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"wall_s": wall, "output_tokens": tokens, "output_tok_s": tokens / wall,
            "requests_s": len(latencies) / wall, "failed": failed,
            "latency_p50_s": statistics.median(latencies) if latencies else None}


def bench_server(name: str, cmd: list[str], args, log_dir: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_dir / f"{name.replace(' ', '_')}.log", "w") as log:
        proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc)
            print(f"\n######## {name}: {' '.join(cmd)}", flush=True)
            # warm-up: connections, the router's view of the replicas, first-call costs
            asyncio.run(_closed_loop(url, args.concurrency, args.concurrency, 8))
            runs = []
            for _ in range(args.repeats):
                runs.append(asyncio.run(_closed_loop(url, args.concurrency, args.requests,
                                                     args.max_tokens)))
                print(json.dumps(runs[-1]), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                status = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
    # the median run by throughput (the machine is noisy)
    result = sorted(runs, key=lambda r: r["output_tok_s"])[len(runs) // 2]
    return {**result, "runs": runs, "exit_status": status}


def bench_batch(model: Path, args) -> dict:
    import ray

    from armllm import LLM, SamplingParams
    from armllm.ray import Generator
    n, sampling = args.replicas, {"temperature": 0, "max_tokens": args.max_tokens,
                                  "ignore_eos": True}
    conversations = [messages(i) for i in range(args.batch_prompts)]
    engine = {"max_num_seqs": args.concurrency, "kv_cache_gib": args.kv_cache_gib}
    print(f"\n######## in-process: LLM({model.name}, threads={n}, **{engine})"
          f".generate({len(conversations)} chat prompts, {sampling})", flush=True)
    start = time.perf_counter()
    with LLM(model, threads=n, **engine) as llm:
        loaded = time.perf_counter()
        outs = llm.generate([llm.chat_prompt(c) for c in conversations],
                            SamplingParams(**sampling))
        done = time.perf_counter()
    tokens = sum(len(o.token_ids) for o in outs)
    plain = {"wall_s": done - start, "load_s": loaded - start, "generate_s": done - loaded,
             "output_tokens": tokens, "output_tok_s": tokens / (done - loaded)}
    print(json.dumps(plain), flush=True)

    batch_size = -(-len(conversations) // n)  # one batch per actor
    print(f"\n######## Ray Data: map_batches(Generator, ActorPoolStrategy(size={n}), "
          f"num_cpus=1, batch_size={batch_size}) on a local Ray of {n} CPUs", flush=True)
    ray.init(address="local", num_cpus=n, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        start = time.perf_counter()
        rows = ray.data.from_items([{"messages": c} for c in conversations]).map_batches(
            Generator, fn_constructor_kwargs={"model": str(model), "sampling": sampling,
                                              **engine},
            compute=ray.data.ActorPoolStrategy(size=n), num_cpus=1,
            batch_size=batch_size).take_all()
        wall = time.perf_counter() - start
    finally:
        ray.shutdown()
    tokens = sum(int(r["num_generated_tokens"]) for r in rows)
    # the actors' engine time: from their first request's arrival to their last token
    engine_s = max(r["e2e_s"] for r in rows)
    data = {"wall_s": wall, "rows": len(rows), "output_tokens": tokens,
            "output_tok_s": tokens / wall, "longest_batch_s": engine_s}
    print(json.dumps(data), flush=True)
    return {"in-process": plain, "ray data": data}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the demo model (SmolLM2 Q4_1)")
    ap.add_argument("--replicas", type=int, default=2, help="N: replicas, actors, threads")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3, help="runs per server (the median "
                    "is compared)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-prompts", type=int, default=128)
    ap.add_argument("--kv-cache-gib", type=float, default=0.5, help="of every engine")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    model = Path(resolve_model(args.model))
    n = args.replicas
    base = [sys.executable, "-m", "armllm", "serve", str(model), "--log-interval", "0",
            "--max-num-seqs", str(args.concurrency), "--kv-cache-gib", str(args.kv_cache_gib)]
    servers = {f"serve {n} threads": [*base, "--threads", str(n)],
               f"serve -dp {n}": [*base, "-dp", str(n), "--threads", "1"],
               f"ray {n}x1": [*base, "--ray", "--ray-address", "local", "--num-replicas",
                              str(n), "--threads", "1"]}
    print(f"# {args.concurrency} clients, {args.requests} chat requests of {args.max_tokens} "
          f"tokens (greedy, ignore_eos), model {model.name}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in servers.items():
            results[name] = bench_server(name, cmd, args, Path(tmp))
    batch = bench_batch(model, args)

    base_tput = results[f"serve {n} threads"]["output_tok_s"]
    dp_tput = results[f"serve -dp {n}"]["output_tok_s"]
    print("\n######## serving, side by side (median run's tok/s; ratios to one engine of "
          f"{n} threads and to -dp {n})")
    print(f"{'server':<18} {'out tok/s':>10} {'ratio':>6} {'vs -dp':>6} {'req/s':>6} "
          f"{'p50 s':>6} {'failed':>6} {'exit':>4}")
    for name, r in results.items():
        print(f"{name:<18} {r['output_tok_s']:10.1f} {r['output_tok_s'] / base_tput:6.3f} "
              f"{r['output_tok_s'] / dp_tput:6.3f} {r['requests_s']:6.2f} "
              f"{r['latency_p50_s']:6.2f} {r['failed']:>6} {r['exit_status']:>4}")
    plain, data = batch["in-process"], batch["ray data"]
    print(f"\n######## batch, {args.batch_prompts} prompts (s; tok/s)")
    print(f"in-process: load {plain['load_s']:.1f} + generate {plain['generate_s']:.1f} s = "
          f"{plain['wall_s']:.1f} s; {plain['output_tok_s']:.1f} tok/s while generating")
    print(f"Ray Data:   {data['wall_s']:.1f} s in all (actors' start and load included; "
          f"their longest batch {data['longest_batch_s']:.1f} s); "
          f"{data['output_tokens'] / data['longest_batch_s']:.1f} tok/s while generating; "
          f"wall ratio {plain['wall_s'] / data['wall_s']:.3f}, generating ratio "
          f"{plain['generate_s'] / data['longest_batch_s']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"serving": results, "batch": batch}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
