"""`armllm bench throughput` and `armllm bench latency`: the engine in-process,
on prompts of random token ids of exact lengths, ignoring EOS, so that every
request computes exactly --input-len prompt tokens and generates exactly
--output-len tokens. Requests sample with the model's own defaults unless
--temperature, --top-p, --top-k, --min-p, --repetition-penalty or --greedy say
otherwise, request i seeded with --seed + i (bench/workload_sampling.py); the
results state the sampling used.

throughput: all requests are queued at once, after one warm-up request, and
this module drives `engine.step()` itself to time every step. A step is a
*prefill step* when it computes any prompt rows (a prompt chunk, or a
preempted sequence's recomputation), a *decode-only step* otherwise. Prefill
tok/s = prompt rows / the time of prefill steps (decodes batched into those
steps are charged to them); decode tok/s = the rows of decode-only steps /
their time. Request, output and total tok/s are over the whole wall time
from queueing the first request to finishing the last.

latency: one request at a time (batch 1), after --warmup unmeasured ones;
each repetition draws a fresh prompt, so the prefix cache never helps.
TTFT runs from queueing to the first token, TPOT is the mean gap between the
later tokens; pp tok/s = input_len / TTFT and tg tok/s = 1 / TPOT, as
llama-bench names them. With --profile, each decode-only step of the measured
requests is also split into GEMMs, attention, other kernels, Python/engine glue,
sampling and detokenize/postprocess (bench/step_profile.py), per decode token.

Both report the process's peak resident memory while loading (the model and
the engine's KV cache and buffers) and its steady resident memory after the
runs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from armllm.bench.rss import peak_rss_bytes, rss_bytes
from armllm.bench.workload_sampling import WorkloadSampling, request_seed
from armllm.cmdline import UsageError, add_model_argument
from armllm.engine.args import SERVER_ONLY, EngineArgs
from armllm.generate_cli import add_model_sampling_arguments, load_llm, sampling_overrides
from armllm.sampling import SamplingParams

if TYPE_CHECKING:
    from armllm.api import LLM

WARMUP_TOKENS = 8  # output tokens of the throughput warm-up request


# -- arguments ---------------------------------------------------------------------------

def _add_common_arguments(p: argparse.ArgumentParser, input_len: int, output_len: int) -> None:
    add_model_argument(p)
    p.add_argument("--input-len", type=int, default=input_len,
                   help=f"prompt tokens per request (default {input_len})")
    p.add_argument("--output-len", type=int, default=output_len,
                   help=f"generated tokens per request (default {output_len})")
    add_model_sampling_arguments(p)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random prompts; request i samples with seed + i")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    EngineArgs.add_cli_args(p, exclude=SERVER_ONLY,
                            unset={"max_model_len": "--input-len + --output-len"})


def add_throughput_arguments(p: argparse.ArgumentParser) -> None:
    _add_common_arguments(p, 128, 128)
    p.add_argument("--num-prompts", type=int, default=64, help="requests (default 64)")


def add_latency_arguments(p: argparse.ArgumentParser) -> None:
    _add_common_arguments(p, 128, 128)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests first (default 2)")
    p.add_argument("--repetitions", type=int, default=5, help="measured requests (default 5)")
    p.add_argument("--profile", action="store_true",
                   help="also split each decode token's time into GEMMs, attention, other kernels, "
                        "glue, sampling and postprocessing (timers add a little to it)")
    p.set_defaults(max_num_seqs=1)  # batch 1: a KV cache for one sequence


def _at_least(args: argparse.Namespace, minimum: int, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


# -- shared pieces -----------------------------------------------------------------------

def random_prompts(rng: np.random.Generator, vocab_size: int, count: int,
                   length: int) -> list[list[int]]:
    """count prompts of exactly `length` token ids, clear of the vocabulary's ends
    (where special tokens usually sit) unless the vocabulary is tiny."""
    low, high = (100, vocab_size - 100) if vocab_size >= 1000 else (0, vocab_size)
    return rng.integers(low, high, (count, length)).tolist()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _sampling(llm: LLM, overrides: dict) -> WorkloadSampling:
    try:
        return WorkloadSampling.resolve(llm.loaded.generation_config, overrides,
                                        str(llm.loaded.path))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _load(args: argparse.Namespace) -> LLM:
    """The LLM, with max_model_len defaulting to what one request needs, refused if a
    request of --input-len + --output-len tokens cannot run on it."""
    need = args.input_len + args.output_len
    if args.max_model_len is not None and args.max_model_len < need:
        raise UsageError(f"--max-model-len {args.max_model_len} is shorter than --input-len + "
                         f"--output-len = {need}")
    if args.max_model_len is None:
        args.max_model_len = need

    def check(llm: LLM) -> None:
        try:  # token id 0 is in every vocabulary: only the lengths matter
            llm.check_request([0] * args.input_len, greedy(args.output_len))
        except ValueError as exc:
            raise UsageError(f"a request of --input-len + --output-len tokens cannot run: "
                             f"{exc}") from None

    return load_llm(args, check)


def _setup(llm: LLM, args: argparse.Namespace) -> dict:
    """What the numbers depend on: model, machine, engine settings."""
    from armllm import ops
    info = ops.cpu_info()
    w = llm.loaded.model.weights
    return {"model": str(llm.loaded.path), "weights": w.quantization or w.dtype,
            "cpu": info["cpu"], "isa": info["isa"], "threads": ops.num_threads(),
            "max_num_seqs": llm.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": llm.max_model_len,
            "kv_cache_blocks": llm.stats().num_blocks, "block_size": args.block_size,
            "kv_cache_dtype": args.kv_cache_dtype, "prefix_caching": args.enable_prefix_caching}


def _memory(llm: LLM, args: argparse.Namespace, load_peak: int) -> dict:
    """Peak RSS while loading (measured right after it), steady RSS now, and what the
    model holds: packed weights and the KV cache."""
    return {"load_peak_rss_bytes": load_peak, "steady_rss_bytes": rss_bytes(),
            "weights_bytes": llm.loaded.model.weights.nbytes,
            "kv_cache_bytes": llm.engine.runner.kv.nbytes}


def _print_memory(m: dict) -> None:
    gib = 2.0 ** 30
    steady = "unknown" if m["steady_rss_bytes"] is None else \
        f"{m['steady_rss_bytes'] / gib:.2f} GiB"
    print(f"memory: peak RSS while loading {m['load_peak_rss_bytes'] / gib:.2f} GiB, steady "
          f"RSS {steady} (weights {m['weights_bytes'] / gib:.2f} GiB, KV cache "
          f"{m['kv_cache_bytes'] / gib:.2f} GiB)")


def _print_setup(title: str, s: dict) -> None:
    print(f"armllm bench {title}: {Path(s['model']).name}, {s['weights']} weights, "
          f"{s['threads']} threads ({s['isa']}, {s['cpu']})")
    print(f"engine: max_num_seqs {s['max_num_seqs']}, max_num_batched_tokens "
          f"{s['max_num_batched_tokens']}, max_model_len {s['max_model_len']}, KV cache "
          f"{s['kv_cache_blocks']} blocks of {s['block_size']} tokens ({s['kv_cache_dtype']}), "
          f"prefix caching {'on' if s['prefix_caching'] else 'off'}")


def _write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def summary(values: list[float]) -> dict:
    """mean, median and sample standard deviation (0 for a single value)."""
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


# -- throughput --------------------------------------------------------------------------

def run_throughput(args: argparse.Namespace) -> int:
    _at_least(args, 1, "num_prompts", "input_len", "output_len")
    _at_least(args, 0, "seed")
    overrides = sampling_overrides(args)
    llm = _load(args)
    load_peak = peak_rss_bytes()
    engine = llm.engine
    sampling = _sampling(llm, overrides)
    rng = np.random.default_rng(args.seed)
    warmup = random_prompts(rng, llm.vocab_size, 1, args.input_len)
    prompts = random_prompts(rng, llm.vocab_size, args.num_prompts, args.input_len)
    llm.generate(warmup, sampling.params(min(WARMUP_TOKENS, args.output_len),
                                         request_seed(args.seed, args.num_prompts)))
    before = engine.stats()

    prefill = {"steps": 0, "time_s": 0.0, "prompt_tokens": 0, "decode_tokens": 0}
    decode = {"steps": 0, "time_s": 0.0, "tokens": 0}
    metrics, produced = {}, {f"bench-{i}": 0 for i in range(args.num_prompts)}
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{i}", prompt,
                           sampling.params(args.output_len, request_seed(args.seed, i)))
    while engine.has_unfinished():
        last = engine.stats()
        t_step = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t_step
        now = engine.stats()  # this step's rows: decodes, and prompt rows (or recomputes)
        decode_rows = now.num_decode_tokens - last.num_decode_tokens
        prompt_rows = (now.num_computed_tokens - last.num_computed_tokens - decode_rows
                       - (now.spec_draft_tokens - last.spec_draft_tokens))
        if prompt_rows:
            prefill["steps"] += 1
            prefill["time_s"] += dt
            prefill["prompt_tokens"] += prompt_rows
            prefill["decode_tokens"] += decode_rows
        elif decode_rows:
            decode["steps"] += 1
            decode["time_s"] += dt
            decode["tokens"] += decode_rows
        for out in outs:
            produced[out.request_id] += len(out.new_token_ids)
            if out.finish_reason is not None:
                if out.finish_reason != "length":
                    raise RuntimeError(f"request {out.request_id} ended with "
                                       f"{out.finish_reason}: {out.error}")
                metrics[out.request_id] = out.metrics
    elapsed = time.perf_counter() - t0
    after = engine.stats()

    requests = [metrics[f"bench-{i}"] for i in range(args.num_prompts)]
    n_in = sum(m.num_prompt_tokens for m in requests)
    n_out = sum(produced.values())
    prefill["tokens_per_s"] = prefill["prompt_tokens"] / prefill["time_s"]
    decode["tokens_per_s"] = decode["tokens"] / decode["time_s"] if decode["time_s"] else None
    decode["mean_batch"] = decode["tokens"] / decode["steps"] if decode["steps"] else None
    result = {
        **_setup(llm, args), "num_prompts": args.num_prompts, "input_len": args.input_len,
        "output_len": args.output_len, "seed": args.seed, "sampling": sampling.report(),
        "elapsed_s": elapsed,
        "num_prompt_tokens": n_in, "num_output_tokens": n_out,
        "requests_per_s": args.num_prompts / elapsed, "output_tokens_per_s": n_out / elapsed,
        "total_tokens_per_s": (n_in + n_out) / elapsed,
        "prefill": prefill, "decode": decode,
        "num_preemptions": after.num_preemptions - before.num_preemptions,
        "prefix_cache_hit_tokens": after.prefix_cache_hits - before.prefix_cache_hits,
        "ttft_s": summary([m.ttft_s for m in requests]),
        "tpot_s": summary([m.tpot_s for m in requests]) if args.output_len > 1 else None,
        "requests": [{"num_prompt_tokens": m.num_prompt_tokens,
                      "num_output_tokens": produced[f"bench-{i}"], "ttft_s": m.ttft_s,
                      "tpot_s": m.tpot_s, "e2e_s": m.e2e_s} for i, m in enumerate(requests)],
        "memory": _memory(llm, args, load_peak),
        "speculative": speculative_summary(before, after),
    }
    _print_throughput(result)
    _write_json(args.json, result)
    return 0


def speculative_summary(before, after) -> dict | None:
    """Speculative decoding's counters between two EngineStats (None: it is off)."""
    verifies = after.spec_verifies - before.spec_verifies
    if not verifies and not after.spec_proposed_by_position:
        return None
    proposed = {p: n - before.spec_proposed_by_position.get(p, 0)
                for p, n in after.spec_proposed_by_position.items()}
    accepted = {p: after.spec_accepted_by_position.get(p, 0)
                - before.spec_accepted_by_position.get(p, 0) for p in proposed}
    drafted = sum(proposed.values())
    return {"verifies": verifies, "draft_tokens": drafted,
            "accepted_tokens": sum(accepted.values()),
            "acceptance": sum(accepted.values()) / drafted if drafted else 0.0,
            "acceptance_per_position": [accepted[p] / proposed[p] if proposed[p] else 0.0
                                        for p in sorted(proposed)]}


def print_speculative(s: dict | None) -> None:
    if s is None:
        return
    per = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"])
    print(f"speculative: {s['draft_tokens']} draft tokens in {s['verifies']} verifies"
          f", {s['accepted_tokens']} accepted ({s['acceptance']:.1%}); by position: {per}")


def _print_throughput(r: dict) -> None:
    _print_setup("throughput", r)
    print(f"workload: {r['num_prompts']} requests x ({r['input_len']} prompt + "
          f"{r['output_len']} output) tokens, random token ids (seed {r['seed']}), "
          f"ignore_eos; all queued at once after 1 warm-up request")
    print(f"sampling: {r['sampling']['description']}")
    print(f"Throughput: {r['requests_per_s']:.2f} requests/s, "
          f"{r['output_tokens_per_s']:.1f} output tok/s, "
          f"{r['total_tokens_per_s']:.1f} total tok/s "
          f"({r['num_prompt_tokens']} + {r['num_output_tokens']} tokens in "
          f"{_duration(r['elapsed_s'])})")
    p, d = r["prefill"], r["decode"]
    print(f"  prefill: {p['tokens_per_s']:9.1f} tok/s  ({p['prompt_tokens']} prompt tokens in "
          f"{_plural(p['steps'], 'step')}, {_duration(p['time_s'])}; {p['decode_tokens']} "
          f"decode tokens rode along)")
    if d["steps"]:
        print(f"  decode:  {d['tokens_per_s']:9.1f} tok/s  ({d['tokens']} tokens in "
              f"{_plural(d['steps'], 'decode-only step')}, {_duration(d['time_s'])}; "
              f"{d['mean_batch']:.1f} sequences per step)")
    tpot = (f", TPOT median {r['tpot_s']['median'] * 1e3:.1f} ms" if r["tpot_s"] else "")
    print(f"  per request: TTFT median {_duration(r['ttft_s']['median'])}{tpot}; "
          f"{r['num_preemptions']} preemptions, {r['prefix_cache_hit_tokens']} prompt tokens "
          f"from the prefix cache")
    print_speculative(r["speculative"])
    _print_memory(r["memory"])
    print("prefill tok/s = prompt tokens / time of the steps that compute any prompt tokens; "
          "decode tok/s = tokens / time of decode-only steps.")


# -- latency -----------------------------------------------------------------------------

def run_latency(args: argparse.Namespace) -> int:
    _at_least(args, 1, "input_len", "repetitions")
    _at_least(args, 0, "warmup", "seed")
    if args.output_len < 2:
        raise UsageError(f"--output-len must be >= 2 (TPOT needs two tokens), "
                         f"got {args.output_len}")
    overrides = sampling_overrides(args)
    llm = _load(args)
    load_peak = peak_rss_bytes()
    sampling = _sampling(llm, overrides)
    rng = np.random.default_rng(args.seed)
    prompts = random_prompts(rng, llm.vocab_size, args.warmup + args.repetitions,
                             args.input_len)
    params = [sampling.params(args.output_len, request_seed(args.seed, i))
              for i in range(len(prompts))]
    for i in range(args.warmup):
        llm.generate([prompts[i]], params[i])
    runs = []
    if args.profile:
        from armllm.bench.step_profile import StepProfile
    profile = StepProfile(llm.engine) if args.profile else contextlib.nullcontext()
    spec_before = llm.engine.stats()
    for prompt, request_params in zip(prompts[args.warmup:], params[args.warmup:],
                                      strict=True):
        before = llm.engine.stats()
        with profile:
            completion = llm.generate([prompt], request_params)[0].outputs[0]
        m = completion.metrics
        decode_steps = llm.engine.stats().num_decode_tokens - before.num_decode_tokens
        runs.append({"ttft_s": m.ttft_s, "tpot_s": m.tpot_s, "e2e_s": m.e2e_s,
                     "pp_tokens_per_s": args.input_len / m.ttft_s,
                     "tg_tokens_per_s": 1.0 / m.tpot_s,
                     "num_prompt_tokens": m.num_prompt_tokens,
                     "num_cached_prompt_tokens": m.num_cached_prompt_tokens,
                     "num_output_tokens": len(completion.token_ids),
                     # tokens after the first per forward that decoded them (1 without
                     # speculative decoding)
                     "tokens_per_forward": (len(completion.token_ids) - 1)
                     / max(decode_steps, 1)})
    keys = ("ttft_s", "tpot_s", "e2e_s", "pp_tokens_per_s", "tg_tokens_per_s",
            "tokens_per_forward")
    result = {**_setup(llm, args), "input_len": args.input_len, "output_len": args.output_len,
              "warmup": args.warmup, "repetitions": args.repetitions, "seed": args.seed,
              "sampling": sampling.report(),
              "runs": runs, **{k: summary([r[k] for r in runs]) for k in keys},
              "memory": _memory(llm, args, load_peak)}
    result["speculative"] = speculative_summary(spec_before, llm.engine.stats())
    if args.profile:
        result["profile"] = {"decode_tokens": profile.decode_tokens,
                             "per_token_ms": profile.per_token_ms()}
    _print_latency(result)
    _write_json(args.json, result)
    return 0


def _print_latency(r: dict) -> None:
    _print_setup("latency", r)
    cached = sum(run["num_cached_prompt_tokens"] for run in r["runs"])
    print(f"workload: batch 1, {r['input_len']} prompt + {r['output_len']} output tokens, "
          f"ignore_eos; {r['warmup']} warm-up + {r['repetitions']} measured requests, "
          f"a fresh random prompt each (seed {r['seed']}; {cached} prompt tokens from the "
          f"prefix cache)")
    print(f"sampling: {r['sampling']['description']}")
    pp, tg = f"pp{r['input_len']} tok/s", f"tg{r['output_len']} tok/s"
    rows = [("TTFT ms", "ttft_s", 1e3), ("TPOT ms", "tpot_s", 1e3), ("e2e ms", "e2e_s", 1e3),
            (pp, "pp_tokens_per_s", 1.0), (tg, "tg_tokens_per_s", 1.0),
            ("tokens/forward", "tokens_per_forward", 1.0)]
    print(f"{'':<14} {'mean':>10} {'median':>10} {'stdev':>10}   per repetition")
    for label, key, scale in rows:
        s = r[key]
        each = " ".join(f"{run[key] * scale:.2f}" for run in r["runs"])
        print(f"{label:<14} {s['mean'] * scale:10.2f} {s['median'] * scale:10.2f} "
              f"{s['stdev'] * scale:10.2f}   {each}")
    print_speculative(r["speculative"])
    _print_memory(r["memory"])
    print("TTFT = queueing to first token; TPOT = mean gap between the later tokens; "
          "pp = prompt tokens / TTFT; tg = 1 / TPOT; tokens/forward = output tokens after the "
          "first / the forwards that decoded them; stdev is the sample standard deviation.")
    if "profile" in r:
        from armllm.bench.step_profile import format_profile
        print("\n".join(format_profile(r["profile"]["per_token_ms"],
                                       r["profile"]["decode_tokens"])))
