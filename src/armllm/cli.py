"""The `armllm` command line: info, generate, chat, transcribe, convert, quantize, serve,
plan, eval, bench.

Bad input ends with a one-line message on stderr and exit code 2. Building
the parser loads no engine and no kernels (`armllm --help` is instant): a
subcommand module imports at its top only what its flags need, and the engine,
the kernels or the server inside the function that runs the command. main
loads the kernels (armllm.ops) before running a command, so that a bad
ARMLLM_ISA, ARMLLM_NUM_THREADS or ARMLLM_DECODE_STREAMS is a one-line message
too.
"""
from __future__ import annotations

import argparse
import json
import sys

from armllm import generate_cli, transcribe_cli
from armllm.bench import comm, kernels, offline, perplexity, plan
from armllm.bench import serve as bench_serve
from armllm.bench import transcribe as bench_transcribe
from armllm.cmdline import UsageError
from armllm.server import cli as server_cli


def cmd_info(args: argparse.Namespace) -> int:
    from armllm.engine.topology import format_cpulist, numa_nodes
    info = _kernels().cpu_info()
    info["numa_nodes"] = {n.id: format_cpulist(n.cpus) for n in numa_nodes()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    sve = f", SVE {info['sve_vector_bits']} bits" if info["sve_vector_bits"] else ""
    cpuid = info["cpuid"]
    ident = (f", {cpuid['vendor']} family {cpuid['family']:#x} model {cpuid['model']:#x}"
             if cpuid["vendor"] else "")
    print(f"cpu:         {info['cpu']} ({info['arch']}{sve}{ident})")
    print(f"features:    {' '.join(info['features']) or '-'}")
    if info["amx_denied"]:
        print(f"amx:         not runnable: {info['amx_denied']}")
    print(f"threads:     {info['num_threads']} (allowed CPUs: {info['allowed_cpus']}; "
          f"fetch-add: {info['fetch_add']})")
    print("numa nodes:  " + "; ".join(f"node {n}: CPUs {cpus}"
                                       for n, cpus in info["numa_nodes"].items()))
    source = "forced by ARMLLM_ISA" if info["isa_source"] != "auto" else "auto"
    print(f"variant:     {info['isa']} ({source}; "
          f"runnable: {', '.join(info['isa_available'])})")
    print("kernels:")
    width = max(map(len, info["kernels"]))
    for name, impl in info["kernels"].items():
        print(f"  {name:<{width}} {impl}")
    print(f"gemm layouts: f32 {info['gemm_layouts']['f32']}, bf16 {info['gemm_layouts']['bf16']}, "
          f"int8/int4 {info['gemm_layouts']['wq']} "
          f"(bf16 compute in {info['gemm_bf16_compute']}); attention with a bf16 cache "
          f"computes in {info['attention_bf16_compute']}")
    return 0


def _kernels():
    """armllm.ops, loaded on first use; a bad ARMLLM_ISA, ARMLLM_NUM_THREADS or
    ARMLLM_DECODE_STREAMS is a UsageError."""
    try:
        from armllm import ops
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return ops


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="armllm", description="CPU-first LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="CPU features, threads and the kernel chosen per family")
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(func=cmd_info)

    generate_cli.add_commands(sub)

    transcribe = sub.add_parser("transcribe", help="speech to text with a Whisper model "
                                "(txt, srt, vtt or JSON transcripts)")
    transcribe_cli.add_arguments(transcribe)

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    server_cli.add_arguments(serve)
    serve.set_defaults(func=server_cli.cmd_serve)

    planner = sub.add_parser("plan", help="memory and decode speed bound of a model, from its "
                             "config alone")
    plan.add_arguments(planner)
    planner.set_defaults(func=plan.run)

    evaluate = sub.add_parser("eval", help="accuracy checks")
    eval_sub = evaluate.add_subparsers(dest="eval_command", required=True)
    ppl = eval_sub.add_parser("perplexity", help="sliding-window perplexity over a text file")
    perplexity.add_arguments(ppl)
    ppl.set_defaults(func=perplexity.run)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    benchmarks = [
        ("kernels", "GEMM speed vs machine limits and numpy; the sampler's time a row",
         kernels.add_arguments, kernels.run),
        ("comm", "the tensor-parallel all-reduce over shared memory: latency and bandwidth",
         comm.add_arguments, comm.run),
        ("throughput", "offline throughput: many requests at once, in-process",
         offline.add_throughput_arguments, offline.run_throughput),
        ("latency", "batch-1 TTFT, TPOT and end-to-end latency, in-process",
         offline.add_latency_arguments, offline.run_latency),
        ("serve", "load test any OpenAI-compatible server (streaming client; TTFT, TPOT, "
         "ITL, E2E, SLOs)", bench_serve.add_arguments, bench_serve.run),
        ("transcribe", "speech to text with a Whisper model, in-process: batch-1 real-time "
         "factor and concurrent throughput", bench_transcribe.add_arguments,
         bench_transcribe.run),
    ]
    for name, help_text, add_arguments, run in benchmarks:
        p = bench_sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        _kernels()
        return args.func(args)
    except UsageError as exc:
        print(f"armllm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
