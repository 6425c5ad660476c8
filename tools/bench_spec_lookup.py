#!/usr/bin/env python3
"""bench_spec_lookup: what the lookup proposers (engine/spec/ngram.py, suffix.py)
cost on the engine thread, without a model. Token streams are synthetic:

  zipf    natural-text-like: tokens drawn from a Zipf(1.1) law over a 32k vocabulary
  loop    an agent loop: a 60-token tool-call template with 3 changing tokens and
          a 10-token new remark, over and over

For each, a sequence is prefilled to CONTEXT tokens (in 512-token chunks, k = 0),
then decoded as the engine does: each call adds `accept + 1` tokens (the kept
draft and the target's own) and asks for k = 4. Reported: microseconds per
propose call (median of REPEATS runs of CALLS calls), the prefill's indexing cost
per token, and Python heap bytes per context token. For suffix, also the cost of
a finished output joining the shared tree and of the oldest one leaving it, with
CACHED outputs cached. suffix+ is suffix decoding with WARM outputs of the same
stream already in the shared tree (its matches there move on every token too).

    python tools/bench_spec_lookup.py [--context 8192] [--calls 2000] [--repeats 5]
        [--cached 200] [--output-len 500] [--warm 20]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.ngram import NgramProposer
from armllm.engine.spec.proposer import Draft, ProposeInput
from armllm.engine.spec.suffix import SuffixProposer
from armllm.sampling import SamplingParams

VOCAB = 32000
CHUNK = 512            # prefill chunk the engine would observe at a time
K = 4


def zipf_tokens(rng: random.Random, count: int) -> list[int]:
    weights = [1.0 / (rank ** 1.1) for rank in range(1, VOCAB + 1)]
    return rng.choices(range(VOCAB), weights=weights, k=count)


def loop_tokens(rng: random.Random, count: int) -> list[int]:
    out: list[int] = []
    template = [rng.randrange(VOCAB) for _ in range(60)]
    while len(out) < count:
        call = list(template)
        for at in (20, 21, 45):
            call[at] = rng.randrange(VOCAB)
        out += call + [rng.randrange(VOCAB) for _ in range(10)]
    return out[:count]


STREAMS = {"zipf": zipf_tokens, "loop": loop_tokens}


def make(method: str):
    config = SpeculativeConfig(method=method, num_speculative_tokens=K)
    return NgramProposer(config) if method == "ngram" else SuffixProposer(config)


def ask(proposer, key, token_ids: list[int], k: int, num_prompt: int) -> list[int]:
    inp = ProposeInput(key, token_ids, num_prompt, 0, 0, k, SamplingParams())
    return proposer.propose([inp])[0].tokens


def decode(propose, tokens: list[int], context: int, calls: int, key):
    """The engine's side of `calls` decode steps: each call keeps the right part of
    the draft and the target's own token, and asks for k more. Returns the drafts
    and the draft tokens accepted in all."""
    token_ids = tokens[:context]        # the list the engine keeps, growing in place
    at = context
    params = SamplingParams()
    drafts = []
    accepted_total = 0
    for _ in range(calls):
        draft = propose([ProposeInput(key, token_ids, context, 0, 0, K, params)])[0].tokens
        drafts.append(draft)
        truth = tokens[at:at + len(draft) + 1]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == truth[accepted]:
            accepted += 1
        accepted_total += accepted
        token_ids.extend(tokens[at:at + accepted + 1])
        at += accepted + 1
    return drafts, accepted_total


def warm(proposer, outputs: list[list[int]]) -> None:
    """Finished requests' outputs into the shared tree (suffix only)."""
    for i, output in enumerate(outputs):
        ask(proposer, ("done", i), [1] + output, 0, 1)
        proposer.release(("done", i), [1] + output, finished=True)


def run_once(method: str, tokens: list[int], context: int, calls: int,
             cached_outputs: list[list[int]] = ()):
    """Prefill `context` tokens in chunks, then `calls` decode calls. Returns
    (prefill seconds per token, proposer seconds per decode call, draft tokens
    accepted per call). CPU time of this process (the box is shared); the engine
    side's own cost is measured by replaying the same drafts without the proposer
    and taken off."""
    proposer = make(method)
    warm(proposer, cached_outputs)
    key = ("bench", 0)
    start = time.process_time()
    for end in range(CHUNK, context + 1, CHUNK):
        ask(proposer, key, tokens[:end], 0, context)
    prefill = (time.process_time() - start) / context
    start = time.process_time()
    drafts, accepted = decode(proposer.propose, tokens, context, calls, key)
    with_proposer = time.process_time() - start
    replay = iter(drafts)
    start = time.process_time()
    decode(lambda inputs: [Draft(next(replay))], tokens, context, calls, key)
    engine_side = time.process_time() - start
    return prefill, (with_proposer - engine_side) / calls, accepted / calls


def heap_bytes_per_token(method: str, tokens: list[int], context: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    proposer = make(method)
    ask(proposer, ("mem", 0), tokens[:context], 0, context)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del proposer
    return used / context


def shared_cache_costs(rng: random.Random, cached: int, output_len: int):
    """Seconds to add one finished output to a shared tree holding `cached` others
    (and drop the oldest), per output token; Python heap bytes per cached token."""
    config = SpeculativeConfig(method="suffix", num_speculative_tokens=K,
                               suffix_decoding_max_cached_requests=cached)
    proposer = SuffixProposer(config)
    outputs = [zipf_tokens(rng, output_len) for _ in range(cached)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    warm(proposer, outputs)
    heap = (tracemalloc.get_traced_memory()[0] - base) / (cached * output_len)
    tracemalloc.stop()
    times = []
    for i in range(cached, cached + 20):
        output = zipf_tokens(rng, output_len)
        ask(proposer, ("done", i), [1] + output, 0, 1)
        t0 = time.process_time()
        proposer.release(("done", i), [1] + output, finished=True)   # insert + evict
        times.append(time.process_time() - t0)
    return statistics.median(times) / output_len, heap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cached", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=500)
    parser.add_argument("--warm", type=int, default=20,
                        help="outputs of the same stream cached first for suffix+")
    args = parser.parse_args()
    rng = random.Random(0)
    print(f"context {args.context}, k {K}, {args.calls} decode calls x {args.repeats}")
    print(f"{'method':7} {'stream':6} {'us/call':>8} {'accepted/call':>14} "
          f"{'prefill us/tok':>15} {'heap B/tok':>11}")
    for stream, generate in STREAMS.items():
        tokens = generate(rng, args.context + 8 * args.calls)
        cached_outputs = [generate(rng, args.output_len) for _ in range(args.warm)]
        for method in ("ngram", "suffix", "suffix+"):
            runs = [run_once(method.rstrip("+"), list(tokens), args.context, args.calls,
                             cached_outputs if method.endswith("+") else ())
                    for _ in range(args.repeats)]
            prefill = statistics.median(r[0] for r in runs)
            per_call = statistics.median(r[1] for r in runs)
            heap = heap_bytes_per_token(method.rstrip("+"), tokens, args.context)
            print(f"{method:7} {stream:6} {per_call * 1e6:8.2f} {runs[0][2]:14.2f} "
                  f"{prefill * 1e6:15.2f} {heap:11.0f}")
    per_token, heap = shared_cache_costs(rng, args.cached, args.output_len)
    print(f"suffix shared tree, {args.cached} cached outputs of {args.output_len} tokens: "
          f"insert + evict {per_token * 1e6:.1f} us per output token, "
          f"heap {heap:.0f} B per cached token")


if __name__ == "__main__":
    main()
