"""structured: structured outputs in the engine: each constrained completion's
grammar state (an llguidance matcher that follows its tokens), and the step's
token masks, which the sampler applies to the logits rows (engine/sampler.py).

Where the masks are computed depends on whether the machine has a CPU the
kernel thread pool leaves free. If it has, they are computed there, on a
worker thread, while the model's forward runs (the kernels release the GIL),
and are ready when the logits are. If the pool has every CPU (the default),
a mask thread could only run by preempting a pool thread, and a pool thread
preempted in the middle of its chunk stalls the whole kernel for a scheduler
time slice (measured: +8% TPOT at 32 sequences for ~1% of mask work); the
masks are then computed on the engine's thread, and most of them not at all:
a lazy completion (greedy, or a plain temperature: no top-k,
top-p or min-p; no logprobs) samples its row unmasked, and only when its
grammar refuses the token is its mask computed and the row drawn again, masked,
with a fresh uniform (llguidance's "lazy" mode). That is exact: greedy keeps
the masked argmax when the argmax is allowed, and a draw from p kept when
allowed, else drawn again from p masked, gives each allowed token
p / mass(allowed), as masking first does. The other completions' masks are
computed on the engine's thread just before the forward, while the pool is
idle and the matchers' data is still in cache from the tokens they took
(measured: a third less time per mask than right after the forward, whose
weights evict it).

The llguidance tokenizer is built once per engine, on first use, from the
model's `tokenizers` JSON (a GGUF's rebuilt tokenizer included), with the
model's vocabulary size (masks are as wide as the logits rows) and its EOS
ids, which a grammar allows only where its output is complete."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from armllm import ops
from armllm.engine.completion import CompletionState
from armllm.model.reasoning import CONTENT
from armllm.model.tokenizer import TextTokenizer
from armllm.sampling import SamplingParams
from armllm.structured_output import StructuredOutput

MASK_BITS = 32  # tokens per mask word (llguidance's int32 bitmask)


class GrammarDeadEnd(RuntimeError):
    """A constrained completion reached a state its grammar allows no token from."""


class GrammarState:
    """One completion's place in its grammar. `row` is its mask's row this step."""

    __slots__ = ("matcher", "row")

    def __init__(self, matcher: Any):
        self.matcher, self.row = matcher, -1

    def accept(self, token: int) -> bool:
        """Advances past a sampled token; True once the grammar's output is complete
        (nothing may follow but EOS)."""
        if not self.matcher.consume_token(token):
            raise GrammarDeadEnd(f"structured output: the grammar refused token {token}: "
                                 f"{self.matcher.get_error()}")
        return self.matcher.is_stopped()

    def fork(self) -> GrammarState:
        """The same place, for a completion forked before its first token."""
        twin = GrammarState(self.matcher.deep_copy())
        twin.row = self.row
        return twin


class StructuredOutputs:
    """The engine's grammar machinery: new_state() per constrained completion, then
    per step start() (before the forward) and mask_row() (per constrained row, after)."""

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, eos_token_ids: frozenset[int],
                 max_num_seqs: int, overlap: bool | None = None):
        self._text_tokenizer, self.vocab_size = tokenizer, vocab_size
        # a CPU the kernel pool does not use: masks compute there during the forward
        self.spare_cpus = len(os.sched_getaffinity(0)) - ops.num_threads()
        self.overlap = self.spare_cpus > 0 if overlap is None else overlap
        self._eos = sorted(eos_token_ids)
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()      # check_request builds it from any thread
        self._masks = np.full((max_num_seqs, -(-vocab_size // MASK_BITS)), -1, np.int32)
        self._verify_mask = np.full((1, self._masks.shape[1]), -1, np.int32)   # see mask_now
        self._num_rows = 0                 # rows of _masks the step uses
        self._started: set[GrammarState] = set()   # the states start() took this step
        self._worker: ThreadPoolExecutor | None = None
        self._executor: Any = None
        self._pending: Future | None = None
        self.mask_seconds = 0.0            # time computing masks (either thread)
        self.wait_seconds = 0.0            # the engine thread's: computing or waiting
        self.num_masks = 0

    def _tokenizer(self) -> Any:
        """llguidance's view of the model's tokenizer; a ValueError (kept for later
        calls) if llguidance cannot read it."""
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance
                try:
                    self._ll_tokenizer = llguidance.LLTokenizer(
                        self._text_tokenizer.tokenizer.to_str(), n_vocab=self.vocab_size,
                        eos_token=self._eos or None)
                except Exception as exc:  # noqa: BLE001 - llguidance's reasons, as text
                    self._ll_tokenizer = (f"structured outputs are not available for this "
                                          f"model's tokenizer: {exc}")
            if isinstance(self._ll_tokenizer, str):
                raise ValueError(self._ll_tokenizer)
            return self._ll_tokenizer

    def new_state(self, spec: StructuredOutput) -> GrammarState:
        """A matcher at the grammar's start; a ValueError if the grammar cannot run
        with this model's tokenizer. Safe from any thread."""
        import llguidance
        matcher = llguidance.LLMatcher(self._tokenizer(), spec.spec, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_output.{spec.kind}: {matcher.get_error()}")
        return GrammarState(matcher)

    # -- per step --------------------------------------------------------------------------

    @staticmethod
    def lazy(params: SamplingParams, completion: CompletionState) -> bool:
        """Whether a completion samples unmasked first and is masked only when its
        grammar refuses the token (see the module's docstring): sampled greedily or
        with a plain temperature (no top-k, top-p, min-p), without logprobs or logits
        processors, in its answer. (Whether or not a spare CPU computes masks: a
        seed's tokens do not depend on it.)"""
        return completion.phase == CONTENT \
            and params.logprobs is None and not params.logits_processors \
            and (params.greedy or (params.top_k <= 0 and params.top_p == 1.0
                                   and params.min_p == 0.0))

    def allows(self, state: GrammarState, token: int) -> bool:
        """Whether the completion's grammar takes `token` next (after the worker, if
        it computes the step's masks, is done with the matchers)."""
        self.wait()
        return state.matcher.validate_tokens([token]) == 1

    def start(self, states: list[GrammarState]) -> None:
        """Computes the masks of the constrained completions that sample this step, or
        starts computing them on the worker thread."""
        self._num_rows = len(states)
        self._started = set(states)
        if not states:
            return
        for i, state in enumerate(states):
            state.row = i
        if not self.overlap:
            began = time.perf_counter()
            self._compute(states)
            self.wait_seconds += time.perf_counter() - began
            return
        if self._worker is None:
            import llguidance
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="armllm-grammar")
            self._executor = llguidance.LLExecutor(self.spare_cpus)
        self._pending = self._worker.submit(self._compute, states)

    def refused(self, states: list[GrammarState]) -> None:
        """The masks of lazy completions whose grammar refused their token: the step's
        when the worker computed them during the forward (with a spare CPU, start()
        takes lazy completions too), else computed now on the engine's thread, in
        rows after the step's."""
        self.wait()
        late = [state for state in states if state not in self._started]
        if not late:
            return
        began = time.perf_counter()
        for i, state in enumerate(late):
            state.row = self._num_rows + i
        self._num_rows += len(late)
        self._compute(late)
        self.wait_seconds += time.perf_counter() - began

    def _compute(self, states: list[GrammarState]) -> None:
        began = time.perf_counter()
        masks = self._masks
        row_bytes = masks.shape[1] * 4
        # on the spare CPUs in parallel; inline one by one (measured: llguidance's
        # threads contend with the pool's spinning ones and lose more than they gain)
        if len(states) > 1 and self._executor is not None:
            self._executor.unsafe_compute_mask_ptr([(s.matcher, s.row) for s in states],
                                                   masks.ctypes.data, row_bytes, len(masks))
        else:
            for s in states:
                s.matcher.unsafe_compute_mask_ptr(masks[s.row].ctypes.data, row_bytes)
        self.mask_seconds += time.perf_counter() - began
        self.num_masks += len(states)

    def wait(self) -> None:
        """Until the step's masks are computed (the matchers are the worker's until
        then)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            began = time.perf_counter()
            pending.result()
            self.wait_seconds += time.perf_counter() - began

    @property
    def masks(self) -> np.ndarray:
        """The step's masks, a row per constrained completion (GrammarState.row)."""
        return self._masks

    def mask_row(self, state: GrammarState, completion: CompletionState) -> int:
        """The row of the step's masks that holds the completion's (waiting for them
        the first time); GrammarDeadEnd if its grammar allows no token."""
        self.wait()
        self._check(state, completion, self._masks[state.row])
        return state.row

    def mask_now(self, state: GrammarState, completion: CompletionState, i: int
                 ) -> tuple[np.ndarray, list[int]]:
        """The masks and a job's mask_rows for row i of a constrained completion's
        verify (engine/sampler.py's sample_row): the step's mask for the first row if
        start() computed it; else (a later row, whose grammar state is known only once
        the tokens before it are accepted, or a lazy completion's refused token) a
        mask computed here, on the engine's thread."""
        if i == 0 and state in self._started:
            return self._masks, [self.mask_row(state, completion)]
        self.wait()
        began = time.perf_counter()
        mask = self._verify_mask
        state.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        self.mask_seconds += time.perf_counter() - began
        self.wait_seconds += time.perf_counter() - began
        self.num_masks += 1
        self._check(state, completion, mask[0])
        return mask, [-1] * i + [0]

    @staticmethod
    def _check(state: GrammarState, completion: CompletionState, mask: np.ndarray) -> None:
        """GrammarDeadEnd if the mask allows nothing; an undecided completion (the
        answer, or a reasoning block first) may open its reasoning block too."""
        if state.matcher.is_error() or not mask.any():
            raise GrammarDeadEnd("structured output: the grammar allows no token here"
                                 + (f": {state.matcher.get_error()}"
                                    if state.matcher.is_error() else ""))
        if completion.phase == "undecided":  # the answer, or a reasoning block first
            opener = completion.opener
            mask[opener // MASK_BITS] |= np.int32(np.uint32(1 << opener % MASK_BITS)
                                                  .view(np.int32))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
