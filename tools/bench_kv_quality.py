#!/usr/bin/env python3
"""bench_kv_quality: what a KV cache type costs in accuracy (issue 41's int8 check).

    python tools/bench_kv_quality.py MODEL --text FILE [--context 2048]
        [--kv bf16,int8] [--prompts 8] [--tokens 128]

Per KV cache type, one JSON line and a table row:
  perplexity  `armllm eval perplexity --llama-cpp` over FILE in chunks of
              --context tokens (llama-perplexity's recipe), and llama.cpp's own
              llama-perplexity on the same file and chunks with the matching
              cache type (-ctk/-ctv f16 beside bf16, q8_0 beside int8; flash
              attention on), so that each engine's loss from its 8-bit cache
              reads beside the other's
  agreement   --prompts chat prompts, --tokens greedy tokens each: the share
              of tokens equal to the first type's (bf16) at the same position,
              and the mean count before the first difference
llama.cpp is tools/build_llama_cpp.sh's build; 2 threads.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from armllm import LLM, SamplingParams
from armllm.demo_model import cache_dir

THREADS = "2"
LLAMA_KV = {"bf16": "f16", "f32": "f32", "int8": "q8_0"}
QUESTIONS = ["Tell me about the Moon.", "How do vaccines work?",
             "Write a short poem about autumn.", "Explain how a CPU cache works.",
             "What is the capital of France and why is it famous?",
             "Give me three tips for learning to program.",
             "Summarize the plot of Romeo and Juliet.", "Why is the sky blue?",
             "Describe how bread is made.", "What causes earthquakes?"]


def armllm_perplexity(model: Path, text: Path, context: int, kv: str) -> float:
    r = subprocess.run([sys.executable, "-m", "armllm", "eval", "perplexity", str(model),
                        "--text", str(text), "--context", str(context), "--llama-cpp",
                        "--kv-cache-dtype", kv, "--threads", THREADS, "--json"],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["perplexity"]


def llama_perplexity(llama_bin: Path, model: Path, text: Path, context: int, kv: str) -> float:
    cache = LLAMA_KV[kv]
    r = subprocess.run([str(llama_bin / "llama-perplexity"), "-m", str(model), "-f", str(text),
                        "-c", str(context), "-b", str(context), "-fa", "on", "-ctk", cache,
                        "-ctv", cache, "-t", THREADS], capture_output=True, text=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    if r.returncode or not found:
        raise RuntimeError(f"llama-perplexity failed: {(r.stdout + r.stderr)[-2000:]}")
    return float(found.group(1))


def greedy_tokens(model: Path, kv: str, prompts: int, tokens: int) -> list[list[int]]:
    llm = LLM(model, threads=int(THREADS), kv_cache_dtype=kv, max_num_seqs=prompts)
    chats = [llm.chat_prompt([{"role": "user", "content": q}])
             for q in (QUESTIONS * prompts)[:prompts]]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    out = [list(o.outputs[0].token_ids) for o in llm.generate(chats, params)]
    llm.shutdown()
    return out


def agreement(base: list[list[int]], other: list[list[int]]) -> tuple[float, float]:
    """(share of equal tokens at equal positions, mean tokens before the first
    difference)."""
    same = sum(a == b for x, y in zip(base, other, strict=True)
               for a, b in zip(x, y, strict=True))
    total = sum(len(x) for x in base)
    firsts = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
              for x, y in zip(base, other, strict=True)]
    return same / total, sum(firsts) / len(firsts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--kv", default="bf16,int8", help="comma-separated; the first is the base")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--llama-bin", type=Path,
                    default=cache_dir() / "llama.cpp-0.3.36" / "build" / "bin")
    args = ap.parse_args(argv)
    kvs = args.kv.split(",")
    if bad := [k for k in kvs if k not in LLAMA_KV]:
        ap.error(f"--kv takes {', '.join(LLAMA_KV)}, got {', '.join(bad)}")
    rows, base = [], None
    for kv in kvs:
        row = {"kv": kv, "llama_kv": LLAMA_KV[kv],
               "perplexity": armllm_perplexity(args.model, args.text, args.context, kv)}
        if args.model.suffix == ".gguf" and (args.llama_bin / "llama-perplexity").exists():
            row["llama_perplexity"] = llama_perplexity(args.llama_bin, args.model, args.text,
                                                       args.context, kv)
        tokens = greedy_tokens(args.model, kv, args.prompts, args.tokens)
        base = base or (row, tokens)
        row["ppl_vs_base"] = row["perplexity"] / base[0]["perplexity"] - 1
        if "llama_perplexity" in row:
            row["llama_ppl_vs_base"] = row["llama_perplexity"] / base[0]["llama_perplexity"] - 1
        row["token_agreement"], row["tokens_to_first_difference"] = agreement(base[1], tokens)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{'kv':6} {'ppl':>9} {'vs base':>8} {'llama.cpp':>10} {'vs base':>8} "
          f"{'agree':>6} {'first diff':>10}")
    for r in rows:
        llama = (f"{r['llama_perplexity']:10.4f} {100 * r['llama_ppl_vs_base']:+7.3f}%"
                 if "llama_perplexity" in r else f"{'-':>10} {'-':>8}")
        print(f"{r['kv']:6} {r['perplexity']:9.4f} {100 * r['ppl_vs_base']:+7.3f}% {llama} "
              f"{r['token_agreement']:6.3f} {r['tokens_to_first_difference']:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
