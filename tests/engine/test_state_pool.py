"""A hybrid model's state slots (engine/state_pool.py) alone and through the
BlockManager (plain Python): exact slot ids for live states, forks and
checkpoints, the copies each step makes and their order, least-recently-used
eviction, and prefix hits only where a checkpoint and the KV blocks both are."""
from __future__ import annotations

import pytest

from armllm.engine.block_manager import BlockManager
from armllm.engine.sequence import Sequence
from armllm.engine.state_pool import StatePool
from tests.engine.test_block_manager import seq


def run(bm: BlockManager, s: Sequence, upto: int, prefix=None) -> None:
    """As a step does: room for `upto` tokens, then they are computed."""
    assert bm.allocate_slots(s, upto, prefix) is not None
    s.num_computed = upto
    bm.commit(s)


def test_live_slots_lowest_first_and_none_when_all_are_held():
    pool = StatePool(3)
    assert [pool.take(), pool.take(), pool.take(), pool.take()] == [0, 1, 2, None]
    pool.give_back(1)
    assert pool.take() == 1
    assert pool.step_limit(5) is None and not pool.is_boundary(8)


def test_checkpoints_evict_the_least_recently_used_and_copies_keep_their_order():
    pool = StatePool(2, checkpoints=2, interval=8)
    assert pool.num_slots == 4 and pool.step_limit(5) == 3 and pool.step_limit(8) == 8
    assert pool.is_boundary(16) and not pool.is_boundary(0) and not pool.is_boundary(12)
    pool.save(b"a", 0)
    pool.save(b"b", 1)
    pool.save(b"a", 1)              # already saved: refreshed, no copy
    assert pool.copies() == [(0, 2), (1, 3)] and pool.copies() == []
    assert pool.find(b"b") == 3     # now b is the most recently used
    pool.save(b"c", 0)              # evicts a, the least recently used
    assert pool.copies() == [(0, 2)]
    assert pool.find(b"a") is None and pool.find(b"c") == 2
    with pytest.raises(ValueError):
        StatePool(0)


def test_block_manager_hands_out_slots_and_forks_copy_them():
    bm = BlockManager(16, 4, states=StatePool(3))
    a, b = seq(range(6)), seq(range(6), "b")
    run(bm, a, 6)
    run(bm, b, 6)
    assert (a.state_slot, b.state_slot) == (0, 1)
    child = a.fork(1)
    bm.fork(a, child)
    assert child.state_slot == 2 and bm.take_state_copies() == [(0, 2)]
    c = seq(range(3), "c")
    assert bm.allocate_slots(c, 3) is None and c.block_tables == []   # no slot: nothing taken
    bm.release(b)
    assert b.state_slot == -1
    run(bm, c, 3)
    assert c.state_slot == 1


def test_a_prefix_hit_needs_a_checkpoint_and_restores_it():
    """Blocks of 4, checkpoints every 8 tokens: a 13-token prompt's computation stops at
    8 (step_limit), checkpoints there under block 1's hash; a second prompt sharing 10
    tokens hits the 8 (not the 10 its KV blocks would serve), its live state copied from
    the checkpoint; one sharing 6 tokens finds none."""
    bm = BlockManager(32, 4, states=StatePool(2, checkpoints=2, interval=8))
    a = seq(range(13))
    assert bm.step_limit(0) == 8
    run(bm, a, 8)
    assert bm.take_state_copies() == [(0, 2)]
    run(bm, a, 13)
    assert bm.take_state_copies() == []
    bm.release(a)
    b = seq([*range(10), 90, 91], "b")
    prefix = bm.cached_prefix(b)
    assert prefix.num_tokens == 8 and prefix.state == 2 and prefix.tables == [[0, 1]]
    run(bm, b, 12, prefix)
    assert b.state_slot == 0 and bm.take_state_copies() == [(2, 0)]
    assert bm.cached_prefix(seq([*range(6), 80, 81, 82], "c")).num_tokens == 0


def test_checkpoint_interval_must_be_whole_blocks():
    with pytest.raises(ValueError, match="no multiple of the block size"):
        BlockManager(8, 16, states=StatePool(1, checkpoints=1, interval=24))
