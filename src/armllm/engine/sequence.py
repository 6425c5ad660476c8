"""sequence: one request's state as the engine sees it (plain Python)."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any


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


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: Any                      # SamplingParams (kept opaque here)
    eos_token_ids: frozenset[int] = frozenset()
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0            # tokens whose K/V are in the cache
    finish_reason: str | None = None
    text: str = ""                   # detokenized output, stop strings removed
    logprobs: list = field(default_factory=list)
    timings: Timings = field(default_factory=lambda: Timings(time.monotonic()))

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
