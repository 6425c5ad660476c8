"""embedding: an embedding or score request as the engine runs it.
PoolingParams is what the request asks (it rides where a generation's
SamplingParams does, so the engine thread and data-parallel replicas carry it
unchanged); PoolState gathers the prompt's pooled hidden states chunk by chunk
while its prefill runs, and gives the vector when the last chunk is done: the
embedding, or a reranker's relevance score (its score head over the last
token's state, model/score_head.py) as a vector of one. The request then
finishes: it samples nothing and its KV blocks are freed at once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from armllm.model.pooling import PoolingConfig
from armllm.model.score_head import ScoreHead

# what a pooling request asks for: the prompt's embedding, or a reranker's score of it
PoolingTask = Literal["embed", "score"]
# a score reads the last token's final hidden state, unnormalized (what the head was
# trained on)
SCORE_POOLING = PoolingConfig("last", normalize=False)


@dataclass(frozen=True)
class PoolingParams:
    """An embedding request (`dimensions` truncates the vector: Matryoshka models
    only; None: the model's hidden size), or with task "score" a reranker's score."""
    dimensions: int | None = None
    task: PoolingTask = "embed"
    # what the scheduler and request bookkeeping read of a request's parameters
    n: ClassVar[int] = 1
    max_tokens: ClassVar[int] = 0
    structured_output: ClassVar[None] = None
    logprobs: ClassVar[None] = None


class PoolState:
    """One embedding request's pooling so far: the last row's state (last), the
    first's (cls) or the running sum of every row's (mean, in float64)."""

    def __init__(self, pooling: PoolingConfig, params: PoolingParams,
                 head: ScoreHead | None = None):
        self.pooling, self.params, self.head = pooling, params, head
        self._pooled: np.ndarray | None = None
        self._rows = 0

    def add(self, hidden: np.ndarray, first_position: int, last: bool) -> None:
        """The final hidden states of this step's prompt rows that pooling reads (see
        rows_to_read), the first at prompt position first_position; `last`: they
        end the prompt."""
        mode = self.pooling.mode
        if first_position == 0:   # the prompt (re)starts: a preempted one is recomputed
            self._pooled, self._rows = None, 0
        if mode == "mean":
            part = hidden.sum(axis=0, dtype=np.float64)
            self._pooled = part if self._pooled is None else self._pooled + part
            self._rows += len(hidden)
        elif mode == "cls" and first_position == 0 or mode == "last" and last:
            self._pooled, self._rows = hidden[0].astype(np.float64), 1

    def rows_to_read(self, start: int, count: int, prompt_len: int) -> tuple[int, int]:
        """(first, end) offsets within a step's `count` rows of this prompt, starting
        at prompt position `start`, whose states pooling reads (first == end: none)."""
        mode = self.pooling.mode
        if mode == "mean":
            return 0, count
        if mode == "cls":
            return (0, 1) if start == 0 else (0, 0)
        return (count - 1, count) if start + count == prompt_len else (0, 0)

    def result(self) -> np.ndarray:
        """The embedding: pooled, truncated to the requested dimensions, normalized
        if the model normalizes (float32); with a score head, [its score]."""
        if self._pooled is None:
            raise RuntimeError("the prompt's pooled rows never ran")
        if self.head is not None:
            return np.array([self.head.score(self._pooled)], np.float32)
        v = self._pooled / self._rows if self.pooling.mode == "mean" else self._pooled
        if self.params.dimensions is not None:
            v = v[:self.params.dimensions]
        if self.pooling.normalize:
            norm = np.linalg.norm(v)
            v = v / norm if norm > 0 else v
        return v.astype(np.float32)


def pooling_refusal(loaded, params: PoolingParams) -> tuple[str, str] | None:
    """Why the model (a LoadedModel) can never run this pooling request, and the field
    to change; None if it can: a score of a model that is no reranker, an embedding
    whose pooling armllm does not run, or `dimensions` the model does not allow."""
    if params.task == "score":
        if loaded.score_head is None:
            return ("this model is no reranker: scores need a cross-encoder or reranker "
                    "checkpoint (a one-label sequence classifier, a GGUF of pooling type "
                    "rank, or a causal reranker served with --score-from-tokens)", "model")
        return None
    if loaded.pooling.unsupported:
        return f"this model's embeddings cannot be computed: {loaded.pooling.unsupported}", \
            "model"
    try:
        loaded.pooling.check_dimensions(params.dimensions, loaded.config.hidden_size)
    except ValueError as exc:
        return str(exc), "dimensions"
    return None
