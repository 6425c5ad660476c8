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
from armllm.model.llama import KVCache
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


def build_engine(model: str | Path, args: EngineArgs, progress=None) -> LLMEngine:
    loaded = load(model, args, progress)
    if loaded.tensor_types:
        log.info("GGUF tensor types: %s", loaded.tensor_types)
    if loaded.model.weights.quantization:
        log.info("linear layers: %s", loaded.model.weights.quantization)
    c = loaded.config
    model_len = min(args.max_model_len or c.max_position_embeddings, c.max_position_embeddings)
    per_block = KVCache.bytes_per_block(c, args.block_size, args.kv_cache_dtype)
    if args.kv_cache_gib is not None:
        num_blocks = int(args.kv_cache_gib * 2**30 // per_block)
    else:  # enough for every sequence at full length, within a share of free memory
        want = args.max_num_seqs * -(-model_len // args.block_size)
        num_blocks = min(want, int(available_bytes() * DEFAULT_KV_FRACTION // per_block))
    if num_blocks < 1:
        raise ValueError(f"the KV cache fits no block of {per_block} bytes")
    model_len = min(model_len, num_blocks * args.block_size)
    log.info("KV cache: %d blocks of %d tokens (%.2f GiB, %s), max_model_len %d, "
             "%.1f sequences at full length", num_blocks, args.block_size,
             num_blocks * per_block / 2**30, args.kv_cache_dtype, model_len,
             num_blocks * args.block_size / model_len)
    blocks = BlockManager(num_blocks, args.block_size, args.enable_prefix_caching)
    scheduler = Scheduler(blocks, args.max_num_seqs, args.max_num_batched_tokens, model_len)
    kv = KVCache(c, num_blocks, args.block_size, args.kv_cache_dtype)
    runner = ModelRunner(loaded.model, kv, args.max_num_batched_tokens, args.max_num_seqs,
                         model_len)
    return LLMEngine(loaded, scheduler, runner)
