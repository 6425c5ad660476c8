"""SuffixTree against naive counting over the stored sequences: after any mix of
appends, inserts and removals every node's count, total, label, recorded stops
and best child are what counting substrings says, and a draft from any position is
the greedy most-frequent path with the same probabilities."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armllm.engine.spec.suffix_tree import SuffixTree, SuffixWriter, draft


def continuations(seqs, context, depth_cap) -> Counter:
    """How often each token follows `context` in seqs (paths are at most depth_cap)."""
    width = len(context)
    if width >= depth_cap:
        return Counter()
    return Counter(q[s + width] for q in seqs for s in range(len(q) - width)
                   if q[s:s + width] == context)


def occurs(seqs, tokens) -> bool:
    width = len(tokens)
    return any(q[s:s + width] == tokens for q in seqs for s in range(len(q) - width + 1))


def stops(finished, tokens, depth_cap) -> int:
    """Suffixes (cut to depth_cap) of finished sequences that are exactly `tokens`."""
    if len(tokens) >= depth_cap:
        return 0
    return sum(1 for q in finished for s in range(len(q)) if q[s:] == tokens)


def most_frequent(counts: Counter) -> int:
    return min(counts, key=lambda token: (-counts[token], token))


def reference_draft(seqs, context, max_tokens, min_prob, depth_cap):
    tokens, score, prob = [], 0.0, 1.0
    while len(tokens) < max_tokens:
        counts = continuations(seqs, context + tokens, depth_cap)
        if not counts:
            break
        token = most_frequent(counts)
        prob *= counts[token] / sum(counts.values())
        if prob < min_prob:
            break
        tokens.append(token)
        score += prob
    return tokens, score


def check_tree(tree: SuffixTree, live: list[list[int]], finished: list[list[int]]) -> None:
    depth_cap = tree.max_depth
    seqs = live + finished

    def visit(node, path):
        expected = continuations(seqs, path, depth_cap)
        children = node.children or {}
        assert set(children) == set(expected), path
        assert node.total == sum(expected.values()), path
        if node.best is not None:
            assert node.best is children[most_frequent(expected)], path
        for token, child in children.items():
            label = list(child.seq[child.pos:min(len(child.seq), child.end)])
            assert label and label[0] == token and child.parent is node
            if not live:                  # nodes of finished sequences end inside them
                assert child.end <= len(child.seq)
            assert child.count == expected[token]
            assert len(path) + len(label) <= depth_cap
            assert occurs(seqs, path + label)          # a suffix reaches the label's end
            for offset in range(1, len(label)):        # inside the edge: one way on
                inside = path + label[:offset]
                assert set(continuations(seqs, inside, depth_cap)) == {label[offset]}
                recorded = (child.ends or {}).get(offset, 0)
                assert recorded == stops(finished, inside, depth_cap), inside
            visit(child, path + label)

    visit(tree.root, [])


def check_drafts(tree: SuffixTree, seqs, min_prob: float) -> None:
    """A draft from every stored context equals the naive greedy path."""
    depth_cap = tree.max_depth
    contexts = {tuple(q[s:e]) for q in seqs for s in range(len(q))
                for e in range(s + 1, min(len(q), s + depth_cap) + 1)}
    for context in contexts:
        node, offset = tree.walk(context)
        assert node is not None
        for max_tokens in (1, 3, depth_cap):
            got = draft(node, offset, max_tokens, min_prob)
            assert got == reference_draft(seqs, list(context), max_tokens, min_prob, depth_cap)


tokens_st = st.lists(st.integers(0, 3), max_size=24)


@settings(max_examples=150, deadline=None)
@given(depth_cap=st.integers(1, 7), tokens=tokens_st, min_prob=st.sampled_from([0.0, 0.3]))
def test_a_growing_sequence_is_counted_exactly(depth_cap, tokens, min_prob):
    tree = SuffixTree(depth_cap)
    writer = SuffixWriter(tree, [])
    for length, token in enumerate(tokens, 1):
        writer.append(token)
        check_tree(tree, [tokens[:length]], [])
        # the live suffixes are the matches of the sequence's own suffixes that
        # occur earlier, longest first
        expected_live = [n for n in range(min(depth_cap - 1, length), 0, -1)
                         if occurs([tokens[:length - 1]], tokens[length - n:length])]
        assert len(writer.nodes) == len(expected_live)
        assert list(range(len(writer.nodes), 0, -1)) == expected_live
        for i, (node, offset) in enumerate(zip(writer.nodes, writer.offsets, strict=True)):
            assert (node, offset) == tree.walk(tokens[length - (len(writer.nodes) - i):length])
    check_drafts(tree, [tokens], min_prob)


@settings(max_examples=80, deadline=None)
@given(depth_cap=st.integers(1, 6), seqs=st.lists(tokens_st.filter(bool), min_size=1,
                                                  max_size=5),
       removals=st.lists(st.integers(0, 4), max_size=5),
       min_prob=st.sampled_from([0.0, 0.3]))
def test_inserted_and_removed_sequences_are_counted_exactly(depth_cap, seqs, removals,
                                                           min_prob):
    tree = SuffixTree(depth_cap)
    stored = []
    for tokens in seqs:
        stored.append((tokens, tree.insert(tokens)))
        check_tree(tree, [], [t for t, _ in stored])
    for which in removals:
        if not stored:
            break
        tokens, handle = stored.pop(which % len(stored))
        tree.remove(handle)
        check_tree(tree, [], [t for t, _ in stored])
        # no surviving label still reads the removed sequence
        pending = [tree.root]
        while pending:
            node = pending.pop()
            assert node.seq is not handle
            pending.extend((node.children or {}).values())
    check_drafts(tree, [t for t, _ in stored], min_prob)
    if not stored:
        assert tree.root.children == {} and tree.root.total == 0


def test_removing_everything_leaves_an_empty_tree_and_the_version_moves():
    tree = SuffixTree(4)
    handles = [tree.insert(t) for t in ([1, 2, 3, 1, 2], [2, 3, 1], [1, 2, 3, 4])]
    assert tree.version == 3
    for handle in handles:
        tree.remove(handle)
    assert tree.version == 6
    assert tree.root.children == {} and tree.root.total == 0


def test_draft_follows_the_most_frequent_continuation_and_multiplies_shares():
    tree = SuffixTree(8)
    for tail in ([7, 8], [7, 8], [7, 9], [5, 6]):
        tree.insert([1, 2] + tail)
    node, offset = tree.walk([1, 2])
    # after 1 2: 7 three times in four, then 8 two times in three
    tokens, score = draft(node, offset, 4, 0.0)
    assert tokens == [7, 8]
    assert score == pytest.approx(0.75 + 0.5)
    assert draft(node, offset, 4, 0.6)[0] == [7]          # 0.5 < 0.6 stops the 8
    assert draft(node, offset, 4, 0.8)[0] == []           # 0.75 < 0.8 stops at once
    assert draft(node, offset, 1, 0.0)[0] == [7]


def test_tree_rejects_a_depth_below_one():
    with pytest.raises(ValueError, match="max_depth"):
        SuffixTree(0)
