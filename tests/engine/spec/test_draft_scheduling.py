"""How the scheduler runs a decoding sequence's draft tokens (plain Python, exact
block ids): beside its last token within the step's budget, the context and a
hybrid's next state checkpoint; kept ones count as computed, and the blocks only
rejected ones used go back; a preempted sequence drops its drafts."""
from __future__ import annotations

from dataclasses import dataclass

from armllm.engine.block_manager import BlockManager
from armllm.engine.scheduler import Scheduler
from armllm.engine.sequence import Sequence
from armllm.engine.state_pool import StatePool


@dataclass
class Params:
    max_tokens: int = 32
    n: int = 1


def decoding(scheduler: Scheduler, prompt: list[int], rid: str = "r", max_tokens: int = 32
             ) -> Sequence:
    """A sequence whose prompt ran and whose first token was sampled."""
    seq = Sequence(rid, prompt, Params(max_tokens))
    scheduler.add(seq)
    out = scheduler.schedule()
    scheduler.update(out)
    seq.append(100)
    return seq


def test_drafts_run_beside_the_last_token_and_rejected_blocks_go_back():
    blocks = BlockManager(16, block_size=4)
    scheduler = Scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    seq = decoding(scheduler, [1, 2, 3])          # 4 tokens: block 0 full once computed
    assert seq.block_table == [0]
    seq.draft_ids = [7, 8, 9, 10, 11]
    out = scheduler.schedule()
    (item,) = out.scheduled
    assert (item.num_new_tokens, item.num_draft) == (6, 5)
    assert seq.block_table == [0, 1, 2]           # positions 3..8
    scheduler.update(out)
    assert seq.num_computed == 4                  # the drafts count once verified
    seq.append(7)
    seq.append(55)                                # kept 1 draft, then the target's token
    scheduler.accept_drafts(seq, 5, 1)
    assert seq.num_computed == 5 and seq.draft_ids == []
    assert seq.block_table == [0, 1]              # block 2 held only rejected drafts
    assert blocks.num_free == 14
    assert seq.block_hashes and len(seq.block_hashes) == 1   # block 0 committed


def test_drafts_fit_the_budget_and_the_context():
    blocks = BlockManager(64, block_size=4)
    scheduler = Scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=4, max_model_len=10)
    seq = decoding(scheduler, [1, 2, 3], max_tokens=7)
    seq.draft_ids = [7, 8, 9, 10, 11]
    out = scheduler.schedule()
    assert (out.scheduled[0].num_new_tokens, out.scheduled[0].num_draft) == (4, 3)
    assert seq.draft_ids == [7, 8, 9]             # what did not fit is dropped
    scheduler.update(out)
    seq.append(7), seq.append(8), seq.append(9), seq.append(12)
    scheduler.accept_drafts(seq, 3, 3)
    assert seq.num_computed == 7
    seq.draft_ids = [1, 2, 3, 4]
    out = scheduler.schedule()                    # 8 tokens: 2 more fit max_model_len 10
    assert (out.scheduled[0].num_new_tokens, out.scheduled[0].num_draft) == (3, 2)


def test_a_prefilling_sequence_runs_no_drafts():
    blocks = BlockManager(64, block_size=4)
    scheduler = Scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=4, max_model_len=64)
    seq = Sequence("r", list(range(10)), Params())
    scheduler.add(seq)
    seq.draft_ids = [1, 2]
    out = scheduler.schedule()
    assert (out.scheduled[0].num_new_tokens, out.scheduled[0].num_draft) == (4, 0)


def test_a_hybrids_drafts_stop_at_the_checkpoint_and_a_rejection_recomputes():
    states = StatePool(live=2, checkpoints=1, interval=8)
    blocks = BlockManager(32, block_size=4, states=states)
    scheduler = Scheduler(blocks, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    seq = decoding(scheduler, [1, 2, 3, 4, 5])    # computed 5; the checkpoint is at 8
    seq.draft_ids = [7, 8, 9, 10]
    out = scheduler.schedule()
    assert (out.scheduled[0].num_new_tokens, out.scheduled[0].num_draft) == (3, 2)
    scheduler.update(out)
    seq.append(7), seq.append(60)                 # kept 1 of 2
    scheduler.accept_drafts(seq, 2, 1, recompute=True)
    assert seq.num_computed == 5                  # the state is back to 5 tokens
    out = scheduler.schedule()                    # the last token and the kept draft again
    assert (out.scheduled[0].num_new_tokens, out.scheduled[0].num_draft) == (3, 0)


def test_preemption_drops_the_drafts():
    blocks = BlockManager(2, block_size=4)
    scheduler = Scheduler(blocks, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=12)
    a, b = Sequence("a", [1, 2, 3], Params(5)), Sequence("b", [4, 5, 6], Params(5))
    scheduler.add(a), scheduler.add(b)
    scheduler.update(scheduler.schedule())        # both prompts
    a.append(100), b.append(101)
    a.draft_ids, b.draft_ids = [1, 2, 3, 4], [5, 6, 7, 8]
    out = scheduler.schedule()                    # a's 5 rows need 2 blocks: b goes
    assert out.preempted == [b] and b.draft_ids == []
    assert [(s.seq, s.num_draft) for s in out.scheduled] == [(a, 4)]
