"""controller: how many draft tokens each decoding sequence asks for in the next
step, and the acceptance counters.

On a CPU a verify row is not free: a step's GEMMs read the weights once for up
to a few rows (memory-bound), then cost grows with the rows (compute-bound), and
there is no idle compute to hide it behind. So the controller drafts only where
the tokens it expects to gain are worth the measured cost of the rows:

- StepCost: the seconds of a step of M rows, measured at start (calibrate: the
  model's forward at M = 1.. over a short context) and interpolated.
- Each sequence's acceptance rate a (the share of its draft tokens kept, past
  verifies decayed so it follows the text) gives its i-th draft token a
  chance a^i of being kept: every earlier one must be.
- The step's candidate draft rows, best chance first, are taken as far as the
  prefix with the most expected tokens per second of the whole step,
  (tokens + sum of the taken a^i) / cost(rows), where a step's cost is the
  forward's and the engine's own time per step (scheduling, sampling,
  detokenizing: measured as it runs), a draft model's time counted once.
  At large batches the rows are compute-bound and nothing is worth drafting;
  a sequence whose drafts are never kept stops drafting until its rate would
  pay again (while it does not draft, its rate drifts back toward the prior)."""
from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SeqKey = tuple[str, int]

PRIOR_RATE, PRIOR_WEIGHT = 0.5, 2.0   # a new sequence's rate: 0.5, as if from 2 draft tokens
OVERHEAD_DECAY = 0.9   # per step: the engine's time per step, averaged over ~10 steps
DECAY = 0.8      # per verify: about the last 5 verifies weigh in a sequence's rate
# per step without drafts, a sequence's counts drift back toward the prior (about 350
# steps to halve the gap), so one whose drafts stopped paying tries one again now and
# then (every few tens of steps where a row costs 4%); a kept one raises its rate
IDLE_DECAY = 0.998
# calibration: every row count runs at least this many times and this long in all
PROBE_ROUNDS, PROBE_SECONDS_MIN = 5, 0.05


class StepCost:
    """Seconds of a forward of M rows, from measured (rows, seconds) points,
    interpolated linearly between them and extrapolated from the last two."""

    def __init__(self, points: list[tuple[int, float]]):
        points = sorted(points)
        if not points or points[0][0] != 1:
            raise ValueError(f"step costs need a 1-row point, got {points!r}")
        self.rows = [m for m, _ in points]
        self.seconds = [t for _, t in points]

    def __call__(self, rows: int) -> float:
        r, s = self.rows, self.seconds
        i = bisect.bisect_left(r, rows)
        if i < len(r) and r[i] == rows:
            return s[i]
        if i == len(r):   # past the last point: the last segment's slope
            if len(r) == 1:
                return s[0] * rows
            slope = (s[-1] - s[-2]) / (r[-1] - r[-2])
            return s[-1] + max(slope, 0.0) * (rows - r[-1])
        lo, hi = i - 1, i
        return s[lo] + (s[hi] - s[lo]) * (rows - r[lo]) / (r[hi] - r[lo])

    @classmethod
    def measure(cls, forward: Callable[[int], None], max_rows: int, max_draft: int
                ) -> StepCost:
        """Times forward(m) (a forward of m rows) for m = 1..max_draft + 2, then
        doubling up to max_rows: rounds over every m in turn, each m's time the fastest
        of its rounds (another process's burst slows some rounds, never all), until
        every m has run at least PROBE_ROUNDS times and PROBE_SECONDS_MIN in all."""
        counts = list(range(1, min(max_draft + 2, max_rows) + 1))
        m = counts[-1] * 2
        while m < max_rows:
            counts.append(m)
            m *= 2
        if max_rows > counts[-1]:
            counts.append(max_rows)
        forward(1)   # warm: first-touch of the workspace and the weights
        best = dict.fromkeys(counts, float("inf"))
        spent = dict.fromkeys(counts, 0.0)
        rounds = 0
        while rounds < PROBE_ROUNDS or min(spent.values()) < PROBE_SECONDS_MIN:
            for m in counts:
                began = time.perf_counter()
                forward(m)
                took = time.perf_counter() - began
                best[m], spent[m] = min(best[m], took), spent[m] + took
            rounds += 1
        points = [(m, best[m]) for m in counts]
        # cost never falls with more rows: a noisy point takes its predecessor's
        for i in range(1, len(points)):
            points[i] = (points[i][0], max(points[i][1], points[i - 1][1]))
        return cls(points)


@dataclass
class SpecStats:
    """Counters: draft tokens proposed and accepted, per draft position (0: the first
    draft token of a verify), and the verifies."""
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    num_verifies: int = 0          # sequence-steps that verified at least one draft token
    num_emitted: int = 0           # tokens those verifies emitted (accepted + the target's)

    def add(self, num_draft: int, num_accepted: int) -> None:
        while len(self.proposed) < num_draft:
            self.proposed.append(0)
            self.accepted.append(0)
        for i in range(num_draft):
            self.proposed[i] += 1
            self.accepted[i] += i < num_accepted
        self.num_verifies += 1
        self.num_emitted += num_accepted + 1

    @property
    def num_proposed(self) -> int:
        return sum(self.proposed)

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted)

    def acceptance_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted, self.proposed, strict=True)]


class _Rate:
    __slots__ = ("kept", "tried")

    def __init__(self):
        self.kept, self.tried = PRIOR_RATE * PRIOR_WEIGHT, PRIOR_WEIGHT

    @property
    def value(self) -> float:
        return self.kept / self.tried

    def drift(self) -> None:
        self.kept = IDLE_DECAY * self.kept + (1 - IDLE_DECAY) * PRIOR_RATE * PRIOR_WEIGHT
        self.tried = IDLE_DECAY * self.tried + (1 - IDLE_DECAY) * PRIOR_WEIGHT


class SpecController:
    """k per sequence and step, from acceptance and cost. max_draft: the most draft
    tokens of one sequence (num_speculative_tokens); max_rows: of one step (the
    token budget); disable_by_batch_size: no drafts with more running sequences."""

    def __init__(self, cost: StepCost, max_draft: int, max_rows: int,
                 disable_by_batch_size: int | None = None):
        self.cost, self.max_draft, self.max_rows = cost, max_draft, max_rows
        self.disable_by_batch_size = disable_by_batch_size
        self.stats = SpecStats()
        self._rates: dict[SeqKey, _Rate] = {}
        self.overhead = 0.0    # seconds a step spends outside the forward (averaged)

    def step_overhead(self, seconds: float) -> None:
        """A step spent this long outside the model's forward."""
        self.overhead = OVERHEAD_DECAY * self.overhead + (1 - OVERHEAD_DECAY) * max(seconds, 0)

    def rate(self, key: SeqKey) -> float:
        rate = self._rates.get(key)
        return PRIOR_RATE if rate is None else rate.value

    def record(self, key: SeqKey, num_draft: int, num_accepted: int) -> None:
        """A verify of num_draft draft tokens kept the first num_accepted."""
        if num_draft <= 0:
            return
        rate = self._rates.setdefault(key, _Rate())
        rejected = num_accepted < num_draft
        rate.kept = DECAY * rate.kept + num_accepted
        rate.tried = DECAY * rate.tried + num_accepted + rejected
        self.stats.add(num_draft, num_accepted)

    def forget(self, key: SeqKey) -> None:
        self._rates.pop(key, None)

    def plan(self, wanted: dict[SeqKey, int], num_rows: int, num_running: int,
             draft_seconds: float = 0.0, max_seqs: int | None = None) -> dict[SeqKey, int]:
        """Draft tokens for each sequence in `wanted` (key -> the most it may take:
        max_draft capped by its remaining tokens), for a next step of num_rows rows
        without drafts (one per decoding sequence) and num_running sequences.
        draft_seconds: what proposing costs when anything is drafted; max_seqs: the
        most sequences that may draft (a hybrid's spare state slots)."""
        ks = dict.fromkeys(wanted, 0)
        if not wanted or (self.disable_by_batch_size is not None
                          and num_running > self.disable_by_batch_size):
            return ks
        # the candidate rows: sequence s's i-th draft token is kept with chance a_s^i
        candidates = []
        for key, most in wanted.items():
            a = self.rate(key)
            chance = 1.0
            for _ in range(min(most, self.max_draft)):
                chance *= a
                candidates.append((chance, key))
        candidates.sort(key=lambda c: -c[0])
        # the step's rows grow along the candidates, best chance first; the plan is the
        # prefix with the most expected tokens per second (not the first row that does
        # not pay: the cost curve may jump where a kernel changes plan and flatten after)
        rows, tokens = num_rows, float(num_rows)
        seconds = self.cost(rows) + self.overhead
        best_rate, best_len, taken, drafting = tokens / seconds, 0, [], set()
        for chance, key in candidates:
            if rows + 1 > self.max_rows:
                break
            if key not in drafting and max_seqs is not None and len(drafting) >= max_seqs:
                continue
            seconds += self.cost(rows + 1) - self.cost(rows)
            if not taken:   # the first draft row: proposing costs once
                seconds += draft_seconds
            rows, tokens = rows + 1, tokens + chance
            drafting.add(key)
            taken.append(key)
            if tokens / seconds > best_rate:
                best_rate, best_len = tokens / seconds, len(taken)
        for key in taken[:best_len]:
            ks[key] += 1
        for key, k in ks.items():
            if not k and key in self._rates:
                self._rates[key].drift()
        return ks
