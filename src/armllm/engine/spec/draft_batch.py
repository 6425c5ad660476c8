"""draft_batch: DraftBatch, the arrays of a proposer's own forward (a draft model's,
an MTP block's), allocated once and filled in place, sequence by sequence, into the
BatchMeta the model's forward takes."""
from __future__ import annotations

import numpy as np

from armllm.model.decoder import BatchMeta


class DraftBatch:
    """Up to max_seqs sequences of up to max_tokens rows in all, each with a block
    table of up to max_blocks blocks of block_size tokens."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, block_size: int):
        self.block_size = block_size
        self.ids, self.positions = np.empty(max_tokens, np.int32), np.empty(max_tokens, np.int32)
        self.slots = np.empty(max_tokens, np.int32)
        self.query_start = np.zeros(max_seqs + 1, np.int32)
        self.seq_lens = np.empty(max_seqs, np.int32)
        self.block_table = np.zeros((max_seqs, max_blocks), np.int32)
        self.state_slots = np.zeros(max_seqs, np.int32)
        self.logits_rows = np.empty(max_seqs, np.int64)
        self.num_rows = self.num_seqs = self.num_logits = 0

    def clear(self) -> None:
        self.num_rows = self.num_seqs = self.num_logits = 0

    def add(self, ids, start: int, blocks: np.ndarray, wants_logits: bool,
            state_slot: int = 0) -> slice:
        """Appends a sequence: its token ids at positions start.., its KV blocks (the
        block ids, in order), whether its last row needs logits, its state slot (a
        hybrid's). Returns its rows."""
        b, row, bs = self.num_seqs, self.num_rows, self.block_size
        end = row + len(ids)
        self.ids[row:end] = ids
        positions = self.positions[row:end]
        positions[:] = np.arange(start, start + len(ids))
        table = self.block_table[b]
        table[:len(blocks)] = blocks
        np.add(table[positions // bs] * bs, positions % bs, out=self.slots[row:end])
        self.query_start[b + 1] = end
        self.seq_lens[b] = start + len(ids)
        self.state_slots[b] = max(state_slot, 0)
        if wants_logits:
            self.logits_rows[self.num_logits] = end - 1
            self.num_logits += 1
        self.num_rows, self.num_seqs = end, b + 1
        return slice(row, end)

    def meta(self, with_state_slots: bool = False) -> BatchMeta:
        """The batch added since clear(), as views of the arrays."""
        t, n = self.num_rows, self.num_seqs
        return BatchMeta(self.ids[:t], self.positions[:t], self.slots[:t],
                         self.query_start[:n + 1], self.seq_lens[:n], self.block_table[:n],
                         self.logits_rows[:self.num_logits],
                         state_slots=self.state_slots[:n] if with_state_slots else None)
