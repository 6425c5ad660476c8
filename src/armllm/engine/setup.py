"""setup: building an LLMEngine from a model path and its EngineArgs: set the
kernel threads, load the weights, then size the KV cache from what memory is
left and log the result, and put the engine's parts together (block manager,
scheduler, model runner). With tensor_parallel_size N > 1 the calling thread
becomes rank 0 (bound to its CPUs and node before anything loads) and the
other ranks start as processes (engine/tensor_parallel.py), loading their
shards while rank 0 loads its own."""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
from pathlib import Path

from armllm import ops
from armllm.engine import topology
from armllm.engine.args import DEFAULT_KV_FRACTION, WEIGHT_DTYPES, EngineArgs
from armllm.engine.block_manager import BlockManager
from armllm.engine.comm import DEFAULT_MAX_FLOATS
from armllm.engine.llm_engine import LLMEngine
from armllm.engine.prefix_store import PrefixStore
from armllm.engine.runner import ModelRunner
from armllm.engine.scheduler import Scheduler
from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.speculator import (
    HIDDEN_METHODS,
    MAX_DRAFTING_SEQS,
    SpecController,
    Speculator,
    build_proposer,
    calibrate,
)
from armllm.engine.state_pool import StatePool
from armllm.engine.tensor_parallel import RankGroup, TPModelRunner, stop_ranks
from armllm.model.config import ModelConfig
from armllm.model.kv_cache import (
    KVCache,
    bytes_per_block,
    checkpoint_interval,
    state_bytes,
    state_slots,
    window_pool_blocks,
)
from armllm.model.loader import LoadedModel, load_model, model_path, tensor_parallel_plans
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


def _quantization(args: EngineArgs):
    return args.quantization if args.quantization in ("auto", "none") else \
        parse_scheme(args.quantization)


def load(model: str | Path, args: EngineArgs, progress=None, comm: ops.Comm | None = None
         ) -> LoadedModel:
    """The model as `args` say (kernel threads, weight dtype, quantization): what
    build_engine runs, and `armllm eval perplexity` too (comm: a tensor-parallel
    rank's, whose threads are set already)."""
    if args.threads is not None and comm is None:
        ops.set_num_threads(args.threads)
    return load_model(model, WEIGHT_DTYPES[args.dtype], progress, _quantization(args),
                      args.quantize_lm_head, comm, args.score_from_tokens, args.score_template)


def size_kv_cache(c: ModelConfig, args: EngineArgs, model_len: int, ranks: int = 1
                  ) -> tuple[int, int | None, int]:
    """(blocks of the layers that attend the whole sequence, blocks of the
    sliding-window layers' own pool or None when they share the first, max_model_len
    within what the cache holds), from --kv-cache-gib or a share of free memory; logs
    them, and what the window pool saves. With tensor parallel, `c` is rank 0's
    shard (the most KV heads, and a hybrid's most recurrent-state heads, of any rank)
    and --kv-cache-gib each rank's budget (by default each rank's share of free
    memory), so the cache holds more tokens as ranks are added."""
    bs, dtype = args.block_size, args.kv_cache_dtype
    sliding = sum(1 for i in c.attention_layers if c.window(i))
    want = args.max_num_seqs * -(-model_len // bs)   # every sequence at full length
    window_blocks = window_pool_blocks(c, bs, args.max_num_seqs, args.max_num_batched_tokens,
                                       model_len)
    full_layers = len(c.attention_layers) - (sliding if window_blocks is not None else 0)
    window_block_bytes = bytes_per_block(c, sliding, bs, dtype)
    budget = args.kv_cache_gib * 2**30 if args.kv_cache_gib is not None else \
        available_bytes() * DEFAULT_KV_FRACTION / ranks
    live, saved, spare = _state_layout(c, args)
    states = state_bytes(c, live + saved + spare, dtype)
    if states and c.encoder is not None:   # an encoder-decoder's cross-attention K/V
        budget -= states
        log.info("cross-attention pool: %d slots of %.1f MiB (%d decoder layers' K and V of "
                 "%d encoder frames, %s), %.2f GiB: one a running sequence", live,
                 states / live / 2**20, c.num_layers, c.encoder.positions, dtype,
                 states / 2**30)
    elif states:   # a hybrid's recurrent layers: a state per running sequence, from the budget
        budget -= states
        log.info("state pool: %d slots of %.1f MiB (%d Gated DeltaNet layers' conv and delta "
                 "states, float32), %.2f GiB: %d for running sequences, %d for the prefix "
                 "cache's checkpoints (every %d tokens), %d for drafting sequences' "
                 "snapshots", live + saved + spare,
                 states / (live + saved + spare) / 2**20, len(c.linear_layers),
                 states / 2**30, live, saved, checkpoint_interval(bs), spare)
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
                                if window_blocks else "")
                             + (f" beside the recurrent state pool of {states / 2**30:.2f} "
                                f"GiB ({live + saved} slots: fewer --max-num-seqs, or a "
                                f"larger --kv-cache-gib)" if states else ""))
        model_len = min(model_len, num_blocks * bs)
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB, %s%s), max_model_len %d, "
                 "%.1f sequences at full length", num_blocks, bs, num_blocks * per_block / 2**30,
                 dtype, f"; per rank, each of the {ranks} ranks caching its {c.num_kv_heads} "
                 "KV heads" if ranks > 1 else "", model_len, num_blocks * bs / model_len)
    if window_blocks is not None:
        shared = num_blocks if full_layers else want  # what sharing one pool would hold
        log.info("sliding-window layers (%d of %d, window %d): their own pool of %d blocks "
                 "(%.2f GiB) instead of %d: %.2f GiB saved", sliding, c.num_layers,
                 c.sliding_window, window_blocks, window_blocks * window_block_bytes / 2**30,
                 shared, (shared - window_blocks) * window_block_bytes / 2**30)
    return num_blocks, window_blocks, model_len


def build_engine(model: str | Path, args: EngineArgs, progress=None) -> LLMEngine:
    if args.data_parallel_size > 1:
        raise ValueError(f"data_parallel_size={args.data_parallel_size}: replicas run behind "
                         "AsyncLLM (armllm serve); build one engine per replica")
    if args.tensor_parallel_size > 1:
        if args.prefix_cache_dir is not None:
            raise ValueError("prefix_cache_dir: the disk tier of the prefix cache runs in one "
                             "process; with tensor_parallel_size > 1 each rank holds a part "
                             "of every block")
        return _build_tensor_parallel(model, args, progress)
    if args.cpus is not None:   # one rank on the CPUs given (a data-parallel replica's)
        (cpus, nodes), = topology.placements(1, args.cpus)
        topology.bind(cpus, list(nodes))
        ops.restart_pool(args.threads or len(cpus))
    loaded = load(model, args, progress)
    spec = SpeculativeConfig.parse(args.speculative_config)
    kv, model_len, _ = _kv_cache(loaded, args)
    runner = ModelRunner(loaded.model, kv, args.max_num_batched_tokens, args.max_num_seqs,
                         model_len, _max_logits(args), spare_state_slots=_spare_slots(
                             loaded.model.config, args),
                         keep_hidden=spec is not None and spec.method in HIDDEN_METHODS)
    return _engine(loaded, kv, model_len, runner, args)


def _drafting_seqs(c: ModelConfig, args: EngineArgs) -> int:
    """How many sequences may verify drafts in one step (0: no speculation)."""
    spec = SpeculativeConfig.parse(args.speculative_config)
    return 0 if spec is None else min(args.max_num_seqs, MAX_DRAFTING_SEQS)


def _max_logits(args: EngineArgs) -> int:
    """Logits rows a step may return: one per sequence, and the drafting sequences'
    draft tokens."""
    spec = SpeculativeConfig.parse(args.speculative_config)
    if spec is None:
        return args.max_num_seqs
    return args.max_num_seqs + spec.num_speculative_tokens * min(args.max_num_seqs,
                                                                  MAX_DRAFTING_SEQS)


def _state_layout(c: ModelConfig, args: EngineArgs) -> tuple[int, int, int]:
    """A hybrid's state slots: (live, prefix-cache checkpoints, drafting snapshots)."""
    live, saved = state_slots(c, args.max_num_seqs, args.enable_prefix_caching)
    spare = _drafting_seqs(c, args) if live and c.encoder is None else 0
    return live, saved, spare


def _spare_slots(c: ModelConfig, args: EngineArgs) -> tuple[int, ...]:
    live, saved, spare = _state_layout(c, args)
    return tuple(range(live + saved, live + saved + spare))


def _kv_cache(loaded: LoadedModel, args: EngineArgs, ranks: int = 1
              ) -> tuple[KVCache, int, dict]:
    """The KV cache of the loaded model (a rank's shard's), max_model_len, and the
    sizes the other ranks build theirs with."""
    if loaded.tensor_types:
        log.info("GGUF tensor types: %s", loaded.tensor_types)
    if loaded.model.weights.quantization:
        log.info("linear layers: %s", loaded.model.weights.quantization)
    c = loaded.model.config
    model_len = min(args.max_model_len or c.max_position_embeddings, c.max_position_embeddings)
    num_blocks, num_window_blocks, model_len = size_kv_cache(c, args, model_len, ranks)
    slots = sum(_state_layout(c, args))
    sizes = {"num_blocks": num_blocks, "num_window_blocks": num_window_blocks,
             "max_model_len": model_len, "state_slots": slots}
    return KVCache(c, num_blocks, args.block_size, args.kv_cache_dtype,
                   num_window_blocks, state_slots=slots), model_len, sizes


def _engine(loaded: LoadedModel, kv: KVCache, model_len: int, runner, args: EngineArgs
            ) -> LLMEngine:
    live, saved = state_slots(loaded.model.config, args.max_num_seqs,
                              args.enable_prefix_caching)
    states = StatePool(live, saved, checkpoint_interval(args.block_size)) if live else None
    store = _prefix_store(loaded, kv, args)
    blocks = BlockManager(kv.pool_layout, args.block_size, args.enable_prefix_caching, states,
                          store, kv if store is not None else None)
    scheduler = Scheduler(blocks, args.max_num_seqs, args.max_num_batched_tokens, model_len)
    speculator = _speculator(loaded, runner, model_len, args)
    return LLMEngine(loaded, scheduler, runner, args.reasoning_parser, speculator)


FINGERPRINT_SAMPLE = 1 << 20  # bytes read from each end of each weight file


def store_fingerprint(loaded: LoadedModel, kv: KVCache) -> bytes:
    """What a prefix store's blocks are valid for: the model's config, its weight
    files (each one's name, size and first and last MiB: another fine-tune's
    tensors differ there), the format its layers run in, and the KV cache's dtype,
    block size and per-block layout."""
    h = hashlib.blake2b(digest_size=32)
    h.update(repr(loaded.config).encode())
    h.update(repr((loaded.model.weights.quantization, loaded.tensor_types, kv.dtype,
                   kv.block_size, [(g.window, g.layers) for g in kv.groups])).encode())
    path = Path(loaded.path)
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.suffix in (".safetensors", ".gguf", ".bin", ".json"))
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(FINGERPRINT_SAMPLE))
            fh.seek(max(0, size - FINGERPRINT_SAMPLE))
            h.update(fh.read(FINGERPRINT_SAMPLE))
    return h.digest()


def _prefix_store(loaded: LoadedModel, kv: KVCache, args: EngineArgs) -> PrefixStore | None:
    """The prefix cache's disk tier that --prefix-cache-dir asks for, or None."""
    if args.prefix_cache_dir is None:
        return None
    c = loaded.model.config
    if c.encoder is not None:
        raise ValueError("prefix_cache_dir: an encoder-decoder (Whisper) caches no prefixes")
    sizes = [len(kv.read_block(g, 0)) for g in range(len(kv.groups))]
    if c.linear_layers:   # a hybrid's state checkpoints, as one more group
        sizes.append(len(kv.read_state(0)))
    store = PrefixStore(args.prefix_cache_dir, store_fingerprint(loaded, kv), sizes,
                        int(args.prefix_cache_gib * 2**30))
    log.info("prefix cache on disk: %s, %d blocks (%.2f GiB of %.2f)", store.dir, len(store),
             store.nbytes / 2**30, args.prefix_cache_gib)
    return store


def _speculator(loaded: LoadedModel, runner: ModelRunner, model_len: int, args: EngineArgs
                ) -> Speculator | None:
    """Speculative decoding as --speculative-config says: its proposer, and a
    controller that knows what verify rows cost on this machine (measured now)."""
    spec = SpeculativeConfig.parse(args.speculative_config)
    if spec is None:
        return None
    c = loaded.model.config
    if c.encoder is not None:
        raise ValueError("speculative_config: speculative decoding is for decoder-only "
                         "models; this one is an encoder-decoder (Whisper)")
    if not c.has_lm_head:
        raise ValueError("speculative_config: this model has no lm_head (an embedding "
                         "model): it generates nothing to speculate on")
    drafting = _drafting_seqs(c, args)
    max_rows = min(args.max_num_batched_tokens,
                   args.max_num_seqs + spec.num_speculative_tokens * drafting)
    # method draft_model: its checkpoint, loaded as the target was (the threads already set)
    draft = load(spec.model, dataclasses.replace(args, threads=None)) \
        if spec.method == "draft_model" else None
    proposer = build_proposer(spec, loaded, args, model_len, runner.kv.num_blocks, draft)
    try:
        cost = calibrate(runner, max_rows, spec.num_speculative_tokens, model_len)
    except BaseException:
        proposer.close()
        raise
    log.info("speculative decoding: %s, up to %d draft tokens per sequence; a step of "
             "M rows costs %s", spec.method, spec.num_speculative_tokens,
             ", ".join(f"M={m}: {t / cost.seconds[0]:.2f}x"
                       for m, t in zip(cost.rows, cost.seconds, strict=True)))
    controller = SpecController(cost, spec.num_speculative_tokens, args.max_num_batched_tokens,
                                spec.disable_by_batch_size)
    return Speculator(spec, proposer, controller, model_len,
                      runner.num_spare_states if c.linear_layers else drafting)


def _build_tensor_parallel(model: str | Path, args: EngineArgs, progress=None) -> LLMEngine:
    loaded, group, restore = start_ranks(model, args, progress)
    try:
        kv, model_len, sizes = _kv_cache(loaded, args, args.tensor_parallel_size)
        spec = SpeculativeConfig.parse(args.speculative_config)
        group.configure(**sizes, max_tokens=args.max_num_batched_tokens,
                        max_logits=_max_logits(args))
        runner = TPModelRunner(loaded.model, kv, args.max_num_batched_tokens,
                               args.max_num_seqs, model_len, group, restore,
                               _max_logits(args), _spare_slots(loaded.model.config, args),
                               spec is not None and spec.method in HIDDEN_METHODS)
        return _engine(loaded, kv, model_len, runner, args)
    except BaseException:
        stop_ranks(group, restore)
        raise


def start_ranks(model: str | Path, args: EngineArgs, progress=None
                ) -> tuple[LoadedModel, RankGroup, tuple[int, tuple[int, ...]]]:
    """A tensor-parallel model: rank 0 here (this thread bound to its CPUs and node, its
    kernel pool restarted there, its model's forward driving the others), ranks 1..
    as processes that have loaded their shards; a model that does not split is
    refused before anything starts. The caller sizes the KV cache and workspace and
    gives them to group.configure(), and ends with stop_ranks(group, restore)."""
    ranks, path = args.tensor_parallel_size, model_path(model)
    tensor_parallel_plans(path, ranks, _quantization(args))
    places = topology.placements(ranks, args.cpus)
    for r, (cpus, nodes) in enumerate(places):
        log.info("tensor-parallel rank %d: CPUs %s, memory of NUMA node(s) %s", r,
                 topology.format_cpulist(cpus), ",".join(map(str, nodes)) or "unbound")
    fields = {"dtype": WEIGHT_DTYPES[args.dtype], "quantization": args.quantization,
              "quantize_lm_head": args.quantize_lm_head,
              "score_from_tokens": args.score_from_tokens,
              "kv_cache_dtype": args.kv_cache_dtype, "block_size": args.block_size}
    restore = (threading.get_ident(), tuple(os.sched_getaffinity(0)))
    topology.bind(places[0][0], list(places[0][1]))
    ops.restart_pool(args.threads or len(places[0][0]))
    group = None
    try:
        group = RankGroup.start(str(path), ranks, [p[0] for p in places],
                                [p[1] for p in places], args.threads, fields,
                                DEFAULT_MAX_FLOATS)
        loaded = load(path, args, progress, group.comm)
        group.wait("loaded")
        return loaded, group, restore
    except BaseException:
        stop_ranks(group, restore)
        raise

