"""TTFT of a long shared prefix after a restart, with the prefix cache on disk
(--prefix-cache-dir), against a cold prefill of the same prompt.

One process: engine 1 (an empty prefix-cache folder) runs prefix + suffix A
(cold: its TTFT is the whole prefill), then shuts down, which writes its
cached blocks; engine 2 starts on the same folder and runs prefix + suffix B,
whose prefix blocks it loads from disk. Both ask for one token; TTFT is the
request's arrival to its first token (RequestMetrics.ttft_s). The issue's
target: restart TTFT <= 0.2x the cold one for a 4K-token prefix on a 1B shape.

    python tools/bench_prefix_store.py /work/synth/llama-3.2-1b/llama-3.2-1b-Q4_0.gguf
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from armllm.api import LLM
from armllm.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prefix-len", type=int, default=4096)
    ap.add_argument("--suffix-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dir", default=None, help="the prefix-cache folder (default: a new "
                    "temporary one)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    prefix = list(map(int, rng.integers(100, 20000, a.prefix_len)))
    suffixes = [list(map(int, rng.integers(100, 20000, a.suffix_len))) for _ in range(2)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    folder = a.dir or tempfile.mkdtemp(prefix="armllm-prefix-")
    kw = dict(max_model_len=a.prefix_len + a.suffix_len + 16, prefix_cache_dir=folder,
              threads=a.threads, kv_cache_gib=1.0)
    results = []
    for run, suffix in zip(("cold", "restart"), suffixes, strict=True):
        t0 = time.monotonic()
        llm = LLM(a.model, **kw)
        loaded = time.monotonic() - t0
        out = llm.generate(prefix + suffix, one)[0].outputs[0]
        m = out.metrics
        t0 = time.monotonic()
        llm.shutdown()
        results.append(m.ttft_s)
        print(f"{run:8s} TTFT {m.ttft_s:8.3f} s  prompt {m.num_prompt_tokens} tokens, "
              f"{m.num_cached_prompt_tokens} from the prefix cache "
              f"({llm.engine.blocks.disk_hits} blocks from disk); load {loaded:.1f} s, "
              f"shutdown {time.monotonic() - t0:.2f} s", flush=True)
    size = sum(f.stat().st_size for f in os.scandir(next(os.scandir(folder)).path))
    print(f"restart / cold TTFT: {results[1] / results[0]:.3f}  ({size / 2**20:.0f} MiB of "
          f"blocks in {folder})")


if __name__ == "__main__":
    main()
