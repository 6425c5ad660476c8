"""BlockManager alone (plain Python): exact block ids for allocation, prefix
hits, eviction order and copy on write, and the counters."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from armllm.engine.block_manager import BlockManager, block_hash
from armllm.engine.sequence import Sequence


@dataclass
class Params:
    max_tokens: int = 8
    n: int = 1


def seq(tokens, rid="r") -> Sequence:
    return Sequence(rid, list(tokens), Params())


def run(bm: BlockManager, s: Sequence, upto: int) -> None:
    """As a step does: room for `upto` tokens, then they are computed."""
    assert bm.allocate_slots(s, upto) is not None
    s.num_computed = upto
    bm.commit(s)


def free_order(bm: BlockManager) -> list[int]:
    return list(bm.pools[0].free)


def test_allocation_takes_blocks_in_order_and_release_returns_them():
    bm = BlockManager(8, 4)
    a = seq(range(10))
    run(bm, a, 10)
    assert a.block_table == [0, 1, 2]
    assert bm.pools[0].ref_count[:3] == [1, 1, 1] and bm.num_free == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.release(a)
    # the unhashed partial block first, then hashed ones tail first (the prefix lasts longest)
    assert free_order(bm) == [2, 3, 4, 5, 6, 7, 1, 0]
    assert a.block_table == [] and a.num_computed == 0


def test_prefix_hit_reuses_exact_blocks_and_counts_tokens():
    bm = BlockManager(8, 4)
    a = seq(range(10))
    run(bm, a, 10)
    assert bm.pools[0].cached == {a.block_hashes[0]: 0, a.block_hashes[1]: 1}
    assert a.block_hashes[1] == block_hash(block_hash(b"", [0, 1, 2, 3]), [4, 5, 6, 7])
    bm.release(a)
    b = seq([0, 1, 2, 3, 4, 5, 6, 7, 50, 51], "b")
    prefix = bm.cached_prefix(b)
    assert prefix.tables == [[0, 1]] and prefix.num_tokens == 8
    assert bm.allocate_slots(b, 10, prefix) == []
    assert b.num_computed == 8 and bm.prefix_queries == 10 and bm.prefix_hits == 8
    assert b.block_table == [0, 1, 2]
    # a running holder and a new one share block 0 and 1
    c = seq([0, 1, 2, 3, 9, 9, 9, 9, 9], "c")
    prefix = bm.cached_prefix(c)
    assert prefix.tables == [[0]] and prefix.num_tokens == 4
    assert bm.allocate_slots(c, 4, prefix) == [] and c.block_table == [0]
    assert bm.pools[0].ref_count[0] == 2 and bm.pools[0].ref_count[1] == 1


def test_at_least_one_prompt_token_is_recomputed():
    bm = BlockManager(8, 4)
    a = seq(range(8))
    run(bm, a, 8)
    bm.release(a)
    again = seq(range(8), "again")
    assert bm.cached_prefix(again).tables == [[0]]  # not [0, 1]: token 7 makes the logits
    longer = seq(range(9), "longer")
    assert bm.cached_prefix(longer).tables == [[0, 1]]


def test_eviction_takes_unhashed_then_least_recently_freed():
    bm = BlockManager(6, 2)
    a, b = seq([1, 2, 3, 4, 5], "a"), seq([7, 8, 9], "b")
    run(bm, a, 5)   # blocks 0 1 2 (0, 1 full)
    run(bm, b, 3)   # blocks 3 4 (3 full)
    bm.release(a)
    bm.release(b)
    assert free_order(bm) == [4, 2, 5, 1, 0, 3]
    assert len(bm.pools[0].cached) == 3
    c = seq(range(100, 108), "c")
    bm.allocate_slots(c, 8)                  # four blocks: 4, 2, 5, then evicts 1,
    assert c.block_table == [1, 2, 4, 5]     # in the table in ascending order
    assert set(bm.pools[0].cached.values()) == {0, 3}
    assert bm.cached_prefix(seq([1, 2, 3, 4, 5], "a2")).tables == [[0]]  # block 1 is gone
    assert bm.cached_prefix(seq([7, 8, 9], "b2")).tables == [[3]]


def test_fork_shares_blocks_and_copies_on_write():
    bm = BlockManager(8, 4)
    parent = seq(range(6))
    run(bm, parent, 6)                       # blocks 0 (full) and 1 (2 of 4 tokens)
    child = Sequence("r", parent.prompt_ids, Params(), index=1)
    bm.fork(parent, child)
    assert child.block_table == [0, 1] and bm.pools[0].ref_count[:2] == [2, 2]
    child.output_ids.append(42)
    copies = bm.allocate_slots(child, 7)     # writes position 6, in shared block 1
    assert copies == [(0, 1, 2)] and child.block_table == [0, 2]
    assert bm.pools[0].ref_count[:3] == [2, 1, 1]
    parent.output_ids.append(43)
    assert bm.allocate_slots(parent, 7) == []  # block 1 is parent's alone now: no copy
    assert parent.block_table == [0, 1]
    bm.release(child)
    bm.release(parent)
    assert bm.num_free == 8 and all(r == 0 for r in bm.pools[0].ref_count)


def test_copy_on_write_counts_and_what_does_not_fit_changes_nothing():
    bm = BlockManager(3, 4)
    parent = seq(range(6))
    run(bm, parent, 6)
    child = Sequence("r", parent.prompt_ids, Params(), index=1)
    bm.fork(parent, child)
    child.output_ids.append(1)
    assert bm.blocks_needed(child, 7) == [1]
    assert bm.allocate_slots(child, 7) == [(0, 1, 2)]
    child2 = Sequence("r", parent.prompt_ids, Params(), index=2)
    bm.fork(parent, child2)
    child2.output_ids.append(1)
    assert bm.blocks_needed(child2, 7) == [1] and bm.num_free == 0
    assert bm.allocate_slots(child2, 7) is None
    assert child2.block_table == [0, 1] and bm.pools[0].ref_count == [3, 2, 1]


def test_prefix_caching_off_hashes_nothing():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = seq(range(10))
    run(bm, a, 10)
    bm.release(a)
    assert bm.pools[0].cached == {} and bm.cached_prefix(seq(range(10))).tables == [[]]
    assert free_order(bm) == [0, 1, 2, 3, 4, 5, 6, 7]


def test_same_tokens_in_two_blocks_keep_the_first_cached():
    bm = BlockManager(8, 4)
    a, b = seq(range(5), "a"), seq(range(5), "b")
    run(bm, a, 5)
    run(bm, b, 5)                            # computed concurrently, not from the cache
    assert bm.pools[0].cached == {a.block_hashes[0]: 0}
    bm.release(b)
    assert free_order(bm)[:2] == [2, 3]      # b's blocks are unhashed: reused first


def test_a_window_pool_drops_blocks_out_of_the_window_at_the_next_allocate():
    bm = BlockManager([(0, 8), (4, 8)], 2)      # a 4-token window over 2-token blocks
    full, window = bm.pools
    a = seq(range(9))
    run(bm, a, 9)
    assert a.block_tables == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    a.output_ids.append(9)
    # position 9 reads 6..9: blocks 3 and 4; 0..2 go back, the newest first
    assert bm.blocks_needed(a, 10) == [0, -3] and bm.allocate_slots(a, 10) == []
    assert a.block_tables == [[0, 1, 2, 3, 4], [8, 8, 8, 3, 4]]
    assert list(window.free) == [5, 6, 7, 2, 1, 0] and window.ref_count[:3] == [0, 0, 0]
    bm.release(a)
    assert window.num_blocks == 8 and bm.num_free == 16


def test_a_prefix_hit_needs_the_window_before_its_first_token():
    bm = BlockManager([(0, 8), (4, 8)], 2)
    a = seq(range(9))
    run(bm, a, 9)
    a.output_ids.append(9)
    run(bm, a, 10)
    bm.release(a)
    b = seq([*range(9), 50], "b")
    # the first token to compute, 8, reads 5..8: the window pool serves blocks 2 and 3
    assert bm.cached_prefix(b).tables == [[0, 1, 2, 3], [8, 8, 2, 3]]
    c = seq(range(100, 108), "c")
    bm.allocate_slots(c, 8)                  # evicts full block 4 and window block 2
    assert c.block_tables == [[4, 5, 6, 7], [2, 5, 6, 7]]   # each chunk's in order
    # four full blocks match, but token 8 would read 5..8 and token 6 3..6: window
    # block 2 is gone
    prefix = bm.cached_prefix(b)
    assert prefix.tables == [[0, 1], [0, 1]] and prefix.num_tokens == 4
    assert bm.allocate_slots(b, 5, prefix) == []
    assert b.num_computed == 4 and bm.pools[1].ref_count[:2] == [1, 1]
    assert b.block_tables == [[0, 1, 3], [0, 1, 4]]  # then the least recently freed


def test_bad_sizes():
    with pytest.raises(ValueError, match="num_blocks and block_size must be >= 1"):
        BlockManager(0, 16)
