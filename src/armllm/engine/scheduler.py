"""scheduler: picks what runs in each step (plain Python).

Running sequences go first (a decode token each, or the next chunk of a
prompt still being prefilled); then waiting prompts are admitted, first come
first served, while the token budget, the sequence cap and the free KV
blocks allow; a prompt longer than what is left of the budget is prefilled in
chunks over several steps. A decode that finds no free block
preempts the most recently admitted running sequence (its blocks are freed
and it waits to be recomputed)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from armllm.engine.block_manager import BlockManager
from armllm.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int      # rows this step computes for seq


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        self.blocks = blocks
        self.max_num_seqs, self.max_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        total = len(seq.prompt_ids) + seq.params.max_tokens
        if not seq.prompt_ids:
            raise ValueError("the prompt is empty")
        if len(seq.prompt_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(seq.prompt_ids)} tokens; max_model_len is "
                             f"{self.max_model_len}")
        if -(-min(total, self.max_model_len) // self.blocks.block_size) > self.blocks.num_blocks:
            raise ValueError(f"prompt + max_tokens = {total} tokens cannot fit the KV cache "
                             f"({self.blocks.num_blocks * self.blocks.block_size} tokens)")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def schedule(self) -> SchedulerOutput:
        scheduled, preempted = [], []
        budget = self.max_tokens
        for seq in list(self.running):
            if seq not in self.running or budget <= 0:
                continue  # preempted to make room for an older one, or no budget left
            n = min(seq.num_tokens - seq.num_computed, budget)  # 1 for a decode
            target = seq.num_computed + n
            while not self.blocks.can_allocate(seq, target):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq in self.running:
                self.blocks.allocate(seq, target)
                scheduled.append(ScheduledSeq(seq, n))
                budget -= n
        while (self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
               and not preempted):
            seq = self.waiting[0]
            n = min(seq.num_tokens - seq.num_computed, budget)  # long prompts go in chunks
            if not self.blocks.can_allocate(seq, seq.num_computed + n):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq, seq.num_computed + n)
            seq.status = Status.RUNNING
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = time.monotonic()
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return SchedulerOutput(scheduled, preempted)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status, seq.finish_reason = Status.FINISHED, reason
        seq.timings.finished = time.monotonic()
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
