"""setup: the engine's settings (EngineArgs), validated where they enter, and
building an LLMEngine from a model path: load the weights, then size the KV
cache from what memory is left and log the result."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from armllm.engine.llm_engine import LLMEngine
from armllm.model.llama import KVCache
from armllm.model.loader import load_model
from armllm.model.quantize import parse_scheme

log = logging.getLogger("armllm")

DEFAULT_KV_FRACTION = 0.4  # of available memory after the weights, when kv_cache_gib is unset
_WEIGHT_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "float32": "f32",
                  "f32": "f32"}


@dataclass
class EngineArgs:
    dtype: str = "auto"                   # weights: auto (bf16), bfloat16, float32
    kv_cache_gib: float | None = None     # None: DEFAULT_KV_FRACTION of available memory
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None      # None: the model's, capped by the KV cache
    block_size: int = 16
    kv_cache_dtype: str = "bf16"
    enable_prefix_caching: bool = True
    quantization: str = "auto"            # auto (the checkpoint's own), none, or a scheme name
    quantize_lm_head: bool = False        # a float lm_head too (default: kept in dtype)

    def __post_init__(self):
        if self.dtype not in _WEIGHT_DTYPES:
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int)
                                               or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2, got "
                             f"{self.max_model_len!r}")
        if self.kv_cache_gib is not None and not (isinstance(self.kv_cache_gib, (int, float))
                                                  and self.kv_cache_gib > 0):
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib!r}")
        if self.quantization != "auto":
            parse_scheme(self.quantization)  # raises ValueError naming the value
        if self.kv_cache_dtype not in ("bf16", "f32"):
            raise ValueError(f"kv_cache_dtype must be 'bf16' or 'f32', got "
                             f"{self.kv_cache_dtype!r}")


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def build_engine(model: str | Path, args: EngineArgs, progress=None) -> LLMEngine:
    quant = args.quantization if args.quantization in ("auto", "none") else \
        parse_scheme(args.quantization)
    loaded = load_model(model, _WEIGHT_DTYPES[args.dtype], progress, quant,
                        args.quantize_lm_head)
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
    return LLMEngine(loaded, num_blocks, args.block_size, args.max_num_seqs,
                     args.max_num_batched_tokens, model_len, args.kv_cache_dtype,
                     args.enable_prefix_caching)
