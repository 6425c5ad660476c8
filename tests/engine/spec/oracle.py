"""A proposer for tests: it knows each request's output without speculation (the
reference, by prompt and completion index) and drafts it, with a chosen share of
drafts wrong at one position, so that a test decides how much a verify keeps."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.engine.spec.controller import StepCost
from armllm.engine.spec.proposer import Draft, ProposeInput


def flat_step_cost(patch: pytest.MonkeyPatch) -> None:
    """Engines built under `patch` take every verify row as free (a memory-bound
    step) instead of timing their forwards: they draft whatever the proposer
    offers, however loaded this machine is (the policy's own tests are
    test_controller's)."""
    patch.setattr(StepCost, "measure",
                  classmethod(lambda cls, forward, max_rows, max_draft: cls([(1, 1.0), (2, 1.0)])))


class OracleProposer:
    wants_hidden = False
    draft_seconds = 0.0

    def __init__(self, reference: dict[tuple[tuple[int, ...], int], list[int]], wrong: float,
                 seed: int = 0):
        self.reference, self.wrong = reference, wrong
        self.rng = np.random.default_rng(seed)
        self.calls: list[ProposeInput] = []
        self.released: list[tuple[tuple[str, int], bool]] = []

    def propose(self, inputs: list[ProposeInput]) -> list[Draft]:
        drafts = []
        for item in inputs:
            self.calls.append(item)
            done = len(item.token_ids) - item.num_prompt
            known = self.reference.get((tuple(item.token_ids[:item.num_prompt]), item.key[1]), [])
            tokens = list(known[done:done + item.k])
            if tokens and self.rng.random() < self.wrong:
                at = int(self.rng.integers(len(tokens)))
                tokens[at] = (tokens[at] + 1) % 100
            drafts.append(Draft(tokens))
        return drafts

    def release(self, key, token_ids, finished) -> None:
        self.released.append((key, finished))

    def close(self) -> None:
        pass


def with_oracle(llm, reference: dict, wrong: float, seed: int = 0) -> OracleProposer:
    """Puts an OracleProposer in place of the engine's proposer."""
    oracle = OracleProposer(reference, wrong, seed)
    llm.engine.speculator.proposer = oracle
    return oracle
