"""speculator: speculative decoding in the engine's step: after the step's tokens
are verified, which sequences draft how many tokens for the next step
(controller.py), and asking the proposer for them.

The engine calls `verified` for each sequence whose drafts it verified (how
many were kept), `release` when a sequence leaves the running set, and
`propose` once per step after sampling, which leaves each chosen sequence's
drafts in Sequence.draft_ids (and, for drafts drawn at random, their
distributions in its RequestState) for the scheduler to run next step."""
from __future__ import annotations

from collections.abc import Mapping

from armllm.engine.request_state import RequestState, SeqKey
from armllm.engine.scheduler import Scheduler, SchedulerOutput
from armllm.engine.sequence import Sequence
from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.controller import SpecController, SpecStats, StepCost
from armllm.engine.spec.proposer import ProposeInput, Proposer


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer,
                 controller: SpecController, max_model_len: int,
                 max_drafting: int | None = None):
        self.config, self.proposer, self.controller = config, proposer, controller
        self.max_model_len = max_model_len
        self.max_drafting = max_drafting   # a hybrid's spare state slots: drafting sequences
        self._kept: dict[Sequence, int] = {}   # this step's verified sequences: rows kept

    @property
    def stats(self) -> SpecStats:
        return self.controller.stats

    def verified(self, seq: Sequence, num_draft: int, num_accepted: int, recompute: bool
                 ) -> None:
        """seq's verify kept num_accepted of num_draft drafts; recompute: its recurrent
        state was restored, so none of the step's rows count as kept."""
        self.controller.record(seq.key, num_draft, num_accepted)
        self._kept[seq] = 0 if recompute else 1 + num_accepted

    def release(self, seq: Sequence, finished: bool) -> None:
        self.proposer.release(seq.key, seq.all_ids, finished)
        if finished:
            self.controller.forget(seq.key)

    def propose(self, out: SchedulerOutput, scheduler: Scheduler,
                states: Mapping[SeqKey, RequestState], first_rows: list[int],
                hidden=None, overhead: float = 0.0) -> None:
        """The drafts of the step's generating sequences for the next step (and what
        the step kept, for a proposer that follows every position). overhead: the
        seconds the step spent outside the model's forward."""
        kept, self._kept = self._kept, {}
        self.controller.step_overhead(overhead)
        for seq in out.preempted:
            self.release(seq, finished=False)
        rows, wanted = [], {}   # (seq, its first row, rows kept), tokens it may draft
        for item, row in zip(out.scheduled, first_rows, strict=True):
            seq = item.seq
            if seq.finished or states[seq.key].pool is not None or seq not in \
                    scheduler.running:
                continue
            rows.append((seq, row, kept.get(seq, item.num_new_tokens - item.num_draft)))
            if seq.num_computed == seq.num_tokens - 1:   # decoding
                wanted[seq.key] = max(0, min(
                    self.config.num_speculative_tokens,
                    seq.params.max_tokens - len(seq.output_ids) - 1,
                    self.max_model_len - seq.num_tokens - 1))
        if not rows:
            return
        num_decoding = sum(1 for s in scheduler.running if s.num_computed == s.num_tokens - 1)
        ks = self.controller.plan({k: v for k, v in wanted.items() if v > 0}, num_decoding,
                                  scheduler.num_running, self.proposer.draft_seconds,
                                  self.max_drafting)
        # a proposer that follows every position sees every sequence's kept rows; lookups
        # and draft models catch up when asked, so only drafting sequences are built
        inputs, seqs = [], []
        for seq, row, num_kept in rows:
            k = ks.get(seq.key, 0)
            if not k and not self.proposer.wants_hidden:
                continue
            inputs.append(ProposeInput(
                seq.key, seq.all_ids, len(seq.prompt_ids), seq.num_computed - num_kept,
                num_kept, k, seq.params,
                None if hidden is None else hidden[row:row + num_kept]))
            seqs.append(seq)
        if not inputs:
            return
        for seq, item, draft in zip(seqs, inputs, self.proposer.propose(inputs), strict=True):
            tokens = draft.tokens[:item.k]
            seq.draft_ids = list(tokens)
            states[seq.key].draft_probs = None if draft.probs is None or not tokens \
                else draft.probs[:len(tokens)]


# methods whose proposer drafts from the target's last hidden states
HIDDEN_METHODS = frozenset({"mtp"})
# the most sequences that verify drafts in one step: on the CPUs measured (Xeon AMX,
# Zen 4/5 at 2-64 threads) a step's GEMMs are memory-bound up to about 8 rows and
# compute-bound past it, where the controller would draft for none of them anyway;
# it bounds the logits rows the workspace holds and a hybrid's snapshot state slots
MAX_DRAFTING_SEQS = 8
CALIBRATION_CONTEXT = 256   # tokens of context the verify-cost probes attend over


def build_proposer(config: SpeculativeConfig, loaded, args, max_model_len: int,
                   target_blocks: int, draft=None) -> Proposer:
    """The proposer of config.method for the loaded target model, whose KV cache holds
    target_blocks blocks (a draft model's holds what it holds, and every running
    sequence's drafts beyond); draft: method draft_model's loaded checkpoint."""
    if config.method == "ngram":
        from armllm.engine.spec.ngram import NgramProposer
        return NgramProposer(config)
    if config.method == "suffix":
        from armllm.engine.spec.suffix import SuffixProposer
        return SuffixProposer(config)
    if config.method in ("draft_model", "self_draft"):
        from armllm.engine.spec.draft_model import DraftModelProposer
        drafts = -(-(config.num_speculative_tokens - 1) // args.block_size)
        return DraftModelProposer(config, loaded, args, args.max_num_seqs, max_model_len,
                                  target_blocks + args.max_num_seqs * (1 + drafts), draft)
    from armllm.engine.spec.mtp import MTPProposer
    return MTPProposer(config, loaded, args.max_num_seqs, max_model_len, args.block_size,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       kv_cache_dtype=args.kv_cache_dtype, num_blocks=target_blocks)


def calibrate(runner, max_rows: int, max_draft: int, max_model_len: int,
              context: int = CALIBRATION_CONTEXT) -> StepCost:
    """The seconds of the target's forward at 1..max_rows rows (controller.StepCost),
    measured on this machine over `context` tokens of context (fewer when the
    model's context is shorter), in KV blocks no sequence holds yet
    (tools/bench_verify_cost.py prints them)."""
    import numpy as np
    bs = runner.kv.block_size
    room = min(max_model_len, min(n for _, n in runner.kv.pool_layout) * bs)
    max_rows = max(1, min(max_rows, room // 2))
    context = max(1, min(context, room - max_rows))
    blocks = np.arange(-(-(context + max_rows) // bs), dtype=np.int32)
    tables = [blocks for _ in runner.kv.groups]
    ids = np.zeros(context + max_rows, np.int32)   # token 0: any id of the vocabulary
    chunk = runner.workspace.max_tokens
    for start in range(0, context, chunk):
        end = min(context, start + chunk)
        runner.prompt_logits(ids[start:end], start, tables, np.array([end - start - 1]))
    return StepCost.measure(
        lambda m: runner.prompt_logits(ids[context:context + m], context, tables,
                                       np.arange(m)), max_rows, max_draft)
