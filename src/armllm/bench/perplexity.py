"""`armllm eval perplexity`: sliding-window perplexity of a model over a plain
text file — the accuracy check for quantization (compare `--quantization
none` with `w8a8` or `w4a8` on the same text).

The text is tokenized once; windows of --context tokens start every --stride
tokens, and each window scores only the tokens the previous one did not
(the Hugging Face recipe), so every token after the first is predicted once,
with at least context - stride tokens of history after the first window. With
--llama-cpp, llama-perplexity's recipe instead (chunk_perplexity), so that the
two engines' figures on one file compare directly.
Each window is prefilled through the engine's ModelRunner (prompt_logits) in
chunks of at most --max-num-batched-tokens rows, with logits for the rows it
scores. The engine flags mean what they mean elsewhere (a window is one
sequence), except --max-num-seqs and --no-prefix-caching, which this command
does not take: one window runs at a time, and windows at shifted positions
share no cached prefix."""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from armllm.cmdline import UsageError, add_model_argument, resolve_model
from armllm.engine.args import SERVER_ONLY, EngineArgs
from armllm.generate_cli import engine_args

if TYPE_CHECKING:
    from armllm.model.loader import LoadedModel

# one window runs at a time, and windows at shifted positions share no KV prefix
NOT_HONOURED = ("max_num_seqs", "enable_prefix_caching", "speculative_config", *SERVER_ONLY)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    p.add_argument("--text", required=True, help="a UTF-8 plain-text file")
    p.add_argument("--context", type=int, default=512,
                   help="tokens per window (at most --max-model-len and what the KV cache "
                        "holds)")
    p.add_argument("--stride", type=int, default=256, help="tokens between window starts")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="score only the first N tokens of the text")
    p.add_argument("--llama-cpp", action="store_true",
                   help="llama-perplexity's recipe instead: chunks of --context tokens, each "
                        "alone, scoring its second half (the first token is BOS when the "
                        "model adds one); --stride is not used; compare with `llama-perplexity "
                        "-c CONTEXT` on the same text")
    p.add_argument("--chunks", type=int, default=None,
                   help="with --llama-cpp: the first N chunks only (llama-perplexity's "
                        "--chunks)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    EngineArgs.add_cli_args(p, exclude=NOT_HONOURED,
                            unset={"kv_cache_gib": "one window of --context tokens"})


class _WindowScorer:
    """Scores windows of one sequence on a loaded model through a ModelRunner: a KV
    cache for windows of up to `context` tokens (capped to the model's context,
    settings.max_model_len and the KV cache), each prefilled in chunks of at most
    settings.max_num_batched_tokens rows with logits for the rows it scores. With a
    tensor-parallel `group`, the other ranks get the same cache and workspace sizes.
    """

    def __init__(self, loaded: LoadedModel, context: int, settings: EngineArgs, group=None):
        from armllm.engine.runner import ModelRunner
        from armllm.engine.tensor_parallel import TPModelRunner
        from armllm.model.kv_cache import KVCache
        model, c = loaded.model, loaded.model.config
        context = min(context, settings.max_model_len or context, c.max_position_embeddings)
        block_size = settings.block_size
        if settings.kv_cache_gib is None:
            num_blocks = -(-context // block_size)
        else:
            per_block = KVCache.bytes_per_block(c, block_size, settings.kv_cache_dtype)
            num_blocks = int(settings.kv_cache_gib * 2**30 // per_block)
            if num_blocks < 1:
                raise ValueError(f"--kv-cache-gib {settings.kv_cache_gib} holds no KV block of "
                                 f"{per_block} bytes")
        kv = KVCache(c, num_blocks, block_size, settings.kv_cache_dtype, state_slots=1)
        self.kv_cache_dtype = kv.dtype
        self.context = min(context, num_blocks * block_size)
        if self.context < 2:
            raise ValueError(f"a window of {self.context} token leaves nothing to score")
        self.chunk = min(settings.max_num_batched_tokens, self.context)
        # one window at a time, every row of a chunk may be scored; with other ranks,
        # the tensor-parallel runner hands them each chunk
        self.runner = ModelRunner(model, kv, self.chunk, 1, self.context, max_logits=self.chunk) \
            if group is None else TPModelRunner(model, kv, self.chunk, 1, self.context, group,
                                                max_logits=self.chunk)
        # a window's blocks: the first ones of the cache, the same for every window
        self.block_tables = [np.arange(-(-self.context // block_size), dtype=np.int32)]
        if group is not None:
            group.configure(num_blocks, None, self.context, self.chunk, self.chunk,
                            kv.state_slots)

    def nll(self, window: np.ndarray, first: int) -> tuple[float, int]:
        """Summed negative log-likelihood of window[r + 1] given window[:r + 1] over rows r
        in [first, len - 1), and how many rows that is."""
        t, chunk, nll, scored = len(window), self.chunk, 0.0, 0
        for a in range(0, t, chunk):
            b = min(a + chunk, t)
            rows = np.arange(max(a, first), min(b, t - 1))
            logits = self.runner.prompt_logits(window[a:b], a, self.block_tables,
                                               rows - a).astype(np.float64)
            if not len(rows):
                continue
            m = logits.max(axis=1, keepdims=True)
            logz = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
            nll += float((logz - logits[np.arange(len(rows)), window[rows + 1]]).sum())
            scored += len(rows)
        return nll, scored


def perplexity(loaded: LoadedModel, ids: list[int], context: int, stride: int,
               settings: EngineArgs | None = None, group=None) -> dict:
    """Sliding-window perplexity of token ids under a loaded model (the Hugging Face
    recipe). Windows are capped to the model's context, settings.max_model_len and the
    KV cache (`context` tokens, unless settings.kv_cache_gib says); each is prefilled in
    chunks of at most settings.max_num_batched_tokens rows, with logits for the rows it
    scores (group: a tensor-parallel model's other ranks, engine/setup.start_ranks)."""
    if len(ids) < 2:
        raise ValueError("the text has fewer than 2 tokens")
    scorer = _WindowScorer(loaded, context, settings or EngineArgs(), group)
    context = scorer.context
    stride = min(stride, context)
    nll, scored, prev_end, windows = 0.0, 0, 0, 0
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + context, len(ids))
        first = max(prev_end, begin + 1) - begin - 1  # rows whose next token is new: scored
        window_nll, window_scored = scorer.nll(np.asarray(ids[begin:end], np.int32), first)
        nll, scored, windows, prev_end = nll + window_nll, scored + window_scored, windows + 1, end
        if end == len(ids):
            break
    return {"tokens": len(ids), "scored": scored, "windows": windows, "context": context,
            "stride": stride, "kv_cache_dtype": scorer.kv_cache_dtype, "nll": nll / scored,
            "perplexity": math.exp(nll / scored)}


def chunk_perplexity(loaded: LoadedModel, ids: list[int], context: int,
                     settings: EngineArgs | None = None, bos_id: int | None = None,
                     max_chunks: int | None = None, group=None) -> dict:
    """llama.cpp's recipe (llama-perplexity): the ids cut into chunks of `context` tokens,
    each run alone with its first token replaced by bos_id (when the model adds one),
    scoring the tokens of its second half: every chunk predicts context - context // 2 - 1
    tokens from at least context // 2 of history. Needs 2 * context ids."""
    scorer = _WindowScorer(loaded, context, settings or EngineArgs(), group)
    if scorer.context != context:
        raise ValueError(f"a chunk of {context} tokens does not fit: at most {scorer.context} "
                         f"(the model's context, --max-model-len and the KV cache)")
    if len(ids) < 2 * context:
        raise ValueError(f"chunks of {context} tokens need at least {2 * context} tokens of "
                         f"text, got {len(ids)}")
    chunks = len(ids) // context if max_chunks is None else min(max_chunks, len(ids) // context)
    nll, scored = 0.0, 0
    for i in range(chunks):
        window = np.asarray(ids[i * context:(i + 1) * context], np.int32)
        if bos_id is not None:
            window[0] = bos_id
        window_nll, window_scored = scorer.nll(window, context // 2)
        nll, scored = nll + window_nll, scored + window_scored
    return {"tokens": len(ids), "scored": scored, "windows": chunks, "context": context,
            "stride": context, "kv_cache_dtype": scorer.kv_cache_dtype, "nll": nll / scored,
            "perplexity": math.exp(nll / scored)}


def run(args: argparse.Namespace) -> int:
    from armllm.engine.setup import load, start_ranks
    from armllm.engine.tensor_parallel import stop_ranks
    from armllm.model.tokenizer import TextTokenizer
    for name in ("context", "stride", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 2:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 2, got {value}")
    if args.chunks is not None and (args.chunks < 1 or not args.llama_cpp):
        raise UsageError(f"--chunks takes a positive count, with --llama-cpp; got --chunks "
                         f"{args.chunks}{'' if args.llama_cpp else ' without --llama-cpp'}")
    if args.stride > args.context and not args.llama_cpp:
        raise UsageError(f"--stride {args.stride} is larger than --context {args.context}: "
                         "tokens between windows would never be scored")
    settings = engine_args(args)
    model = resolve_model(args.model)
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{args.text}: {exc}") from None
    t0 = time.perf_counter()
    group = restore = None
    try:
        if settings.tensor_parallel_size > 1:
            loaded, group, restore = start_ranks(model, settings)
        else:
            loaded = load(model, settings)
        tokenizer = TextTokenizer(loaded.tokenizer, loaded.tokenizer_config)
        ids = tokenizer.encode(text)
        ids = ids[:args.max_tokens] if args.max_tokens else ids
        if args.llama_cpp:
            bos = tokenizer.token_id(tokenizer.bos_token) if tokenizer.add_bos else None
            result = chunk_perplexity(loaded, ids, args.context, settings, bos, args.chunks,
                                      group)
        else:
            result = perplexity(loaded, ids, args.context, args.stride, settings, group)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    finally:
        if restore is not None:
            stop_ranks(group, restore)
    w = loaded.model.weights
    result.update(model=str(model), weights=w.quantization or w.dtype, text=str(args.text),
                  seconds=time.perf_counter() - t0)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"perplexity {result['perplexity']:.4f} (mean NLL {result['nll']:.5f} nats) over "
              f"{result['scored']} tokens of {Path(args.text).name}; {result['windows']} "
              f"{'chunks (llama.cpp recipe)' if args.llama_cpp else 'windows'} of "
              f"{result['context']} tokens, stride {result['stride']}; {Path(model).name}, "
              f"linear layers {result['weights']}, KV cache {result['kv_cache_dtype']}; "
              f"{result['seconds']:.1f} s")
    return 0
