"""sampler: a step's tokens from its logits rows, in one kernel call.

Every completion that samples in a step hands its rows over as a SampleJob:
one logits row, or with speculative decoding the rows that verify its draft
tokens. The rows' parameters go into the columns of ops.RowSampler, and one
call on the kernel pool does, for every row, the grammar mask, bad words, the
logit bias, the raw logprobs and their top n, the penalties, DRY and the draw
(XTC in it) (sample.h). Only what a row rarely needs stays in Python, per row: a request's logits
processors (Whisper's timestamp rules) before the call, and verifying a draft
that was drawn from a distribution (engine/spec/verify.py) instead of it.

Randomness: a row's uniform draw is a pure function of the request's seed, the
completion's index and the output position the row produces
(ops.sample_uniform), so a seed's tokens do not depend on batching,
speculation, preemption or thread count. A request without a seed gets a
random one when it first samples.

Penalties, DRY and bad words read a completion's prompt and output ids from an
int32 buffer kept in its RequestState and extended as it grows; a verify step's
rows see the draft tokens before them appended (what the output is if they are
kept). XTC's draw, like the token's, is a function of the output position."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from armllm import ops
from armllm.engine.request_state import RequestState
from armllm.engine.sequence import Sequence
from armllm.engine.spec.verify import verify_drawn
from armllm.sampling import SampleResult, SamplingParams

# a random request's seed: numpy's default_rng bounds, and the C side's uint64
_SEED_BOUND = 2**63
# a lazy constrained row's second draw: a stream apart from every completion's own (its
# index, below 2^32) and from verify.py's
RESAMPLE_STREAM = 3 << 32


@dataclass(eq=False)
class SampleJob:
    """One completion's rows in a step. row: the index of its first row in the step's
    logits (None: `rows` is an array of its own, a forked completion's copy); drafts:
    the draft tokens its rows after the first verify; mask_rows: per row, its grammar
    mask's row in the step's masks (-1: none); lazy: its one row is sampled unmasked,
    and drawn again masked (resample) if its grammar refuses the token. The sampler
    fills `results` (a token per row it decided, in order) and `num_agreeing` (how
    many of the leading drafts the results keep), or `error` when this completion's
    sampling failed."""

    seq: Sequence
    state: RequestState
    rows: np.ndarray
    row: int | None
    drafts: list[int] = field(default_factory=list)
    draft_probs: np.ndarray | None = None
    mask_rows: list[int] = field(default_factory=list)
    results: list[SampleResult] = field(default_factory=list)
    num_agreeing: int = 0
    error: Exception | None = None
    output_len: int = -1   # the completion's output length when the job was made
    lazy: bool = False   # a grammar mask applied only if its token is refused (structured.py)

    def __post_init__(self):
        if self.output_len < 0:
            self.output_len = len(self.seq.output_ids)


def _edits_row(params: SamplingParams) -> bool:
    """Whether the sampling kernel writes a row of these parameters even with keep_row
    (its bias and penalties apply in place)."""
    return bool(params.logit_bias) or params.repetition_penalty != 1.0 \
        or bool(params.presence_penalty) or bool(params.frequency_penalty) \
        or params.dry or bool(params.bad_words)


class StepSampler:
    """The engine's sampling over a RowSampler sized for a step's rows: max_rows logits
    rows and max_forks forked completions' copies (one row each)."""

    def __init__(self, vocab_size: int, max_rows: int, max_forks: int):
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.kernel = ops.RowSampler(vocab_size, max_rows + max_forks)
        self._seed_source = np.random.default_rng()
        self._attached: set[int] = set()   # columns holding a history or a bias
        # lazy jobs' rows as they were before sampling (resample draws them again): the
        # rows themselves (keep_row) or, where the kernel edits them, copies
        self._unmasked = np.empty((0, vocab_size), np.float32)
        self._unmasked_of: dict[int, np.ndarray] = {}

    def sample(self, jobs: list[SampleJob], logits: np.ndarray,
               masks: np.ndarray | None = None) -> None:
        """Every job's tokens: the step's logits rows (row r of `logits` is column r),
        then the forked completions' own rows, in one kernel call each; masks: the
        grammar masks the jobs' mask_rows index."""
        k = self.kernel
        n = len(logits)
        if n > self.max_rows:
            raise ValueError(f"a step of {n} logits rows, the sampler holds {self.max_rows}")
        forks = [job for job in jobs if job.row is None]
        fork_column = {id(job): n + i for i, job in enumerate(forks)}
        total = n + len(forks)
        self._defaults(0, total)
        batched: list[tuple[SampleJob, int]] = []
        drawn: list[SampleJob] = []
        for job in jobs:
            if job.drafts and job.draft_probs is not None and not job.seq.params.greedy:
                drawn.append(job)   # verified in Python below
                continue
            first = job.row if job.row is not None else fork_column[id(job)]
            try:
                self._fill(job, first, masks)
                batched.append((job, first))
            except Exception as exc:  # noqa: BLE001 - this completion fails alone
                job.error = exc
                self._defaults(first, first + len(job.rows))
        self._keep_unmasked([(job, first) for job, first in batched if job.lazy])
        k.run(logits, 0, n, masks)
        if forks:   # their rows, after any logits processor ran on them
            k.run(np.stack([job.rows[0] for job in forks]), n, total, masks)
        for job, first in batched:
            if job.error is None:
                self._collect(job, first)
        for job in drawn:
            try:
                self._verify_drawn(job, masks)
            except Exception as exc:  # noqa: BLE001 - this completion fails alone
                job.error = exc

    def resample(self, jobs: list[SampleJob], masks: np.ndarray) -> None:
        """Lazy jobs whose grammar refused their token: their rows as they were before
        sample(), drawn again under their masks (mask_rows) with a fresh uniform (the
        completion's resample stream), in one kernel call."""
        rows = np.stack([self._unmasked_of[id(job)] for job in jobs])
        self._defaults(0, len(jobs))
        for column, job in enumerate(jobs):
            job.results.clear()
            job.rows = rows[column:column + 1]
            self._fill_row(job, 0, column, RESAMPLE_STREAM)
        self.kernel.run(rows, 0, len(jobs), masks)
        for column, job in enumerate(jobs):
            job.results.append(self._result(job.seq.params, column))

    def _keep_unmasked(self, jobs: list[tuple[SampleJob, int]]) -> None:
        """Lazy jobs' rows as they are before the draw (jobs: with their columns): the
        kernel leaves a row without bias or penalties as it is (keep_row; a lazy row
        has no mask), the others are copied."""
        edited = [job for job, _ in jobs if _edits_row(job.seq.params)]
        if len(self._unmasked) < len(edited):
            self._unmasked = np.empty((max(len(edited), 2 * len(self._unmasked)),
                                       self.vocab_size), np.float32)
        self._unmasked_of = {}
        for copy, job in zip(self._unmasked[:len(edited)], edited, strict=True):
            copy[:] = job.rows[0]
            self._unmasked_of[id(job)] = copy
        for job, column in jobs:
            if id(job) not in self._unmasked_of:
                self.kernel.keep_row[column] = 1
                self._unmasked_of[id(job)] = job.rows[0]

    def sample_row(self, job: SampleJob, i: int, masks: np.ndarray | None, stream: int = 0
                   ) -> tuple[SampleResult, bool]:
        """Row i of a job alone, after the step's batch (a constrained completion's
        verify rows, whose masks are known only once the tokens before them are); and
        whether its token keeps the job's draft there. stream: added to the
        completion's uniform stream (RESAMPLE_STREAM: a refused lazy row's redraw)."""
        draft = job.drafts[i] if i < len(job.drafts) else None
        if job.drafts and job.draft_probs is not None and not job.seq.params.greedy:
            return self._verify_drawn_row(job, i, masks)
        column = 0   # any: the batch's results are collected already
        self._defaults(column, column + 1)
        self._process(job, i, masks)
        self._fill_row(job, i, column, stream)
        self.kernel.run(job.rows[i:i + 1], column, column + 1, masks)
        result = self._result(job.seq.params, column)
        return result, result.token == draft

    # -- columns ---------------------------------------------------------------------

    def _defaults(self, begin: int, end: int) -> None:
        """Rows nobody samples (a finished completion's, a drawn draft's) argmax."""
        k = self.kernel
        k.temperature[begin:end] = 0.0
        k.top_p[begin:end] = 1.0
        k.min_p[begin:end] = 0.0
        k.top_k[begin:end] = 0
        k.repetition_penalty[begin:end] = 1.0
        k.presence_penalty[begin:end] = 0.0
        k.frequency_penalty[begin:end] = 0.0
        k.num_logprobs[begin:end] = -1
        k.mask_row[begin:end] = -1
        k.keep_row[begin:end] = 0
        k.dry_multiplier[begin:end] = 0.0
        k.xtc_probability[begin:end] = 0.0
        for column in [c for c in self._attached if begin <= c < end]:
            k.clear_history(column)
            k.clear_bias(column)
            k.clear_bad_words(column)
            k.clear_breakers(column)
            self._attached.discard(column)

    def _fill(self, job: SampleJob, first: int, masks: np.ndarray | None) -> None:
        for i in range(len(job.rows)):
            self._process(job, i, masks)
            self._fill_row(job, i, first + i)

    @staticmethod
    def _process(job: SampleJob, i: int, masks: np.ndarray | None) -> None:
        """Row i's logits processors (Whisper's, in Python), after its grammar mask
        (applied here then, not by the kernel)."""
        processors = job.seq.params.logits_processors
        if not processors:
            return
        row = job.rows[i]
        if i < len(job.mask_rows) and job.mask_rows[i] >= 0:
            ops.mask_logits(row, masks[job.mask_rows[i]])
            job.mask_rows[i] = -1
        output = job.seq.output_ids[:job.output_len] + job.drafts[:i]
        for processor in processors:
            processor(output, row)

    def _fill_row(self, job: SampleJob, i: int, column: int, stream: int = 0) -> None:
        """Column `column` from row i of a job; stream: added to the completion's
        uniform stream (its index)."""
        k, seq, state, params = self.kernel, job.seq, job.state, job.seq.params
        k.temperature[column] = params.temperature
        k.top_p[column] = params.top_p
        k.min_p[column] = params.min_p
        k.top_k[column] = max(params.top_k, 0)
        k.num_logprobs[column] = -1 if params.logprobs is None else params.logprobs
        k.mask_row[column] = job.mask_rows[i] if i < len(job.mask_rows) else -1
        k.keep_row[column] = 0
        if state.seed is None:
            state.seed = params.seed if params.seed is not None \
                else int(self._seed_source.integers(_SEED_BOUND))
        k.seed[column] = state.seed
        k.stream[column] = seq.index + stream
        k.counter[column] = job.output_len + i
        penalties = params.repetition_penalty != 1.0 or params.presence_penalty \
            or params.frequency_penalty
        if penalties:
            k.repetition_penalty[column] = params.repetition_penalty
            k.presence_penalty[column] = params.presence_penalty
            k.frequency_penalty[column] = params.frequency_penalty
        if params.kernel_only:
            self._fill_dry_xtc_words(params, state, column)
        if penalties or params.dry or params.bad_words:
            ids, length = history(seq, state, job.output_len, job.drafts)
            k.set_history(column, ids, length - len(job.drafts) + i, len(seq.prompt_ids))
            self._attached.add(column)
        if params.logit_bias:
            if state.bias is None:
                state.bias = (np.fromiter(params.logit_bias, np.int32, len(params.logit_bias)),
                              np.fromiter(params.logit_bias.values(), np.float32,
                                          len(params.logit_bias)))
            k.set_bias(column, *state.bias)
            self._attached.add(column)

    def _fill_dry_xtc_words(self, params: SamplingParams, state: RequestState, column: int
                            ) -> None:
        """Column `column`'s DRY, XTC and bad words (the sequence lists the engine made
        of the request's strings: engine/sample_words.py)."""
        k = self.kernel
        if params.dry:
            k.dry_multiplier[column] = params.dry_multiplier
            k.dry_base[column] = params.dry_base
            k.dry_allowed_length[column] = params.dry_allowed_length
            k.dry_last_n[column] = params.dry_penalty_last_n
            if state.breakers is not None:
                k.set_breakers(column, state.breakers)
                self._attached.add(column)
        if params.xtc:
            k.xtc_probability[column] = params.xtc_probability
            k.xtc_threshold[column] = params.xtc_threshold
        if state.bad_words is not None:
            k.set_bad_words(column, state.bad_words)
            self._attached.add(column)

    # -- results ---------------------------------------------------------------------

    def _result(self, params: SamplingParams, column: int) -> SampleResult:
        k = self.kernel
        token = int(k.token[column])
        if params.logprobs is None:
            return SampleResult(token)
        n = params.logprobs
        top = list(zip(k.top_ids[column, :n].tolist(), k.top_logprobs[column, :n].tolist(),
                       strict=True))
        return SampleResult(token, float(k.logprob[column]), top)

    def _collect(self, job: SampleJob, first: int) -> None:
        """The job's tokens up to the first that is not its draft (all of them, and the
        row after the last draft, when every draft is kept)."""
        params = job.seq.params
        for i in range(len(job.rows)):
            result = self._result(params, first + i)
            job.results.append(result)
            if i == len(job.drafts) or result.token != job.drafts[i]:
                break
            job.num_agreeing += 1

    def _verify_drawn(self, job: SampleJob, masks: np.ndarray | None) -> None:
        """Drafts drawn from a distribution q, row by row to the first rejected."""
        for i in range(len(job.rows)):
            result, agrees = self._verify_drawn_row(job, i, masks)
            job.results.append(result)
            if not agrees:
                break
            job.num_agreeing += 1

    def _verify_drawn_row(self, job: SampleJob, i: int, masks: np.ndarray | None
                          ) -> tuple[SampleResult, bool]:
        """A drawn draft kept with probability min(1, p / q), a rejected one replaced by
        a draw from the residual (verify.py)."""
        seq, state, params = job.seq, job.state, job.seq.params
        if state.seed is None:
            state.seed = int(self._seed_source.integers(_SEED_BOUND))
        mask = masks[job.mask_rows[i]] if i < len(job.mask_rows) \
            and job.mask_rows[i] >= 0 else None
        draft = job.drafts[i] if i < len(job.drafts) else None
        return verify_drawn(job.rows[i], params, seq.prompt_ids,
                            seq.output_ids[:job.output_len] + job.drafts[:i], mask, draft,
                            None if draft is None else job.draft_probs[i], state.seed,
                            seq.index, job.output_len + i)


def history(seq: Sequence, state: RequestState, output_len: int, drafts: list[int]
            ) -> tuple[np.ndarray, int]:
    """seq's prompt and first output_len output ids, then `drafts`, in its state's
    int32 buffer (grown and brought up to date here); returns the buffer and the ids'
    count."""
    known = len(seq.prompt_ids) + output_len
    need = known + len(drafts)
    buf = state.history
    if buf is None or len(buf) < need:
        grown = np.empty(max(2 * need, 64), np.int32)
        if buf is not None:
            grown[:state.history_len] = buf[:state.history_len]
        else:
            grown[:len(seq.prompt_ids)] = seq.prompt_ids
            state.history_len = len(seq.prompt_ids)
        state.history = buf = grown
    if state.history_len < known:
        buf[state.history_len:known] = seq.output_ids[state.history_len
                                                      - len(seq.prompt_ids):output_len]
    state.history_len = known
    buf[known:need] = drafts
    return buf, need
