#!/usr/bin/env python3
"""bench_sampled: what sampling costs a batched engine against greedy decoding.

One engine, the same requests (random-token prompts of --input-len tokens,
ignore_eos, exactly --output-len tokens each), submitted --concurrency at a
time to the engine itself: greedy and sampled (--temperature, --top-p, --top-k,
--min-p, seeded per request) alternate for --rounds rounds in one process, so
the ratio is not spoiled by the ±15% this VM class varies from process to
process. Reports
output tokens/s per workload (best of the rounds) and sampled / greedy, and the
engine's time in sampling per step (LLMEngine.step's sampling call: the batch
kernel and its Python around it).

    python tools/bench_sampled.py [MODEL] [--concurrency 32] [--input-len 128]
        [--output-len 96] [--rounds 3] [--temperature 0.8] [--top-p 0.95]
        [--top-k 0] [--min-p 0] [--threads N] [--json FILE]

MODEL defaults to SmolLM2-135M-Instruct (the demo GGUF); a 1B shape comes from
tools/make_synthetic.py --shape llama-3.2-1b.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        os.environ["ARMLLM_NUM_THREADS"] = str(args.threads)
    from armllm import ops
    from armllm.api import LLM
    from armllm.bench.offline import random_prompts
    from armllm.cmdline import resolve_model
    from armllm.sampling import SamplingParams

    model = resolve_model(args.model)
    llm = LLM(model, max_model_len=args.input_len + args.output_len,
              max_num_seqs=args.concurrency)
    prompts = random_prompts(np.random.default_rng(0), llm.engine.loaded.config.vocab_size,
                             args.concurrency, args.input_len)
    workloads = {
        "greedy": lambda i: SamplingParams(max_tokens=args.output_len, temperature=0.0,
                                           ignore_eos=True),
        "sampled": lambda i: SamplingParams(max_tokens=args.output_len,
                                            temperature=args.temperature, top_p=args.top_p,
                                            top_k=args.top_k, min_p=args.min_p, seed=i,
                                            ignore_eos=True),
    }
    engine = llm.engine
    sample = engine.runner.sample
    spent = {"seconds": 0.0, "steps": 0}

    def timed(*call):   # any runner's sample(), this one's or an older per-row one
        began = time.perf_counter()
        try:
            return sample(*call)
        finally:
            spent["seconds"] += time.perf_counter() - began

    engine.runner.sample = timed
    llm.generate([prompts[0]], workloads["greedy"](0))   # warm up
    ids = itertools.count()
    results: dict[str, list[dict]] = {name: [] for name in workloads}
    for _ in range(args.rounds):
        for name, params in workloads.items():
            spent.update(seconds=0.0, steps=0)
            for i, prompt in enumerate(prompts):
                engine.add_request(f"{name}-{next(ids)}", prompt, params(i))
            began = time.perf_counter()
            tokens = 0
            while engine.has_unfinished():
                tokens += sum(len(o.new_token_ids) for o in engine.step())
                spent["steps"] += 1
            wall = time.perf_counter() - began
            results[name].append({"tok_s": tokens / wall, "sample_ms_per_step":
                                  1e3 * spent["seconds"] / max(spent["steps"], 1)})
    best = {name: max(runs, key=lambda r: r["tok_s"]) for name, runs in results.items()}
    ratio = best["sampled"]["tok_s"] / best["greedy"]["tok_s"]
    cpu = ops.cpu_info()
    print(f"model {model}  {cpu['cpu']}  threads {ops.num_threads()}  "
          f"isa {ops.selected_isa()}")
    print(f"{args.concurrency} requests x {args.input_len} + {args.output_len} tokens, "
          f"best of {args.rounds} alternating rounds")
    for name, r in best.items():
        print(f"  {name:8s} {r['tok_s']:8.1f} output tok/s   sampling "
              f"{r['sample_ms_per_step']:.3f} ms/step")
    print(f"  sampled / greedy: {ratio:.3f}  (temperature {args.temperature}, top_p "
          f"{args.top_p}, top_k {args.top_k}, min_p {args.min_p})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": shlex.join(sys.argv), "model": model, "cpu": cpu,
                       "threads": ops.num_threads(), "rounds": results, "best": best,
                       "ratio": ratio}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
