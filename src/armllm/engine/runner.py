"""runner: turns a SchedulerOutput into one model forward and sampled tokens.

Owns the KV cache and the workspace; builds the flattened BatchMeta (numpy)
the model reads (the forward makes the copy-on-write block copies first), and
samples the step's tokens in one call (engine/sampler.py). An embedding
request's prompt rows sample nothing: after the forward, the rows its pooling
reads go to its PoolState (engine/embedding.py).

Speculative decoding: a sequence with draft tokens gets a logits row for its
last token and for each draft token. A hybrid model's recurrent state takes
every row it runs, rejected drafts included, and cannot be unwound: before
such a step the runner copies the sequence's state slot to a spare one, and
when the verify rejects a draft it copies it back before the next step (the
scheduler then computes the kept tokens again). A proposer that drafts from
the target's hidden states (MTP) gets the last hidden states of the step's
rows (`hidden`)."""
from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from armllm.engine.embedding import PoolState
from armllm.engine.request_state import RequestState, SeqKey
from armllm.engine.sampler import SampleJob, StepSampler
from armllm.engine.scheduler import SchedulerOutput
from armllm.engine.sequence import Sequence, Status
from armllm.model.decoder import BatchMeta, DecoderModel, KVCache
from armllm.sampling import SampleResult


class ModelRunner:
    """The model's forward over its KV cache and workspace: a scheduler's step (run,
    then sample), or one sequence's tokens with the logits of any of their rows
    (prompt_logits), or a tensor-parallel rank's forward of rank 0's batch (forward).
    max_logits: the logits rows one call may return (default max_num_seqs: a step
    samples at most one token per sequence); logits_cols: a rank's vocabulary shard's
    width (default the vocabulary)."""

    def __init__(self, model: DecoderModel, kv: KVCache, max_num_batched_tokens: int,
                 max_num_seqs: int, max_model_len: int, max_logits: int | None = None,
                 logits_cols: int | None = None, spare_state_slots: tuple[int, ...] = (),
                 keep_hidden: bool = False):
        self.model, self.kv = model, kv
        max_logits = max_logits or max_num_seqs
        # speculative decoding: the state slots a hybrid's drafting sequences snapshot
        # to, and each drafting sequence's snapshot this step
        self._spare_states = list(spare_state_slots)
        self._snapshots: dict[Sequence, int] = {}
        self._rollbacks: list[tuple[int, int]] = []   # (snapshot, live): before the next step
        self.keep_hidden = keep_hidden
        self.hidden: np.ndarray | None = None   # [rows, hidden] of the last run (keep_hidden)
        self.first_rows: list[int] = []          # each scheduled sequence's first row
        self.forward_seconds = 0.0               # the last run's forward
        self.workspace = model.new_workspace(max_num_batched_tokens, max_logits,
                                             max_seq_len=max_model_len, logits_cols=logits_cols)
        self.max_blocks = -(-max_model_len // kv.block_size)
        # a step's logits rows, and a copy for each completion forked from a prompt
        self.sampler = StepSampler(model.config.vocab_size, max_logits, max_num_seqs)
        # the batch arrays, filled in place every step (BatchMeta holds views of them)
        t, b = max_num_batched_tokens, max_num_seqs
        groups = len(kv.groups)
        self._ids, self._positions = np.empty(t, np.int32), np.empty(t, np.int32)
        self._query_start = np.zeros(b + 1, np.int32)
        self._seq_lens = np.empty(b, np.int32)
        # a hybrid model's: each sequence's recurrent state slot
        self._state_slots = np.zeros(b, np.int32) if kv.state_slots else None
        # per KV group, each row's slot and each sequence's block table
        self._slots = [np.empty(t, np.int32) for _ in range(groups)]
        self._block_tables = [np.zeros((b, self.max_blocks), np.int32) for _ in range(groups)]
        self._logits_rows = np.empty(max_logits, np.int64)
        self._pool_reads: list[tuple[PoolState, int, int, int, bool]] = []
        # an encoder-decoder's windows encoded in a running sequence's slot: id(features)
        # -> (the features array, that sequence)
        self._encoded: dict[int, tuple[np.ndarray, Sequence]] = {}

    def build_meta(self, out: SchedulerOutput, states: Mapping[SeqKey, RequestState]
                   ) -> tuple[BatchMeta, list[Sequence]]:
        """The batch (views of the runner's arrays, valid until the next step), and the
        sequences (in logits-row order) that sample a token. The embedding requests'
        rows to pool are left in self._pool_reads: (their PoolState, first row, end
        row, prompt position of the first, whether they end the prompt)."""
        bs = self.kv.block_size
        n = len(out.scheduled)
        ids, positions = self._ids, self._positions
        query_start, seq_lens = self._query_start, self._seq_lens
        tables = list(zip(self._slots, self._block_tables, strict=True))
        sampling = []
        num_logits = 0
        self.first_rows = []
        self._pool_reads.clear()
        row = 0
        for b, item in enumerate(out.scheduled):
            seq, count = item.seq, item.num_new_tokens
            start = seq.num_computed
            stop, end = start + count, row + count
            n_prompt = len(seq.prompt_ids)
            self.first_rows.append(row)
            if count == 1:  # a decode (or a prompt's last token): no arrays to build
                ids[row] = seq.output_ids[start - n_prompt] if start >= n_prompt \
                    else seq.prompt_ids[start]
                positions[row] = start
                for (slots, block_table), blocks in zip(tables, seq.block_tables, strict=True):
                    block_table[b, :len(blocks)] = blocks
                    slots[row] = blocks[start // bs] * bs + start % bs
            else:   # a prompt chunk, or a last token and the drafts to verify after it
                known, drafts = stop - item.num_draft, end - item.num_draft
                ids[row:drafts] = (seq.prompt_ids if known <= n_prompt
                                   else seq.all_ids)[start:known]
                ids[drafts:end] = seq.draft_ids[:item.num_draft]
                pos = positions[row:end]
                pos[:] = np.arange(start, stop)
                for (slots, block_table), blocks in zip(tables, seq.block_tables, strict=True):
                    block_table[b, :len(blocks)] = blocks
                    np.add(block_table[b, pos // bs] * bs, pos % bs, out=slots[row:end])
            pool = states[seq.key].pool
            if pool is not None:   # an embedding: its pooled rows, if any, this step
                first, last = pool.rows_to_read(start, count, n_prompt)
                if first < last:
                    self._pool_reads.append((pool, row + first, row + last, start + first,
                                             stop == n_prompt))
            row = end
            query_start[b + 1] = row
            seq_lens[b] = stop
            if self._state_slots is not None:
                self._state_slots[b] = seq.state_slot
            if stop - item.num_draft == seq.num_tokens and pool is None:  # samples
                rows = item.num_draft + 1
                self._logits_rows[num_logits:num_logits + rows] = np.arange(row - rows, row)
                num_logits += rows
                sampling.append(seq)
        (slots, block_table), *others = tables
        meta = BatchMeta(ids[:row], positions[:row], slots[:row], query_start[:n + 1],
                         seq_lens[:n], block_table[:n],
                         self._logits_rows[:num_logits],
                         tuple((sl[:row], bt[:n]) for sl, bt in others),
                         None if self._state_slots is None else self._state_slots[:n])
        return meta, sampling

    def run(self, out: SchedulerOutput, states: Mapping[SeqKey, RequestState]
            ) -> tuple[list[Sequence], np.ndarray]:
        """Runs the step (`states`: every scheduled sequence's, by key); returns the
        sequences that sample and their logits rows (a view of the workspace, valid
        until the next step): one per sequence, and one more per draft token it
        verifies (ScheduledSeq.num_draft), in order."""
        meta, sampling = self.build_meta(out, states)
        self._encode(out, states)
        state_copies = self._rollbacks + out.state_copies + self._snapshot(out)
        self._rollbacks = []
        began = time.perf_counter()
        logits = self.forward(meta, out.copies, state_copies)
        self.forward_seconds = time.perf_counter() - began
        if self.keep_hidden:
            self.hidden = self.model.final_hidden(self.workspace, np.arange(len(meta.input_ids)))
        if self._pool_reads:
            rows = np.concatenate([np.arange(a, b) for _, a, b, _, _ in self._pool_reads])
            hidden = self.model.final_hidden(self.workspace, rows)
            at = 0
            for pool, a, b, position, last in self._pool_reads:
                pool.add(hidden[at:at + b - a], position, last)
                at += b - a
        return sampling, logits

    def _snapshot(self, out: SchedulerOutput) -> list[tuple[int, int]]:
        """The state copies that keep each drafting sequence's recurrent state as it
        was before the step (a hybrid model's), in a spare slot."""
        for spare in self._snapshots.values():   # a failed step's: nothing verified them
            self._spare_states.append(spare)
        self._snapshots.clear()
        if not self.kv.state_slots:
            return []
        copies = []
        for item in out.scheduled:
            if item.num_draft:
                if not self._spare_states:
                    raise RuntimeError("no spare state slot for a drafting sequence (the "
                                       "controller drafts for at most as many as there are)")
                spare = self._spare_states.pop()
                self._snapshots[item.seq] = spare
                copies.append((item.seq.state_slot, spare))
        return copies

    @property
    def num_spare_states(self) -> int:
        """How many sequences of a hybrid model may draft in one step."""
        return len(self._spare_states) + len(self._snapshots)

    def end_verify(self, seq: Sequence, rejected: bool) -> bool:
        """seq's drafts are verified: True when its recurrent state took rejected
        tokens and is restored (before the next step) to what it was before this one,
        so that the kept tokens are computed again."""
        spare = self._snapshots.pop(seq, None)
        if spare is None:
            return False
        self._spare_states.append(spare)
        if rejected and seq.state_slot >= 0:
            self._rollbacks.append((spare, seq.state_slot))
        return rejected

    def _encode(self, out: SchedulerOutput, states: Mapping[SeqKey, RequestState]) -> None:
        """An encoder-decoder's encoder, over the input of each sequence whose first
        chunk runs this step, into its state slot (read by this step's decoder rows).
        Requests of one window (Whisper's no-speech probe, best_of samples, fallbacks)
        share its features array: while a running sequence holds that array encoded,
        a new one copies its slot instead of encoding again."""
        runs, copies = [], []
        for item in out.scheduled:
            seq = item.seq
            features = states[seq.key].encoder_input
            if seq.num_computed or features is None:
                continue
            holder = self._encoded.get(id(features))
            if holder is not None and holder[0] is features and holder[1].state_slot >= 0 \
                    and holder[1].status is Status.RUNNING and holder[1] is not seq:
                copies.append((holder[1].state_slot, seq.state_slot))
                continue
            self._encoded[id(features)] = (features, seq)
            runs.append((features, seq.state_slot))
        if runs:
            self.model.encode([f for f, _ in runs], [slot for _, slot in runs], self.kv)
        self.kv.copy_states(copies)
        for key in [k for k, (_, held) in self._encoded.items()
                    if held.status is not Status.RUNNING]:
            del self._encoded[key]   # the holder finished or was preempted

    def forward(self, meta: BatchMeta, copies, state_copies=()) -> np.ndarray:
        """The model's forward over this runner's cache and workspace."""
        return self.model.forward(meta, self.kv, self.workspace, copies, state_copies)

    def prompt_logits(self, token_ids: np.ndarray, start: int,
                      block_tables: list[np.ndarray], logits_rows: np.ndarray) -> np.ndarray:
        """One sequence's tokens token_ids at positions start.. run without the
        scheduler or sampling (scoring a text: bench/perplexity.py): its KV blocks are
        block_tables (one per KV group, as Sequence.block_tables), and the result the
        logits of the chunk's rows logits_rows (a view of the workspace, valid until the
        next call). The tokens before start must be in those blocks already."""
        t, r, bs = len(token_ids), len(logits_rows), self.kv.block_size
        ids, positions = self._ids[:t], self._positions[:t]
        ids[:] = token_ids
        positions[:] = np.arange(start, start + t)
        groups = list(zip(self._slots, self._block_tables, strict=True))
        for (slots, block_table), blocks in zip(groups, block_tables, strict=True):
            block_table[0, :len(blocks)] = blocks
            np.add(block_table[0, positions // bs] * bs, positions % bs, out=slots[:t])
        self._query_start[1] = t
        self._seq_lens[0] = start + t
        self._logits_rows[:r] = logits_rows
        (slots, block_table), *others = groups
        meta = BatchMeta(ids, positions, slots[:t], self._query_start[:2], self._seq_lens[:1],
                         block_table[:1], self._logits_rows[:r],
                         tuple((sl[:t], bt[:1]) for sl, bt in others),
                         None if self._state_slots is None else self._state_slots[:1])
        return self.forward(meta, ())

    def sample(self, jobs: list[SampleJob], logits: np.ndarray,
               masks: np.ndarray | None = None) -> None:
        """Every job's tokens from the step's logits (engine/sampler.py): one kernel
        call over the rows; a job whose sampling failed has its `error` set."""
        self.sampler.sample(jobs, logits, masks)

    def resample(self, jobs: list[SampleJob], masks: np.ndarray) -> None:
        """Lazy constrained jobs whose token was refused, drawn again masked."""
        self.sampler.resample(jobs, masks)

    def sample_row(self, job: SampleJob, i: int, masks: np.ndarray | None, stream: int = 0
                   ) -> tuple[SampleResult, bool]:
        """Row i of a job alone (a constrained completion's verify rows)."""
        return self.sampler.sample_row(job, i, masks, stream)
