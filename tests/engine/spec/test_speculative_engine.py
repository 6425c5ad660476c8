"""Speculative decoding in the engine: whatever share of the drafts is right, the
output is the output without speculation, token for token (greedy, and seeded
sampling, since every draft here is a point mass), with its logprobs, stop
strings, n > 1 completions, penalties, structured outputs, chunked prefill,
prefix caching and preemption; rejected drafts give their KV blocks back; and
a hybrid model's recurrent state is restored after a rejected draft."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.api import LLM
from armllm.engine import setup
from armllm.sampling import SamplingParams
from tests.engine.spec.oracle import OracleProposer, flat_step_cost, with_oracle
from tests.engine.test_structured import SCHEMA
from tests.tiny_model import write_tiny_chat_llama, write_tiny_llama

NGRAM = '{"method": "ngram", "num_speculative_tokens": 5}'
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, top_k=40,
                         repetition_penalty=1.1, presence_penalty=0.3, seed=11,
                         ignore_eos=True, logprobs=3)
# DRY, XTC and bad words: the kernel verifies each draft with the drafts before it as output
WORDS = SamplingParams(max_tokens=24, temperature=0.9, seed=12, dry_multiplier=1.5,
                       dry_allowed_length=1, dry_sequence_breakers=["w17"],
                       xtc_probability=0.6, xtc_threshold=0.02, bad_words=["w5 w6", "w9"],
                       ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module", autouse=True)
def oracle_factory():
    """Engines built here draft with an OracleProposer (set per test by with_oracle)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setup, "build_proposer", lambda *args: OracleProposer({}, 0.0))
        flat_step_cost(patch)
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def plain(model_dir):
    return LLM(model_dir, dtype="float32", kv_cache_gib=0.01)


@pytest.fixture(scope="module")
def speculative(model_dir):
    return LLM(model_dir, dtype="float32", kv_cache_gib=0.01, speculative_config=NGRAM)


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(2, 120, rng.integers(3, 40)))) for _ in range(n)]


def reference(outputs) -> dict:
    """Each completion's output tokens, by (prompt, completion index)."""
    return {(tuple(o.prompt_token_ids), c.index): c.token_ids
            for o in outputs for c in o.outputs}


def generate(llm, ps, params, ids=None):
    return llm.generate(ps, params)


@pytest.mark.parametrize("wrong", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED, WORDS], ids=["greedy", "sampled", "words"])
def test_output_is_the_output_without_speculation(plain, speculative, params, wrong):
    ps = prompts(6)
    ids = [f"r{i}" for i in range(len(ps))]
    want = generate(plain, ps, params, ids)
    oracle = with_oracle(speculative, reference(want), wrong)
    stats = speculative.engine.speculator.stats
    proposed, accepted = stats.num_proposed, stats.num_accepted
    got = generate(speculative, ps, params, ids)
    assert [c.token_ids for o in got for c in o.outputs] == \
        [c.token_ids for o in want for c in o.outputs]
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].text == w.outputs[0].text
        if params.logprobs is not None:
            for (t1, lp1, top1), (t2, lp2, top2) in zip(g.outputs[0].logprobs,
                                                        w.outputs[0].logprobs, strict=True):
                assert t1 == t2 and lp1 == pytest.approx(lp2, abs=1e-4)
                assert [t for t, _ in top1] == [t for t, _ in top2]
    assert stats.num_proposed > proposed, "nothing was drafted"
    if wrong == 0.0:   # every draft right: every one kept
        assert stats.num_accepted - accepted == stats.num_proposed - proposed
    assert oracle.calls and all(c.k <= 5 for c in oracle.calls)
    blocks = speculative.engine.blocks
    assert blocks.num_free == blocks.num_blocks


def test_stop_strings_and_max_tokens_inside_a_draft(plain, speculative):
    ps = prompts(4, seed=3)
    ids = [f"s{i}" for i in range(len(ps))]
    free = generate(plain, ps, GREEDY, ids)
    # a stop string a few words into each output, and a max_tokens that ends mid-draft
    stops = [o.outputs[0].text.split()[3] for o in free]
    params = [SamplingParams(max_tokens=24, temperature=0.0, stop=[s]) for s in stops]
    want = [generate(plain, [p], sp, [i])[0] for p, sp, i in zip(ps, params, ids, strict=True)]
    with_oracle(speculative, reference(free), 0.0)
    got = [generate(speculative, [p], sp, [i])[0]
           for p, sp, i in zip(ps, params, ids, strict=True)]
    for g, w in zip(got, want, strict=True):
        assert (g.outputs[0].text, g.outputs[0].finish_reason) == \
            (w.outputs[0].text, w.outputs[0].finish_reason)
    short = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
    want = generate(plain, ps, short, ids)
    with_oracle(speculative, reference(free), 0.0)
    got = generate(speculative, ps, short, ids)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert all(len(o.outputs[0].token_ids) == 7 for o in got)


def test_parallel_samples(plain, speculative):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, n=3, ignore_eos=True)
    ps = prompts(2, seed=4)
    ids = ["n0", "n1"]
    want = generate(plain, ps, params, ids)
    with_oracle(speculative, reference(want), 0.3)
    got = generate(speculative, ps, params, ids)
    assert [[c.token_ids for c in o.outputs] for o in got] == \
        [[c.token_ids for c in o.outputs] for o in want]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0),
                                      dict(temperature=0.9, top_k=8, seed=3, n=2)])
def test_structured_output_masks_every_verified_row(tmp_path_factory, sampling):
    chat = write_tiny_chat_llama(tmp_path_factory.mktemp("chat"))
    plain = LLM(chat, max_model_len=512, dtype="float32")
    speculative = LLM(chat, max_model_len=512, dtype="float32", speculative_config=NGRAM)
    ps = [plain.engine.tokenizer.encode(t) for t in ("a json object", "give me one", "{")]
    for kind in ({"json": SCHEMA}, {"regex": r"[a-f]{2,4}@\d\d"}):
        params = SamplingParams(max_tokens=60, structured_output=kind, **sampling)
        want = plain.generate(ps, params)
        # wrong drafts that break the grammar are rejected at their row, never emitted
        with_oracle(speculative, reference(want), 0.5)
        got = speculative.generate(ps, params)
        assert [[c.token_ids for c in o.outputs] for o in got] == \
            [[c.token_ids for c in o.outputs] for o in want]
        assert speculative.engine.speculator.stats.num_accepted > 0


@pytest.mark.parametrize("caching", [True, False])
def test_chunked_prefill_prefix_cache_and_preemption(model_dir, plain, caching):
    ps = prompts(5, seed=1)
    ps += [ps[0] + [5, 6, 7]]
    ids = [f"p{i}" for i in range(len(ps))]
    want = generate(plain, ps, GREEDY, ids)
    # 60 tokens of cache: the prompts cannot all run, so decodes preempt and recompute
    small = LLM(model_dir, dtype="float32", block_size=4, max_num_batched_tokens=9,
                kv_cache_gib=60 * 2 * 2 * 2 * 16 * 2 / 2**30, enable_prefix_caching=caching,
                speculative_config=NGRAM)
    oracle = with_oracle(small, reference(want), 0.4)
    got = generate(small, ps, GREEDY, ids)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert small.engine.scheduler.num_preemptions > 0
    assert any(not finished for _, finished in oracle.released)   # preempted ones
    assert small.engine.blocks.num_free == small.engine.blocks.num_blocks


def test_refused_configurations(model_dir):
    for bad, why in (('{"method": "nope"}', "method"),
                     ('{"method": "ngram", "num_speculative_tokens": 0}',
                      "num_speculative_tokens"),
                     ('{"method": "draft_model"}', "model"),
                     ("ngram", "JSON")):
        with pytest.raises(ValueError, match=why):
            LLM(model_dir, dtype="float32", kv_cache_gib=0.01, speculative_config=bad)
