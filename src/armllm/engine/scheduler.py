"""scheduler: picks what runs in each step (plain Python).

Each step has a token budget (max_num_batched_tokens) and a sequence cap
(max_num_seqs). Running decodes go first (one token each), then running
prompts that are still being prefilled, then waiting requests in priority
order (lower first, first come first served among equals). A prompt longer
than what is left of the budget is prefilled in chunks over several steps,
so it never holds running decodes back for more than one step. An
encoder-decoder's request (Whisper) runs its encoder over a window with its
first chunk, and those frames count against the budget too. A new request
starts after the longest prefix of its prompt found in the prefix cache. The
block manager is asked once per sequence and step (allocate_slots) whether its
tokens fit, and gives them their blocks if they do.

When a running sequence finds no free KV block, the most recently admitted
running sequence of the lowest priority is preempted: its blocks are freed
(they stay in the prefix cache) and it goes back to the front of the queue
to be recomputed. A request that could never fit is refused when added.

After the step has run, update() advances each sequence's computed tokens,
commits its newly full blocks to the prefix cache and, when the prompt of a
request with n > 1 completions is done, forks the other n - 1 from it
(sharing its blocks, copied on write). Once the engine has verified a
sequence's draft tokens, accept_drafts() counts the kept ones as computed and
gives back the blocks only rejected ones used. finish() frees a finished
sequence."""
from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass, field

from armllm.engine.block_manager import BlockManager
from armllm.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int      # rows this step computes for seq
    num_draft: int = 0       # of which the last are draft tokens to verify (seq.draft_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted: list[Sequence]
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (pool, src, dst)
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) slots

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        for name, value in (("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens),
                            ("max_model_len", max_model_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.blocks = blocks
        self.max_num_seqs, self.max_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: list[Sequence] = []     # sorted by _order
        self.running: list[Sequence] = []     # in admission order
        self.num_preemptions = 0
        self.num_steps = 0                    # steps that scheduled any token
        self.num_scheduled_tokens = 0         # token rows scheduled (recomputes included)
        # sequence-steps that decode: the rows past the prompt up to the last token (one,
        # but for a hybrid's recompute after a rejected draft), beside any draft rows
        self.num_decode_tokens = 0
        self._arrival = itertools.count()
        self._order: dict[Sequence, tuple[int, int]] = {}  # (priority, arrival), for sorting
        self._admitted: dict[Sequence, int] = {}           # admission counter, for preemption
        self._admission = itertools.count()

    # -- requests in and out -------------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, max_tokens: int, n: int = 1) -> None:
        """Raises ValueError for a request that could never run."""
        total = num_prompt_tokens + max_tokens
        if num_prompt_tokens < 1:
            raise ValueError("the prompt is empty")
        if total > self.max_model_len:
            raise ValueError(f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) "
                             f"= {total} exceeds max_model_len {self.max_model_len}")
        pools = self.blocks.pools
        for pool, need in zip(pools, self.blocks.most_blocks(total, self.max_tokens), strict=True):
            if need > pool.num_blocks:
                what = f"its {pool.window}-token window layers' pool" if pool.window else "it"
                raise ValueError(f"prompt + max_tokens = {total} tokens cannot fit the KV cache "
                                 f"({what} holds {pool.num_blocks * self.blocks.block_size} "
                                 f"tokens)")
        if n > self.max_num_seqs:
            raise ValueError(f"n = {n} completions exceeds max_num_seqs {self.max_num_seqs}")

    def add(self, seq: Sequence) -> None:
        self.check_fits(len(seq.prompt_ids), seq.params.max_tokens, seq.num_forks_pending + 1)
        self._order[seq] = (seq.priority, next(self._arrival))
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=self._order.__getitem__)

    def finish(self, seq: Sequence, reason: str) -> None:
        """seq is done (stopped, length, or aborted): its blocks are released."""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        seq.timings.finished = time.monotonic()
        if seq in self._admitted:
            self.running.remove(seq)
            del self._admitted[seq]
        elif seq in self._order:
            self.waiting.remove(seq)
        self._order.pop(seq, None)
        self.blocks.release(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        seq.draft_ids.clear()
        self.running.remove(seq)
        del self._admitted[seq]
        self.blocks.release(seq)
        self._enqueue(seq)

    def _victim(self, exclude: set) -> Sequence:
        """The running sequence to preempt: lowest priority, then most recently admitted."""
        return max((s for s in self.running if s not in exclude),
                   key=lambda s: (self._order[s][0], self._admitted[s]))

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [])
        budget = self.max_tokens
        done: set[Sequence] = set()
        # decodes, then prompts still prefilling; each in priority then admission order
        order = sorted(self.running, key=lambda s: (s.num_tokens - s.num_computed > 1,
                                                    self._order[s], self._admitted[s]))
        for seq in order:
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:
                continue  # preempted to make room for an earlier one
            n = self._chunk(seq, seq.num_computed, budget)
            drafts = 0
            if seq.draft_ids:
                if n == 1 and seq.num_computed == seq.num_tokens - 1:
                    drafts = self._drafts(seq, budget)
                    n += drafts
                del seq.draft_ids[drafts:]
            while (copies := self.blocks.allocate_slots(seq, seq.num_computed + n)) is None:
                victim = self._victim(done)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                out.copies += copies
                out.scheduled.append(ScheduledSeq(seq, n, drafts))
                done.add(seq)
                budget -= n
                if seq.num_computed >= len(seq.prompt_ids) and \
                        n - drafts == seq.num_tokens - seq.num_computed:
                    self.num_decode_tokens += 1   # a decode (or a verify's recompute)
        # running sequences and the completions they will fork hold a slot each
        slots = sum(1 + s.num_forks_pending for s in self.running)
        while self.waiting and budget > 0 and not out.preempted:
            seq = self.waiting[0]
            if slots + seq.num_forks_pending + 1 > self.max_num_seqs:
                break
            prefix = self.blocks.cached_prefix(seq)
            n = self._chunk(seq, prefix.num_tokens, budget)
            # an encoder-decoder's window is encoded with its first chunk: its frames
            # count against the budget, though a step always admits at least one
            encode = seq.encoder_len if seq.num_computed == 0 else 0
            if encode and out.scheduled and n + encode > budget:
                break
            copies = self.blocks.allocate_slots(seq, prefix.num_tokens + n, prefix)
            if copies is None:
                break
            self.waiting.pop(0)
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = time.monotonic()
                seq.num_cached_prompt = prefix.num_tokens
            out.copies += copies
            seq.status = Status.RUNNING
            self._admitted[seq] = next(self._admission)
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n + encode
            slots += seq.num_forks_pending + 1
        if out.scheduled:
            self.num_steps += 1
            self.num_scheduled_tokens += out.num_tokens
        # forks' and checkpoints' state copies, then this step's admissions' restores
        out.state_copies = self.blocks.take_state_copies()
        return out

    def _drafts(self, seq: Sequence, budget: int) -> int:
        """How many of a decoding seq's draft tokens run beside its last token: within
        the budget, the model's context, and (a hybrid's) its next state checkpoint."""
        room = min(budget, self.max_model_len - seq.num_computed)
        limit = self.blocks.step_limit(seq.num_computed)
        if limit is not None:
            room = min(room, limit)
        return max(0, min(len(seq.draft_ids), room - 1))

    def _chunk(self, seq: Sequence, num_computed: int, budget: int) -> int:
        """The tokens seq computes this step: what is left of it, within the budget and
        (a hybrid model's prompt) up to its next state checkpoint boundary."""
        n = min(seq.num_tokens - num_computed, budget)
        limit = self.blocks.step_limit(num_computed)
        return n if limit is None else min(n, limit)

    def update(self, out: SchedulerOutput) -> dict[Sequence, list[Sequence]]:
        """The step ran: the scheduled tokens are in the cache. Returns the completions
        forked from each prompt that finished (empty unless a request has n > 1); they
        sample their first token from their parent's logits."""
        forks = {}
        for item in out.scheduled:
            seq = item.seq
            seq.num_computed += item.num_new_tokens - item.num_draft  # drafts: once verified
            self.blocks.commit(seq)
            if seq.num_forks_pending and seq.num_computed == seq.num_tokens:
                forks[seq] = self._fork(seq)
        return forks

    def accept_drafts(self, seq: Sequence, num_draft: int, num_accepted: int,
                      recompute: bool = False) -> None:
        """seq's verify kept num_accepted of its num_draft draft tokens (now in its
        output): their K/V are in the cache and count as computed, and the blocks
        beyond them go back. recompute: the state of seq's recurrent layers took the
        rejected tokens too and was restored to before the step, so its last token and
        the kept drafts are computed again."""
        seq.draft_ids.clear()
        if recompute:
            seq.num_computed -= 1
        else:
            seq.num_computed += num_accepted
            self.blocks.commit(seq)
        if num_accepted < num_draft:
            self.blocks.shrink(seq)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The prompt is done: the request's other completions start from its KV blocks
        and run beside it."""
        children = [parent.fork(index) for index in range(1, parent.num_forks_pending + 1)]
        parent.num_forks_pending = 0
        for child in children:
            self.blocks.fork(parent, child)
            self._order[child] = self._order[parent]
            self._admitted[child] = next(self._admission)
            child.status = Status.RUNNING
            self.running.append(child)
        return children

    # -- lookups ---------------------------------------------------------------------------

    def sequences(self, request_id: str) -> list[Sequence]:
        """The unfinished sequences of one request."""
        return [s for s in itertools.chain(self.running, self.waiting)
                if s.request_id == request_id]

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)
