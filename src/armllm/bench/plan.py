"""`armllm plan`: what serving a model with the same engine flags as `armllm
serve` will take (bench/sizing.py computes it from the checkpoint's config and
headers alone; bench/sizing_encoder_decoder.py for an encoder-decoder, Whisper)
against this machine's MemAvailable, and the decode speed that its measured memory
bandwidth allows.

Building the parser imports neither the engine nor the kernels: the command
loads them when it runs (a bad ARMLLM_ISA is then a one-line usage error)."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from armllm.cmdline import UsageError, add_model_argument, resolve_model
from armllm.engine.args import DEFAULT_KV_FRACTION, SERVER_ONLY, EngineArgs

PROBE_MIN_TIME = 0.3             # seconds per bandwidth measurement
ALLREDUCE_REPS = 300             # timed all-reduces of the hidden vector (about 1 ms each)
# what plan cannot honour: prefix caching changes no memory figure
EXCLUDED_ENGINE_FLAGS = ("enable_prefix_caching", *SERVER_ONLY)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="memory read bandwidth in GB/s (default: measured now)")
    p.add_argument("--allreduce-us", type=float, default=None,
                   help="with -tp: one all-reduce of one hidden vector between the ranks in "
                        "microseconds, e.g. over the sockets' link (default: measured now "
                        "between processes of this machine)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    EngineArgs.add_cli_args(p, exclude=EXCLUDED_ENGINE_FLAGS,
                            unset={"max_model_len": "the model's context"})


def run(args: argparse.Namespace) -> int:
    from armllm import ops  # the kernels (and their packed sizes) load when plan runs
    from armllm.bench.kernels import probe_machine
    from armllm.bench.sizing import make_plan, read_model
    from armllm.engine.setup import available_bytes
    try:
        engine = EngineArgs.from_cli_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.bandwidth_gbs is not None and not args.bandwidth_gbs > 0:
        raise UsageError(f"--bandwidth-gbs must be > 0, got {args.bandwidth_gbs}")
    if args.allreduce_us is not None and not args.allreduce_us >= 0:
        raise UsageError(f"--allreduce-us must be >= 0, got {args.allreduce_us}")
    model = resolve_model(args.model)
    try:
        config, formats, tensor_types, shard = read_model(model, engine)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    max_len = engine.max_model_len or config.max_position_embeddings
    if max_len > config.max_position_embeddings:
        raise UsageError(f"--max-model-len {max_len} exceeds the model's context "
                         f"({config.max_position_embeddings} tokens)")
    threads = None
    bandwidth = args.bandwidth_gbs
    if bandwidth is None:
        if engine.threads is not None:
            try:
                ops.set_num_threads(engine.threads)
            except ValueError as exc:   # the pool already runs another count
                raise UsageError(str(exc)) from None
        # read GB/s over the default thread pool, with `armllm bench kernels`' probe
        bandwidth = probe_machine(ops.get_pool(), PROBE_MIN_TIME)["read_gbs"]
        threads = ops.num_threads()
    if config.encoder is not None:
        return _run_encoder_decoder(args, model, config, engine, max_len, bandwidth, threads)
    allreduce_us = args.allreduce_us
    if shard is not None and allreduce_us is None:
        allreduce_us = measure_allreduce_us(shard.ranks, config.hidden_size)
    plan = make_plan(config, formats, engine, max_len, bandwidth, available_bytes(), shard,
                     None if allreduce_us is None else allreduce_us * 1e-6)
    if shard is not None:
        plan["tensor_parallel"]["allreduce_source"] = (
            "given" if args.allreduce_us is not None else "measured")
    plan["model"] = str(model)
    plan["gguf_tensor_types"] = tensor_types
    plan["config"] = {k: getattr(config, k) for k in (
        "architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
        "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings",
        "tie_word_embeddings", "moe_layers", "num_experts", "experts_per_token",
        "moe_intermediate_size")}
    plan["decode"]["bandwidth_source"] = "given" if args.bandwidth_gbs else "measured"
    plan["decode"]["bandwidth_threads"] = threads
    plan["assumptions"] = assumptions(plan)
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print_plan(plan)
    return 0


def _run_encoder_decoder(args: argparse.Namespace, model, config, engine: EngineArgs,
                         max_len: int, bandwidth: float, threads: int | None) -> int:
    """An encoder-decoder's plan (Whisper: bench/sizing_encoder_decoder.py)."""
    from armllm.bench import sizing_encoder_decoder as sizing
    from armllm.engine.setup import available_bytes
    from armllm.model.loader import model_path
    plan = sizing.make_plan(model_path(model), config, engine, max_len, bandwidth,
                            available_bytes())
    plan["model"] = str(model)
    plan["config"] = {k: getattr(config, k) for k in (
        "architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
        "num_heads", "head_dim", "max_position_embeddings")}
    plan["config"]["encoder"] = dataclasses.asdict(config.encoder)
    plan["decode"]["bandwidth_source"] = "given" if args.bandwidth_gbs else "measured"
    plan["decode"]["bandwidth_threads"] = threads
    plan["assumptions"] = sizing.assumptions(plan)
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print_encoder_decoder_plan(plan)
    return 0


def measure_allreduce_us(ranks: int, hidden_size: int) -> float:
    """One all-reduce of one hidden vector between `ranks` processes of this machine,
    as the layers run it (staged in place where the size has a staging buffer), with
    `armllm bench comm`'s timing."""
    from armllm.bench.comm import time_allreduce
    times, staged = time_allreduce(ranks, [4 * hidden_size], ALLREDUCE_REPS)
    return (staged[0] if staged[0] is not None else times[0]) * 1e6


def assumptions(p: dict) -> list[str]:
    formats = p["linear_formats"]
    item = p["weight_bytes"]["embedding"] / p["params"]["embedding"]
    layers = ", ".join(f"{count} {name}" for name, count in formats["layers"].items())
    out = [f"linear weights (--quantization {p['quantization']}): {layers}; lm_head "
           f"{formats['lm_head']}; quantized ones as the {p['kernel_variant']} kernels pack "
           f"them, with their scales; embedding {formats['embedding']}, {item:.4g} B per "
           "parameter; norms and biases f32"]
    if p["params"]["tied"]:
        out.append("tied lm_head: counted once as parameters, but armllm packs a second copy "
                   "for the GEMM, so its bytes count twice in memory")
    kv = p["kv_cache"]
    rows = "1 logits row" if p["max_num_seqs"] == 1 else f"{p['max_num_seqs']} logits rows"
    out += [f"KV cache: {kv['sized_by']}, in whole {kv['block_size']}-token blocks",
            f"overhead: the engine's workspace (Workspace.nbytes) for "
            f"{p['overhead']['max_num_batched_tokens']} batched tokens and {rows}, the "
            f"RoPE table, and {p['overhead']['process_bytes'] >> 20} MiB for the Python "
            f"process; loading peaks higher (tensors pass through f32)",
            "decode bound: all weights and one embedding row per sequence read once per "
            "step, each sequence's KV at half of --max-model-len; KV writes and activations "
            "ignored; those bytes at the read bandwidth give a floor on step time. Compute "
            "is not bounded here: large batches on few cores are compute-bound well below "
            "this (see `armllm bench kernels`)"]
    tp = p["tensor_parallel"]
    if tp:
        out.append(f"tensor parallel: --bandwidth-gbs is the whole machine's, each rank "
                   f"reading its node's 1/{tp['ranks']}; each step adds "
                   f"{tp['allreduces_per_step']} all-reduces of {tp['allreduce_us']:.1f} us "
                   f"({tp['allreduce_source']}) for one hidden vector, plus each further "
                   "sequence's vector moved at the node's bandwidth")
    return out
    return out


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def print_plan(p: dict) -> None:
    c, pc, wb, kv, ov = p["config"], p["params"], p["weight_bytes"], p["kv_cache"], p["overhead"]
    formats = p["linear_formats"]
    print(f"armllm plan: {Path(p['model']).name} ({c['architecture']}: {c['num_layers']} layers, "
          f"hidden {c['hidden_size']}, intermediate {c['intermediate_size']}, "
          f"{c['num_heads']}/{c['num_kv_heads']} heads x {c['head_dim']}, vocab "
          f"{c['vocab_size']}, context {c['max_position_embeddings']})")
    if p.get("gguf_tensor_types"):
        print(f"GGUF tensor types: {p['gguf_tensor_types']}")
    seqs = "1 sequence" if p["max_num_seqs"] == 1 else f"{p['max_num_seqs']} sequences"
    layers = ", ".join(f"{count} {name}" for name, count in formats["layers"].items())
    print(f"for {seqs} of {p['max_model_len']} tokens, --quantization {p['quantization']}: "
          f"linear weights {layers}, lm_head {formats['lm_head']}; KV cache "
          f"{p['kv_cache_dtype']}")
    tp = p["tensor_parallel"]
    if tp:
        r0 = tp["rank0"]
        delta = r0.get("delta_heads")
        delta = f", Gated DeltaNet {delta[0]}/{delta[1]} key/value heads" if delta else ""
        print(f"tensor parallel over {tp['ranks']} ranks: memory and decode figures are rank "
              f"0's, the largest shard ({r0['q_heads']}/{r0['kv_heads']} heads{delta}, "
              f"intermediate {r0['intermediate']}, {r0['vocab_rows']} vocabulary rows; "
              f"embedding replicated), each rank reading at 1/{tp['ranks']} of the "
              f"bandwidth; {tp['allreduces_per_step']} all-reduces a step of "
              f"{tp['allreduce_bytes_per_token']:,} B per token, "
              f"{tp['allreduce_us']:.1f} us each at batch 1 ({tp['allreduce_source']})")
    print(f"\nparameters {_count(pc['total']):>14}")
    print(f"  embedding  {_count(pc['embedding']):>13}  ({c['vocab_size']} x {c['hidden_size']})")
    if c["moe_layers"]:
        print(f"  layers     {_count(pc['layers']):>13}  ({c['num_layers']} layers, "
              f"{len(c['moe_layers'])} of them sparse: {c['num_experts']} experts of "
              f"{c['moe_intermediate_size']}, {c['experts_per_token']} per token)")
        print(f"  active per token {_count(pc['active']):>7}")
    else:
        print(f"  layers     {_count(pc['layers']):>13}  ({c['num_layers']} x "
              f"{pc['per_layer']:,})")
    print(f"  final norm {pc['final_norm']:>11,}")
    lm = "tied to the embedding" if pc["tied"] else _count(pc["lm_head"])
    print(f"  lm_head    {lm:>13}")
    print("\nmemory")
    tied = " (tied: a second, packed copy)" if pc["tied"] else ""
    print(f"  weights    {_size(wb['total']):>13}  embedding {_size(wb['embedding'])}, layers "
          f"{_size(wb['layers'])}, lm_head {_size(wb['lm_head'])}{tied}")
    print(f"  KV cache   {_size(kv['bytes']):>13}  {kv['blocks']} blocks x {kv['block_size']} "
          f"tokens x {kv['bytes_per_token']:,} B/token ({kv['sequences_at_full_length']:g} "
          f"sequences at full length; {kv['sized_by']})")
    if kv["window_pool"]:
        w = kv["window_pool"]
        print(f"             {'':>13}  of which {_size(w['bytes'])} for the {w['layers']} "
              f"sliding-window layers ({w['window']} tokens): a pool of {w['blocks']} blocks "
              f"of their own, {_size(w['saved_bytes'])} less than at full length")
    if kv["state_pool"]:
        sp = kv["state_pool"]
        print(f"             {'':>13}  of which {_size(sp['bytes'])} recurrent state: "
              f"{sp['live_slots']} + {sp['checkpoint_slots']} prefix-cache checkpoint slots "
              f"of {_size(sp['bytes_per_slot'])} ({sp['layers']} Gated DeltaNet layers)")
    print(f"  overhead   {_size(ov['bytes']):>13}  workspace {_size(ov['workspace_bytes'])}, "
          f"RoPE table {_size(ov['rope_table_bytes'])}, process {_size(ov['process_bytes'])}")
    if tp:
        print(f"  per rank   {_size(tp['rank_bytes']):>13}  (the sum of the above)")
        print(f"  total      {_size(p['total_bytes']):>13}  ({tp['ranks']} ranks, at most)")
    else:
        print(f"  total      {_size(p['total_bytes']):>13}")
    _print_fit(p, kv)
    def step(s: dict) -> tuple[str, str]:
        comm = (f" + all-reduces {s['allreduce_s'] * 1e3:.2f} ms" if "allreduce_s" in s
                else "")
        return f" + state {s['state_bytes'] / 1e6:.1f}" if s["state_bytes"] else "", comm
    _print_decode(p, "decode upper bound", step)
    print("\nassumptions:")
    for line in p["assumptions"]:
        print(f"  - {line}")


def _print_fit(p: dict, kv: dict) -> None:
    """Whether the plan fits, serve's default cap, and the engine flags that size it."""
    avail = p["mem_available_bytes"]
    verdict = "fits" if p["fits"] else "DOES NOT FIT"
    print(f"  MemAvailable {_size(avail):>11}  -> {verdict}; room for "
          f"{p['max_concurrency_that_fits']} sequences of {p['max_model_len']} tokens")
    cap = kv.get("serve_default_cap_blocks")
    if cap is not None and cap < kv["blocks"]:
        print(f"  serve without --kv-cache-gib caps the KV cache at "
              f"{DEFAULT_KV_FRACTION:.0%} of the memory left after the weights: {cap} blocks")
    print(f"  engine flags: --max-model-len {p['max_model_len']} --max-num-seqs "
          f"{p['max_num_seqs']} --kv-cache-gib {kv['kv_cache_gib_flag']:.2f}")


def _print_decode(p: dict, title: str, extra) -> None:
    """The decode bound's rows at batch 1 and max_num_seqs; extra(step) gives the
    step's bytes beyond weights and KV (a state, the cross-attention K/V) and its
    further time (all-reduces)."""
    d = p["decode"]
    how = (f"measured, {d['bandwidth_threads']} threads" if d["bandwidth_source"] == "measured"
           else "given")
    print(f"\n{title}: read bandwidth {d['bandwidth_gbs']:.1f} GB/s ({how}), "
          f"average context {d['context']:g} tokens")
    rows = [("batch_1", "batch 1")]
    if p["max_num_seqs"] > 1:
        rows.append(("batch_c", f"batch {p['max_num_seqs']}"))
    for key, label in rows:
        s = d[key]
        per_seq = "TPOT" if s["batch"] == 1 else "TPOT per sequence"
        more_bytes, more_time = extra(s)
        print(f"  {label:<9} {s['bytes'] / 1e6:9.1f} MB/step (weights "
              f"{s['weight_bytes'] / 1e6:.1f} + KV {s['kv_bytes'] / 1e6:.1f}{more_bytes})"
              f"{more_time} -> <= {s['max_tokens_per_s']:.1f} tok/s, {per_seq} >= "
              f"{s['min_step_s'] * 1e3:.2f} ms")


def print_encoder_decoder_plan(p: dict) -> None:
    """An encoder-decoder's plan (bench/sizing_encoder_decoder.py) as text."""
    c, e, pc, wb = p["config"], p["config"]["encoder"], p["params"], p["weight_bytes"]
    kv, x, ov = p["kv_cache"], p["cross_attention_pool"], p["overhead"]
    print(f"armllm plan: {Path(p['model']).name} ({c['architecture']}: an encoder of "
          f"{e['layers']} layers over {e['n_mels']} mel bins and {e['positions']} frames a 30 s "
          f"window, a decoder of {c['num_layers']} layers, hidden {c['hidden_size']}, "
          f"{c['num_heads']} heads, vocab {c['vocab_size']}, context "
          f"{c['max_position_embeddings']})")
    formats = ", ".join(f"{n} {name}" for name, n in p["linear_formats"].items())
    seqs = "1 sequence" if p["max_num_seqs"] == 1 else f"{p['max_num_seqs']} sequences"
    print(f"for {seqs} (windows decoding at once) of {p['max_model_len']} tokens, "
          f"--quantization {p['quantization']}: linear weights {formats}; KV cache "
          f"{p['kv_cache_dtype']}")
    print(f"\nparameters {_count(pc['total']):>14}")
    print(f"  encoder    {_count(pc['encoder']):>13}  ({e['layers']} x "
          f"{pc['encoder_per_layer']:,}, convs, positions)")
    print(f"  decoder    {_count(pc['decoder']):>13}  ({c['num_layers']} x "
          f"{pc['decoder_per_layer']:,}, embedding {_count(pc['embedding'])} tied to the "
          "lm_head, positions)")
    print("\nmemory")
    print(f"  weights    {_size(wb['total']):>13}  encoder {_size(wb['encoder'])}, decoder "
          f"{_size(wb['decoder'])} (of which the embedding {_size(wb['embedding'])} and "
          f"its packed copy for the logits {_size(wb['lm_head'])})")
    print(f"  KV cache   {_size(kv['bytes']):>13}  self-attention {kv['blocks']} blocks x "
          f"{kv['block_size']} tokens x {kv['bytes_per_token']:,} B/token "
          f"({kv['sequences_at_full_length']:g} sequences at full length; {kv['sized_by']})")
    print(f"             {'':>13}  of which {_size(x['bytes'])} cross-attention pool: "
          f"{x['slots']} slots of {_size(x['bytes_per_slot'])} ({x['layers']} decoder layers' "
          f"K and V of {x['encoder_frames']} encoder frames)")
    print(f"  overhead   {_size(ov['bytes']):>13}  workspace {_size(ov['workspace_bytes'])}, "
          f"process {_size(ov['process_bytes'])}")
    print(f"  total      {_size(p['total_bytes']):>13}")
    _print_fit(p, kv)
    _print_decode(p, "decoder's decode upper bound",
                  lambda s: (f" + cross {s['cross_bytes'] / 1e6:.1f}", ""))
    print("\nassumptions:")
    for line in p["assumptions"]:
        print(f"  - {line}")
