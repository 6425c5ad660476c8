#!/usr/bin/env python3
"""bench_spec_overhead: what speculative decoding costs where it gains nothing. One
process holds two engines of the same model, one without speculation and one with
--speculative-config, and has them generate the same batch in turn (random prompt
token ids, ignore_eos), so both see the same machine state; each generation's tok/s
(prefill included, output tokens / wall time) is paired with the other engine's in
the same round, and the report is the median of the pairwise ratios (speculation /
none) with their range, and the draft and accepted tokens.

    python tools/bench_spec_overhead.py [--model M] [--batch 32] [--output-len 128] \
        [--rounds 5] [--temperature 0] [--speculative-config JSON] [--threads 2]

Greedy outputs of random prompts often repeat (drafts are kept); --temperature 1
(seeded) gives text with no earlier match, the zero-acceptance case at batch 1.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from armllm import LLM, SamplingParams, ops
from armllm.cmdline import resolve_model

PROMPT_LEN = 128


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: armllm's demo model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--speculative-config",
                    default='{"method": "ngram", "num_speculative_tokens": 8}')
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    model = resolve_model(args.model)
    common = dict(threads=args.threads, max_num_seqs=args.batch)
    engines = {"none": LLM(model, **common),
               "spec": LLM(model, speculative_config=json.loads(args.speculative_config),
                           **common)}
    rng = np.random.default_rng(0)
    vocab = engines["none"].vocab_size
    prompts = [rng.integers(100, vocab, PROMPT_LEN).tolist() for _ in range(args.batch)]
    params = SamplingParams(max_tokens=args.output_len, temperature=args.temperature,
                            seed=1 if args.temperature else None, ignore_eos=True)
    for llm in engines.values():   # warm: first touch of the workspace
        llm.generate(prompts[:1], SamplingParams(max_tokens=8))
    before = engines["spec"].engine.stats()
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, llm in engines.items():
            began = time.perf_counter()
            llm.generate(prompts, params)
            rates[name].append(args.batch * args.output_len / (time.perf_counter() - began))
    after = engines["spec"].engine.stats()
    ratios = sorted(s / n for s, n in zip(rates["spec"], rates["none"], strict=True))
    print(f"{ops.cpu_info()['cpu']}; {args.threads} threads; {model}")
    print(f"batch {args.batch} x ({PROMPT_LEN} + {args.output_len}) tokens, temperature "
          f"{args.temperature}; speculative config {args.speculative_config}")
    for name, r in rates.items():
        print(f"  {name:5s} tok/s: " + " ".join(f"{x:.0f}" for x in r))
    print(f"spec / none: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f} to "
          f"{ratios[-1]:.3f}) over {args.rounds} rounds; draft tokens "
          f"{after.spec_draft_tokens - before.spec_draft_tokens}, accepted "
          f"{after.spec_accepted_tokens - before.spec_accepted_tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
