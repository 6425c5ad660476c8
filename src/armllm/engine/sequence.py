"""sequence: one completion's state as the scheduler sees it (plain Python).

A request with n > 1 completions is n Sequences sharing a request id
(`index` 0..n-1); the first carries the prompt through prefill and the
scheduler forks the others from it, sharing its KV blocks, when the prompt is
done. What a completion's tokens mean as output (stop conditions, text), its
grammar, pooling and sampler are the engine's, kept beside the sequence
(engine/request_state.py)."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importing them would load numpy
    from armllm.engine.embedding import PoolingParams
    from armllm.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Timings:
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)


@dataclass(eq=False)  # identity semantics: sequences live in lists and sets by object
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams | PoolingParams
    index: int = 0                   # which of the request's n completions
    priority: int = 0                # lower runs first; FCFS among equals
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)  # one per KV block pool
    state_slot: int = -1             # its slot in the recurrent layers' state pool (-1: none)
    num_computed: int = 0            # tokens whose K/V are in the cache
    num_cached_prompt: int = 0       # prompt tokens found in the prefix cache at admission
    num_committed_blocks: int = 0    # leading blocks already entered in the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)  # chained, of full token blocks
    num_forks_pending: int = 0       # completions still to fork off when the prompt is done
    finish_reason: str | None = None
    reuse_prefix: bool = True        # False: every prompt row must run (not from the cache)
    encoder_len: int = 0             # an encoder-decoder's frames its first chunk encodes
    # speculative decoding: tokens a proposer guessed follow output_ids, verified in the
    # next step beside the last token (the scheduler may drop some to fit the step)
    draft_ids: list[int] = field(default_factory=list)
    timings: Timings = field(default_factory=lambda: Timings(time.monotonic()))

    @property
    def block_table(self) -> list[int]:
        """The first pool's block table (the only one of a model without sliding
        layers)."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def key(self) -> tuple[str, int]:
        return self.request_id, self.index

    def append(self, token: int) -> None:
        """Adds a sampled token and records when it came."""
        now = time.monotonic()
        self.output_ids.append(token)
        self.timings.token_times.append(now)
        if self.timings.first_token is None:
            self.timings.first_token = now

    def fork(self, index: int) -> Sequence:
        """Completion `index` of the same request, before it has any output: it shares
        the prompt, priority, arrival and admission time, and the prefix-cache hit."""
        t = self.timings
        return Sequence(self.request_id, self.prompt_ids, self.params, index=index,
                        priority=self.priority, num_cached_prompt=self.num_cached_prompt,
                        timings=Timings(t.arrival, t.first_scheduled))
