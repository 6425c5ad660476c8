"""sizing: what serving a model takes, from its config and headers alone (no tensor
data is read): parameter counts, the weights as the engine loads and packs them for this
CPU's kernels (--quantization auto included), the KV cache, the engine's Workspace (as
Workspace.nbytes computes it), a fixed allowance for the process, and the bytes one
decode step reads. `armllm plan` prints it.

Decode reads every weight once per step (the embedding only one row per
sequence; of a mixture-of-experts layer only the experts its tokens route to)
plus each sequence's KV cache, so with read bandwidth B a step of b sequences at
average context n takes at least
    (weights + b * (embedding row + n * KV bytes per token)) / B,
which bounds TPOT from below and tok/s from above. n = max_model_len / 2.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from armllm import ops
from armllm.engine.args import DEFAULT_KV_FRACTION, WEIGHT_DTYPES, EngineArgs
from armllm.model import arch
from armllm.model.arch import load_hf_config
from armllm.model.compressed_tensors import parse_config
from armllm.model.config import ModelConfig
from armllm.model.decoder import Workspace
from armllm.model.gguf import GGML_TYPES, TYPE_IDS, GGUFFile
from armllm.model.kv_cache import bytes_per_block, state_bytes, state_slots, window_pool_blocks
from armllm.model.layer import DeltaNet, QKNorm, attention_step, has_step, step_norms
from armllm.model.loader import ct2_config, gguf_model_config, model_path
from armllm.model.quantize import parse_scheme
from armllm.model.sharding import ShardedSource, ShardPlan, k_unit, plan_shards
from armllm.model.sources import GGUFSource, HFSource
from armllm.model.weights import (
    LinearFormats,
    QuantFormat,
    head_tensor_name,
    linear_formats,
    linear_shapes,
)
from armllm.model.whisper import is_ct2_dir

PROCESS_BYTES = 300 << 20        # Python, numpy, tokenizer and code: a fixed allowance
ITEM_BYTES = {"bf16": 2, "f32": 4}


def _layer_small_params(c: ModelConfig, i: int) -> int:
    """Layer i's float vectors as its steps read them (kept f32): its RMSNorm weights,
    q/k/v (and o) biases, per-head q/k norms, attention sinks; a Gated DeltaNet's b/a
    projections (counted at 4 bytes too), conv, A, dt_bias and norm; a shared expert's
    gate."""
    steps = arch.of(c).layer(c, i)
    attention, d = attention_step(steps), c.delta_net
    delta = (2 * d.v_heads * c.hidden_size + d.conv_size * d.conv_kernel + 2 * d.v_heads
             + d.v_dim) if has_step(steps, DeltaNet) else 0
    return (len(step_norms(steps)) * c.hidden_size
            + (c.q_size + 2 * c.kv_size if c.attention_bias else 0)
            + (c.hidden_size if c.o_bias else 0) + (2 * c.head_dim if has_step(steps, QKNorm)
                                                    else 0)
            + (c.num_heads if attention and attention.sinks else 0) + delta
            + (c.hidden_size if c.shared_expert_intermediate_size and c.is_moe_layer(i)
               else 0))


def _experts(c: ModelConfig, i: int, batch: int | None = None) -> float:
    """How many copies of layer i's MLP weights there are (batch None), or how many a
    decode step of `batch` sequences reads on average: 1 for a dense layer; for a
    sparse one the experts, or the expected number of distinct experts that batch*k
    uniform picks hit (E (1 - (1 - k/E)^batch))."""
    if not c.is_moe_layer(i):
        return 1
    e, k = c.num_experts, c.experts_per_token
    return e if batch is None else e * (1.0 - (1.0 - k / e) ** batch)


def _layer_params(c: ModelConfig, i: int, batch: int | None = None) -> float:
    """Layer i's linear parameters (batch: those a decode step reads, as _experts), with
    the router's and experts' biases (GPT-OSS)."""
    shapes = linear_shapes(c, i)
    qkv, o, gate_up, down = (n * k for n, k in shapes)
    router = c.num_experts * c.hidden_size if c.is_moe_layer(i) else 0
    if c.moe_bias and c.is_moe_layer(i):
        router += c.num_experts
        gate_up, down = gate_up + shapes[2][0], down + shapes[3][0]
    shared = 3 * c.shared_expert_intermediate_size * c.hidden_size if c.is_moe_layer(i) else 0
    return qkv + o + _experts(c, i, batch) * (gate_up + down) + router + shared


def param_counts(c: ModelConfig) -> dict:
    embedding = c.vocab_size * c.hidden_size
    layers = [_layer_params(c, i) + _layer_small_params(c, i) for i in range(c.num_layers)]
    lm_head = embedding if c.has_lm_head and not c.tie_word_embeddings else 0
    counts = {"embedding": embedding, "per_layer": max(layers),
              "layers": sum(layers), "final_norm": c.hidden_size,
              "lm_head": lm_head, "tied": c.tie_word_embeddings}
    counts["total"] = embedding + counts["layers"] + c.hidden_size + lm_head
    if c.moe_layers:   # what one token runs through: its k experts in each sparse layer
        counts["active"] = round(counts["total"] - counts["layers"] + sum(
            _layer_params(c, i, 1) + _layer_small_params(c, i) for i in range(c.num_layers)))
    return counts


def linear_bytes(n: int, k: int, dense: str, fmt: QuantFormat | None) -> int:
    """Bytes of one [n, k] weight: dense, or packed for this CPU's quantized kernels with
    its scales and offsets (and, for asymmetric activations, the zero points' f32
    correction of one float a group)."""
    if fmt is None:
        return n * k * ITEM_BYTES[dense]
    if fmt.runs_gguf:
        return ops.kernels().gguf_packed_len(k, [TYPE_IDS[t] for t, _ in fmt.gguf],
                                             [rows for _, rows in fmt.gguf])
    packed = ops.kernels().wq_packed_len(n, k, fmt.bits, fmt.group)
    if not fmt.act_symmetric:
        packed += n * ops.quant_groups(k, fmt.group) * ITEM_BYTES["f32"]
    return packed


def weight_bytes(c: ModelConfig, dense: str, formats: LinearFormats | None,
                 head_rows: int | None = None) -> dict:
    """Resident weight bytes. The lm_head is packed for the GEMM, so a tied lm_head is a
    second copy of the embedding; norms and biases stay f32. head_rows: the lm_head's
    rows (a tensor-parallel rank's vocabulary shard; default the vocabulary)."""
    linear = [_layer_bytes(c, dense, formats, i) for i in range(c.num_layers)]
    small = [4 * _layer_small_params(c, i) for i in range(c.num_layers)]
    embed = c.vocab_size * c.hidden_size * ITEM_BYTES[dense]
    if formats and formats.embed_gguf:   # kept in its GGUF blocks
        _, elems, block_bytes = GGML_TYPES[TYPE_IDS[formats.embed_gguf]]
        embed = c.vocab_size * c.hidden_size // elems * block_bytes
    out = {"embedding": embed,
           "per_layer": max(map(sum, zip(linear, small, strict=True))),
           "layers": sum(linear) + sum(small),
           "final_norm": 4 * c.hidden_size,
           "lm_head": linear_bytes(head_rows or c.vocab_size, c.hidden_size, dense,
                                   formats.lm_head if formats else None)
           if c.has_lm_head else 0,   # an embedding model has none
           "mtp": _mtp_bytes(c, dense, formats) if head_rows is None else 0}
    out["total"] = (out["embedding"] + out["layers"] + out["final_norm"] + out["lm_head"]
                    + out["mtp"])
    return out


def _mtp_bytes(c: ModelConfig, dense: str, formats: LinearFormats | None) -> int:
    """A multi-token-prediction block's bytes (Qwen3.5's, loaded beside the model on one
    rank): its fc and norms, and layers as the last attention layer's, in its formats."""
    if not c.mtp_layers:
        return 0
    last = c.attention_layers[-1]
    layer = _layer_bytes(c, dense, formats, last) + 4 * _layer_small_params(c, last)
    return c.mtp_layers * layer + 2 * c.hidden_size ** 2 * ITEM_BYTES[dense] \
        + 3 * 4 * c.hidden_size


def _layer_bytes(c: ModelConfig, dense: str, formats: LinearFormats | None, i: int,
                 batch: int | None = None) -> float:
    """Layer i's linear weight bytes (batch: those a decode step reads, as _experts)."""
    fmts = formats.layers[i] if formats else (None,) * 4
    qkv, o, gate_up, down = (linear_bytes(n, k, dense, f)
                             for f, (n, k) in zip(fmts, linear_shapes(c, i), strict=True))
    router = c.num_experts * c.hidden_size * ITEM_BYTES[dense] if c.is_moe_layer(i) else 0
    # a shared expert runs in the routed experts' format (weights.py loads it so)
    shared = (gate_up + down) if c.is_moe_layer(i) and c.shared_expert_intermediate_size else 0
    return qkv + o + _experts(c, i, batch) * (gate_up + down) + router + shared


def step_layer_bytes(c: ModelConfig, dense: str, formats: LinearFormats | None,
                     batch: int) -> float:
    """The layers' weight bytes a decode step of `batch` sequences reads: all of them
    in a dense model; in a sparse layer only the experts its tokens route to."""
    return sum(_layer_bytes(c, dense, formats, i, batch) for i in range(c.num_layers)) \
        + sum(4 * _layer_small_params(c, i) for i in range(c.num_layers))


def format_name(fmt: QuantFormat | None, dense: str) -> str:
    """w4a8-g32, w8a8-ch-asym, ... or the dense dtype."""
    if fmt is None:
        return dense
    if fmt.runs_gguf:
        return "+".join(dict.fromkeys(t for t, _ in fmt.gguf)) + " (GGUF)"
    return (f"w{fmt.bits}a8-{f'g{fmt.group}' if fmt.group else 'ch'}"
            f"{'' if fmt.act_symmetric else '-asym'}")


def describe_formats(formats: LinearFormats | None, dense: str, num_layers: int) -> dict:
    """How many of the layers' linear weights run in each format, and the lm_head's."""
    layers = formats.layers if formats else [(None,) * 4] * num_layers
    counts = Counter(format_name(f, dense) for layer in layers for f in layer)
    return {"layers": dict(sorted(counts.items())),
            "lm_head": format_name(formats.lm_head if formats else None, dense),
            "embedding": f"{formats.embed_gguf} (GGUF)" if formats and formats.embed_gguf
            else dense}


def rope_table_bytes(c: ModelConfig) -> int:
    return c.max_position_embeddings * c.head_dim * 4


def make_plan(c: ModelConfig, formats: LinearFormats | None, engine: EngineArgs,
              max_model_len: int, bandwidth_gbs: float | None = None,
              mem_available: int | None = None, shard: ShardPlan | None = None,
              allreduce_s: float | None = None) -> dict:
    """Every figure of the plan, in bytes, seconds and tokens. With tensor parallel,
    `shard` is rank 0's ShardPlan (the largest shard) and `formats` its weights': the
    memory and decode figures are that rank's (its KV heads, its --kv-cache-gib, its
    node's share of the bandwidth), the totals the ranks' together. `allreduce_s` is
    one all-reduce of one hidden vector between the ranks (the link's latency): a step
    of b sequences adds, per all-reduce, that time plus the (b - 1) further vectors'
    bytes moved at the node's bandwidth, 2(N-1)/N of them per rank (reduce-scatter and
    all-gather)."""
    ranks = shard.ranks if shard else 1
    full = c
    c = shard.config(c) if shard else c
    dense, seqs, block = WEIGHT_DTYPES[engine.dtype], engine.max_num_seqs, engine.block_size
    params = param_counts(full)
    weights = weight_bytes(c, dense, formats,
                           shard.vocab[1] - shard.vocab[0] if shard else None)
    dtype = engine.kv_cache_dtype
    blocks_per_seq = -(-max_model_len // block)
    # sliding-window layers in a pool of their own, as build_engine sizes it
    sliding = sum(1 for i in c.attention_layers if c.window(i))
    window_blocks = window_pool_blocks(c, block, seqs, engine.max_num_batched_tokens,
                                       max_model_len) or 0
    window_block_bytes = bytes_per_block(c, sliding, block, dtype)
    window_pool = None
    if window_blocks and sliding < len(c.attention_layers):
        window_pool = {"layers": sliding, "window": c.sliding_window, "blocks": window_blocks,
                       "bytes": (window_blocks + 1) * window_block_bytes,  # + the null block
                       "saved_bytes": (seqs * blocks_per_seq - window_blocks)
                       * window_block_bytes}
    main_layers = len(c.attention_layers) - (sliding if window_pool else 0)
    per_block = bytes_per_block(c, main_layers, block, dtype)
    kv_token = per_block // block
    if window_blocks and not window_pool:  # every layer slides: a sequence holds its window
        blocks_per_seq = window_blocks // seqs
    kv_seq = blocks_per_seq * per_block
    # a hybrid's recurrent layers: a state slot per sequence, taken from the KV budget
    live, saved = state_slots(c, seqs, engine.enable_prefix_caching)
    states = state_bytes(c, live + saved)
    fixed = (window_pool["bytes"] if window_pool else 0) + states
    if engine.kv_cache_gib is not None:   # as build_engine sizes it
        kv_blocks = int((engine.kv_cache_gib * 2**30 - fixed) // per_block)
        kv_source = "--kv-cache-gib"
    else:
        kv_blocks = seqs * blocks_per_seq
        kv_source = "--max-num-seqs sequences at --max-model-len"
    workspace = Workspace.nbytes(c, engine.max_num_batched_tokens, seqs, formats,
                                 max_seq_len=max_model_len)
    overhead = workspace + rope_table_bytes(c) + PROCESS_BYTES
    rank_total = weights["total"] + kv_blocks * per_block + fixed + overhead
    total = ranks * rank_total   # an upper bound: rank 0's shard is the largest
    # after attention's o and the MLP's down projection (a sparse layer's experts: one more)
    allreduces = 2 * full.num_layers + len(full.moe_layers)
    plan = {
        "kernel_variant": ops.selected_isa(), "max_model_len": max_model_len, "max_num_seqs": seqs,
        "weight_dtype": dense, "quantization": engine.quantization,
        "quantize_lm_head": engine.quantize_lm_head,
        "linear_formats": describe_formats(formats, dense, c.num_layers),
        "kv_cache_dtype": engine.kv_cache_dtype,
        "params": params, "weight_bytes": weights,
        "kv_cache": {"bytes_per_token": kv_token, "block_size": block,
                     "blocks_per_sequence": blocks_per_seq, "bytes_per_sequence": kv_seq,
                     "sized_by": kv_source, "blocks": kv_blocks, "tokens": kv_blocks * block,
                     "bytes": kv_blocks * per_block + fixed,
                     "sequences_at_full_length": kv_blocks / blocks_per_seq,
                     "window_pool": window_pool,
                     "state_pool": {"live_slots": live, "checkpoint_slots": saved,
                                    "layers": len(c.linear_layers),
                                    "bytes_per_slot": states // (live + saved),
                                    "bytes": states} if states else None,
                     "kv_cache_gib_flag": -(-(seqs * kv_seq + fixed) * 100 // 2**30) / 100},
        "overhead": {"max_num_batched_tokens": engine.max_num_batched_tokens,
                     "workspace_bytes": workspace, "rope_table_bytes": rope_table_bytes(c),
                     "process_bytes": PROCESS_BYTES, "bytes": overhead},
        "total_bytes": total, "mem_available_bytes": mem_available,
        "tensor_parallel": None if shard is None else {
            "ranks": ranks, "rank_bytes": rank_total,
            "rank0": {"q_heads": c.num_heads, "kv_heads": c.num_kv_heads,
                      "intermediate": c.intermediate_size,
                      "vocab_rows": shard.vocab[1] - shard.vocab[0],
                      # a hybrid's Gated DeltaNet key and value heads (its state's)
                      "delta_heads": [c.delta_net.k_heads, c.delta_net.v_heads]
                      if c.delta_net else None},
            "allreduces_per_step": allreduces, "allreduce_us": (
                None if allreduce_s is None else allreduce_s * 1e6),
            "allreduce_bytes_per_token": 4 * full.hidden_size},
    }
    if mem_available is not None:
        plan["fits"] = total <= mem_available
        room = mem_available // ranks - weights["total"] - overhead - fixed
        plan["max_concurrency_that_fits"] = max(0, room // kv_seq)
        if engine.kv_cache_gib is None:   # serve caps its default KV cache (build_engine)
            cap = int(max(0, (mem_available - weights["total"]) * DEFAULT_KV_FRACTION / ranks
                          - fixed) // per_block)
            plan["kv_cache"]["serve_default_cap_blocks"] = cap
    # decode: all weights once per step (of a sparse layer, the experts routed to), one
    # embedding row and the KV of each sequence
    row = weights["embedding"] // c.vocab_size
    # per sequence, at the average context (a sliding layer reads at most its window)
    context = max_model_len // 2
    kv_read = kv_token * context + (
        window_block_bytes // block * min(c.sliding_window, context) if window_pool else 0)

    state_rw = 2 * state_bytes(c, 1)   # a hybrid's recurrent state, read and written

    def step(batch: int) -> dict:
        step_weights = round(weights["total"] - weights["embedding"] - weights["layers"]
                             - weights["mtp"]
                             + step_layer_bytes(c, dense, formats, batch))
        nbytes = step_weights + batch * (row + kv_read + state_rw)
        d = {"batch": batch, "bytes": nbytes, "weight_bytes": step_weights + batch * row,
             "kv_bytes": batch * kv_read, "state_bytes": batch * state_rw}
        if bandwidth_gbs:   # each rank reads its shard at its node's share
            node_bytes_per_s = bandwidth_gbs / ranks * 1e9
            t = nbytes / node_bytes_per_s
            if shard is not None and allreduce_s is not None:
                moved = (batch - 1) * 4 * full.hidden_size * 2 * (ranks - 1) / ranks
                comm = allreduces * (allreduce_s + moved / node_bytes_per_s)
                d["allreduce_s"] = comm
                t += comm
            d.update(min_step_s=t, max_tokens_per_s=batch / t)
        return d

    plan["decode"] = {"bandwidth_gbs": bandwidth_gbs, "context": max_model_len / 2,
                      "batch_1": step(1), "batch_c": step(seqs)}
    return plan


# -- reading the model -------------------------------------------------------------------

def read_model(model: str | Path, engine: EngineArgs
               ) -> tuple[ModelConfig, LinearFormats | None, str | None, ShardPlan | None]:
    """The ModelConfig of a model directory (config.json) or GGUF file (its metadata
    and tensor list), the formats its linear weights load in under `engine`'s
    quantization (with tensor parallel, rank 0's shard's), a GGUF's tensor count per
    ggml type (GGUFFile.type_summary) and rank 0's ShardPlan (None: one rank); only
    headers are read. An encoder-decoder (a CTranslate2 directory too) gives its config
    alone: sizing_encoder_decoder.py sizes it."""
    path = model_path(model)
    quantization = engine.quantization if engine.quantization in ("auto", "none") else \
        parse_scheme(engine.quantization)
    if path.is_dir() and is_ct2_dir(path):   # CTranslate2's layout (faster-whisper's)
        config = ct2_config(path)
    elif path.is_dir():
        config = load_hf_config(path)
    if path.is_dir() and config.encoder is not None:   # sizing_encoder_decoder.py's
        if engine.tensor_parallel_size > 1:
            raise ValueError(f"{config.architecture}: tensor parallel does not split an "
                             "encoder-decoder; run it on one rank")
        return config, None, None, None
    gguf = None
    try:
        if path.is_dir():
            ct = parse_config(json.loads((path / "config.json").read_text()),
                              str(path / "config.json"))
            # a float checkpoint stores no quantized layer: config.json alone answers
            source = HFSource(path, ct, config) if ct is not None else None
        else:
            gguf = GGUFFile(path)
            config = gguf_model_config(gguf)
            source = GGUFSource(gguf, config)
        shard = None
        if engine.tensor_parallel_size > 1:
            shard = plan_shards(config, engine.tensor_parallel_size,
                                k_unit(source, config, quantization))[0]
            if source is not None:
                source = ShardedSource(source, shard, config, head_tensor_name(config))
        formats = linear_formats(source, shard.config(config) if shard else config,
                                 quantization, engine.quantize_lm_head)
        return config, formats, gguf.type_summary() if gguf else None, shard
    finally:
        if gguf is not None:
            gguf.close()
