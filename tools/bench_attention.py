#!/usr/bin/env python3
"""bench_attention: the attention kernel of several variants side by side, on
real models' head shapes, for a prefill chunk and for decode.

    python tools/bench_attention.py [--isa avx512,amx] [--threads 2]
        [--cache bf16,int8] [--tables scrambled,engine] [--model llama-3.2-1b]
        [--min-time 0.5] [--rounds 3] [--long] [--json FILE]

Each case is one attention call per layer over a paged cache (blocks of 16)
holding random K/V: a prefill chunk (its rows attend causally to
themselves) or one decode row per sequence at a given context. Every layer has
its own cache, as in a model, so a decode reads its K/V from wherever a
layer's worth of other data left it (--layers). Variants run interleaved,
--rounds times; each figure is the fastest round's mean time per layer
(this machine is shared: the fastest round is the least disturbed), with the
split-KV scratch the engine passes. A decode case also gives the K/V bytes it
reads over its time, against the read probe (passes before and after the
case, their mean): issue 41's target is 80% of the probe at 4K-32K. An int8
cache's bytes are its rows and their bf16 scales. --cache takes several cache
dtypes, each a column per variant, run interleaved with the variants. --long
adds decode at 4K, 16K and 32K tokens, and 4K x 8 sequences. --tables says
where the blocks of a sequence lie: `scrambled` (the default) in a random
order over the whole cache, `engine` in one run of consecutive blocks a
sequence, as a fresh engine's block pool hands them out to a prompt (several
take a column each, run interleaved like the cache dtypes). The caches are
allocated as the engine's are (written through: huge pages where numpy asks
for them), so a decode reads them as a model's would.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from armllm import ops
from armllm.bench.kernels import cold_bytes

# (name, n_heads, n_kv_heads, head_dim)
SHAPES = [("smollm2-135m", 9, 3, 64), ("llama-3.2-1b", 32, 8, 64), ("llama-3.1-8b", 32, 8, 128)]
# (case, rows per sequence, context after them, sequences)
CASES = [("prefill 1024", 1024, 0, 1), ("prefill 512", 512, 0, 1),
         ("decode ctx 256", 1, 255, 1), ("decode ctx 1024", 1, 1023, 1),
         ("decode ctx 1024 x 8", 1, 1023, 8)]
LONG_CASES = [("decode ctx 4096", 1, 4095, 1), ("decode ctx 16384", 1, 16383, 1),
              ("decode ctx 32768", 1, 32767, 1), ("decode ctx 4096 x 8", 1, 4095, 8)]
BLOCK = 16  # tokens per cache block (the engine's default)
CACHE_DTYPES = {"f32": np.float32, "bf16": np.uint16, "int8": np.int8}
SCALE_BYTES = 2  # an int8 cache row's bf16 scale
TABLES = ("scrambled", "engine")  # where a sequence's blocks lie (--tables)


class Layer:
    """One layer's paged cache and a batch of queries over it."""

    def __init__(self, rng, n_heads, n_kv, hd, rows, ctx, seqs, cache, tables="scrambled"):
        seq_len = rows + ctx
        blocks = -(-seq_len // BLOCK)
        order = (rng.permutation(blocks * seqs) if tables == "scrambled"
                 else np.arange(blocks * seqs))
        self.table = order.astype(np.int32).reshape(seqs, blocks)
        shape = (n_kv, blocks * seqs, BLOCK, hd)   # model/kv_cache.py's layout
        # empty + fill as model/kv_cache.py does (np.zeros would map 4 KiB zero pages)
        self.k, self.v = (filled(shape, CACHE_DTYPES[cache]) for _ in range(2))
        self.k_scale, self.v_scale = ((filled(shape[:3], np.uint16) for _ in range(2))
                                      if cache == "int8" else (None, None))
        for b in range(seqs):
            pos = np.arange(seq_len)
            slots = (self.table[b, pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
            kv = rng.standard_normal((2, seq_len, n_kv * hd)).astype(np.float32)
            ops.kv_write(kv[0], kv[1], slots, self.k, self.v, self.k_scale, self.v_scale)
        self.q = rng.standard_normal((rows * seqs, n_heads * hd)).astype(np.float32)
        self.out = np.empty_like(self.q)
        self.lens = np.full(seqs, seq_len, np.int32)
        self.starts = (np.arange(seqs + 1) * rows).astype(np.int32)
        self.scratch = np.empty(ops.attn_scratch_len(rows * seqs, n_heads, hd, seq_len),
                                np.float32)
        self.n_heads, self.scale = n_heads, hd ** -0.5
        row_bytes = self.k.itemsize * hd + (SCALE_BYTES if cache == "int8" else 0)
        self.kv_bytes = row_bytes * 2 * n_kv * seq_len * seqs   # a decode reads

    def run(self, kernels, pool):
        kernels.attention(self.q, self.k, self.v, self.table, self.lens, self.starts,
                          self.n_heads, self.scale, self.out, 0, self.scratch, pool,
                          k_scale=self.k_scale, v_scale=self.v_scale)


def filled(shape, dtype):
    """A zeroed array written through (its pages mapped now, as the engine's caches)."""
    a = np.empty(shape, dtype)
    a.fill(0)
    return a


def time_layers(kernels, layers, pool, min_time):
    """Mean seconds per layer over at least min_time (and at least 3 passes)."""
    calls, t0 = 0, time.perf_counter()
    while calls < 3 * len(layers) or time.perf_counter() - t0 < min_time:
        for layer in layers:
            layer.run(kernels, pool)
        calls += len(layers)
    return (time.perf_counter() - t0) / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", default=None,
                    help="comma-separated variants (default: avx512 and the selected one)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cache", default="bf16",
                    help="comma-separated KV cache dtypes: f32, bf16, int8 (default bf16)")
    ap.add_argument("--tables", default="scrambled",
                    help="comma-separated block orders: scrambled, engine (default scrambled)")
    ap.add_argument("--model", default=None,
                    help="comma-separated head shapes (default all: "
                         + ", ".join(s[0] for s in SHAPES) + ")")
    ap.add_argument("--layers", type=int, default=16,
                    help="separate caches cycled through (default 16)")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long", action="store_true",
                    help="also decode at 4K, 16K and 32K tokens and 4K x 8 sequences")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    selected = ops.kernels().isa
    isas = args.isa.split(",") if args.isa else list(dict.fromkeys(["avx512", selected]))
    caches = args.cache.split(",")
    orders = args.tables.split(",")
    shapes = [s for s in SHAPES if args.model is None or s[0] in args.model.split(",")]
    if not set(caches) <= set(CACHE_DTYPES):
        print(f"bench_attention: --cache takes {', '.join(CACHE_DTYPES)}", file=sys.stderr)
        return 2
    if not set(orders) <= set(TABLES):
        print(f"bench_attention: --tables takes {', '.join(TABLES)}", file=sys.stderr)
        return 2
    if not shapes:
        print(f"bench_attention: --model takes {', '.join(s[0] for s in SHAPES)}",
              file=sys.stderr)
        return 2
    try:
        variants = dict(zip(isas, (ops.kernels(isa) for isa in isas), strict=True))
    except ValueError as e:
        print(f"bench_attention: {e}", file=sys.stderr)
        return 2
    # the caches: every dtype in every block order, named by what varies
    kinds = [(cache, order) for order in orders for cache in caches]
    kind_name = {k: " ".join(x for x, many in zip(k, (len(caches) > 1, len(orders) > 1),
                                                 strict=True) if many) for k in kinds}
    # the columns: every variant on every cache, named by the variant alone for one cache
    configs = [(isa, kind) for kind in kinds for isa in isas]
    names = [f"{isa} {kind_name[kind]}".strip() for isa, kind in configs]
    pool = ops.ThreadPool(args.threads) if args.threads else ops.get_pool()
    rng = np.random.default_rng(0)
    probe_buf = np.ones(cold_bytes() >> 20 << 20, dtype=np.uint8)

    def read_gbs() -> float:
        t0 = time.perf_counter()
        ops.probe_read(probe_buf, pool)
        return probe_buf.nbytes / (time.perf_counter() - t0) / 1e9

    results = []
    us_labels = [f"{n} us" for n in names]
    ratio_label = f"{names[0]}/{names[-1]}" if len(names) > 1 else None
    # decode: the first variant's K/V read rate on each cache
    gbs_labels = {k: f"{isas[0]} {kind_name[k]} GB/s" if len(kinds) > 1 else "GB/s"
                  for k in kinds}
    print(f"{'model':14} {'case':20}" + "".join(f" {x:>12}" for x in us_labels)
          + (f" {ratio_label:>12}" if ratio_label else "")
          + "".join(f" {x:>6} {'/probe':>6}" for x in gbs_labels.values()))
    for name, n_heads, n_kv, hd in shapes:
        for case, rows, ctx, seqs in CASES + (LONG_CASES if args.long else []):
            layers = {k: [Layer(rng, n_heads, n_kv, hd, rows, ctx, seqs, *k)
                          for _ in range(args.layers if rows == 1 else 2)]
                      for k in kinds}
            best = dict.fromkeys(configs, float("inf"))
            probe = read_gbs()
            for _ in range(args.rounds):
                for isa, kind in configs:
                    t = time_layers(variants[isa], layers[kind], pool, args.min_time)
                    best[isa, kind] = min(best[isa, kind], t)
            probe = (probe + read_gbs()) / 2
            us = {n: best[c] * 1e6 for n, c in zip(names, configs, strict=True)}
            row = {"model": name, "case": case, "us_per_layer": us}
            line = f"{name:14} {case:20}" + "".join(
                f" {us[n]:{max(12, len(x))}.1f}" for n, x in zip(names, us_labels, strict=True))
            if ratio_label:
                line += f" {us[names[0]] / us[names[-1]]:{max(12, len(ratio_label))}.2f}"
            if rows == 1:   # decode: the K/V bytes over the time
                gbs = {k: layers[k][0].kv_bytes / best[isas[0], k] / 1e9 for k in kinds}
                row.update(read_gbs={kind_name[k] or k[0]: round(g, 2) for k, g in gbs.items()},
                           probe_gbs=round(probe, 2))
                line += "".join(f" {gbs[k]:{max(6, len(x))}.1f} {gbs[k] / probe:6.2f}"
                                for k, x in gbs_labels.items())
            print(line, flush=True)
            results.append(row)
            del layers  # this case's caches go before the next case's are written
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": pool.num_threads, "cache": caches, "tables": orders,
                       "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
