#!/usr/bin/env python3
"""torch_prefill: HF transformers' prefill speed on this CPU, the torch/oneDNN
reference of issue 13's benchmark (tools/bench_matrix.py runs it).

    python tools/torch_prefill.py MODEL [--input-len 512[,1024]] [--threads 2]
        [--repetitions 3] [--json FILE]

MODEL is a Hugging Face directory (bf16 safetensors, as tools/make_synthetic.py
writes) or a .gguf file, which transformers dequantizes to dense weights at load
(gguf_file loading with GgufConfig(dequantize=True)). The weights run in bfloat16. Each
--input-len times one forward pass over that many random token ids (batch 1,
use_cache=False, no sampling): one warm-up, then the median of --repetitions;
prefill tok/s = input_len / that median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# token ids are drawn from [LOW_ID, vocab - LOW_ID): clear of the special tokens
# that vocabularies keep at their ends
LOW_ID = 100


def load(model: Path):
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig
    if model.suffix == ".gguf":
        # dequantize: dense bf16 weights (oneDNN's matmuls), not transformers' kernels
        # over GGUF blocks, which compute in f32
        return AutoModelForCausalLM.from_pretrained(
            str(model.parent), gguf_file=model.name, dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True))
    return AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--input-len", default="512",
                    help="comma-separated prompt lengths (default 512)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    try:
        lengths = [int(v) for v in args.input_len.split(",")]
    except ValueError:
        print(f"--input-len must be comma-separated integers, got {args.input_len!r}",
              file=sys.stderr)
        return 2
    if min(lengths) < 1 or args.repetitions < 1 or args.threads < 1:
        print("--input-len, --repetitions and --threads must be >= 1", file=sys.stderr)
        return 2
    if not args.model.exists():
        print(f"no such model: {args.model}", file=sys.stderr)
        return 2

    import torch
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load(args.model).eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    result = {"model": str(args.model), "engine": f"transformers bf16 (torch {torch.__version__})",
              "threads": torch.get_num_threads(), "load_s": load_s, "runs": {}}
    print(f"torch_prefill: {args.model.name}, bf16, {result['threads']} threads, "
          f"loaded in {load_s:.1f} s")
    with torch.inference_mode():
        for n in lengths:
            ids = torch.randint(LOW_ID, vocab - LOW_ID, (1, n), generator=gen)
            model(ids, use_cache=False)  # warm-up: oneDNN primitives are created here
            times = []
            for _ in range(args.repetitions):
                t = time.perf_counter()
                model(ids, use_cache=False)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            result["runs"][str(n)] = {"times_s": times, "median_s": med,
                                      "tokens_per_s": n / med}
            print(f"  prefill {n:>5} tokens: median {med * 1e3:9.1f} ms -> "
                  f"{n / med:8.1f} tok/s  (each: "
                  + " ".join(f"{x * 1e3:.1f}" for x in times) + " ms)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
