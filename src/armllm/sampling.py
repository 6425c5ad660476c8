"""sampling: per-request sampling parameters, and turning logits rows into
tokens: penalties, temperature, top-k, top-p, min-p, seeded randomness,
greedy, and the log-probabilities a request asked for. A random token is
chosen in C (ops.sample_token: a selection, never a sort of the vocabulary),
a greedy one by numpy's vectorized argmax; penalties and log-probabilities,
which only some requests ask for, stay in numpy."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from armllm.structured_output import StructuredOutput

# what a model's generation_config.json (or a GGUF's general.sampling.* keys) may set
MODEL_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# the defaults of a model that sets none of them: at SamplingParams' own (temperature 1,
# nothing truncated) small models such as SmolLM2-135M ramble; a lower temperature with
# top-p and min-p cut-offs keeps them coherent
FALLBACK_DEFAULTS = {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05}
# sample.h's ARMLLM_SAMPLE_EXP_CUT: a token more than this below the maximum (after the
# temperature) gets probability 0
EXP_CUT = 80.0
# sample.c's top-p shortcut: only tokens of p >= tau can be in the kept set once the
# tokens at or above tau hold top_p (+ a margin far above the rounding of the sums);
# tau starts at pmax * FLOOR_STEP and shrinks by that factor
TOP_P_FLOOR_STEP = 1e-3
TOP_P_MARGIN = 1e-9


def model_sampling_defaults(generation_config: dict) -> dict:
    """The MODEL_DEFAULT_FIELDS a model's generation_config (or what a GGUF's
    general.sampling.* keys imply) sets; do_sample=false means greedy. Empty when it
    sets none: then FALLBACK_DEFAULTS apply."""
    defaults = {k: generation_config[k] for k in MODEL_DEFAULT_FIELDS
                if generation_config.get(k) is not None}
    if generation_config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return defaults


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0          # 0: greedy
    top_k: int = 0                    # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0   # on prompt and output tokens (HF semantics)
    presence_penalty: float = 0.0     # on output tokens (OpenAI semantics)
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None       # None: none; k >= 0: the sampled token's and the top k
    skip_special_tokens: bool = True
    n: int = 1                        # completions of the prompt (sharing its KV blocks)
    # what the output must match (a StructuredOutput or a dict of its fields):
    # the grammar's token mask applies before penalties, temperature, top-k/p
    structured_output: StructuredOutput | dict | None = None
    # callables (output_ids, logits_row) -> None that edit a completion's float32 logits
    # row in place before penalties and sampling, in order, after the grammar's mask
    # (Whisper's timestamp rules: armllm/audio/logits.py); each sees only its own
    # completion's rows, so a request with n > 1 shares them
    logits_processors: tuple[Callable[[list[int], np.ndarray], None], ...] = ()

    def __post_init__(self):
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", "must be in [0, 100]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (off) or a positive integer")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", "must be in (0, 10]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "must be in [-2, 2]")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", "must be a non-negative integer")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative integers")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        if self.logprobs is not None and (not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= 20):
            raise bad("logprobs", "must be an integer in [0, 20]")
        self.structured_output = StructuredOutput.coerce(self.structured_output)
        self.logits_processors = tuple(self.logits_processors)
        if not all(callable(p) for p in self.logits_processors):
            raise bad("logits_processors", "must be callables (output_ids, logits_row)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SampleResult:
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    m = x64.max()
    return x64 - m - np.log(np.exp(x64 - m).sum())


def apply_penalties(row: np.ndarray, params: SamplingParams, prompt_ids: list[int],
                    output_ids: list[int]) -> None:
    """In place on one logits row."""
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(prompt_ids + output_ids, dtype=np.int64))
        vals = row[seen]
        row[seen] = np.where(vals > 0, vals / params.repetition_penalty,
                             vals * params.repetition_penalty)
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        row[ids] -= params.presence_penalty + params.frequency_penalty * counts


def sample_scratch(vocab_size: int) -> np.ndarray:
    """The scratch sample_row reuses for rows of vocab_size logits (allocate once)."""
    from armllm import ops  # the kernels load with the engine, not with SamplingParams
    return np.empty(ops.sample_scratch_bytes(vocab_size), np.uint8)


def sample_row(row: np.ndarray, params: SamplingParams, rng: np.random.Generator,
               prompt_ids: list[int], output_ids: list[int],
               scratch: np.ndarray | None = None) -> SampleResult:
    """One token from one float32 logits row (the row is modified). The random token
    is, for the draw u = rng.random(), the one sample.h defines: temperature, then
    top-k, then min-p and top-p on the candidates' softmax, then the token whose
    interval of the kept mass (in id order) holds u. scratch: sample_scratch(len(row)),
    allocated for the call when not given."""
    raw_logprobs = prepare_row(row, params, prompt_ids, output_ids)
    return with_logprobs(choose_token(row, params, rng, scratch), params, raw_logprobs)


def prepare_row(row: np.ndarray, params: SamplingParams, prompt_ids: list[int],
                output_ids: list[int]) -> np.ndarray | None:
    """The row's logits processors and penalties, in place; returns the raw
    log-probabilities (before penalties) when the request asked for logprobs."""
    for processor in params.logits_processors:
        processor(output_ids, row)
    raw_logprobs = _log_softmax(row) if params.logprobs is not None else None
    apply_penalties(row, params, prompt_ids, output_ids)
    return raw_logprobs


def choose_token(row: np.ndarray, params: SamplingParams, rng: np.random.Generator,
                 scratch: np.ndarray | None = None) -> int:
    """The token of a prepared row: its argmax (greedy), or sample.h's draw for
    u = rng.random()."""
    if params.greedy:
        return int(np.argmax(row))
    from armllm import ops
    if scratch is None:
        scratch = sample_scratch(len(row))
    return ops.sample_token(row, params.temperature, params.top_k, params.top_p,
                            params.min_p, rng.random(), scratch)


def sampling_probs(row: np.ndarray, params: SamplingParams, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """The probabilities (float32, summing to 1) with which choose_token draws each
    token of a prepared float32 logits row under params' temperature (> 0), top_k,
    top_p and min_p: sample.h's definition, where the kernel only returns the token
    (what rejection sampling weighs draft tokens with); written into `out` (as long as
    row) when given. The computation is sample.h's in float64 (its sums in numpy's
    order: equal up to rounding)."""
    if not params.temperature > 0:
        raise ValueError(f"sampling_probs needs a temperature > 0, got {params.temperature}")
    n = len(row)
    out = np.empty(n, np.float32) if out is None else out
    top_k = params.top_k
    if 0 < top_k < n:
        # the top_k largest, ties at the k-th value going to the lower ids
        kth = np.partition(row, n - top_k)[n - top_k]
        above = np.flatnonzero(row > kth)
        ties = np.flatnonzero(row == kth)[:top_k - len(above)]
        candidates = np.sort(np.concatenate([above, ties]))
    else:
        candidates = None
    x = (row if candidates is None else row[candidates]).astype(np.float64) / params.temperature
    d = x - x.max()
    p = np.where(d >= -EXP_CUT, np.exp(np.maximum(d, -EXP_CUT)), 0.0)
    p /= p.sum()
    keep = p >= params.min_p * p.max() if params.min_p > 0 else np.ones(len(p), bool)
    if params.top_p < 1.0:
        keep &= _top_p_set(p, params.top_p)
    q = np.where(keep, p, 0.0)
    q /= q.sum()
    out[:] = 0
    if candidates is None:
        out[:] = q
    else:
        out[candidates] = q
    return out


def _top_p_set(p: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of the highest p (ties: lower index first) whose sum, added in
    that order, reaches top_p (every token when rounding keeps it from doing so)."""
    pmax = p.max()
    tau = pmax * TOP_P_FLOOR_STEP
    while tau > 0 and p[p >= tau].sum() < top_p + TOP_P_MARGIN:
        tau = tau * TOP_P_FLOOR_STEP if tau > 1e-300 else 0.0
    heads = np.flatnonzero((p > 0) & (p >= tau))
    order = heads[np.argsort(-p[heads], kind="stable")]   # heads ascend: ties by index
    cum = np.cumsum(p[order])
    reached = np.flatnonzero(cum >= top_p)
    keep = np.zeros(len(p), bool)
    if len(reached):
        keep[order[:reached[0] + 1]] = True
    else:
        keep[:] = True
    return keep


def with_logprobs(token: int, params: SamplingParams, raw_logprobs: np.ndarray | None
                  ) -> SampleResult:
    """The SampleResult of a chosen token, with the log-probabilities asked for."""
    if raw_logprobs is None:
        return SampleResult(token)
    top = []
    if params.logprobs:
        best = np.argpartition(-raw_logprobs, params.logprobs - 1)[:params.logprobs]
        best = best[np.argsort(-raw_logprobs[best], kind="stable")]
        top = [(int(t), float(raw_logprobs[t])) for t in best]
    return SampleResult(token, float(raw_logprobs[token]), top)
