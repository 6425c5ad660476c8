"""SuffixProposer: drafts equal a naive count over the request's tokens and the
cached outputs, call after call (growth, rewritten tails, preemption, requests
finishing and being evicted), and equal a proposer rebuilt from scratch; the
spec-factor, min-probability and depth caps; eviction order; and an agent loop
that repeats its tool-call JSON gets long accepted drafts."""
from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armllm.engine.spec import suffix
from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.history import CHECK_WINDOW
from armllm.engine.spec.proposer import NO_DRAFT, ProposeInput
from armllm.engine.spec.suffix import SuffixProposer
from armllm.sampling import SamplingParams
from tests.engine.spec.test_suffix_tree import check_tree, reference_draft


def config(k=4, depth=24, cached=1000, factor=1.0, min_prob=0.1) -> SpeculativeConfig:
    return SpeculativeConfig(method="suffix", num_speculative_tokens=k,
                             suffix_decoding_max_tree_depth=depth,
                             suffix_decoding_max_cached_requests=cached,
                             suffix_decoding_max_spec_factor=factor,
                             suffix_decoding_min_token_prob=min_prob)


def ask(proposer, key, token_ids, k, num_prompt=0) -> list[int]:
    inp = ProposeInput(key, list(token_ids), num_prompt=num_prompt, start=0,
                       num_kept=len(token_ids), k=k, params=SamplingParams())
    return proposer.propose([inp])[0].tokens


def finish(proposer, key, prompt, output) -> None:
    ask(proposer, key, prompt + output, 0, num_prompt=len(prompt))
    proposer.release(key, prompt + output, finished=True)


def reference(context, outputs, k, cfg: SpeculativeConfig) -> list[int]:
    """Every suffix of the context (shorter than the depth cap) in the request's own
    tokens, then in the cached outputs, longest first; the greedy most-frequent
    draft from each, capped; the highest summed probability wins, the first on a tie."""
    depth = cfg.suffix_decoding_max_tree_depth
    k = min(k, cfg.num_speculative_tokens)
    best, best_score = [], 0.0
    for seqs in ([context], outputs):
        for match_len in range(min(depth - 1, len(context)), 0, -1):
            most = min(k, int(match_len * cfg.suffix_decoding_max_spec_factor + 1e-6),
                       depth - match_len)
            if most <= 0:
                continue
            tokens, score = reference_draft(seqs, context[-match_len:], most,
                                            cfg.suffix_decoding_min_token_prob, depth)
            if score > best_score:
                best, best_score = tokens, score
    return best


def test_own_history_and_finished_outputs_both_draft():
    proposer = SuffixProposer(config())
    # its own prompt: "1 2 3" occurred, followed by 4 5 6
    # (a match of 3 tokens drafts at most 3 at spec factor 1)
    assert ask(proposer, ("a", 0), [1, 2, 3, 4, 5, 6, 0, 1, 2, 3], 4, num_prompt=6) == \
        [4, 5, 6]
    finish(proposer, ("a", 0), [1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 7, 7, 7, 8, 8])
    # another request whose context ends in "3 7 7" finds the first one's output
    assert ask(proposer, ("b", 0), [9, 3, 7, 7], 4, num_prompt=2) == [7, 8, 8]
    assert proposer.draft_seconds == 0.0 and proposer.wants_hidden is False


def test_draft_length_is_capped_by_spec_factor_times_match_and_by_k():
    for factor, expected in ((1.0, [3, 4]), (0.5, [3]), (2.0, [3, 4, 5, 6]),
                             (10.0, [3, 4, 5, 6, 7])):
        proposer = SuffixProposer(config(k=5, factor=factor))
        finish(proposer, ("done", 0), [], [1, 2, 3, 4, 5, 6, 7, 8, 9])
        # "1 2" is the longest match (length 2)
        assert ask(proposer, ("r", 0), [0, 1, 2], 16) == expected, factor


def test_draft_length_is_capped_by_the_tree_depth():
    proposer = SuffixProposer(config(k=8, depth=5, factor=4.0))
    finish(proposer, ("done", 0), [], [1, 2, 3, 4, 5, 6, 7, 8, 9])
    # match "1 2 3" (3 tokens) leaves 2 in a depth-5 tree; match "2 3" leaves 3,
    # and "3" alone leaves 4: the longest draft wins, from the shortest match
    assert ask(proposer, ("r", 0), [0, 1, 2, 3], 8) == [4, 5, 6, 7]


def test_min_token_prob_stops_a_draft_at_an_uncertain_token():
    outputs = [[1, 2, 3, 4]] * 3 + [[1, 2, 5, 6]]
    for min_prob, expected in ((0.8, []), (0.7, [3, 4]), (0.0, [3, 4])):
        proposer = SuffixProposer(config(min_prob=min_prob))
        for i, output in enumerate(outputs):
            finish(proposer, ("done", i), [], output)
        # after "1 2": 3 in three of four outputs (0.75), then 4 surely
        assert ask(proposer, ("r", 0), [0, 1, 2], 4) == expected, min_prob


def test_cached_outputs_are_evicted_oldest_first_and_their_paths_go():
    cfg = config(cached=2)
    proposer = SuffixProposer(cfg)
    outputs = {"a": [1, 1, 2, 2], "b": [3, 3, 4, 4], "c": [5, 5, 6, 6]}
    for name, output in outputs.items():
        finish(proposer, (name, 0), [9], output)
    assert proposer.cached_keys == [("b", 0), ("c", 0)]
    check_tree(proposer._shared, [], [outputs["b"], outputs["c"]])
    assert ask(proposer, ("q", 0), [9, 1], 2) == []        # a's continuations went
    assert ask(proposer, ("q2", 0), [3, 3], 2) == [4, 4]
    # finishing again under a cached key refreshes it: now c is the oldest
    finish(proposer, ("b", 0), [9], [7, 7, 8])
    assert proposer.cached_keys == [("c", 0), ("b", 0)]
    check_tree(proposer._shared, [], [outputs["c"], [7, 7, 8]])
    finish(proposer, ("d", 0), [9], [0, 0])
    assert proposer.cached_keys == [("b", 0), ("d", 0)]


def test_the_token_cap_evicts_too(monkeypatch):
    monkeypatch.setattr(suffix, "MAX_CACHED_TOKENS", 6)
    proposer = SuffixProposer(config())
    finish(proposer, ("a", 0), [], [1, 2, 3])
    finish(proposer, ("b", 0), [], [4, 5, 6])
    finish(proposer, ("c", 0), [], [7, 8])
    assert proposer.cached_keys == [("b", 0), ("c", 0)]


def test_preempted_unseen_and_empty_outputs_are_not_cached():
    proposer = SuffixProposer(config())
    ask(proposer, ("p", 0), [1, 2, 3, 4], 0, num_prompt=2)
    proposer.release(("p", 0), [1, 2, 3, 4], finished=False)
    proposer.release(("never", 0), [1, 2, 3], finished=True)
    finish(proposer, ("empty", 0), [1, 2], [])
    assert proposer.cached_keys == [] and not proposer._requests
    assert proposer.propose([ProposeInput(("x", 0), [1, 2, 1], 1, 0, 3, 0,
                                          SamplingParams())]) == [NO_DRAFT]
    proposer.close()
    assert not proposer._requests and proposer.cached_keys == []


@st.composite
def engine_calls(draw):
    """What the engine sends one proposer for two requests running side by side:
    one grows by 0..5 tokens, has a tail rewritten (within what one verify step
    writes), is preempted and comes back as anything, or finishes, and a new
    request takes its place."""
    def new_request():
        prompt_len = draw(st.integers(0, 6))
        tokens = draw(st.lists(st.integers(0, 3), min_size=prompt_len + 1,
                               max_size=prompt_len + 8))
        return prompt_len, tokens

    calls = []
    running = {0: new_request(), 1: new_request()}    # request number -> its state
    next_request = 2
    for _ in range(draw(st.integers(1, 30))):
        request = draw(st.sampled_from(sorted(running)))
        prompt_len, tokens = running[request]
        action = draw(st.sampled_from(["grow"] * 4 + ["rewrite", "preempt", "finish"]))
        if action == "finish":
            calls.append(("finish", request, prompt_len, list(tokens), 0))
            del running[request]
            request, next_request = next_request, next_request + 1
            prompt_len, tokens = new_request()
        elif action == "rewrite":
            cut = draw(st.integers(max(prompt_len + 1, len(tokens) - CHECK_WINDOW),
                                   len(tokens)))
            tokens = tokens[:cut]
        elif action == "preempt":
            calls.append(("preempt", request, prompt_len, list(tokens), 0))
            tokens = tokens[:prompt_len] + draw(st.lists(st.integers(0, 3), min_size=1,
                                                         max_size=len(tokens)))
        tokens = tokens + draw(st.lists(st.integers(0, 3), max_size=5))
        running[request] = prompt_len, tokens
        calls.append(("propose", request, prompt_len, list(tokens), draw(st.integers(0, 6))))
    return calls


@settings(max_examples=80, deadline=None)
@given(calls=engine_calls(), depth=st.integers(2, 7), cached=st.integers(1, 3),
       factor=st.sampled_from([0.5, 1.0, 3.0]), min_prob=st.sampled_from([0.0, 0.3]))
def test_incremental_drafts_match_a_naive_count_and_a_rebuilt_proposer(
        calls, depth, cached, factor, min_prob):
    cfg = config(k=5, depth=depth, cached=cached, factor=factor, min_prob=min_prob)
    proposer = SuffixProposer(cfg)
    cached_outputs: OrderedDict = OrderedDict()    # what the shared tree should hold
    finished = []                                  # (key, prompt, output) in order
    proposed = set()               # requests the proposer knows the prompt length of
    for action, request, prompt_len, token_ids, k in calls:
        key = (f"r{request}", 0)
        if action == "preempt":
            proposer.release(key, token_ids, finished=False)
            proposed.discard(key)
            continue
        if action == "finish":
            proposer.release(key, token_ids, finished=True)
            if key in proposed and token_ids[prompt_len:]:
                cached_outputs.pop(key, None)
                cached_outputs[key] = token_ids[prompt_len:]
                while len(cached_outputs) > cached:
                    cached_outputs.popitem(last=False)
                finished.append((key, token_ids[:prompt_len], token_ids[prompt_len:]))
            continue
        got = ask(proposer, key, token_ids, k, num_prompt=prompt_len)
        proposed.add(key)
        assert got == reference(token_ids, list(cached_outputs.values()), k, cfg)
        rebuilt = SuffixProposer(cfg)
        for done_key, prompt, output in finished:
            finish(rebuilt, done_key, prompt, output)
        assert got == ask(rebuilt, key, token_ids, k, num_prompt=prompt_len)
    assert proposer.cached_keys == list(cached_outputs)
    check_tree(proposer._shared, [], list(cached_outputs.values()))


def simulate(proposer, key, prompt, output, k) -> list[int]:
    """Greedy decoding with verification against the known output: per step, how
    many draft tokens were accepted (the target adds one of its own each step)."""
    accepted = []
    produced = 1
    while produced < len(output):
        draft = ask(proposer, key, prompt + output[:produced], k, num_prompt=len(prompt))
        truth = output[produced:produced + len(draft)]
        num = 0
        while num < len(truth) and draft[num] == truth[num]:
            num += 1
        accepted.append(num)
        produced += num + 1
    proposer.release(key, prompt + output, finished=True)
    return accepted


def agent_turns(rng: random.Random, num_calls: int) -> list[int]:
    """An agent's output: tool calls in one JSON template (24 fixed tokens, two
    argument tokens that change per call, 8 fixed), each followed by a four-token
    remark that is new every time."""
    out = []
    for _ in range(num_calls):
        out += list(range(100, 124)) + [rng.randrange(200, 300) for _ in range(2)]
        out += list(range(500, 508)) + [rng.randrange(300, 400) for _ in range(4)]
    return out


def test_an_agent_loop_gets_long_accepted_drafts():
    rng = random.Random(0)
    k = 4
    proposer = SuffixProposer(config(k=k))
    prompt = [rng.randrange(1000, 2000) for _ in range(50)]
    accepted = simulate(proposer, ("loop", 0), prompt, agent_turns(rng, 12), k)
    later = accepted[len(accepted) // 3:]
    # 6 of every 38 tokens are new each call (they are never drafted right, and the
    # token after each starts a short match): 2.6 tokens per step measured
    assert (sum(later) + len(later)) / len(later) >= 2.4
    assert later.count(k) >= 3 * 8        # the fixed head goes in full drafts
    # the next request starts with the loop's outputs cached: its first call is
    # drafted from them
    first = simulate(proposer, ("next", 0), [rng.randrange(1000, 2000) for _ in range(20)],
                     agent_turns(rng, 1), k)
    assert sum(first) >= 20


@pytest.mark.parametrize("depth", [8, 24])
def test_a_request_that_repeats_exactly_is_drafted_at_full_length(depth):
    proposer = SuffixProposer(config(k=4, depth=depth))
    block = list(range(10, 40))
    accepted = simulate(proposer, ("rep", 0), [1, 2, 3], block * 4, 4)
    # the first block is new (a step a token); after it, the match is long enough
    # for k = 4 at once after a step or two, and every draft is right
    # (the output's first token comes with the prompt's step, so the 30th step
    # makes the second block's first token)
    first_block_steps = len(block)
    assert accepted[:first_block_steps] == [0] * first_block_steps
    assert accepted[first_block_steps:first_block_steps + 2] == [1, 3]   # match 1, then 3
    assert set(accepted[first_block_steps + 2:-1]) == {4}    # the last meets the end
