"""Every speculative method end to end in the engine, with its real proposer: the
output is the output without speculation (greedy, and seeded sampling), drafts
are proposed and some kept, and --speculative-config's methods refuse models
they cannot run on."""
from __future__ import annotations

import pytest

from armllm import LLM, SamplingParams
from tests.engine.spec.oracle import flat_step_cost
from tests.model.test_qwen3_5 import ENGINE, IDS, tiny, tokenizer  # noqa: F401 - fixtures
from tests.tiny_model import write_tiny_llama

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=40, temperature=0.8, top_k=20, seed=9, ignore_eos=True)


def outputs(llm, prompts, params):
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def spec(method: str, **fields) -> dict:
    return {"method": method, "num_speculative_tokens": 4, **fields}


@pytest.fixture(scope="module", autouse=True)
def free_verify_rows():
    """Drafts are worth their rows here, however loaded the machine (oracle.py)."""
    with pytest.MonkeyPatch.context() as patch:
        flat_step_cost(patch)
        yield


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"))


# a prompt that repeats itself, so that lookups find what follows
REPEATING = [5, 6, 7, 8, 9, 10, 11, 12] * 6


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_lookups(llama_dir, method):
    prompts = [REPEATING, [3, 4, 5, 6, 7] * 4, list(range(20, 50))]
    plain = LLM(llama_dir, dtype="float32", kv_cache_gib=0.01)
    speculative = LLM(llama_dir, dtype="float32", kv_cache_gib=0.01,
                      speculative_config=spec(method, prompt_lookup_min=1))
    for params in (GREEDY, SAMPLED):
        want = outputs(plain, prompts, params)
        assert outputs(speculative, prompts, params) == want
        # again: a suffix tree now holds these outputs, and drafts them whole
        before = speculative.stats()
        assert outputs(speculative, prompts, params) == want
        after = speculative.stats()
        assert after.spec_draft_tokens > before.spec_draft_tokens
        if method == "suffix":
            assert after.spec_accepted_tokens - before.spec_accepted_tokens > \
                sum(len(c) for o in want for c in o) // 2


@pytest.mark.parametrize("config", [spec("self_draft", draft_layers=1),
                                    spec("self_draft", draft_layers=2)],
                         ids=["self_draft-1", "self_draft-all"])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_model_drafts_on_a_dense_model(llama_dir, config, params):
    prompts = [REPEATING, [3, 4, 5, 6, 7], list(range(20, 50))]
    plain = LLM(llama_dir, dtype="float32", kv_cache_gib=0.01)
    speculative = LLM(llama_dir, dtype="float32", kv_cache_gib=0.01,
                      speculative_config=config)
    assert outputs(speculative, prompts, params) == outputs(plain, prompts, params)
    stats = speculative.stats()
    assert stats.spec_draft_tokens > 0
    if config["draft_layers"] == 2 and params is GREEDY:   # the whole model drafts itself
        assert stats.spec_accepted_tokens == stats.spec_draft_tokens


def test_an_int8_cache_drafts_and_verifies(llama_dir):
    """int8 caches in the target and its draft (the whole model, drafting itself): the
    output is the int8 engine's without speculation, and every draft is kept."""
    prompts = [REPEATING, [3, 4, 5, 6, 7], list(range(20, 50))]
    kw = dict(dtype="float32", kv_cache_dtype="int8", kv_cache_gib=0.01)
    plain = LLM(llama_dir, **kw)
    speculative = LLM(llama_dir, **kw, speculative_config=spec("self_draft", draft_layers=2))
    assert outputs(speculative, prompts, GREEDY) == outputs(plain, prompts, GREEDY)
    stats = speculative.stats()
    assert stats.spec_accepted_tokens == stats.spec_draft_tokens > 0


def test_a_draft_checkpoint(llama_dir):
    plain = LLM(llama_dir, dtype="float32", kv_cache_gib=0.01)
    speculative = LLM(llama_dir, dtype="float32", kv_cache_gib=0.01,
                      speculative_config=spec("draft_model", model=str(llama_dir)))
    prompts = [REPEATING, [3, 4, 5]]
    assert outputs(speculative, prompts, GREEDY) == outputs(plain, prompts, GREEDY)
    stats = speculative.stats()
    assert stats.spec_accepted_tokens == stats.spec_draft_tokens > 0


@pytest.mark.parametrize("config", [spec("mtp"), spec("self_draft", draft_layers=4)],
                         ids=["mtp", "self_draft"])
def test_hybrid_model_drafts(tiny, config):   # noqa: F811
    path, _ = tiny("dense")
    prompts = [IDS[:40], IDS[50:60] * 3]
    plain = LLM(path, max_num_seqs=4, **ENGINE)
    speculative = LLM(path, max_num_seqs=4, speculative_config=config, **ENGINE)
    for params in (GREEDY, SAMPLED):
        assert outputs(speculative, prompts, params) == outputs(plain, prompts, params)
    assert speculative.stats().spec_draft_tokens > 0


def test_methods_refuse_models_they_cannot_run(llama_dir):
    with pytest.raises(ValueError, match="multi-token-prediction layers"):
        LLM(llama_dir, dtype="float32", kv_cache_gib=0.01, speculative_config=spec("mtp"))
    with pytest.raises(ValueError, match="draft_layers"):
        LLM(llama_dir, dtype="float32", kv_cache_gib=0.01,
            speculative_config=spec("self_draft", draft_layers=9))
