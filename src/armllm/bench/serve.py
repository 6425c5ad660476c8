"""`armllm bench serve`: an async streaming client that measures any
OpenAI-compatible server (armllm, vLLM, llama.cpp's server) under load.

Requests go out at a Poisson rate (or all at once) with at most
--max-concurrency in flight. Per request it records the time to the first
content chunk (TTFT), the gaps between content chunks (ITL), the end-to-end
latency (E2E) and TPOT = (E2E - TTFT) / (output tokens - 1), with output
tokens from the server's `usage` (`stream_options.include_usage`) or, if the
server sends none, from re-tokenizing the text, and the prompt tokens the
server's prefix cache served (`usage.prompt_tokens_details.cached_tokens`)
where it says. Summaries: mean, median, p90, p95, p99 (ms); request/s,
output and total tok/s, peak concurrency; failed requests counted with their
errors. SLOs (`--slo ttft_p95_ms=...`)
give PASS/FAIL and goodput (completed requests meeting every per-request
bound, per second); a `--concurrency-sweep` reports the highest concurrency
that passes.

Every request states its sampling in full: the --tokenizer model's own
defaults unless --temperature, --top-p, --top-k, --min-p, --repetition-penalty
or --greedy say otherwise, request i seeded with --seed + i
(bench/workload_sampling.py), so servers that default differently (llama-server
has its own) sample the same workload. --backend names the fields:
OpenAI's plus the vLLM-style top_k, min_p and repetition_penalty (armllm,
vLLM, SGLang), or llama-server's, with its sampler chain cut to the same steps
in the same order."""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from armllm.bench.workload_sampling import WorkloadSampling, request_seed
from armllm.cmdline import UsageError, progress_bar, resolve_model
from armllm.generate_cli import (
    MODEL_SAMPLING_FLAGS,
    add_model_sampling_arguments,
    sampling_overrides,
)

SCHEMA_VERSION = 2   # 2: the sampling used in "sampling", not in settings.temperature
PERCENTILES = (50, 90, 95, 99)
SLO_METRICS = ("ttft", "tpot", "itl", "e2e")


# -- workloads ------------------------------------------------------------------------------

@dataclass
class Prompt:
    text: str
    input_tokens: int           # by the local tokenizer
    output_tokens: int          # asked for (max_tokens)


def _text_of_length(tok, rng: np.random.Generator, n: int, vocab: int,
                    special: set[int]) -> str:
    """Text that encodes to exactly n tokens (no special tokens added)."""
    ids = [int(t) for t in rng.integers(0, vocab, n * 2)]
    ids = [t for t in ids if t not in special][:n]
    for _ in range(20):
        text = tok.decode(ids)
        got = tok.encode(text, add_special_tokens=False)
        if len(got) == n:
            return text
        extra = [int(t) for t in rng.integers(0, vocab, n) if int(t) not in special]
        ids = got[:n] if len(got) > n else got + extra[:n - len(got)]
    raise RuntimeError(f"could not make a prompt of exactly {n} tokens")


class Workload:
    """Prompts from a dataset: random, a JSON file, or shared-prefix."""

    def __init__(self, args: argparse.Namespace, tokenizer):
        self.tok = tokenizer
        rng = np.random.default_rng(args.seed)
        hf = tokenizer.tokenizer
        vocab = hf.get_vocab_size()
        special = {i for i in range(vocab)
                   if hf.id_to_token(i) is None or hf.decode([i]) == ""}
        bos = tokenizer.encode("")            # what the server adds in front (a BOS), if any
        # the warm-up requests get prompts of their own, after the measured ones, so the
        # server's prefix cache cannot serve a measured prompt from the warm-up
        n, out_len = args.num_prompts + args.warmup, args.output_len
        if args.dataset == "random":
            body = args.input_len - len(bos)
            self.prompts = [Prompt(_text_of_length(tokenizer, rng, body, vocab, special),
                                   args.input_len, out_len) for _ in range(n)]
        elif args.dataset == "shared-prefix":
            prefix = _text_of_length(tokenizer, rng, args.prefix_len, vocab, special)
            self.prompts = []
            for _ in range(n):
                suffix = _text_of_length(tokenizer, rng, args.input_len, vocab, special)
                text = prefix + suffix
                self.prompts.append(Prompt(text, len(tokenizer.encode(text)), out_len))
        else:
            self.prompts = self._from_json(Path(args.dataset_path), n, out_len, rng)
        self.warmup_prompts = self.prompts[args.num_prompts:]
        self.prompts = self.prompts[:args.num_prompts]

    def _from_json(self, path: Path, n: int, out_len: int | None, rng) -> list[Prompt]:
        """A list of strings, of {"prompt", "max_tokens"?}, or ShareGPT conversations
        ({"conversations": [{"from": "human", "value"}, {"from": "gpt", "value"}]}: the
        first human turn is the prompt, the reply's length the output length)."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: {exc}") from None
        if not isinstance(data, list) or not data:
            raise UsageError(f"{path}: expected a non-empty JSON list")
        prompts = []
        for i, item in enumerate(data):
            text, want = None, out_len
            if isinstance(item, str):
                text = item
            elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
                text = item["prompt"]
                want = out_len or item.get("max_tokens")
            elif isinstance(item, dict) and isinstance(item.get("conversations"), list):
                turns = item["conversations"]
                if len(turns) >= 2 and isinstance(turns[0].get("value"), str):
                    text = turns[0]["value"]
                    reply = turns[1].get("value") or ""
                    want = out_len or max(1, len(self.tok.encode(reply,
                                                                 add_special_tokens=False)))
            if text is None:
                raise UsageError(f"{path}: item {i} is not a string, a {{prompt}} object or a "
                                 "ShareGPT conversation")
            prompts.append(Prompt(text, len(self.tok.encode(text)), want or 128))
        order = rng.permutation(len(prompts))
        return [prompts[int(order[i % len(prompts)])] for i in range(n)]


# -- one run --------------------------------------------------------------------------------

@dataclass
class Record:
    index: int
    input_tokens: int
    output_tokens_requested: int
    success: bool = False
    error: str | None = None
    start_s: float = 0.0                       # since the run started
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    server_prompt_tokens: int | None = None    # usage.prompt_tokens, when the server says
    server_cached_tokens: int | None = None    # usage.prompt_tokens_details.cached_tokens

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


# llama-server's sampler chain cut to armllm's steps, in an order that samples the same
# distribution: its default chain also holds DRY, top-n-sigma, typical-p and XTC (off at
# their defaults, which a server's command line may change), and applies the
# temperature last, after top-p and min-p, where armllm (like vLLM and transformers)
# applies it first; top-k gives the same set either way
LLAMA_CPP_SAMPLERS = ["penalties", "top_k", "temperature", "top_p", "min_p"]
# what else a llama-server request sets, at off: Mirostat replaces the chain, a dynamic
# temperature range changes its temperature, and OpenAI's penalties stay at armllm's 0
LLAMA_CPP_OFF = {"mirostat": 0, "dynatemp_range": 0.0, "presence_penalty": 0.0,
                 "frequency_penalty": 0.0}
# tokens a chat template may add around a prompt: llama-server's repeat_last_n (64 by
# default) must reach back over every prompt token, which armllm's repetition penalty,
# like transformers', counts
TEMPLATE_MARGIN = 256


def sampling_fields(backend: str, sampling: WorkloadSampling, prompt: Prompt,
                    seed: int) -> dict:
    """The sampling fields of one request, as the backend names them."""
    f = sampling.fields
    if backend == "llama.cpp":
        return {"temperature": f["temperature"], "top_k": f["top_k"], "top_p": f["top_p"],
                "min_p": f["min_p"], "repeat_penalty": f["repetition_penalty"],
                "repeat_last_n": prompt.input_tokens + prompt.output_tokens + TEMPLATE_MARGIN,
                "samplers": LLAMA_CPP_SAMPLERS, **LLAMA_CPP_OFF, "seed": seed}
    return {**f, "seed": seed}


def _request_body(args, prompt: Prompt, seed: int) -> dict:
    body = {"model": args.model, "max_tokens": prompt.output_tokens, "stream": True,
            "stream_options": {"include_usage": True},
            **sampling_fields(args.backend, args.sampling, prompt, seed)}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


async def _one(client, url: str, args, prompt: Prompt, seed: int, rec: Record, t0: float,
               tok) -> None:
    sent = time.perf_counter()
    rec.start_s = sent - t0
    last, text = None, []
    try:
        async with client.stream("POST", url, json=_request_body(args, prompt, seed)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {resp.status_code}: {_error_message(body)}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                msg = json.loads(data)
                if "error" in msg:
                    raise RuntimeError(_error_message(data))
                usage = msg.get("usage")
                if usage:
                    rec.output_tokens = usage.get("completion_tokens") or 0
                    rec.server_prompt_tokens = usage.get("prompt_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    rec.server_cached_tokens = details.get("cached_tokens")
                piece = "".join((c.get("text") or (c.get("delta") or {}).get("content") or "")
                                for c in msg.get("choices") or [])
                has_token = any(_carries_token(c) for c in msg.get("choices") or [])
                if not has_token:  # a usage-only or role-only chunk
                    continue
                text.append(piece)
                if rec.ttft_s is None:
                    rec.ttft_s = now - sent
                else:
                    rec.itl_s.append(now - last)
                last = now
        rec.e2e_s = time.perf_counter() - sent
        if not rec.output_tokens:  # the server sent no usage: count the text's tokens
            rec.output_tokens = len(tok.encode("".join(text), add_special_tokens=False))
        if rec.ttft_s is None:
            raise RuntimeError("the stream carried no output")
        rec.success = True
    except (httpx.HTTPError, RuntimeError, ValueError, OSError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]


def _carries_token(choice: dict) -> bool:
    """A completions chunk with text, or a chat delta with content that is not the
    opening role-only delta (its content is "")."""
    if choice.get("text") is not None:
        return True
    delta = choice.get("delta") or {}
    return delta.get("content") is not None and not ("role" in delta and delta["content"] == "")


def _error_message(body: str) -> str:
    try:
        err = json.loads(body).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return body[:200]


async def _run(args, workload: Workload, concurrency: int | None, progress) -> dict:
    url = args.base_url.rstrip("/") + ("/chat/completions" if args.endpoint == "chat"
                                       else "/completions")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    records = [Record(i, p.input_tokens, p.output_tokens) for i, p in enumerate(workload.prompts)]
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    rng = np.random.default_rng(args.seed + 1)
    in_flight = peak = done = 0

    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits,
                                 trust_env=False) as client:
        for j, p in enumerate(workload.warmup_prompts):   # warm-up: not recorded
            await _one(client, url, args, p, request_seed(args.seed, len(records) + j),
                       Record(-1, 0, 0), time.perf_counter(), workload.tok)

        async def guarded(p: Prompt, rec: Record, t0: float) -> None:
            nonlocal in_flight, peak, done
            if sem:
                await sem.acquire()
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await _one(client, url, args, p, request_seed(args.seed, rec.index), rec, t0,
                           workload.tok)
            finally:
                in_flight -= 1
                done += 1
                if sem:
                    sem.release()
                progress(done, len(records))

        t0 = time.perf_counter()
        tasks = []
        for p, rec in zip(workload.prompts, records, strict=True):
            tasks.append(asyncio.create_task(guarded(p, rec, t0)))
            if math.isfinite(args.request_rate):
                await asyncio.sleep(float(rng.exponential(1.0 / args.request_rate)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return summarize(records, duration, peak, args.slo, concurrency, args.request_rate)


# -- summaries ------------------------------------------------------------------------------

def latency_stats(values: list[float]) -> dict:
    """mean, median, std and the PERCENTILES of durations in seconds, in ms (None for
    none)."""
    if not values:
        return {"mean": None, "median": None, "std": None,
                **{f"p{q}": None for q in PERCENTILES}}
    a = np.asarray(values) * 1e3
    return {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std()),
            **{f"p{q}": float(np.percentile(a, q)) for q in PERCENTILES}}


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft_p95_ms=500,tpot_p95_ms=40' -> {'ttft_p95_ms': 500.0, ...}."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        metric, _, rest = name.strip().partition("_")
        stat, _, unit = rest.partition("_")
        ok_stat = stat in ("mean", "median") or (stat.startswith("p") and stat[1:].isdigit()
                                                 and 0 < int(stat[1:]) < 100)
        if metric not in SLO_METRICS or not ok_stat or unit != "ms":
            raise UsageError(f"--slo: {name!r} is not METRIC_STAT_ms with METRIC in "
                             f"{', '.join(SLO_METRICS)} and STAT mean, median or pNN")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--slo: {name}: {value!r} is not a number") from None
    return out


def _slo_value(summary: dict, name: str) -> float | None:
    metric, stat, _ = name.split("_")
    values = summary["_raw"][metric]
    if not values:
        return None
    a = np.asarray(values) * 1e3
    if stat == "mean":
        return float(a.mean())
    if stat == "median":
        return float(np.median(a))
    return float(np.percentile(a, int(stat[1:])))


def summarize(records: list[Record], duration: float, peak: int, slo: dict,
              concurrency: int | None, rate: float) -> dict:
    ok = [r for r in records if r.success]
    raw = {"ttft": [r.ttft_s for r in ok], "tpot": [r.tpot_s for r in ok if r.tpot_s is not None],
           "itl": [g for r in ok for g in r.itl_s], "e2e": [r.e2e_s for r in ok]}
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.server_prompt_tokens or r.input_tokens for r in ok)
    cached = [r.server_cached_tokens for r in ok if r.server_cached_tokens is not None]
    summary = {
        "max_concurrency": concurrency, "request_rate": None if math.isinf(rate) else rate,
        "completed": len(ok), "failed": len(records) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "total_cached_input_tokens": sum(cached) if cached else None,
        "peak_concurrency": peak,
        "errors": dict(Counter(r.error for r in records if not r.success).most_common(10)),
        **{f"{m}_ms": latency_stats(v) for m, v in raw.items()}, "_raw": raw,
        "_records": [{**asdict(r), "tpot_s": r.tpot_s} for r in records],
    }
    if slo:
        results = {}
        for name, bound in slo.items():
            value = _slo_value(summary, name)
            results[name] = {"bound": bound, "value": value,
                             "pass": value is not None and value <= bound}
        summary["slo"] = results
        summary["slo_pass"] = all(v["pass"] for v in results.values()) and not summary["failed"]
        good = [r for r in ok if _request_meets(r, slo)]
        summary["goodput"] = len(good) / duration
    return summary


def _request_meets(r: Record, slo: dict) -> bool:
    """Per request, each SLO metric's bound applies to that request's own value (ITL: its
    worst gap)."""
    own = {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2e": r.e2e_s,
           "itl": max(r.itl_s) if r.itl_s else None}
    for name, bound in slo.items():
        value = own[name.split("_")[0]]
        if value is not None and value * 1e3 > bound:
            return False
    return True


def _print_summary(s: dict, title: str) -> None:
    print(f"\n== {title} ==")
    print(f"completed {s['completed']}, failed {s['failed']}, duration {s['duration_s']:.2f} s, "
          f"peak concurrency {s['peak_concurrency']}")
    print(f"request/s {s['request_throughput']:.2f}   output tok/s "
          f"{s['output_throughput']:.1f}   total tok/s {s['total_token_throughput']:.1f}   "
          f"(input {s['total_input_tokens']}{_cached(s)}, output {s['total_output_tokens']} "
          "tokens)")
    print(f"{'ms':<6}" + "".join(f"{h:>10}" for h in ("mean", "median", "p90", "p95", "p99")))
    for m in SLO_METRICS:
        st = s[f"{m}_ms"]
        cells = "".join(f"{st[k]:10.1f}" if st[k] is not None else f"{'-':>10}"
                        for k in ("mean", "median", "p90", "p95", "p99"))
        print(f"{m.upper():<6}{cells}")
    if "slo" in s:
        for name, v in s["slo"].items():
            value = "-" if v["value"] is None else f"{v['value']:.1f}"
            print(f"SLO {name} <= {v['bound']:g}: {value} {'PASS' if v['pass'] else 'FAIL'}")
        print(f"SLO overall: {'PASS' if s['slo_pass'] else 'FAIL'}; goodput "
              f"{s['goodput']:.2f} req/s")
    for err, count in s["errors"].items():
        print(f"error x{count}: {err}")


def _cached(s: dict) -> str:
    if s["total_cached_input_tokens"] is None:
        return ""
    return f" of which {s['total_cached_input_tokens']} from the server's prefix cache"


# -- the command ----------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1",
                   help="the server's OpenAI API root (with /v1)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's "
                   "first /models entry)")
    p.add_argument("--tokenizer", default=None, help="a local model (directory or .gguf) whose "
                   "tokenizer makes and counts prompts (default: the demo model, as for the "
                   "MODEL of other commands)")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--dataset", choices=["random", "json", "shared-prefix"], default="random")
    p.add_argument("--dataset-path", help="json: a list of strings, {prompt} objects or "
                   "ShareGPT conversations")
    p.add_argument("--input-len", type=int, default=128,
                   help="random: prompt tokens; shared-prefix: tokens after the prefix")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: prefix tokens")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests/s, Poisson arrivals (inf: all at once)")
    p.add_argument("--concurrency-sweep", default=None,
                   help="comma-separated max concurrencies, one run each")
    p.add_argument("--slo", default=None,
                   help="e.g. ttft_p95_ms=1000,tpot_p95_ms=50 (METRIC in ttft, tpot, itl, e2e; "
                        "STAT mean, median or pNN)")
    add_model_sampling_arguments(p)
    p.add_argument("--backend", choices=["openai", "llama.cpp"], default="openai",
                   help="how requests name the sampling fields: openai (OpenAI's and the "
                        "vLLM-style top_k, min_p, repetition_penalty: armllm, vLLM, SGLang) or "
                        "llama.cpp (llama-server's, its sampler chain cut to the same steps)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests stop at EOS (then output lengths vary)")
    p.add_argument("--warmup", type=int, default=1, help="requests before each run, unrecorded")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the prompts and arrivals; request i samples with seed + i")
    p.add_argument("--json", metavar="FILE", help="write every request record and the summary")
    p.add_argument("--plot", metavar="FILE.png", help="throughput and p95 TPOT against "
                   "concurrency (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true")


def _check(args) -> list[int | None]:
    for name in ("input_len", "output_len", "num_prompts", "prefix_len"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    for name in ("warmup", "seed"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if not args.request_rate > 0:
        raise UsageError(f"--request-rate must be > 0 or inf, got {args.request_rate}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.dataset == "json" and not args.dataset_path:
        raise UsageError("--dataset json needs --dataset-path FILE")
    if args.plot and not args.concurrency_sweep:
        raise UsageError("--plot draws a --concurrency-sweep")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the sweep runs
        raise UsageError("--plot needs matplotlib: pip install matplotlib (or armllm[plot])")
    if args.concurrency_sweep is None:
        return [args.max_concurrency]
    try:
        levels = [int(c) for c in args.concurrency_sweep.split(",")]
    except ValueError:
        raise UsageError(f"--concurrency-sweep: {args.concurrency_sweep!r} is not a "
                         "comma-separated list of integers") from None
    if not levels or min(levels) < 1:
        raise UsageError("--concurrency-sweep values must be >= 1")
    return levels


def _load_tokenizer(args, overrides: dict):
    """The --tokenizer model's tokenizer, and the sampling of its defaults under the
    command line's."""
    # the model layer loads the kernels
    from armllm.model.loader import load_generation_config, load_tokenizer
    try:
        model = resolve_model(args.tokenizer)
        return load_tokenizer(model), WorkloadSampling.resolve(
            load_generation_config(model), overrides, model)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None


def _server_model(args) -> str:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        r = httpx.get(args.base_url.rstrip("/") + "/models", headers=headers, timeout=30,
                      trust_env=False)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"{args.base_url}/models: {exc}") from None


def run(args: argparse.Namespace) -> int:
    levels = _check(args)
    overrides = sampling_overrides(args)
    slo = parse_slo(args.slo)
    args.slo = slo
    tok, args.sampling = _load_tokenizer(args, overrides)
    if args.model is None:
        args.model = _server_model(args)
    # every level of a sweep gets fresh prompts (another seed), so a server's prefix cache
    # cannot serve one level's prompts from the level before
    workloads = [Workload(argparse.Namespace(**{**vars(args), "seed": args.seed + i}), tok)
                 for i in range(len(levels))]
    workload = workloads[0]
    tty = sys.stderr.isatty() and not args.no_progress

    def progress(done: int, total: int) -> None:
        if tty:
            print(f"\r{progress_bar(done, total)} {done}/{total}",
                  end="" if done < total else "\n", file=sys.stderr, flush=True)

    print(f"$ armllm bench {' '.join(sys.argv[2:]) if len(sys.argv) > 2 else 'serve'}")
    print(f"{args.base_url} model {args.model!r}, {args.endpoint}, dataset {args.dataset}, "
          f"{len(workload.prompts)} prompts, output {args.output_len} tokens, request rate "
          f"{args.request_rate:g}/s")
    print(f"sampling: {args.sampling.describe()}; {args.backend} fields")
    runs = []
    for c, level_workload in zip(levels, workloads, strict=True):
        summary = asyncio.run(_run(args, level_workload, c, progress))
        _print_summary(summary, f"max concurrency {c or 'unlimited'}")
        runs.append(summary)
    if len(levels) > 1:
        _print_sweep(runs, bool(slo))
    if args.json:
        _write_json(args, runs, workload)
    if args.plot:
        _plot(runs, args.plot)
    return 0


def _print_sweep(runs: list[dict], with_slo: bool) -> None:
    print("\n== sweep ==")
    print(f"{'conc':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT p95':>9} {'TPOT p95':>9} "
          f"{'ITL p95':>8} {'failed':>7}" + (f" {'SLO':>5} {'goodput':>8}" if with_slo else ""))
    for s in runs:
        p95 = [s[f"{m}_ms"]["p95"] for m in ("ttft", "tpot", "itl")]
        cells = " ".join(f"{v:9.1f}" if v is not None else f"{'-':>9}" for v in p95)
        line = (f"{s['max_concurrency']:5d} {s['request_throughput']:7.2f} "
                f"{s['output_throughput']:10.1f} {cells} {s['failed']:7d}")
        if with_slo:
            line += f" {'PASS' if s['slo_pass'] else 'FAIL':>5} {s['goodput']:8.2f}"
        print(line)
    if with_slo:
        ok = [s["max_concurrency"] for s in runs if s["slo_pass"]]
        print(f"highest concurrency meeting the SLO: {max(ok) if ok else 'none'}")


def _write_json(args, runs: list[dict], workload: Workload) -> None:
    sampling_flags = {*MODEL_SAMPLING_FLAGS, "greedy", "sampling"}   # as given: see "sampling"
    settings = {k: v for k, v in vars(args).items()
                if k not in ("func", "slo", *sampling_flags)}
    settings["slo"] = args.slo
    settings["request_rate"] = None if math.isinf(args.request_rate) else args.request_rate
    doc = {"schema_version": SCHEMA_VERSION, "tool": "armllm bench serve",
           "settings": settings, "sampling": args.sampling.report(),
           "runs": [{"summary": {k: v for k, v in s.items() if not k.startswith("_")},
                     "requests": s["_records"]} for s in runs]}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1, default=str)


def _plot(runs: list[dict], path: str) -> None:
    try:  # an optional package (the [plot] extra); _check refused its absence up front
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib") from None
    conc = [s["max_concurrency"] for s in runs]
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(conc, [s["output_throughput"] for s in runs], "o-", color="tab:blue")
    ax1.set_xlabel("max concurrency")
    ax1.set_ylabel("output tok/s", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(conc, [s["tpot_ms"]["p95"] or 0 for s in runs], "s--", color="tab:red")
    ax2.set_ylabel("TPOT p95 (ms)", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")
