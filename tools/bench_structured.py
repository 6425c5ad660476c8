#!/usr/bin/env python3
"""bench_structured: what a JSON-schema constraint costs per output token.

For each model and batch size, the same requests (a chat prompt, temperature
1, ignore_eos, exactly --output-len tokens) run unconstrained and constrained
by a JSON schema that cannot close within --output-len tokens (an array of at
least 1,000 person objects: strings, bounded integers, enums, booleans, a
string array), so both runs decode the same number of rows every step. Two
schemas: "typical" (what Pydantic models and OpenAI's strict mode give: no
string length bounds) and "bounded" (every string with a maxLength: llguidance
then walks the vocabulary's token trie at most string positions, its costliest
JSON case). The two alternate for
--rounds rounds in one process; TPOT is the mean decode-only step time (one
token per running request), and the ratio is constrained / unconstrained per
round, reported as the median over rounds. Mask time per token is llguidance's
time per mask; wait per step is the engine thread's time on masks per step
(all of it when they are computed inline, before the forward; when a spare
CPU computes them during the forward, the part the forward did not hide).

    python tools/bench_structured.py [MODEL ...] [--batches 1 32] [--output-len 128]
        [--rounds 3] [--schemas typical bounded] [--json FILE]

MODEL defaults to SmolLM2-135M-Instruct (the demo GGUF); a synthetic 150k-vocab
model comes from tools/make_synthetic.py --shape qwen3-0.6b.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time

from armllm.cmdline import resolve_model
from armllm.sampling import SamplingParams

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "email": {"type": "string", "maxLength": 40},
                         "role": {"enum": ["admin", "editor", "viewer"]},
                         "active": {"type": "boolean"},
                         "tags": {"type": "array", "maxItems": 4,
                                  "items": {"type": "string", "maxLength": 12}}},
          "required": ["name", "age", "email", "role", "active", "tags"],
          "additionalProperties": False}
BOUNDED = {"type": "array", "minItems": 1000, "items": PERSON}
TYPICAL = json.loads(json.dumps(BOUNDED).replace(', "maxLength": 24', "")
                     .replace(', "maxLength": 40', "").replace(', "maxLength": 12', ""))
assert "maxLength" not in json.dumps(TYPICAL)
SCHEMAS = {"typical": TYPICAL, "bounded": BOUNDED}
MESSAGES = [{"role": "user", "content": "List the users of our system as JSON: name, age, "
                                        "email, role, whether active, and tags."}]


def run_batch(llm, prompt: list[int], batch: int, output_len: int, schema: dict | None,
              seed: int) -> dict:
    """One batch of requests driven step by step; the decode-only steps' times."""
    engine = llm.engine
    before = engine.stats()
    for i in range(batch):
        params = SamplingParams(max_tokens=output_len, temperature=1.0, seed=seed + i,
                                ignore_eos=True,
                                structured_output={"json": schema} if schema else None)
        engine.add_request(f"{'c' if schema else 'u'}{seed}-{i}", prompt, params)
    steps, finished = [], {}
    while engine.has_unfinished():
        decode_only = all(s.num_computed >= len(s.prompt_ids) for s in engine.scheduler.running
                          ) and not engine.scheduler.waiting
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        if decode_only and outs and all(o.new_token_ids for o in outs):
            steps.append(dt)
        finished.update({o.request_id: o.finish_reason for o in outs if o.finish_reason})
    after = engine.stats()
    masks = after.grammar_masks - before.grammar_masks
    assert set(finished.values()) == {"length"}, finished  # every request ran to the end
    return {"tpot_s": statistics.fmean(steps[1:]), "decode_steps": len(steps),
            "masks": masks,
            "mask_s_per_token": ((after.grammar_mask_seconds - before.grammar_mask_seconds)
                                 / masks if masks else 0.0),
            "wait_s_per_step": ((after.grammar_wait_seconds - before.grammar_wait_seconds)
                                / max(len(steps), 1))}


def bench_model(model: str, batches: list[int], output_len: int, rounds: int,
                schemas: list[str]) -> list[dict]:
    from armllm import LLM
    llm = LLM(model, max_num_seqs=max(batches), kv_cache_gib=2.0)
    prompt = llm.chat_prompt(MESSAGES)
    vocab = llm.vocab_size
    print(f"\n== {model}: vocab {vocab}, prompt {len(prompt)} tokens, output {output_len} ==")
    run_batch(llm, prompt, 2, 8, None, 0)   # warm-up: kernels, llguidance's tokenizer
    run_batch(llm, prompt, 2, 8, TYPICAL, 0)
    rows = []
    print(f"{'schema':>8} {'batch':>5} {'TPOT plain ms':>14} {'TPOT json ms':>13} {'ratio':>7} "
          f"{'mask us/token':>14} {'wait us/step':>13}")
    for name, batch in ((n, b) for n in schemas for b in batches):
        ratios, plain, cons = [], [], []
        for r in range(rounds):
            u = run_batch(llm, prompt, batch, output_len, None, 1000 * r)
            c = run_batch(llm, prompt, batch, output_len, SCHEMAS[name], 1000 * r)
            ratios.append(c["tpot_s"] / u["tpot_s"])
            plain.append(u)
            cons.append(c)
        row = {"model": model, "vocab": vocab, "schema": name, "batch": batch,
               "output_len": output_len,
               "rounds": rounds, "ratio_median": statistics.median(ratios), "ratios": ratios,
               "tpot_plain_s": statistics.median(u["tpot_s"] for u in plain),
               "tpot_json_s": statistics.median(c["tpot_s"] for c in cons),
               "mask_s_per_token": statistics.median(c["mask_s_per_token"] for c in cons),
               "wait_s_per_step": statistics.median(c["wait_s_per_step"] for c in cons)}
        rows.append(row)
        print(f"{name:>8} {batch:5d} {row['tpot_plain_s'] * 1e3:14.2f} "
              f"{row['tpot_json_s'] * 1e3:13.2f} {row['ratio_median']:7.3f} "
              f"{row['mask_s_per_token'] * 1e6:14.1f} "
              f"{row['wait_s_per_step'] * 1e6:13.1f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="model paths (default: the demo SmolLM2)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schemas", nargs="+", choices=sorted(SCHEMAS), default=list(SCHEMAS))
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    rows = []
    for model in args.models or [str(resolve_model(None))]:
        rows += bench_model(model, args.batches, args.output_len, args.rounds, args.schemas)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
