"""A model-free engine for scheduler tests: it runs the Scheduler and
BlockManager exactly as LLMEngine does (schedule, block copies, after_step,
fork, finish, abort) and writes token ids instead of K/V into a simulated
cache, so tests can check that every sequence reads its own tokens."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from armllm.engine.block_manager import BlockManager
from armllm.engine.scheduler import Scheduler, SchedulerOutput
from armllm.engine.sequence import Sequence


@dataclass
class Params:
    max_tokens: int = 8
    n: int = 1


def next_token(seq: Sequence) -> int:
    """A deterministic 'model': depends on the last tokens and the completion index."""
    ids = seq.all_ids
    return (sum(ids[-3:]) * 7 + seq.index) % 23


class SimEngine:
    def __init__(self, num_blocks=16, block_size=4, max_num_seqs=4, max_tokens=16,
                 max_model_len=64, caching=True):
        self.blocks = BlockManager(num_blocks, block_size, caching)
        self.sched = Scheduler(self.blocks, max_num_seqs, max_tokens, max_model_len)
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.requests: dict[str, list[Sequence]] = {}
        self.params: dict[str, Params] = {}
        self.finished: Counter[tuple[str, int]] = Counter()   # completions ended
        self.steps: list[SchedulerOutput] = []
        self.open: set[str] = set()                            # requests not yet ended

    def add(self, rid: str, prompt: list[int], max_tokens: int = 8, n: int = 1,
            priority: int = 0) -> Sequence:
        params = Params(max_tokens, n)
        seq = Sequence(rid, list(prompt), params, priority=priority, num_forks_pending=n - 1)
        self.sched.add(seq)
        self.requests[rid], self.params[rid] = [seq], params
        self.open.add(rid)
        return seq

    def _write(self, seq: Sequence, start: int, stop: int) -> None:
        bs, ids = self.blocks.block_size, seq.all_ids
        for pos in range(start, stop):
            self.kv[seq.block_table[pos // bs]][pos % bs] = ids[pos]

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        for src, dst in out.copies:
            self.kv[dst] = list(self.kv[src])
        for item in out.scheduled:
            self._write(item.seq, item.seq.num_computed, item.seq.num_computed
                        + item.num_new_tokens)
        self.sched.after_step(out)
        for item in out.scheduled:
            seq = item.seq
            if seq.num_computed != seq.num_tokens:
                continue  # a prompt chunk: nothing samples yet
            group = [seq]
            if seq.num_forks_pending:
                for index in range(1, seq.num_forks_pending + 1):
                    child = Sequence(seq.request_id, seq.prompt_ids, seq.params, index=index,
                                     priority=seq.priority)
                    self.blocks.fork(seq, child)
                    self.sched.add_running(child, after=seq)
                    self.requests[seq.request_id].append(child)
                    group.append(child)
                seq.num_forks_pending = 0
            for s in group:
                s.output_ids.append(next_token(s))
                if len(s.output_ids) >= s.params.max_tokens:
                    self.sched.finish(s, "length")
                    self.finished[s.key] += 1
                    seqs = self.requests[s.request_id]
                    if len(seqs) == s.params.n and all(x.finished for x in seqs):
                        self.open.discard(s.request_id)
        self.steps.append(out)
        return out

    def abort(self, rid: str) -> None:
        if rid not in self.open:
            return  # unknown or ended already: harmless
        self.open.discard(rid)
        seqs = self.requests[rid]
        for s in seqs:
            if not s.finished:
                self.sched.finish(s, "abort")
                self.finished[s.key] += 1
        for index in range(len(seqs), self.params[rid].n):
            self.finished[(rid, index)] += 1  # never forked: ends with the request

    def drain(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work():
                return
            self.step()
        raise AssertionError("the scheduler made no progress: deadlock")

    def check(self) -> None:
        """Every invariant of the block manager and scheduler."""
        bm, bs = self.blocks, self.blocks.block_size
        holders = Counter()
        for s in self.sched.running:
            assert len(set(s.block_table)) == len(s.block_table), "a block listed twice"
            assert len(s.block_table) * bs >= s.num_computed
            holders.update(s.block_table)
            ids = s.all_ids
            for pos in range(s.num_computed):  # the cache holds this sequence's tokens
                assert self.kv[s.block_table[pos // bs]][pos % bs] == ids[pos], \
                    f"{s.key} reads a wrong token at {pos}"
        for s in self.sched.waiting:
            assert s.block_table == [] and s.num_computed == 0
        for b in range(bm.num_blocks):
            assert bm.ref_count[b] == holders[b], f"block {b}: ref {bm.ref_count[b]}"
            assert (b in bm.free) == (holders[b] == 0), f"block {b} both free and used"
        for h, b in bm.cached.items():
            assert bm.hash_of[b] == h
        for b, h in enumerate(bm.hash_of):
            assert h is None or bm.cached[h] == b
        assert len(self.sched.running) <= self.sched.max_num_seqs
