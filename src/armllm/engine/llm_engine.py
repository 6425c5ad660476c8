"""llm_engine: the step loop (schedule, run the model, sample, postprocess)
and what each step emits per completion (StepOutput), the engine's requests
(add, abort, error isolation) and its counters. Single-threaded: one owner
calls add_request, abort and step (the sync LLM, or the engine thread of
AsyncLLM/the server).

The parts it drives: the Scheduler (which tokens run, KV blocks, forking n > 1
completions), a runner (the model forward and the sampler) and, per
completion, a RequestState (its CompletionState: stop conditions and text; its
grammar, pooling and random generator), which the engine owns. With
speculative decoding (engine/spec/), a Speculator drafts tokens after each
step, and a sequence's logits rows in the next step verify them: the engine
emits the tokens the target model itself chooses at each row, left to right,
as long as they agree with the drafts."""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from armllm.engine.completion import CompletionState
from armllm.engine.embedding import SCORE_POOLING, PoolingParams, PoolState, pooling_refusal
from armllm.engine.outputs import EngineStats, RequestMetrics, StepOutput
from armllm.engine.request_state import RequestState, SeqKey
from armllm.engine.sample_words import SampleWords
from armllm.engine.sampler import RESAMPLE_STREAM, SampleJob
from armllm.engine.scheduler import Scheduler, SchedulerOutput
from armllm.engine.sequence import Sequence, Timings
from armllm.engine.spec.speculator import Speculator
from armllm.engine.structured import StructuredOutputs
from armllm.model.harmony import HarmonyRouter, harmony_tokens
from armllm.model.loader import LoadedModel
from armllm.model.reasoning import CONTENT, REASONING, THINK_PARSERS, ThinkRouter, think_tags
from armllm.model.tokenizer import TextTokenizer
from armllm.sampling import SampleResult, SamplingParams

log = logging.getLogger("armllm")


def _merge(first: StepOutput, then: StepOutput) -> StepOutput:
    """One StepOutput for two of a completion's tokens in one step (a verify's)."""
    return StepOutput(first.request_id, first.index, first.new_token_ids + then.new_token_ids,
                      first.text_delta + then.text_delta, then.finish_reason,
                      first.logprobs + then.logprobs, then.error, then.metrics,
                      first.reasoning_delta + then.reasoning_delta,
                      stop_reason=then.stop_reason)


class RequestRejected(ValueError):
    """A request that could never be served, however long it waited; `field` names
    what to change: "prompt", "max_tokens" or "n"."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


class EngineDead(RuntimeError):
    """The engine cannot run another step (a tensor-parallel rank died): every request
    in flight ended with this error, and new ones are refused with it."""


class ContextLengthExceeded(RequestRejected):
    """The prompt, or the prompt with max_tokens, is longer than the model's context
    (max_model_len) or the KV cache can hold."""


class Runner(Protocol):
    """What the engine needs of a model runner (engine/runner.py's ModelRunner)."""

    def run(self, out: SchedulerOutput, states: Mapping[SeqKey, RequestState]
            ) -> tuple[list[Sequence], Any]:
        """Runs the step (`states`: every scheduled sequence's, by key; an embedding's
        pooling takes its rows); returns the sequences that sample a token and their
        logits rows (indexable in that order; a row has .copy())."""

    def sample(self, jobs: list[SampleJob], logits: Any, masks: Any) -> None:
        """Every job's tokens from the step's logits rows (it may modify them) and the
        grammar masks its mask_rows index: fills each job's results and num_agreeing,
        or its error (engine/sampler.py)."""

    def resample(self, jobs: list[SampleJob], masks: Any) -> None:
        """Lazy jobs whose token their grammar refused: their first rows as they were
        before the step's sampling, drawn again with their masks (a fresh uniform)."""

    def sample_row(self, job: SampleJob, i: int, masks: Any, stream: int = 0
                   ) -> tuple[SampleResult, bool]:
        """Row i of a job alone, with the mask its mask_rows[i] gives in masks (stream:
        added to the completion's uniform stream); and whether the token keeps the
        job's draft there."""

    def end_verify(self, seq: Sequence, rejected: bool) -> bool:
        """seq's drafts are verified; True when its recurrent state is restored to
        before the step (its kept tokens are computed again)."""

    # each scheduled sequence's first row in the last run, and (for a proposer that
    # drafts from them) the last hidden states of its rows, else None
    first_rows: list[int]
    hidden: Any
    forward_seconds: float   # the last run's model forward

    def close(self) -> None:
        """Releases what the runner holds beyond memory (a tensor-parallel group's
        processes)."""


@dataclass
class _Request:
    first: Sequence     # completion 0: carries the prompt and forks the others from it
    num_open: int       # completions not finished yet


class LLMEngine:
    """Serves requests for one model: `loaded` gives its config and tokenizer, the
    scheduler (with its block manager) decides what runs, the runner runs it
    (engine/setup.py's build_engine puts them together). `reasoning_parser` (see
    model/reasoning.py) splits a reasoning model's output into reasoning and
    answer; a harmony tokenizer (GPT-OSS) always has its channels split."""

    def __init__(self, loaded: LoadedModel, scheduler: Scheduler, runner: Runner,
                 reasoning_parser: str | None = None, speculator: Speculator | None = None):
        c = loaded.config
        self.loaded, self.scheduler, self.runner = loaded, scheduler, runner
        self.speculator = speculator
        self.blocks = scheduler.blocks
        self.max_model_len = scheduler.max_model_len
        self.tokenizer = TextTokenizer(loaded.tokenizer, loaded.tokenizer_config)
        gen_eos = loaded.generation_config.get("eos_token_id")  # an int or a list in the wild
        eos = set(c.eos_token_ids) | set([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
        eos_tok = self.tokenizer.token_id(self.tokenizer.eos_token)
        self.eos_token_ids = frozenset(eos | ({eos_tok} if eos_tok is not None else set()))
        self.harmony = harmony_tokens(self.tokenizer)   # GPT-OSS: output in channels
        self.think = None
        if reasoning_parser == "harmony" and self.harmony is None:
            raise ValueError("reasoning_parser 'harmony' needs a tokenizer with the harmony "
                             "tokens (<|channel|>, <|message|>, ...), which this model lacks")
        if reasoning_parser in THINK_PARSERS:
            if self.harmony is not None:
                raise ValueError(f"reasoning_parser {reasoning_parser!r} does not apply to a "
                                 "harmony model (GPT-OSS): its channels are split already")
            self.think = think_tags(self.tokenizer, reasoning_parser)
        self.structured = StructuredOutputs(self.tokenizer, c.vocab_size, self.eos_token_ids,
                                            scheduler.max_num_seqs)
        self.words = SampleWords(self.tokenizer, c.vocab_size)   # DRY breakers, bad words
        self._requests: dict[str, _Request] = {}
        self._states: dict[SeqKey, RequestState] = {}   # per unfinished sequence
        self._deferred: list[StepOutput] = []   # aborts, reported by the next step
        self._num_prompt_tokens = self._num_generation_tokens = 0
        self._finished: Counter[str] = Counter()
        self._dead: str | None = None   # why the engine cannot go on (EngineDead)

    # -- requests ------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int],
                    params: SamplingParams | PoolingParams, priority: int = 0,
                    arrival_time: float | None = None,
                    encoder_input: np.ndarray | None = None) -> None:
        """Queues a request, a generation or (PoolingParams) an embedding; raises
        ValueError (and queues nothing) if it is invalid or could never fit.
        encoder_input: an encoder-decoder's (Whisper's) input, the log-mel features
        [n_mels, frames] of one window, which its encoder runs once."""
        if self._dead is not None:
            raise EngineDead(self._dead)
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(priority, int):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        self.check_request(prompt_ids, params, encoder_input)
        seq = Sequence(request_id, list(prompt_ids), params, priority=priority,
                       num_forks_pending=params.n - 1,
                       timings=Timings(arrival_time or time.monotonic()))
        state = RequestState()
        if isinstance(params, SamplingParams):
            self._sample_words(params, state)
        if encoder_input is not None:   # its KV depends on the audio: no prefix cache
            state.encoder_input = np.ascontiguousarray(encoder_input, np.float32)
            seq.reuse_prefix = False
            seq.encoder_len = self.loaded.config.encoder.positions
        if isinstance(params, PoolingParams):
            state.pool = PoolState(self.loaded.pooling, params) if params.task == "embed" \
                else PoolState(SCORE_POOLING, params, self.loaded.score_head)
            seq.reuse_prefix = not state.pool.pooling.reads_every_row
        else:
            state.completion = self._completion_state(seq)
        if params.structured_output is not None:
            state.grammar = self.structured.new_state(params.structured_output)
        self.scheduler.add(seq)
        self._states[seq.key] = state
        self._requests[request_id] = _Request(seq, params.n)
        self._num_prompt_tokens += len(prompt_ids)

    def _sample_words(self, params: SamplingParams, state: RequestState) -> None:
        """The request's DRY breakers and bad words as the sampler's token sequences."""
        if params.dry and params.dry_sequence_breakers:
            try:
                state.breakers = self.words.breakers(tuple(params.dry_sequence_breakers))
            except ValueError as exc:
                raise RequestRejected(str(exc), "dry_sequence_breakers") from None
        if params.bad_words:
            try:
                state.bad_words = self.words.bad_words(tuple(params.bad_words))
            except ValueError as exc:
                raise RequestRejected(str(exc), "bad_words") from None

    def check_request(self, prompt_ids: list[int], params: SamplingParams | PoolingParams,
                      encoder_input: np.ndarray | None = None) -> None:
        """Raises RequestRejected (a ValueError naming the value and, in `field`, what
        to change) if this request could never be served: a prompt that is empty or
        holds ids outside the vocabulary, a prompt (+ max_tokens) longer than
        max_model_len (which build_engine already capped to what the KV cache holds),
        more KV blocks than the cache has, more completions (n) than max_num_seqs, or
        a structured output whose grammar cannot run with this model's tokenizer; a
        generation on an embedding model (no lm_head), an embedding of a model whose
        pooling armllm does not run, or `dimensions` the model does not allow.
        Reads only fixed limits and the grammar: safe from any thread."""
        embedding = isinstance(params, PoolingParams)
        self._check_encoder_input(encoder_input, embedding)
        if embedding:
            refusal = pooling_refusal(self.loaded, params)
            if refusal is not None:
                raise RequestRejected(*refusal)
        elif not self.loaded.config.has_lm_head:
            raise RequestRejected(
                "this model has no lm_head (an embedding model or a reranker): it serves "
                + ("scores and embeddings" if self.loaded.score_head else "embeddings")
                + " only", "model")
        if not isinstance(prompt_ids, list):
            raise RequestRejected(f"the prompt must be a list of token ids, got "
                                  f"{type(prompt_ids).__name__}", "prompt")
        if not prompt_ids:
            raise RequestRejected("the prompt is empty", "prompt")
        vocab = self.loaded.config.vocab_size
        bad = next((t for t in prompt_ids if type(t) is not int or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestRejected(f"prompt token id {bad!r} is outside the vocabulary "
                                  f"[0, {vocab})" if type(bad) is int else
                                  f"the prompt must be a list of token ids, it holds {bad!r}",
                                  "prompt")
        max_len, prompt_len = self.max_model_len, len(prompt_ids)
        if embedding and prompt_len > max_len:
            raise ContextLengthExceeded(
                f"the input has {prompt_len} tokens; this model's maximum context length "
                f"(max_model_len) is {max_len}", "prompt")
        if not embedding and prompt_len >= max_len:  # a token must fit after the prompt
            raise ContextLengthExceeded(
                f"the prompt has {prompt_len} tokens; this model's maximum context length "
                f"(max_model_len) is {max_len}, prompt and output together", "prompt")
        total = prompt_len + params.max_tokens
        if total > max_len:
            raise ContextLengthExceeded(
                f"prompt ({prompt_len} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds max_model_len {max_len}", "max_tokens")
        try:  # the scheduler's own limits: the KV cache's size, max_num_seqs
            self.scheduler.check_fits(prompt_len, params.max_tokens, params.n)
        except ValueError as exc:
            raise RequestRejected(str(exc), "n" if params.n > self.scheduler.max_num_seqs
                                  else "max_tokens") from None
        bias = getattr(params, "logit_bias", None)
        if bias:
            bad = next((t for t in bias if t >= vocab), None)
            if bad is not None:
                raise RequestRejected(f"logit_bias token id {bad} is outside the vocabulary "
                                      f"[0, {vocab})", "logit_bias")
        if params.structured_output is not None:
            try:
                self.structured.new_state(params.structured_output)
            except ValueError as exc:
                raise RequestRejected(str(exc), "structured_output") from None

    def _check_encoder_input(self, encoder_input: np.ndarray | None, embedding: bool) -> None:
        """An encoder-decoder (Whisper) needs its encoder's input, of its shape; any
        other model takes none."""
        encoder = self.loaded.config.encoder
        if encoder is None:
            if encoder_input is not None:
                raise RequestRejected("this model has no encoder: it takes text, not audio",
                                      "file")
            return
        if encoder_input is None or embedding:
            raise RequestRejected("this model transcribes speech (an encoder-decoder): send "
                                  "audio (LLM.transcribe, /v1/audio/transcriptions)", "model")
        shape = (encoder.n_mels, 2 * encoder.positions)
        if getattr(encoder_input, "shape", None) != shape:
            raise RequestRejected(f"the encoder input has shape "
                                  f"{list(getattr(encoder_input, 'shape', ()))}, this model "
                                  f"takes [{shape[0]}, {shape[1]}] (one 30 s window of "
                                  f"{shape[0]}-bin log-mel features)", "file")

    def _completion_state(self, seq: Sequence) -> CompletionState:
        # reasoning and answer apart, unless special tokens are asked for (the raw output)
        router = None
        if seq.params.skip_special_tokens:
            if self.harmony is not None:
                router = HarmonyRouter(self.harmony, self.tokenizer)
            elif self.think is not None:
                router = ThinkRouter(self.think, self.tokenizer, seq.prompt_ids)
        return CompletionState(self.tokenizer, seq.prompt_ids, seq.params, self.eos_token_ids,
                               self.max_model_len, router)

    def abort(self, request_id: str) -> bool:
        """Stops a request and frees its KV blocks now; the next step reports it
        finished with reason "abort". An unknown or finished id is ignored (False)."""
        if request_id not in self._requests:
            return False
        self._deferred += self._end_request(request_id, "abort")
        return True

    def _end_request(self, request_id: str, reason: str, error: str | None = None
                     ) -> list[StepOutput]:
        """Finishes every open completion of a request (abort or error)."""
        first = self._requests.pop(request_id).first
        outs = []
        for seq in sorted(self.scheduler.sequences(request_id), key=lambda s: s.index):
            state = self._finish(seq, reason)
            completion = state.completion if state is not None else None
            outs.append(self._final(seq, [], "", reason, error, num_reasoning=(
                completion.num_reasoning_tokens if completion is not None else 0)))
        n = first.params.n
        for index in range(n - first.num_forks_pending, n):  # completions never forked
            outs.append(StepOutput(request_id, index, [], "", reason, error=error,
                                   metrics=self._metrics(first)))
        self._finished[reason] += first.num_forks_pending
        return outs

    def _finish(self, seq: Sequence, reason: str) -> RequestState | None:
        """seq is done: the scheduler frees its blocks, and its state goes (returned)."""
        if self.speculator is not None:
            self.speculator.release(seq, finished=True)
        self.scheduler.finish(seq, reason)
        return self._states.pop(seq.key, None)   # None: a fork the step ended before its state

    def _fail(self, request_ids: Iterable[str], exc: Exception) -> list[StepOutput]:
        """Ends these requests with finish reason "error"; the others go on."""
        open_ids = [rid for rid in dict.fromkeys(request_ids) if rid in self._requests]
        error = f"{type(exc).__name__}: {exc}"
        if open_ids:
            log.error("request(s) %s failed: %s", ", ".join(open_ids), error,
                      exc_info=exc if exc.__traceback__ is not None else None)
        return [out for rid in open_ids for out in self._end_request(rid, "error", error)]

    @property
    def failure(self) -> str | None:
        """Why the engine cannot run another step (its runner's failure, e.g. a dead
        tensor-parallel rank, seen even while idle), or None."""
        return self._dead or getattr(self.runner, "failure", None)

    def fail_all(self) -> list[StepOutput]:
        """Ends every request in flight with the engine's failure (an idle engine found
        dead); new requests are refused with it."""
        self._dead = self.failure
        outputs, self._deferred = self._deferred, []
        return outputs + self._fail(list(self._requests), EngineDead(self._dead))

    def close(self) -> None:
        """Writes the prefix cache's blocks to its disk tier (--prefix-cache-dir) and
        releases the runner's processes (tensor parallel); the engine is unusable
        afterwards."""
        self.blocks.close(save=not self._dead)
        self._dead = self._dead or "the engine is shut down"
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def has_unfinished(self) -> bool:
        return bool(self._requests or self._deferred)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    # -- one step ------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """Schedules, runs the model, samples a token per completion that needs one and
        postprocesses it; returns what changed (aborts since the last step included)."""
        began = time.perf_counter()
        outputs, self._deferred = self._deferred, []
        out = self.scheduler.schedule()
        if not out.scheduled:
            return outputs
        # the constrained completions that sample an answer token: their masks (a lazy
        # one's only if its token is refused, after the step's batch, unless a spare CPU
        # computes them during the forward anyway)
        states = self._states
        self.structured.start([state.grammar for s in out.scheduled
                               if (state := states[s.seq.key]).grammar is not None
                               and s.seq.num_computed + s.num_new_tokens - s.num_draft
                               == s.seq.num_tokens
                               and state.completion.phase != REASONING
                               and (s.num_draft or self.structured.overlap
                                    or not self.structured.lazy(s.seq.params,
                                                                state.completion))])
        try:
            sampling, logits = self.runner.run(out, states)
        except EngineDead as exc:  # nothing can run: every request ends with the reason
            self._dead = str(exc)
            return outputs + self._fail(list(self._requests), exc)
        except Exception as exc:  # fail this step's requests, keep serving the others
            return outputs + self._fail((item.seq.request_id for item in out.scheduled), exc)
        forks = self.scheduler.update(out)  # computed tokens, prefix cache, n > 1 forks
        for item in out.scheduled:   # embeddings whose prompt is done
            seq = item.seq
            pool = states[seq.key].pool
            if pool is not None and seq.num_computed == seq.num_tokens:
                outputs.append(self._embedded(seq, pool))
        num_drafts = {item.seq: item.num_draft for item in out.scheduled if item.num_draft}
        jobs = list(self._sample_jobs(sampling, logits, forks, num_drafts))
        batched = [job for job in jobs if not self._sequential(job)]
        try:
            self.runner.sample(batched, logits, self.structured.masks)
            refused = [job for job in batched if job.lazy and job.error is None
                       and not self.structured.allows(job.state.grammar,
                                                      job.results[0].token)]
            if refused:   # their masks, and their rows drawn again under them
                self.structured.refused([job.state.grammar for job in refused])
                for job in refused:
                    try:
                        job.mask_rows = [self.structured.mask_row(job.state.grammar,
                                                                  job.state.completion)]
                    except Exception as exc:  # noqa: BLE001 - a dead end fails alone
                        job.error = exc
                refused = [job for job in refused if job.error is None]
                if refused:
                    self.runner.resample(refused, self.structured.masks)
        except Exception as exc:  # the sampler itself failed: this step's completions end
            for job in batched:
                job.error = job.error or exc
        for job in jobs:
            if job.seq.finished:   # its request failed earlier in this loop
                continue
            try:
                if job.error is not None:
                    raise job.error
                outputs.append(self._emit(job))
            except Exception as exc:  # this request ends alone
                outputs += self._fail([job.seq.request_id], exc)
        if self.speculator is not None:   # the next step's drafts
            self.speculator.propose(out, self.scheduler, states, self.runner.first_rows,
                                    self.runner.hidden, time.perf_counter() - began
                                    - self.runner.forward_seconds)
        return outputs

    @staticmethod
    def _sequential(job: SampleJob) -> bool:
        """Whether a job's rows are sampled one by one after the step's batch: a
        constrained completion's verify rows, whose masks (and whether the grammar
        applies yet: a reasoning block may end inside the draft) follow the tokens
        before them."""
        return job.state.grammar is not None and bool(job.drafts)

    def _emit(self, job: SampleJob) -> StepOutput:
        """The tokens a job's rows give: one, or with draft tokens to verify, the
        target's own token at each row as long as the draft agrees (and one more after
        a fully kept draft), until the completion ends."""
        seq, state = job.seq, job.state
        num_draft = len(job.drafts)
        step = None
        accepted = 0
        try:
            for i in range(num_draft + 1):
                if self._sequential(job):
                    result, agrees = self._sample_constrained(job, i)
                elif i < len(job.results):
                    result, agrees = job.results[i], i < job.num_agreeing
                else:
                    break
                forced = state.completion.forced_token()
                if forced is not None and forced != result.token:   # a reasoning budget
                    result = SampleResult(forced, None, result.top_logprobs)
                    agrees = i < num_draft and job.drafts[i] == forced
                out = self._postprocess(seq, state, result)
                step = out if step is None else _merge(step, out)
                if out.finish_reason is not None or not agrees:
                    break
                accepted += 1
        finally:
            if num_draft:
                recompute = self.runner.end_verify(seq, accepted < num_draft)
                if not seq.finished:
                    self.scheduler.accept_drafts(seq, num_draft, accepted, recompute)
                    self.speculator.verified(seq, num_draft, accepted, recompute)
        return step

    def _sample_constrained(self, job: SampleJob, i: int) -> tuple[SampleResult, bool]:
        """Row i of a constrained completion's verify, alone, masked as the batch masks
        it: a lazy completion's row unmasked first, masked and drawn again only if its
        grammar refuses the token (so its tokens are the ones it gets without
        speculation)."""
        state = job.state
        grammar, completion = state.grammar, state.completion
        if completion.phase == REASONING:   # the grammar constrains the answer only
            job.mask_rows = []
            return self.runner.sample_row(job, i, None)
        if self.structured.lazy(job.seq.params, completion):
            unmasked = np.array(job.rows[i])
            job.mask_rows = []
            result, agrees = self.runner.sample_row(job, i, None)
            if self.structured.allows(grammar, result.token):
                return result, agrees
            job.rows[i] = unmasked
            masks, job.mask_rows = self.structured.mask_now(grammar, completion, i)
            return self.runner.sample_row(job, i, masks, RESAMPLE_STREAM)
        masks, job.mask_rows = self.structured.mask_now(grammar, completion, i)
        return self.runner.sample_row(job, i, masks)

    def _sample_jobs(self, sampling: list[Sequence], logits: Any,
                     forks: dict[Sequence, list[Sequence]], num_drafts: dict[Sequence, int]
                     ) -> Iterator[SampleJob]:
        """A SampleJob for each completion that samples this step, with its logits rows
        (one, and one per draft token it verifies) and its grammar's mask. The
        completions forked from a prompt that finished this step start their own state
        and sample from copies of its row (sampling edits a row in place). Skips
        completions whose request failed earlier in the step."""
        at = 0
        for seq in sampling:
            first = at
            rows = logits[at:at + 1 + num_drafts.get(seq, 0)]
            at += len(rows)
            if seq.finished:   # and so are its forks
                continue
            children = forks.get(seq) if forks else None
            if children:
                grammar = self._states[seq.key].grammar
                if grammar is not None:
                    self.structured.wait()  # the parent's matcher is the worker's until then
                for child in children:
                    parent = self._states[seq.key]
                    self._states[child.key] = RequestState(
                        completion=self._completion_state(child),
                        grammar=None if grammar is None else grammar.fork(),
                        breakers=parent.breakers, bad_words=parent.bad_words)
                copies = [rows.copy() for _ in children]
            yield self._job(seq, rows, first)
            if children:
                yield from (self._job(c, r, None) for c, r in zip(children, copies, strict=True)
                            if not c.finished)
        if at != len(logits):
            raise RuntimeError(f"the step returned {len(logits)} logits rows for {at}")

    def _job(self, seq: Sequence, rows: Any, first: int | None) -> SampleJob:
        """seq's SampleJob; a constrained completion's first row gets its step mask
        (a GrammarDeadEnd is the job's error: it fails alone)."""
        state = self._states[seq.key]
        job = SampleJob(seq, state, rows, first, list(seq.draft_ids[:len(rows) - 1]),
                        state.draft_probs)
        state.draft_probs = None
        if state.grammar is not None and state.completion.phase != REASONING \
                and not self._sequential(job):
            job.lazy = self.structured.lazy(seq.params, state.completion)
            if job.lazy:   # masked only if its token is refused
                return job
            try:
                job.mask_rows = [self.structured.mask_row(state.grammar, state.completion)]
            except Exception as exc:  # noqa: BLE001 - this completion fails alone
                job.error = exc
        return job

    def _postprocess(self, seq: Sequence, state: RequestState, sample: SampleResult
                     ) -> StepOutput:
        """Appends the sampled token; its completion's state says which text it adds
        and whether it ends the completion."""
        seq.append(sample.token)
        self._num_generation_tokens += 1
        completion, grammar = state.completion, state.grammar
        delta, reasoning, reason = completion.add(sample.token)
        # a grammar constrains the answer: it follows the tokens routed to it
        if (grammar is not None and reason != "stop"
                and completion.last_route == CONTENT and grammar.accept(sample.token)):
            delta += completion.flush()  # the structured output is complete
            reason = "stop"
        logprobs = [] if sample.logprob is None else [
            (sample.token, sample.logprob, sample.top_logprobs)]
        if reason is None:
            return StepOutput(seq.request_id, seq.index, [sample.token], delta, None, logprobs,
                              reasoning_delta=reasoning)
        self._finish(seq, reason)
        request = self._requests[seq.request_id]
        request.num_open -= 1
        if not request.num_open:
            del self._requests[seq.request_id]
        out = self._final(seq, [sample.token], delta, reason, None, logprobs, reasoning,
                          completion.num_reasoning_tokens)
        out.stop_reason = completion.stop_string
        return out

    def _embedded(self, seq: Sequence, pool: PoolState) -> StepOutput:
        """An embedding request's one output: its vector; its blocks are freed."""
        try:
            vector = pool.result()
        except Exception as exc:  # noqa: BLE001 - this request ends alone
            return self._fail([seq.request_id], exc)[0]
        seq.timings.first_token = time.monotonic()
        self._finish(seq, "stop")
        del self._requests[seq.request_id]
        out = self._final(seq, [], "", "stop", None)
        out.embedding = vector
        return out

    def _final(self, seq: Sequence, tokens: list[int], delta: str, reason: str,
               error: str | None, logprobs: list | None = None,
               reasoning: str = "", num_reasoning: int = 0) -> StepOutput:
        self._finished[reason] += 1
        return StepOutput(seq.request_id, seq.index, tokens, delta, reason, logprobs or [],
                          error, self._metrics(seq, num_reasoning), reasoning)

    @staticmethod
    def _metrics(seq: Sequence, num_reasoning: int = 0) -> RequestMetrics:
        t = seq.timings
        return RequestMetrics(t.arrival, t.first_scheduled, t.first_token, t.finished,
                              list(t.token_times), len(seq.prompt_ids), seq.num_cached_prompt,
                              len(seq.output_ids), num_reasoning)

    # -- counters ------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        b, s = self.blocks, self.scheduler
        return EngineStats(s.num_running, s.num_waiting, b.num_blocks, b.num_free, b.usage,
                           b.num_cached_blocks, s.num_preemptions, b.prefix_queries,
                           b.prefix_hits, self._num_prompt_tokens, self._num_generation_tokens,
                           s.num_scheduled_tokens, s.num_decode_tokens, s.num_steps,
                           dict(self._finished), self.structured.num_masks,
                           self.structured.mask_seconds, self.structured.wait_seconds,
                           **self._spec_stats())

    def _spec_stats(self) -> dict:
        if self.speculator is None:
            return {}
        st = self.speculator.stats
        return {"spec_verifies": st.num_verifies, "spec_draft_tokens": st.num_proposed,
                "spec_accepted_tokens": st.num_accepted,
                "spec_proposed_by_position": dict(enumerate(st.proposed)),
                "spec_accepted_by_position": dict(enumerate(st.accepted))}
