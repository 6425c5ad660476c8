"""runner: turns a SchedulerOutput into one model forward and sampled tokens.

Owns the KV cache and the workspace; builds the flattened BatchMeta (numpy)
the model reads, makes the copy-on-write block copies first, and samples each
sequence's token with its own random generator."""
from __future__ import annotations

import numpy as np

from armllm.engine.scheduler import SchedulerOutput
from armllm.engine.sequence import Sequence
from armllm.model.llama import BatchMeta, KVCache, LlamaModel, Workspace
from armllm.sampling import SampleResult, sample_row, sample_scratch


class ModelRunner:
    def __init__(self, model: LlamaModel, kv: KVCache, max_num_batched_tokens: int,
                 max_num_seqs: int, max_model_len: int):
        self.model, self.kv = model, kv
        self.workspace = Workspace(model.config, max_num_batched_tokens, max_num_seqs,
                                   model.formats, max_seq_len=max_model_len)
        self.max_blocks = -(-max_model_len // kv.block_size)
        self._seed_source = np.random.default_rng()
        self._block_table = np.zeros((max_num_seqs, self.max_blocks), np.int32)
        self._sample_scratch = sample_scratch(model.config.vocab_size)

    def build_meta(self, out: SchedulerOutput) -> tuple[BatchMeta, list[Sequence]]:
        """The batch, and the sequences (in logits-row order) that sample a token."""
        bs = self.kv.block_size
        n = len(out.scheduled)
        ids, positions, query_start = [], [], [0]
        seq_lens = np.empty(n, np.int32)
        block_table = self._block_table[:n]
        logits_rows, sampling = [], []
        for b, item in enumerate(out.scheduled):
            seq = item.seq
            start = seq.num_computed
            stop = start + item.num_new_tokens
            if item.num_new_tokens == 1 and start >= len(seq.prompt_ids):  # a decode
                ids.append(seq.output_ids[start - len(seq.prompt_ids)])
            else:
                ids.extend(seq.all_ids[start:stop])
            positions.extend(range(start, stop))
            query_start.append(query_start[-1] + item.num_new_tokens)
            seq_lens[b] = stop
            block_table[b, :len(seq.block_table)] = seq.block_table
            if stop == seq.num_tokens:  # the prompt is complete: this row samples
                logits_rows.append(query_start[-1] - 1)
                sampling.append(seq)
        pos = np.asarray(positions, np.int32)
        rows_block = np.repeat(np.arange(n), np.diff(query_start))
        slots = (block_table[rows_block, pos // bs] * bs + pos % bs).astype(np.int32)
        meta = BatchMeta(np.asarray(ids, np.int32), pos, slots,
                         np.asarray(query_start, np.int32), seq_lens, block_table,
                         np.asarray(logits_rows, np.int64))
        return meta, sampling

    def run(self, out: SchedulerOutput) -> tuple[list[Sequence], np.ndarray]:
        """Runs the step; returns the sequences that sample and their logits rows
        (a view of the workspace, valid until the next step)."""
        if out.copies:
            self.kv.copy_blocks(out.copies)
        meta, sampling = self.build_meta(out)
        return sampling, self.model.forward(meta, self.kv, self.workspace)

    def sample(self, seq: Sequence, row: np.ndarray) -> SampleResult:
        """seq's next token from its logits row (modified in place)."""
        if seq.rng is None:
            seed = seq.params.seed
            if seed is None:
                seed = int(self._seed_source.integers(2**63))
            # completion i > 0 of a seeded request draws from its own stream
            seq.rng = np.random.default_rng(seed if seq.index == 0 else [seed, seq.index])
        return sample_row(row, seq.params, seq.rng, seq.prompt_ids, seq.output_ids,
                          self._sample_scratch)
