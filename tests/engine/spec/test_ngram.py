"""NgramProposer against a naive scan of the whole sequence, call after call, as
the sequence grows by a few tokens, rolls its tail back, or is preempted and comes
back: the incremental index always drafts what a fresh scan finds."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.history import CHECK_WINDOW
from armllm.engine.spec.ngram import NgramProposer
from armllm.engine.spec.proposer import NO_DRAFT, ProposeInput
from armllm.sampling import SamplingParams

KEY = ("r", 0)


def config(lo=2, hi=4, k=4) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", num_speculative_tokens=k,
                             prompt_lookup_min=lo, prompt_lookup_max=hi)


def ask(proposer, token_ids, k, key=KEY) -> list[int]:
    inp = ProposeInput(key, list(token_ids), num_prompt=1, start=0,
                       num_kept=len(token_ids), k=k, params=SamplingParams())
    return proposer.propose([inp])[0].tokens


def reference(token_ids, lo, hi, k) -> list[int]:
    """The longest n first; for it the latest earlier end; what follows, repeating
    the period when the match is closer to the end than k tokens."""
    length = len(token_ids)
    for n in range(hi, lo - 1, -1):
        tail = token_ids[length - n:]
        for end in range(length - 1, n - 1, -1):
            if token_ids[end - n:end] == tail:
                draft = []
                for i in range(k):
                    at = end + i
                    draft.append(token_ids[at] if at < length else draft[at - length])
                return draft
    return []


def test_drafts_what_followed_the_longest_latest_match():
    proposer = NgramProposer(config())
    #            0  1  2  3  4  5  6  7  8  9 10 11
    sequence = [5, 1, 2, 3, 9, 9, 7, 2, 3, 8, 1, 2, 3]
    # "1 2 3" (n=3) last ended at 4; "2 3" alone would match later (at 9)
    assert ask(proposer, sequence, 3) == [9, 9, 7]
    assert ask(proposer, sequence + [4], 3) == []     # no earlier "2 3 4" / "3 4"


def test_a_match_near_the_end_repeats_its_period():
    proposer = NgramProposer(config())
    assert ask(proposer, [4, 1, 2, 1, 2], 4) == [1, 2, 1, 2]
    assert ask(proposer, [7, 7, 7], 3, key=("s", 0)) == [7, 7, 7]


def test_k_zero_observes_only_and_k_is_capped_by_the_config():
    proposer = NgramProposer(config(k=2))
    sequence = [1, 2, 3, 4, 5, 1, 2]
    assert proposer.propose([ProposeInput(KEY, sequence, 1, 0, 7, 0, SamplingParams())]) == \
        [NO_DRAFT]
    assert ask(proposer, sequence, 8) == [3, 4]
    assert proposer.draft_seconds == 0.0 and proposer.wants_hidden is False


def test_sequences_are_indexed_apart_and_release_forgets():
    proposer = NgramProposer(config())
    assert ask(proposer, [1, 2, 3, 1, 2], 2, key=("a", 0)) == [3, 1]
    assert ask(proposer, [1, 2], 2, key=("b", 0)) == []
    proposer.release(("a", 0), [1, 2, 3, 1, 2], finished=True)
    assert ("a", 0) not in proposer._indexes
    proposer.release(("zz", 0), [], finished=False)          # unknown key: nothing to do
    proposer.close()
    assert not proposer._indexes


@st.composite
def token_streams(draw):
    """Calls as the engine makes them: the list grows by 1..5 tokens, or its tail
    (within what one verify step writes) is rewritten, or the sequence is
    preempted (released) and comes back as anything."""
    calls = []
    tokens = draw(st.lists(st.integers(0, 3), min_size=1, max_size=12))
    for _ in range(draw(st.integers(1, 20))):
        action = draw(st.sampled_from(["grow", "grow", "grow", "rewrite", "preempt"]))
        if action == "rewrite":
            cut = draw(st.integers(max(0, len(tokens) - CHECK_WINDOW), len(tokens)))
            tokens = tokens[:cut]
        elif action == "preempt":
            tokens = draw(st.lists(st.integers(0, 3), max_size=len(tokens) + 3))
        tokens = tokens + draw(st.lists(st.integers(0, 3), min_size=0, max_size=5))
        calls.append((action == "preempt", list(tokens), draw(st.integers(0, 5))))
    return calls


@settings(max_examples=80, deadline=None)
@given(calls=token_streams(), sizes=st.sampled_from([(1, 1), (1, 3), (2, 4), (3, 3)]))
def test_incremental_index_matches_a_naive_scan_and_a_rebuild(calls, sizes):
    lo, hi = sizes
    proposer = NgramProposer(config(lo, hi, k=5))
    for preempted, token_ids, k in calls:
        if preempted:
            proposer.release(KEY, token_ids, finished=False)
        got = ask(proposer, token_ids, k)
        assert got == reference(token_ids, lo, hi, k)
        assert got == ask(NgramProposer(config(lo, hi, k=5)), token_ids, k)
