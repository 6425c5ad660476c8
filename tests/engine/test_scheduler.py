"""The Scheduler and BlockManager driven by the real LLMEngine over a
model-free runner (tests/engine/sim.py): budgets, chunked prefill, decodes
first, priority, preemption, fork, abort, refusal up front, and a hypothesis
state machine of random add/step/abort sequences checking every invariant."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.conftest import examples
from tests.engine.sim import SimEngine


def test_chunked_prefill_respects_the_budget_and_decodes_go_first():
    sim = SimEngine(num_blocks=64, block_size=4, max_tokens=8, max_model_len=128)
    a = sim.add("a", list(range(5)), max_tokens=20)
    out = sim.step()
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 5)]
    b = sim.add("b", list(range(100, 130)), max_tokens=4)
    chunks = []
    for _ in range(5):
        out = sim.step()
        assert out.num_tokens <= 8
        assert out.scheduled[0].seq is a and out.scheduled[0].num_new_tokens == 1
        chunks.append(sum(s.num_new_tokens for s in out.scheduled if s.seq is b))
        sim.check()
    assert chunks == [7, 7, 7, 7, 2]         # 30 prompt tokens, 7 a step beside a's decode
    assert len(b.output_ids) == 1


def test_encoder_frames_count_against_the_budget():
    """An encoder-decoder's window is encoded with its first chunk: a step admits as
    many new windows as the budget holds, and always at least one."""
    sim = SimEngine(max_num_seqs=8, max_tokens=2000)
    seqs = [sim.add(r, [1, 2, 3], max_tokens=3) for r in "abcd"]
    for seq in seqs:
        seq.encoder_len = 1500 if seq.request_id != "d" else 0
    admitted = [[s.seq.request_id for s in sim.step().scheduled] for _ in range(3)]
    # a (3 + 1500 of 2000), then b beside a's decode, then c beside a's and b's decodes,
    # and d (no encoder) in what c leaves: first come, first served
    assert admitted[0] == ["a"]
    assert admitted[1] == ["a", "b"]
    assert admitted[2] == ["a", "b", "c", "d"]
    sim.check()


def test_sequence_cap_and_fcfs_admission():
    sim = SimEngine(max_num_seqs=2, max_tokens=100)
    for r in "abc":
        sim.add(r, [1, 2, 3], max_tokens=3)
    out = sim.step()
    assert [s.seq.request_id for s in out.scheduled] == ["a", "b"]
    sim.drain()
    assert all(sim.ends[(r, 0)] == 1 for r in "abc")


def test_priority_orders_the_waiting_queue():
    sim = SimEngine(max_num_seqs=1, max_tokens=100)
    sim.add("low", [1, 2], max_tokens=2, priority=5)
    sim.add("high", [3, 4], max_tokens=2, priority=-1)
    sim.add("mid", [5, 6], max_tokens=2)
    order = []
    while sim.sched.has_work():
        out = sim.step()
        order += [s.seq.request_id for s in out.scheduled if s.seq.request_id not in order]
    assert order == ["high", "mid", "low"]


def test_preemption_takes_the_newest_and_recomputes():
    sim = SimEngine(num_blocks=4, block_size=4, max_num_seqs=4, max_tokens=64)
    a = sim.add("a", list(range(8)), max_tokens=8)      # grows to 16 tokens: 4 blocks
    b = sim.add("b", list(range(10, 18)), max_tokens=8)
    sim.step()
    assert a.block_table and b.block_table and sim.blocks.num_free == 0
    out = sim.step()                                     # a needs a third block: b yields
    assert out.preempted == [b] and b.block_table == [] and sim.sched.num_preemptions == 1
    sim.check()
    sim.drain()
    assert sim.ends[("a", 0)] == 1 and sim.ends[("b", 0)] == 1
    assert len(b.output_ids) == 8


def test_prefix_hit_skips_the_cached_tokens():
    sim = SimEngine(num_blocks=32, block_size=4, max_tokens=64)
    sim.add("a", list(range(12)), max_tokens=1)
    sim.drain()
    b = sim.add("b", list(range(12)) + [40, 41], max_tokens=1)
    out = sim.step()
    assert out.scheduled[0].num_new_tokens == 2 and b.num_cached_prompt == 12
    assert sim.blocks.prefix_hits == 12 and sim.blocks.prefix_queries == 12 + 14


def test_each_scheduled_sequence_is_one_question_to_the_block_manager():
    """allocate_slots alone gives a sequence its blocks, a new one's cached prefix with
    them: once per scheduled sequence and step (short of preemption, which asks again
    after each victim)."""
    sim = SimEngine(num_blocks=64, block_size=4, max_num_seqs=4, max_tokens=10)
    asked: list[tuple[tuple[str, int], int | None]] = []
    allocate_slots = sim.blocks.allocate_slots

    def recorded(seq, num_tokens, prefix=None):
        asked.append((seq.key, None if prefix is None else prefix.num_tokens))
        return allocate_slots(seq, num_tokens, prefix)
    sim.blocks.allocate_slots = recorded
    sim.add("a", list(range(12)), max_tokens=1)
    sim.drain()
    sim.add("b", list(range(12)) + [40, 41], max_tokens=4)     # a prefix hit
    sim.add("c", list(range(100, 118)), max_tokens=3, n=2)     # chunked, then forked
    steps = []
    while sim.engine.has_unfinished():
        asked.clear()
        out = sim.step()
        assert not out.preempted
        assert sorted(key for key, _ in asked) == sorted(s.seq.key for s in out.scheduled)
        steps.append(list(asked))
    assert steps[0] == [(("b", 0), 12), (("c", 0), 0)]           # admitted: with a prefix
    assert all(prefix is None for step in steps[1:] for _, prefix in step)
    assert ("c", 1) in {key for step in steps for key, _ in step}


def test_parallel_sampling_forks_after_the_prompt():
    sim = SimEngine(num_blocks=32, block_size=4, max_num_seqs=4, max_tokens=64)
    sim.add("r", list(range(6)), max_tokens=4, n=3)
    out = sim.step()
    assert [s.num_new_tokens for s in out.scheduled] == [6]
    seqs = sim.requests("r")
    assert [s.index for s in seqs] == [0, 1, 2]
    assert seqs[1].block_table == seqs[0].block_table and sim.blocks.pools[0].ref_count[1] == 3
    out = sim.step()                                     # each writes into shared block 1
    assert sorted(out.copies) == [(0, 1, 2), (0, 1, 3)]
    sim.check()
    sim.drain()
    assert [len(s.output_ids) for s in seqs] == [4, 4, 4]
    assert len({tuple(s.output_ids) for s in seqs}) == 3
    assert sim.blocks.num_free == 32


def test_group_waits_for_room_for_all_its_completions():
    sim = SimEngine(max_num_seqs=3)
    sim.add("a", [1, 2], max_tokens=9)
    sim.add("g", [3, 4], max_tokens=2, n=3)
    sim.step()
    assert [s.seq.request_id for s in sim.step().scheduled] == ["a"]   # 1 + 3 > 3
    sim.drain()
    assert all(sim.ends[("g", i)] == 1 for i in range(3))


def test_requests_that_can_never_fit_are_refused():
    sim = SimEngine(num_blocks=4, block_size=4, max_num_seqs=2, max_model_len=32)
    with pytest.raises(ValueError, match=r"prompt \(30 tokens\) \+ max_tokens \(3\) = 33 "
                                         r"exceeds max_model_len 32"):
        sim.add("a", [1] * 30, max_tokens=3)
    with pytest.raises(ValueError, match="cannot fit the KV cache"):
        sim.add("b", [1] * 10, max_tokens=10)
    with pytest.raises(ValueError, match="n = 3 completions exceeds max_num_seqs 2"):
        sim.add("c", [1], max_tokens=1, n=3)
    with pytest.raises(ValueError, match="the prompt is empty"):
        sim.add("d", [], max_tokens=1)
    assert not sim.sched.has_work()


def test_abort_frees_blocks_and_unknown_or_finished_is_harmless():
    sim = SimEngine(num_blocks=16)
    sim.add("a", list(range(9)), max_tokens=20)
    sim.step()
    assert sim.blocks.num_free < 16
    sim.abort("a")
    assert sim.blocks.num_free == 16 and not sim.sched.has_work()
    assert sim.ends[("a", 0)] == 0                       # reported by the next step
    sim.abort("a")
    sim.abort("nobody")
    sim.drain()
    assert sim.ends[("a", 0)] == 1 and sim.reasons == {"abort": 1}


class RandomOperations(RuleBasedStateMachine):
    """Random add/step/abort sequences under a small cache."""

    def __init__(self):
        super().__init__()
        self.sim = SimEngine(num_blocks=12, block_size=4, max_num_seqs=4, max_tokens=9,
                             max_model_len=40)
        self.count = 0

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [9] * 6]),
          tail=st.lists(st.integers(0, 22), min_size=1, max_size=14),
          max_tokens=st.integers(1, 12), n=st.integers(1, 3), priority=st.integers(0, 2))
    def add(self, prefix, tail, max_tokens, n, priority):
        prompt = (prefix + tail)[:30]
        self.count += 1
        self.sim.add(f"r{self.count}", prompt, max_tokens, n, priority)

    @rule(steps=st.integers(1, 4))
    def step(self, steps):
        for _ in range(steps):
            self.sim.step()

    @precondition(lambda self: self.count > 0)
    @rule(which=st.integers(1, 1000))
    def abort(self, which):
        self.sim.abort(f"r{1 + which % self.count}")

    @precondition(lambda self: self.count > 0)
    @rule(which=st.integers(1, 1000), forward=st.booleans())
    def fail(self, which, forward):
        """The next forward fails (every request in it ends), or one request's sampling."""
        if forward:
            self.sim.runner.fail_run = True
        else:
            self.sim.runner.fail_sample.add(f"r{1 + which % self.count}")

    @invariant()
    def consistent(self):
        self.sim.check()

    def teardown(self):
        self.sim.drain()
        self.sim.check()
        for rid, params in self.sim.params.items():
            for index in range(params.n):
                assert self.sim.ends[(rid, index)] == 1, f"{rid}/{index} not ended once"
        assert set(self.sim.reasons) <= {"length", "abort", "error"}
        bm = self.sim.blocks
        assert bm.num_free == bm.num_blocks
        assert all(sum(pool.ref_count) == 0 for pool in bm.pools)
        stats = self.sim.engine.stats()
        assert stats.finished == {r: k for r, k in self.sim.reasons.items() if k}
        assert stats.num_generation_tokens == sum(map(len, self.sim.tokens.values()))


class RandomOperationsWithAWindowPool(RandomOperations):
    """The same beside a pool for sliding-window layers (window 6 tokens, ten blocks:
    fewer than the 40-token context needs), which trims each table to the window."""

    def __init__(self):
        super().__init__()
        self.sim = SimEngine(num_blocks=12, block_size=4, max_num_seqs=4, max_tokens=9,
                             max_model_len=40, window=6, num_window_blocks=10)


for machine in (RandomOperations, RandomOperationsWithAWindowPool):
    machine.TestCase.settings = settings(max_examples=examples(150), deadline=None,
                                         stateful_step_count=30)
test_random_operations = RandomOperations.TestCase
test_random_operations_with_a_window_pool = RandomOperationsWithAWindowPool.TestCase


def test_scheduler_block_manager_and_sequence_import_neither_numpy_nor_kernels():
    import subprocess
    import sys
    code = ("import sys\n"
            "import armllm.engine.scheduler, armllm.engine.block_manager\n"
            "import armllm.engine.sequence\n"
            "bad = [m for m in ('numpy', 'armllm._kernels._ext', 'armllm.ops')\n"
            "       if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
