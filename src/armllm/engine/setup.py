"""setup: building an LLMEngine from a model path and its EngineArgs: set the
kernel threads, load the weights, then size the KV cache from what memory is
left and log the result, and put the engine's parts together (block manager,
scheduler, model runner)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from armllm import ops
from armllm.engine.args import DEFAULT_KV_FRACTION, WEIGHT_DTYPES, EngineArgs
from armllm.engine.block_manager import BlockManager
from armllm.engine.llm_engine import LLMEngine
from armllm.engine.runner import ModelRunner
from armllm.engine.scheduler import Scheduler
from armllm.model.config import ModelConfig
from armllm.model.kv_cache import KVCache, bytes_per_block, window_pool_blocks
from armllm.model.loader import LoadedModel, load_model
from armllm.model.quantize import parse_scheme

log = logging.getLogger("armllm")


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def load(model: str | Path, args: EngineArgs, progress=None) -> LoadedModel:
    """The model as `args` say (kernel threads, weight dtype, quantization): what
    build_engine runs, and `armllm eval perplexity` too."""
    if args.threads is not None:
        ops.set_num_threads(args.threads)
    quant = args.quantization if args.quantization in ("auto", "none") else \
        parse_scheme(args.quantization)
    return load_model(model, WEIGHT_DTYPES[args.dtype], progress, quant, args.quantize_lm_head)


def size_kv_cache(c: ModelConfig, args: EngineArgs, model_len: int
                  ) -> tuple[int, int | None, int]:
    """(blocks of the layers that attend the whole sequence, blocks of the
    sliding-window layers' own pool or None when they share the first, max_model_len
    within what the cache holds), from --kv-cache-gib or a share of free memory; logs
    them, and what the window pool saves."""
    bs, dtype = args.block_size, args.kv_cache_dtype
    sliding = sum(1 for i in range(c.num_layers) if c.window(i))
    want = args.max_num_seqs * -(-model_len // bs)   # every sequence at full length
    window_blocks = window_pool_blocks(c, bs, args.max_num_seqs, args.max_num_batched_tokens,
                                       model_len)
    full_layers = c.num_layers - (sliding if window_blocks is not None else 0)
    window_block_bytes = bytes_per_block(c, sliding, bs, dtype)
    budget = args.kv_cache_gib * 2**30 if args.kv_cache_gib is not None else \
        available_bytes() * DEFAULT_KV_FRACTION
    if not full_layers:  # every layer slides: the window pool is the cache
        num_blocks = window_blocks = max(window_blocks, int(budget // window_block_bytes)) \
            if args.kv_cache_gib is not None else window_blocks
    else:
        budget -= (window_blocks or 0) * window_block_bytes
        per_block = bytes_per_block(c, full_layers, bs, dtype)
        num_blocks = int(budget // per_block)
        if args.kv_cache_gib is None:
            num_blocks = min(want, num_blocks)
        if num_blocks < 1:
            raise ValueError(f"the KV cache fits no block of {per_block} bytes"
                             + (f" beside the sliding-window layers' pool of {window_blocks}"
                                if window_blocks else ""))
        model_len = min(model_len, num_blocks * bs)
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB, %s), max_model_len %d, "
                 "%.1f sequences at full length", num_blocks, bs, num_blocks * per_block / 2**30,
                 dtype, model_len, num_blocks * bs / model_len)
    if window_blocks is not None:
        shared = num_blocks if full_layers else want  # what sharing one pool would hold
        log.info("sliding-window layers (%d of %d, window %d): their own pool of %d blocks "
                 "(%.2f GiB) instead of %d: %.2f GiB saved", sliding, c.num_layers,
                 c.sliding_window, window_blocks, window_blocks * window_block_bytes / 2**30,
                 shared, (shared - window_blocks) * window_block_bytes / 2**30)
    return num_blocks, window_blocks, model_len


def build_engine(model: str | Path, args: EngineArgs, progress=None) -> LLMEngine:
    loaded = load(model, args, progress)
    if loaded.tensor_types:
        log.info("GGUF tensor types: %s", loaded.tensor_types)
    if loaded.model.weights.quantization:
        log.info("linear layers: %s", loaded.model.weights.quantization)
    c = loaded.config
    model_len = min(args.max_model_len or c.max_position_embeddings, c.max_position_embeddings)
    num_blocks, num_window_blocks, model_len = size_kv_cache(c, args, model_len)
    kv = KVCache(c, num_blocks, args.block_size, args.kv_cache_dtype, num_window_blocks)
    blocks = BlockManager(kv.pool_layout, args.block_size, args.enable_prefix_caching)
    scheduler = Scheduler(blocks, args.max_num_seqs, args.max_num_batched_tokens, model_len)
    runner = ModelRunner(loaded.model, kv, args.max_num_batched_tokens, args.max_num_seqs,
                         model_len)
    return LLMEngine(loaded, scheduler, runner, args.reasoning_parser)
