"""Speculative decoding on a hybrid model (Qwen3.5: Gated DeltaNet layers whose
recurrent state takes every verified row): after a rejected draft the state is
restored and the kept tokens computed again, so the output is the output without
speculation, across prefix-cache state checkpoints, n > 1 forks and preemption."""
from __future__ import annotations

import pytest

from armllm import LLM, SamplingParams
from armllm.engine import setup
from tests.engine.spec.oracle import OracleProposer, flat_step_cost, with_oracle
from tests.engine.spec.test_speculative_engine import NGRAM, reference
from tests.model.test_qwen3_5 import ENGINE, IDS, tiny, tokenizer  # noqa: F401 - fixtures

GREEDY = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def oracle_factory():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setup, "build_proposer", lambda *args: OracleProposer({}, 0.0))
        flat_step_cost(patch)
        yield


def tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.mark.parametrize("wrong", [0.0, 0.5, 1.0])
def test_rejected_drafts_restore_the_recurrent_state(tiny, wrong):   # noqa: F811
    path, _ = tiny("dense")
    # the last prompt runs past the 256-token state checkpoint while decoding
    prompts = [IDS[i:i + 30] for i in range(0, 60, 20)] + [IDS + IDS[:100]]
    plain = LLM(path, max_num_seqs=4, **ENGINE)
    want = plain.generate(prompts, GREEDY)
    speculative = LLM(path, max_num_seqs=4, speculative_config=NGRAM, **ENGINE)
    with_oracle(speculative, reference(want), wrong)
    assert tokens(speculative.generate(prompts, GREEDY)) == tokens(want)
    # again, now with the prompts' state checkpoints in the prefix cache
    assert tokens(speculative.generate(prompts, GREEDY)) == tokens(want)
    stats = speculative.engine.speculator.stats
    assert stats.num_proposed > 0
    assert (stats.num_accepted == stats.num_proposed) == (wrong == 0.0)
    runner = speculative.engine.runner
    assert runner.num_spare_states == len(runner._spare_states)   # every snapshot given back


def test_sampled_forks_and_preemption(tiny):   # noqa: F811
    path, _ = tiny("dense")
    prompts = [IDS[i:i + 30] for i in range(0, 80, 10)]
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=4, n=2, ignore_eos=True)
    want = LLM(path, max_num_seqs=16, **ENGINE).generate(prompts, params)
    # too small a cache for every sequence: decodes preempt and recompute
    states, block = 26 * 6 * 1408 * 4, 2 * 2 * 2 * 8 * 32 * 4
    tight = LLM(path, max_num_seqs=16, block_size=8, speculative_config=NGRAM,
                **{**ENGINE, "kv_cache_gib": (states + 40 * block) / 2**30})
    with_oracle(tight, reference(want), 0.4)
    assert tokens(tight.generate(prompts, params)) == tokens(want)
    assert tight.engine.scheduler.num_preemptions > 0
