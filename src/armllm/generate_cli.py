"""`armllm generate` and `armllm chat` run a model from the command line;
`armllm convert` and `armllm quantize` rewrite one. The engine loads when a
command runs (see cli.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from armllm.cmdline import UsageError, add_model_argument, resolve_model
from armllm.engine.args import SERVER_ONLY, EngineArgs
from armllm.model.quantize import SCHEME_NAMES, parse_scheme
from armllm.sampling import SamplingParams

if TYPE_CHECKING:
    from armllm.api import LLM


# the sampling flags whose defaults are the model's own (sampling.MODEL_DEFAULT_FIELDS)
MODEL_SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
                        "min_p": "--min-p", "repetition_penalty": "--repetition-penalty"}


def add_model_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """--temperature, --top-p, --top-k, --min-p, --repetition-penalty and --greedy: what
    generate, chat and the benchmarks share (see sampling_overrides)."""
    p.add_argument("--temperature", type=float, default=None,
                   help="0 is greedy (default: the model's own sampling defaults, from its "
                        "generation_config.json or a GGUF's general.sampling.* keys, else "
                        "temperature 0.7, top-p 0.9, min-p 0.05)")
    p.add_argument("--top-p", type=float, default=None, help="(default: the model's)")
    p.add_argument("--top-k", type=int, default=None, help="0 or -1: off (default: the model's)")
    p.add_argument("--min-p", type=float, default=None, help="(default: the model's)")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="on prompt and output tokens, 1 is off (default: the model's)")
    p.add_argument("--greedy", action="store_true", help="temperature 0 (the argmax token)")


def sampling_overrides(args: argparse.Namespace) -> dict:
    """The MODEL_SAMPLING_FLAGS' fields the command line sets (--greedy: temperature 0),
    each checked as SamplingParams checks it; a bad value is a UsageError naming its flag."""
    given = {field: getattr(args, field) for field in MODEL_SAMPLING_FLAGS
             if getattr(args, field) is not None}
    if args.greedy:
        if given.get("temperature", 0.0) != 0.0:
            raise UsageError(f"--greedy is --temperature 0; got --temperature "
                             f"{given['temperature']} too")
        given["temperature"] = 0.0
    try:
        SamplingParams(**given)
    except ValueError as exc:   # SamplingParams names the field first
        field, _, why = str(exc).partition(" ")
        raise UsageError(f"{MODEL_SAMPLING_FLAGS.get(field, field)} {why}") from None
    return given


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    add_model_sampling_arguments(p)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    # unset: SamplingParams' defaults (llama.cpp's)
    p.add_argument("--dry-multiplier", type=float, default=None,
                   help="DRY (llama.cpp's): the penalty on a token that extends a repeat "
                        "(default: 0, off)")
    p.add_argument("--dry-base", type=float, default=None,
                   help="DRY's growth per token of repeat (default: 1.75)")
    p.add_argument("--dry-allowed-length", type=int, default=None,
                   help="DRY: repeats up to this long go free (default: 2)")
    p.add_argument("--dry-penalty-last-n", type=int, default=None,
                   help="DRY: the last N prompt and output tokens it reads (default: 64; "
                        "-1: all; 0: off)")
    p.add_argument("--dry-sequence-breaker", action="append", default=None,
                   dest="dry_sequence_breakers",
                   help="a string a repeat does not run across (repeatable; default: "
                        "newline, ':', '\"', '*')")
    p.add_argument("--xtc-probability", type=float, default=None,
                   help="XTC (llama.cpp's): how often it removes the top choices (default: 0)")
    p.add_argument("--xtc-threshold", type=float, default=None,
                   help="XTC: the probability a top choice reaches (default: 0.1; > 0.5: off)")
    p.add_argument("--bad-word", action="append", default=[], dest="bad_words",
                   help="a word the output never holds (repeatable)")


# the add_sampling_arguments flags that are SamplingParams fields of the same name
EXTRA_SAMPLING_FLAGS = ("dry_multiplier", "dry_base", "dry_allowed_length",
                        "dry_penalty_last_n", "dry_sequence_breakers", "xtc_probability",
                        "xtc_threshold", "bad_words")


def sampling_params(llm: LLM, args: argparse.Namespace) -> SamplingParams:
    """The model's defaults, overridden by what the command line gives."""
    overrides = sampling_overrides(args)
    extra = {k: getattr(args, k) for k in EXTRA_SAMPLING_FLAGS
             if getattr(args, k, None) is not None}
    try:
        return llm.default_sampling_params(
            **overrides, **extra, max_tokens=args.max_tokens, seed=args.seed, stop=args.stop,
            ignore_eos=args.ignore_eos)
    except ValueError as exc:   # SamplingParams names the field first: say its flag
        field, _, why = str(exc).partition(" ")
        if field in EXTRA_SAMPLING_FLAGS:
            flag = {"dry_sequence_breakers": "dry_sequence_breaker",
                    "bad_words": "bad_word"}.get(field, field)
            raise UsageError(f"--{flag.replace('_', '-')} {why}") from None
        raise UsageError(str(exc)) from None


def engine_args(args: argparse.Namespace) -> EngineArgs:
    """The EngineArgs of a subcommand's parsed engine flags."""
    try:
        return EngineArgs.from_cli_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def load_llm(args: argparse.Namespace, check: Callable[[LLM], None] | None = None) -> LLM:
    """The LLM of a subcommand's MODEL and engine flags, with a progress line on
    stderr: the one way every in-process command loads a model. `check` may refuse
    the loaded model (with a UsageError) before it is reported loaded."""
    from armllm.api import LLM
    settings = engine_args(args)
    model = resolve_model(args.model)

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():  # a live counter on a terminal; logs get the final line only
            print(f"\rloading {Path(model).name}: layer {done}/{total}", end="",
                  file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        llm = LLM(model, progress=progress, **dataclasses.asdict(settings))
    except ValueError as exc:
        if sys.stderr.isatty():
            print(file=sys.stderr)
        raise UsageError(str(exc)) from None
    if check:
        check(llm)
    print(f"\rloaded {Path(model).name} in {time.perf_counter() - t0:.1f} s" + " " * 20,
          file=sys.stderr)
    return llm


def cmd_generate(args: argparse.Namespace) -> int:
    llm = load_llm(args)
    params = sampling_params(llm, args)
    try:
        prompt = (llm.chat_prompt([{"role": "user", "content": args.prompt}]) if args.chat
                  else args.prompt)
        stream = llm.stream(prompt, params)
        while True:
            try:
                step = next(stream)
            except StopIteration as done:
                result = done.value
                break
            if not args.json:
                sys.stdout.write(step.text_delta)
                sys.stdout.flush()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason,
                          "prompt_tokens": len(result.prompt_token_ids),
                          "timings": result.metrics}))
    else:
        m = result.metrics
        tpot = f", TPOT {m['tpot_s'] * 1e3:.1f} ms" if m["tpot_s"] else ""
        print(f"\n[{result.finish_reason}; {len(result.token_ids)} tokens; TTFT "
              f"{m['ttft_s'] * 1e3:.0f} ms{tpot}]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    llm = load_llm(args)
    params = sampling_params(llm, args)
    history: list[dict] = []
    print("chat: type a message; /reset clears the history; Ctrl-D quits", file=sys.stderr)
    while True:
        try:
            line = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() == "/reset":
            history.clear()
            print("(history cleared)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            reply = ""
            for step in llm.stream(llm.chat_prompt(history), params):
                reply += step.text_delta
                sys.stdout.write(step.text_delta)
                sys.stdout.flush()
        except ValueError as exc:
            history.pop()
            print(f"error: {exc}", file=sys.stderr)
            continue
        print()
        history.append({"role": "assistant", "content": reply})


def cmd_convert(args: argparse.Namespace) -> int:
    from armllm.model.convert import convert_gguf
    try:
        out = convert_gguf(args.gguf, args.out_dir, args.dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from armllm.model.convert import quantize_model
    try:
        out = quantize_model(resolve_model(args.model), args.out, parse_scheme(args.scheme))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {out} ({args.scheme}, compressed-tensors int-quantized)", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    quant = sub.add_parser("quantize", help="write a model as a compressed-tensors W8A8/W4A8 "
                           "checkpoint")
    add_model_argument(quant)
    quant.add_argument("--scheme", required=True, choices=SCHEME_NAMES,
                       help="w8a8: int8 per channel; w4a8: int4 group 32 (-g64, -g128, -ch); "
                       "-asym: asymmetric activations")
    quant.add_argument("--out", required=True, help="a new (or empty) directory")
    quant.set_defaults(func=cmd_quantize)
    conv = sub.add_parser("convert", help="write a GGUF model as a Hugging Face directory")
    conv.add_argument("gguf", help="the .gguf file")
    conv.add_argument("out_dir", help="a new (or empty) directory")
    conv.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                      help="weight precision in the output (float32 keeps GGUF values exactly)")
    conv.set_defaults(func=cmd_convert)
    gen = sub.add_parser("generate", help="generate text from a prompt (streams to stdout)")
    add_model_argument(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt as one user message in the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead")
    add_sampling_arguments(gen)
    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    add_model_argument(chat)
    add_sampling_arguments(chat)
    for p, command in ((gen, cmd_generate), (chat, cmd_chat)):
        EngineArgs.add_cli_args(p, exclude=SERVER_ONLY)
        # one prompt at a time: a KV cache for one sequence, not the server's 32 (the cache
        # is committed when the model loads)
        p.set_defaults(func=command, max_num_seqs=1)
