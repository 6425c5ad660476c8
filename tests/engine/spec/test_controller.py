"""The draft controller: step costs interpolated from measured points, and drafts
only where the expected tokens pay for the rows: many while rows are nearly free,
none when every row costs a step's share (compute-bound, a large batch), fewer as
a sequence's drafts stop being kept, and a cap on how many sequences draft."""
from __future__ import annotations

import pytest

from armllm.engine.spec.controller import SpecController, StepCost

MEMORY_BOUND = StepCost([(1, 1.0), (8, 1.07), (16, 2.0)])   # flat to 8 rows, then linear


def test_step_cost_interpolates_and_extrapolates():
    cost = StepCost([(1, 1.0), (3, 2.0), (5, 2.0)])
    assert cost(1) == 1.0 and cost(2) == 1.5 and cost(4) == 2.0
    assert cost(7) == 2.0                       # the last segment's slope (0)
    assert StepCost([(1, 1.0), (2, 1.5)])(4) == 2.5
    with pytest.raises(ValueError, match="1-row"):
        StepCost([(2, 1.0)])


def test_measure_times_every_small_row_count_then_doubles():
    seen = []
    cost = StepCost.measure(lambda m: seen.append(m), max_rows=40, max_draft=4)
    assert cost.rows == [1, 2, 3, 4, 5, 6, 12, 24, 40]
    assert set(seen) == set(cost.rows)
    assert all(b >= a for a, b in zip(cost.seconds, cost.seconds[1:], strict=False))


def test_nearly_free_rows_are_drafted_while_acceptance_pays():
    controller = SpecController(MEMORY_BOUND, max_draft=5, max_rows=64)
    ks = controller.plan({("a", 0): 5}, num_rows=1, num_running=1)
    assert ks[("a", 0)] >= 3
    for _ in range(10):
        controller.record(("a", 0), 5, 5)          # every draft kept
    assert controller.plan({("a", 0): 5}, 1, 1)[("a", 0)] == 5
    assert controller.plan({("a", 0): 2}, 1, 1)[("a", 0)] == 2   # its tokens left


def test_a_step_in_the_cost_curve_is_crossed_when_the_rows_past_it_pay():
    # flat to 4 rows, a jump at 5 (a kernel's plan changes), flat again to 9
    stepped = StepCost([(1, 1.0), (4, 1.05), (5, 1.5), (9, 1.55), (16, 3.0)])
    controller = SpecController(stepped, max_draft=8, max_rows=64)
    key = ("a", 0)
    for _ in range(10):
        controller.record(key, 8, 8)                # every draft kept: rate near 1
    assert controller.plan({key: 8}, 1, 1)[key] == 8
    for _ in range(10):
        controller.record(key, 8, 2)                # two kept, then a rejection: 2/3
    assert controller.plan({key: 8}, 1, 1)[key] == 3   # the rows past the jump lose


def test_compute_bound_rows_are_never_drafted():
    linear = StepCost([(1, 1.0), (64, 64.0)])
    controller = SpecController(linear, max_draft=5, max_rows=64)
    for _ in range(10):
        controller.record(("a", 0), 5, 5)
    assert controller.plan({("a", 0): 5}, 1, 1) == {("a", 0): 0}
    # a large batch past the memory-bound rows: nothing either
    keys = {(f"r{i}", 0): 5 for i in range(16)}
    assert not any(SpecController(MEMORY_BOUND, 5, 64).plan(keys, 16, 16).values())


def test_rejected_drafts_stop_drafting_then_it_tries_again():
    cost = StepCost([(1, 1.0), (2, 1.04), (8, 1.3)])
    controller = SpecController(cost, max_draft=4, max_rows=64)
    key = ("a", 0)
    for _ in range(20):
        controller.record(key, controller.plan({key: 4}, 1, 1)[key] or 1, 0)
    assert controller.plan({key: 4}, 1, 1)[key] == 0
    tries = 0
    for _ in range(400):
        k = controller.plan({key: 4}, 1, 1)[key]
        if k:
            tries += 1
            controller.record(key, k, 0)
    assert 0 < tries < 20       # now and then, while its rate drifts back to the prior


def test_caps_on_drafting_sequences_and_batch_size():
    keys = {(f"r{i}", 0): 4 for i in range(4)}
    controller = SpecController(MEMORY_BOUND, 4, 64)
    assert sum(k > 0 for k in controller.plan(keys, 4, 4, max_seqs=2).values()) == 2
    capped = SpecController(MEMORY_BOUND, 4, 64, disable_by_batch_size=3)
    assert not any(capped.plan(keys, 4, 4).values())
    assert any(capped.plan(dict(list(keys.items())[:3]), 3, 3).values())
