"""`armllm eval perplexity`: sliding-window perplexity of a model over a plain
text file — the accuracy check for quantization (compare `--quantization
none` with `w8a8` or `w4a8` on the same text).

The text is tokenized once; windows of --context tokens start every --stride
tokens, and each window scores only the tokens the previous one did not
(the Hugging Face recipe), so every token after the first is predicted once,
with at least context - stride tokens of history after the first window.
Each window is one prefill through the model with logits for every row."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def add_arguments(p: argparse.ArgumentParser) -> None:
    from armllm.generate_cli import add_model_arguments
    add_model_arguments(p)
    p.add_argument("--text", required=True, help="a UTF-8 plain-text file")
    p.add_argument("--context", type=int, default=512, help="tokens per window")
    p.add_argument("--stride", type=int, default=256, help="tokens between window starts")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="score only the first N tokens of the text")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def perplexity(loaded, ids: list[int], context: int, stride: int) -> dict:
    """Sliding-window perplexity of token ids under a loaded model."""
    from armllm.model.llama import BatchMeta, KVCache, Workspace
    model, c = loaded.model, loaded.config
    if len(ids) < 2:
        raise ValueError("the text has fewer than 2 tokens")
    kv = KVCache(c, -(-context // 16), 16, "bf16")
    ws = Workspace(c, context, context, max_seq_len=context)
    table = np.arange(kv.num_blocks, dtype=np.int32).reshape(1, -1)
    nll, scored, prev_end, windows = 0.0, 0, 0, 0
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + context, len(ids))
        window = np.asarray(ids[begin:end], np.int32)
        t = len(window)
        pos = np.arange(t, dtype=np.int32)
        meta = BatchMeta(window, pos, pos, np.asarray([0, t], np.int32),
                         np.asarray([t], np.int32), table, np.arange(t, dtype=np.int64))
        logits = model.forward(meta, kv, ws).astype(np.float64)
        first = max(prev_end, begin + 1) - begin   # rows whose next token is new: score them
        rows = np.arange(first - 1, t - 1)
        m = logits[rows].max(axis=1, keepdims=True)
        logz = (m[:, 0] + np.log(np.exp(logits[rows] - m).sum(axis=1)))
        nll += float((logz - logits[rows, window[rows + 1]]).sum())
        scored += len(rows)
        windows += 1
        prev_end = end
        if end == len(ids):
            break
    return {"tokens": len(ids), "scored": scored, "windows": windows,
            "nll": nll / scored, "perplexity": math.exp(nll / scored)}


def run(args: argparse.Namespace) -> int:
    from armllm.cli import UsageError
    from armllm.generate_cli import default_model
    from armllm.model.loader import load_model
    from armllm.model.quantize import parse_scheme
    for name in ("context", "stride", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 2:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 2, got {value}")
    if args.stride > args.context:
        raise UsageError(f"--stride {args.stride} is larger than --context {args.context}: "
                         "tokens between windows would never be scored")
    model = args.model or default_model()
    if model is None:
        raise UsageError("no MODEL given and the demo model is not installed")
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{args.text}: {exc}") from None
    dtype = {"auto": "bf16", "bfloat16": "bf16", "float32": "f32"}[args.dtype]
    quant = args.quantization if args.quantization in ("auto", "none") else \
        parse_scheme(args.quantization)
    t0 = time.perf_counter()
    try:
        loaded = load_model(model, dtype, None, quant, args.quantize_lm_head)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from armllm.model.tokenizer import TextTokenizer
    ids = TextTokenizer(loaded.tokenizer, loaded.tokenizer_config).encode(text)
    if args.max_tokens:
        ids = ids[:args.max_tokens]
    context = min(args.context, loaded.config.max_position_embeddings)
    try:
        result = perplexity(loaded, ids, context, min(args.stride, context))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    w = loaded.model.weights
    result.update(model=str(model), weights=w.quantization or w.dtype, context=context,
                  stride=min(args.stride, context), text=str(args.text),
                  seconds=time.perf_counter() - t0)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"perplexity {result['perplexity']:.4f} (mean NLL {result['nll']:.5f} nats) over "
              f"{result['scored']} tokens of {Path(args.text).name}; {result['windows']} windows "
              f"of {context} tokens, stride {result['stride']}; {Path(str(model)).name}, "
              f"linear layers {result['weights']}; {result['seconds']:.1f} s", file=sys.stdout)
    return 0
