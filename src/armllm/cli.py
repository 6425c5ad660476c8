"""The `armllm` command line: info, generate, chat, convert, quantize, serve, plan, eval,
bench.

Bad input ends with a one-line message on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys


class UsageError(Exception):
    """A bad command-line value: reported in one line, exit code 2."""


def _ops():
    try:
        from armllm import ops
    except ValueError as exc:  # ARMLLM_ISA / ARMLLM_NUM_THREADS
        raise UsageError(str(exc)) from None
    return ops


def cmd_info(args: argparse.Namespace) -> int:
    info = _ops().cpu_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    sve = f", SVE {info['sve_vector_bits']} bits" if info["sve_vector_bits"] else ""
    print(f"cpu:         {info['cpu']} ({info['arch']}{sve})")
    print(f"features:    {' '.join(info['features']) or '-'}")
    print(f"threads:     {info['num_threads']} (allowed CPUs: {info['allowed_cpus']}; "
          f"fetch-add: {info['fetch_add']})")
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


def _after_ops(run):
    """A command that needs the kernels: armllm.ops loads first, so that a bad
    ARMLLM_ISA or ARMLLM_NUM_THREADS is a usage error."""
    def command(args: argparse.Namespace) -> int:
        _ops()
        return run(args)
    return command


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="armllm", description="CPU-first LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="CPU features, threads and the kernel chosen per family")
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(func=cmd_info)

    from armllm.generate_cli import add_commands
    add_commands(sub)

    from armllm.server.cli import add_arguments as add_serve_arguments
    from armllm.server.cli import cmd_serve
    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    from armllm.bench import kernels, offline, plan
    from armllm.bench import serve as bench_serve
    planner = sub.add_parser("plan", help="memory and decode speed bound of a model, from its "
                             "config alone")
    plan.add_arguments(planner)
    planner.set_defaults(func=_after_ops(plan.run))

    from armllm.bench import perplexity
    evaluate = sub.add_parser("eval", help="accuracy checks")
    eval_sub = evaluate.add_subparsers(dest="eval_command", required=True)
    ppl = eval_sub.add_parser("perplexity", help="sliding-window perplexity over a text file")
    perplexity.add_arguments(ppl)
    ppl.set_defaults(func=_after_ops(perplexity.run))

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    benchmarks = [
        ("kernels", "GEMM speed vs machine limits and numpy",
         kernels.add_arguments, kernels.run),
        ("throughput", "offline throughput: many requests at once, in-process",
         offline.add_throughput_arguments, offline.run_throughput),
        ("latency", "batch-1 TTFT, TPOT and end-to-end latency, in-process",
         offline.add_latency_arguments, offline.run_latency),
    ]
    for name, help_text, add_arguments, run in benchmarks:
        p = bench_sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=_after_ops(run))
    client = bench_sub.add_parser("serve", help="load test any OpenAI-compatible server "
                                  "(streaming client; TTFT, TPOT, ITL, E2E, SLOs)")
    bench_serve.add_arguments(client)
    client.set_defaults(func=bench_serve.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"armllm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
