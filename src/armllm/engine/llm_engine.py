"""llm_engine: the step loop: schedule, run, sample, postprocess (stop
conditions, detokenization, forking parallel completions), and what each
step emits per completion. Single-threaded: one owner calls add_request,
abort and step (the sync LLM, or the engine thread of AsyncLLM/the server)."""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from armllm.engine.block_manager import BlockManager
from armllm.engine.outputs import EngineStats, RequestMetrics, StepOutput
from armllm.engine.runner import ModelRunner
from armllm.engine.scheduler import Scheduler
from armllm.engine.sequence import Sequence, Timings
from armllm.model.llama import KVCache
from armllm.model.loader import LoadedModel
from armllm.model.tokenizer import IncrementalDetokenizer, TextTokenizer
from armllm.sampling import SampleResult, SamplingParams

log = logging.getLogger("armllm")


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)        # completions created so far
    detok: dict[int, IncrementalDetokenizer] = field(default_factory=dict)
    pending_text: dict[int, str] = field(default_factory=dict)  # held back for stop strings


class LLMEngine:
    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int = 16,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, kv_dtype: str = "bf16",
                 enable_prefix_caching: bool = True):
        c = loaded.config
        self.loaded = loaded
        self.tokenizer = TextTokenizer(loaded.tokenizer, loaded.tokenizer_config)
        self.max_model_len = min(max_model_len or c.max_position_embeddings,
                                 c.max_position_embeddings)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens,
                                   self.max_model_len)
        kv = KVCache(c, num_blocks, block_size, kv_dtype)
        self.runner = ModelRunner(loaded.model, kv, max_num_batched_tokens, max_num_seqs,
                                  self.max_model_len)
        gen_eos = loaded.generation_config.get("eos_token_id")  # an int or a list in the wild
        eos = set(c.eos_token_ids) | set([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
        eos_tok = self.tokenizer.token_id(self.tokenizer.eos_token)
        self.eos_token_ids = frozenset(eos | ({eos_tok} if eos_tok is not None else set()))
        self._requests: dict[str, _Request] = {}
        self._deferred: list[StepOutput] = []   # aborts, reported by the next step
        self._num_prompt_tokens = self._num_generation_tokens = self._num_steps = 0
        self._num_computed_tokens = 0
        self._finished: Counter[str] = Counter()

    # -- requests ------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    priority: int = 0, arrival_time: float | None = None) -> None:
        """Queues a request; raises ValueError (and queues nothing) if it is invalid or
        could never fit."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(priority, int):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        vocab = self.loaded.config.vocab_size
        bad = next((t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})")
        self.scheduler.check_fits(len(prompt_ids), params.max_tokens, params.n)
        seq = Sequence(request_id, list(prompt_ids), params, self.eos_token_ids,
                       priority=priority, num_forks_pending=params.n - 1,
                       timings=Timings(arrival_time or time.monotonic()))
        req = _Request(seq.prompt_ids, params)
        self._track(req, seq)
        self.scheduler.add(seq)
        self._requests[request_id] = req
        self._num_prompt_tokens += len(prompt_ids)

    def _track(self, req: _Request, seq: Sequence) -> None:
        req.seqs.append(seq)
        req.detok[seq.index] = IncrementalDetokenizer(self.tokenizer, seq.prompt_ids,
                                                      req.params.skip_special_tokens)
        req.pending_text[seq.index] = ""

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
        req = self._requests.pop(request_id)
        outs = []
        for seq in req.seqs:
            if not seq.finished:
                self.scheduler.finish(seq, reason)
                outs.append(self._final(seq, [], "", reason, error))
        n_made = len(req.seqs)
        for index in range(n_made, req.params.n):  # completions never forked
            outs.append(StepOutput(request_id, index, [], "", reason, error=error,
                                   metrics=self._metrics(req.seqs[0])))
        self._finished[reason] += req.params.n - n_made
        return outs

    def has_unfinished(self) -> bool:
        return bool(self._requests or self._deferred)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    # -- one step ------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        outputs, self._deferred = self._deferred, []
        out = self.scheduler.schedule()
        if not out.scheduled:
            return outputs
        self._num_steps += 1
        self._num_computed_tokens += out.num_tokens
        try:
            sampling, logits = self.runner.run(out)
        except Exception as exc:  # fail this step's requests, keep serving the others
            log.exception("engine step failed")
            for rid in dict.fromkeys(item.seq.request_id for item in out.scheduled):
                outputs += self._end_request(rid, "error", f"{type(exc).__name__}: {exc}")
            return outputs
        self.scheduler.after_step(out)
        for i, seq in enumerate(sampling):
            if seq.finished:
                continue  # its request failed earlier in this loop
            try:
                children = self._fork(seq) if seq.num_forks_pending else []
                rows = [logits[i].copy() for _ in children]
                outputs.append(self._postprocess(seq, self.runner.sample(seq, logits[i])))
                for child, row in zip(children, rows, strict=True):
                    outputs.append(self._postprocess(child, self.runner.sample(child, row)))
            except Exception as exc:
                log.exception("request %s failed", seq.request_id)
                if seq.request_id in self._requests:
                    outputs += self._end_request(seq.request_id, "error",
                                                 f"{type(exc).__name__}: {exc}")
        return outputs

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The prompt is done: the request's other completions start from its KV blocks."""
        req = self._requests[parent.request_id]
        children = []
        for index in range(1, parent.num_forks_pending + 1):
            child = Sequence(parent.request_id, parent.prompt_ids, parent.params,
                             parent.eos_token_ids, index=index, priority=parent.priority,
                             timings=Timings(parent.timings.arrival,
                                             parent.timings.first_scheduled))
            child.num_cached_prompt = parent.num_cached_prompt
            self.blocks.fork(parent, child)
            self.scheduler.add_running(child, after=parent)
            self._track(req, child)
            children.append(child)
        parent.num_forks_pending = 0
        return children

    def _postprocess(self, seq: Sequence, sample: SampleResult) -> StepOutput:
        now = time.monotonic()
        req = self._requests[seq.request_id]
        seq.output_ids.append(sample.token)
        seq.timings.token_times.append(now)
        self._num_generation_tokens += 1
        if seq.timings.first_token is None:
            seq.timings.first_token = now
        logprobs = []
        if sample.logprob is not None:
            logprobs = [(sample.token, sample.logprob, sample.top_logprobs)]
            seq.logprobs += logprobs
        p = seq.params
        reason = None
        stop_ids = seq.eos_token_ids | set(p.stop_token_ids)
        eos = not p.ignore_eos and sample.token in seq.eos_token_ids
        if sample.token in p.stop_token_ids or eos:
            reason = "stop"
        elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        # text not yet emitted; emitted text never holds a whole stop string
        pending = req.pending_text[seq.index]
        if reason is None or sample.token not in stop_ids:
            pending += req.detok[seq.index].add(sample.token)
        full = seq.text + pending
        hits = [at for at in (full.find(stop, len(seq.text)) for stop in p.stop) if at >= 0]
        if hits:
            pending, reason = full[len(seq.text):min(hits)], "stop"
        # hold back what may be the start of a stop string until it is decided
        hold = max((len(stop) - 1 for stop in p.stop), default=0) if reason is None else 0
        delta = pending[:len(pending) - hold] if hold else pending
        seq.text += delta
        req.pending_text[seq.index] = pending[len(delta):]
        if reason is None:
            return StepOutput(seq.request_id, seq.index, [sample.token], delta, None, logprobs)
        self.scheduler.finish(seq, reason)
        if all(s.finished for s in req.seqs) and len(req.seqs) == p.n:
            del self._requests[seq.request_id]
        return self._final(seq, [sample.token], delta, reason, None, logprobs)

    def _final(self, seq: Sequence, tokens: list[int], delta: str, reason: str,
               error: str | None, logprobs: list | None = None) -> StepOutput:
        self._finished[reason] += 1
        return StepOutput(seq.request_id, seq.index, tokens, delta, reason, logprobs or [],
                          error, self._metrics(seq))

    @staticmethod
    def _metrics(seq: Sequence) -> RequestMetrics:
        t = seq.timings
        return RequestMetrics(t.arrival, t.first_scheduled, t.first_token, t.finished,
                              list(t.token_times), len(seq.prompt_ids), seq.num_cached_prompt,
                              len(seq.output_ids))

    # -- counters ------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        b, s = self.blocks, self.scheduler
        return EngineStats(s.num_running, s.num_waiting, b.num_blocks, b.num_free, b.usage,
                           b.num_cached_blocks, s.num_preemptions, b.prefix_queries,
                           b.prefix_hits, self._num_prompt_tokens, self._num_generation_tokens,
                           self._num_computed_tokens, self._num_steps, dict(self._finished))
