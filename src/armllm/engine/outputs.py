"""outputs: what the engine reports: per-step deltas (StepOutput), the
per-request result users see (RequestOutput of n CompletionOutputs, folded
from the deltas by OutputCollector), per-request timings, and the engine's
counters (EngineStats)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class RequestMetrics:
    """Times are time.monotonic() seconds; durations in seconds."""
    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finished: float | None
    token_times: list[float]
    num_prompt_tokens: int
    num_cached_prompt_tokens: int       # found in the prefix cache
    num_output_tokens: int
    num_reasoning_tokens: int = 0       # of the output: a reasoning model's thinking

    @property
    def queue_s(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    @property
    def tpot_s(self) -> float | None:
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def as_dict(self) -> dict:
        return {"arrival": self.arrival, "first_scheduled": self.first_scheduled,
                "first_token": self.first_token, "finished": self.finished,
                "queue_s": self.queue_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s, "num_prompt_tokens": self.num_prompt_tokens,
                "num_cached_prompt_tokens": self.num_cached_prompt_tokens,
                "num_output_tokens": self.num_output_tokens,
                "num_reasoning_tokens": self.num_reasoning_tokens}


@dataclass
class StepOutput:
    """What one step produced for one completion of a request."""
    request_id: str
    index: int                          # which of the request's n completions
    new_token_ids: list[int]
    text_delta: str
    finish_reason: str | None           # stop | length | abort | error
    logprobs: list = field(default_factory=list)   # (token, logprob, top) per new token
    error: str | None = None            # why, when finish_reason is "error"
    metrics: RequestMetrics | None = None           # when this completion finished
    reasoning_delta: str = ""           # a reasoning model's thinking (model/reasoning.py)
    embedding: Any = None               # an embedding request's vector (float32), when done
    stop_reason: str | None = None      # the stop string that ended it, if one did


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    reasoning: str = ""                 # the thinking of a reasoning model, apart from text
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list | None = None
    metrics: RequestMetrics | None = None
    stop_reason: str | None = None      # the stop string that ended it, if one did
    # this update's part, for streaming consumers
    text_delta: str = ""
    reasoning_delta: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    error: str | None = None

    # the first completion, for the common n = 1 case
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def reasoning(self) -> str:
        return self.outputs[0].reasoning

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list | None:
        return self.outputs[0].logprobs

    @property
    def metrics(self) -> dict:
        m = self.outputs[0].metrics
        return m.as_dict() if m is not None else {}


@dataclass
class EmbeddingOutput:
    """An embedding request's result."""
    request_id: str
    prompt_token_ids: list[int]
    embedding: Any                      # float32 numpy vector
    metrics: RequestMetrics | None = None


def embedding_result(prompt_ids: list[int], step: StepOutput) -> EmbeddingOutput:
    """The EmbeddingOutput of an embedding request's one StepOutput; raises
    RuntimeError with the engine's reason if the request ended without a vector."""
    if step.embedding is None:
        raise RuntimeError(step.error or f"the embedding request ended: {step.finish_reason}")
    return EmbeddingOutput(step.request_id, list(prompt_ids), step.embedding, step.metrics)


class OutputCollector:
    """Folds one request's StepOutputs into a RequestOutput."""

    def __init__(self, request_id: str, prompt_ids: list[int], n: int, want_logprobs: bool):
        self.output = RequestOutput(request_id, list(prompt_ids),
                                    [CompletionOutput(i, logprobs=[] if want_logprobs else None)
                                     for i in range(n)])
        self._open = n

    def add(self, step: StepOutput) -> RequestOutput:
        """Applies one delta. Returns a new RequestOutput whose completions are new
        objects (their delta fields hold just this step; the cumulative token and
        logprob lists are shared and keep growing), so a consumer may hold it while
        later steps arrive."""
        out = self.output
        c = out.outputs[step.index]
        c.text += step.text_delta
        c.reasoning += step.reasoning_delta
        c.token_ids.extend(step.new_token_ids)
        if c.logprobs is not None:
            c.logprobs.extend(step.logprobs)
        if step.finish_reason is not None and c.finish_reason is None:
            c.finish_reason, c.metrics = step.finish_reason, step.metrics
            c.stop_reason = step.stop_reason
            self._open -= 1
            if step.error is not None:
                out.error = step.error
        out.finished = self._open == 0
        view = [replace(x, text_delta="", reasoning_delta="", new_token_ids=[], new_logprobs=[])
                for x in out.outputs]
        view[step.index] = replace(c, text_delta=step.text_delta,
                                   reasoning_delta=step.reasoning_delta,
                                   new_token_ids=step.new_token_ids, new_logprobs=step.logprobs)
        return replace(out, outputs=view)


@dataclass
class EngineStats:
    """A snapshot of the engine's gauges and counters (counters only grow)."""
    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    kv_usage: float                     # fraction of blocks held by sequences
    num_cached_blocks: int              # blocks whose contents the prefix cache can serve
    num_preemptions: int
    prefix_cache_queries: int           # prompt tokens looked up
    prefix_cache_hits: int              # of which were served from the cache
    num_prompt_tokens: int              # prompt tokens of the requests added
    num_generation_tokens: int
    num_computed_tokens: int            # token rows run through the model (incl. recompute)
    num_decode_tokens: int              # of which decodes (one new row past the prompt)
    num_steps: int
    finished: dict[str, int]            # completions by finish reason
    grammar_masks: int = 0              # structured-output token masks computed
    grammar_mask_seconds: float = 0.0   # time computing them
    grammar_wait_seconds: float = 0.0   # of the engine thread's: computing or waiting for them
    # speculative decoding: verifies (a sequence's step with drafts), draft tokens proposed
    # and accepted, and both by draft position (0: the first draft token of a verify)
    spec_verifies: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_proposed_by_position: dict[int, int] = field(default_factory=dict)
    spec_accepted_by_position: dict[int, int] = field(default_factory=dict)

    @property
    def spec_acceptance_rate(self) -> float:
        d = self.spec_draft_tokens
        return self.spec_accepted_tokens / d if d else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else 0.0


@dataclass
class ScoreOutput:
    """A score request's result: a reranker's relevance score of one prompt (a query
    and a document), in (0, 1)."""
    request_id: str
    prompt_token_ids: list[int]
    score: float
    metrics: RequestMetrics | None = None


def score_result(prompt_ids: list[int], step: StepOutput) -> ScoreOutput:
    """The ScoreOutput of a score request's one StepOutput; raises RuntimeError with
    the engine's reason if the request ended without a score."""
    if step.embedding is None:
        raise RuntimeError(step.error or f"the score request ended: {step.finish_reason}")
    return ScoreOutput(step.request_id, list(prompt_ids), float(step.embedding[0]),
                       step.metrics)
