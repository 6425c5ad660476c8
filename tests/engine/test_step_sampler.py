"""The engine's batched sampling (engine/sampler.py) against sample.h's definition
written out in numpy (tests/kernels/sample_spec.py): every token a batch of requests
with mixed parameters emits is the reference's token for the very logits row the
engine sampled (recorded before the kernel edits it), its seed, completion index
and output position, its prompt and output so far (penalties) and its logit
bias; logprobs too. And a seed's tokens do not depend on the batch around it."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.api import LLM
from armllm.sampling import SamplingParams
from tests.kernels.sample_spec import RowParams, sample_row
from tests.tiny_model import write_tiny_llama

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.0, repetition_penalty=1.5, logprobs=3),
    dict(temperature=1.0, seed=11),
    dict(temperature=0.7, top_p=0.9, min_p=0.05, seed=12, logprobs=0),
    dict(temperature=1.3, top_k=7, seed=13, frequency_penalty=0.8, presence_penalty=0.4),
    dict(temperature=0.9, top_p=0.5, top_k=30, seed=14, logit_bias={7: 3.0, 9: -100.0}),
    dict(temperature=1.0, seed=15, n=3, repetition_penalty=1.2, logprobs=5),
    dict(temperature=0.9, seed=16, dry_multiplier=0.8, dry_allowed_length=1, logprobs=2,
         dry_sequence_breakers=["w30", "w7"], xtc_probability=0.7, xtc_threshold=0.05,
         bad_words=["w3 w4", "w41"]),
    dict(temperature=0.0, dry_multiplier=2.0, dry_base=3.0, dry_allowed_length=0,
         dry_penalty_last_n=6, bad_words=["w9"]),
]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write_tiny_llama(tmp_path_factory.mktemp("tiny")), dtype="float32",
               kv_cache_gib=0.02)


def record_rows(llm):
    """Wraps the runner's sample(): every job's rows as they were before sampling,
    with the completion's output length then. Returns the list it appends to."""
    seen = []
    sample = llm.engine.runner.sample

    def recording(jobs, logits, masks):
        for job in jobs:
            seen.append((job.seq, len(job.seq.output_ids), np.array(job.rows[0])))
        sample(jobs, logits, masks)

    llm.engine.runner.sample = recording
    return seen


def sequences(seq_list) -> list[list[int]]:
    """The id sequences of a sequence list (sample.h's layout)."""
    if seq_list is None:
        return []
    flat = seq_list.tolist()
    return [flat[at + 1:at + 1 + flat[at]] for at in flat[1:1 + flat[0]]]


def reference(seq, position: int, row: np.ndarray, llm):
    p = seq.params
    history = seq.prompt_ids + seq.output_ids[:position]
    uses_history = p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty \
        or p.kernel_only
    words = llm.engine.words
    result = sample_row(row, RowParams(
        temperature=p.temperature, top_k=max(p.top_k, 0), top_p=p.top_p, min_p=p.min_p,
        repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty, history=history if uses_history else [],
        prompt_len=len(seq.prompt_ids) if uses_history else 0,
        bias=list((p.logit_bias or {}).items()),
        num_logprobs=-1 if p.logprobs is None else p.logprobs,
        seed=p.seed or 0, stream=seq.index, counter=position,
        bad_words=sequences(words.bad_words(tuple(p.bad_words)) if p.bad_words else None),
        dry_multiplier=p.dry_multiplier if p.dry else 0.0, dry_base=p.dry_base,
        dry_allowed_length=p.dry_allowed_length, dry_last_n=p.dry_penalty_last_n,
        dry_breakers=sequences(words.breakers(tuple(p.dry_sequence_breakers))),
        xtc_probability=p.xtc_probability, xtc_threshold=p.xtc_threshold))
    n = p.logprobs or 0
    return result.token, result.logprob, list(zip(result.top_ids[:n].tolist(),
                                                  result.top_logprobs[:n].tolist(),
                                                  strict=True))


def test_a_mixed_batch_samples_as_defined(llm):
    seen = record_rows(llm)
    prompts = [[5, 6, 7, 8], [9, 9, 9], [20, 21], [30] * 10, [3, 4, 5, 6, 7], [40, 41, 42],
               [50, 51, 52, 53], [3, 4, 5, 3, 4, 5, 30, 3, 4], [9, 8, 9, 8, 9, 8]]
    params = [SamplingParams(max_tokens=10, ignore_eos=True, **kw) for kw in SETTINGS]
    outs = {}
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        llm.engine.add_request(f"r{i}", prompt, p)
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            outs.setdefault((o.request_id, o.index), []).extend(o.logprobs)
    checked = 0
    for seq, position, row in seen:
        if seq.params.temperature > 0 and seq.params.seed is None:
            continue
        token, logprob, top = reference(seq, position, row, llm)
        assert seq.output_ids[position] == token, (seq.params, position)
        if seq.params.logprobs is not None:
            got_token, got_logprob, got_top = outs[seq.key][position]
            assert got_token == token and got_logprob == pytest.approx(logprob, abs=1e-6)
            assert [t for t, _ in got_top] == [t for t, _ in top]
            assert np.allclose([v for _, v in got_top], [v for _, v in top], atol=1e-6)
        checked += 1
    assert checked == sum(10 * p.n for p in params)


def test_a_seeds_tokens_do_not_depend_on_the_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=3,
                            ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], params)[0].token_ids
    others = SamplingParams(max_tokens=20, temperature=1.2, ignore_eos=True)
    llm.engine.add_request("other-1", [8, 9], others)
    llm.engine.add_request("other-2", [10, 11, 12, 13], others)
    together = llm.generate([[5, 6, 7]], params)[0].token_ids
    assert together == alone


def test_logit_bias_bans_and_forces(llm):
    prompt = [5, 6, 7]
    free = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0,
                                                 ignore_eos=True))[0].token_ids
    banned = llm.generate([prompt], SamplingParams(
        max_tokens=6, temperature=0.0, ignore_eos=True,
        logit_bias={t: -100.0 for t in set(free)}))[0].token_ids
    assert not set(banned) & set(free)
    forced = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=1.0, seed=1,
                                                   logit_bias={42: 100.0}))[0].token_ids
    assert forced == [42] * 4


def test_a_logit_bias_outside_the_vocabulary_is_refused(llm):
    vocab = llm.engine.loaded.config.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias token id {vocab} is outside"):
        llm.generate([[5]], SamplingParams(logit_bias={vocab: 1.0}))


def test_dry_and_bad_words_change_a_repetitive_greedy_output(llm):
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    free = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0,
                                                 ignore_eos=True))[0].token_ids
    # the tiny tokenizer's tokens are words: ban the free output's first one
    banned = llm.generate([prompt], SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True,
        bad_words=[llm.engine.tokenizer.decode([free[0]])]))[0].token_ids
    assert free[0] not in banned
    dry = llm.generate([prompt], SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, dry_multiplier=100.0,
        dry_allowed_length=1))[0].token_ids
    ids = prompt + dry
    # allowed length 1: no token follows a token the way it did before (a penalty of
    # 100 or more is never overcome by the tiny model's logits)
    for end in range(len(prompt), len(ids)):
        before, t = ids[:end], ids[end]
        assert all(not (before[j] == before[-1] and before[j + 1] == t)
                   for j in range(len(before) - 1)), (end, ids)
    assert dry != free
