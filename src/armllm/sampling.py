"""sampling: per-request sampling parameters (SamplingParams), a sampled
token's result (SampleResult), and numpy forms of the sampler's steps for the
few places that need a row's whole distribution rather than one token: a
drafted token drawn from a distribution q (speculative decoding's rejection
sampling, engine/spec/verify.py) and a draft model's own q
(engine/spec/draft_model.py). The engine samples every row of a step in one
kernel call (engine/sampler.py over ops.RowSampler, defined in sample.h);
the functions here follow the same definition in float32 numpy, equal to it
up to the order of sums."""
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
# OpenAI's range for a logit_bias value
MAX_LOGIT_BIAS = 100.0
# the largest finite float32 (the sampler's columns)
FLOAT32_MAX = float(np.finfo(np.float32).max)
# llama.cpp's default DRY sequence breakers: a repeat does not run across them
DRY_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")
# the sampler's int32 column of dry_allowed_length, and the longest DRY window it reads
MAX_DRY_LENGTH = 2**31 - 1


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
    # token id -> a value in [-100, 100] added to its logit before penalties (OpenAI's)
    logit_bias: dict[int, float] | None = None
    # a reasoning model's thinking, in tokens at most (its reasoning parser's REASONING
    # tokens): then the end of its reasoning is forced and the answer follows
    max_reasoning_tokens: int | None = None
    # what the output must match (a StructuredOutput or a dict of its fields):
    # the grammar's token mask applies before penalties, temperature, top-k/p
    structured_output: StructuredOutput | dict | None = None
    # callables (output_ids, logits_row) -> None that edit a completion's float32 logits
    # row in place before penalties and sampling, in order, after the grammar's mask
    # (Whisper's timestamp rules: armllm/audio/logits.py); each sees only its own
    # completion's rows, so a request with n > 1 shares them
    logits_processors: tuple[Callable[[list[int], np.ndarray], None], ...] = ()
    # DRY (llama.cpp's, sample.h step 4b): a token that would extend a repeat of more than
    # dry_allowed_length tokens of the last dry_penalty_last_n (-1: all, 0: off) prompt and
    # output tokens loses dry_multiplier * dry_base ^ (its length - dry_allowed_length)
    # from its logit, after the penalties; a repeat does not run across a breaker
    dry_multiplier: float = 0.0       # 0: off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64      # llama.cpp's default (common.h)
    dry_sequence_breakers: list[str] = field(default_factory=lambda: list(DRY_SEQUENCE_BREAKERS))
    # XTC (llama.cpp's, sample.h step 6): with probability xtc_probability a draw removes
    # every candidate whose probability reaches xtc_threshold but the least probable of
    # them, when two or more do (a threshold above 0.5 turns it off)
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    # words the output never holds (vLLM's): each word with and without a leading space
    # becomes token sequences whose last token is banned after the others
    bad_words: list[str] = field(default_factory=list)

    def __post_init__(self):
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", "must be in [0, 100]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (off) or a positive integer")
        # the sampler reads these as float32: a positive value that rounds to 0 there is 0
        if not 0.0 < np.float32(self.top_p) <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if not 0.0 < np.float32(self.repetition_penalty) <= 10.0:
            raise bad("repetition_penalty", "must be in (0, 10]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "must be in [-2, 2]")
        # the sampler's draws take the seed as a uint64 (sample.h)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(
                self.seed, bool) or not 0 <= self.seed < 2**64):
            raise bad("seed", "must be an integer in [0, 2^64)")
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
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        if self.max_reasoning_tokens is not None and (
                not isinstance(self.max_reasoning_tokens, int)
                or isinstance(self.max_reasoning_tokens, bool) or self.max_reasoning_tokens < 0):
            raise bad("max_reasoning_tokens", "must be an integer >= 0")
        self.structured_output = StructuredOutput.coerce(self.structured_output)
        self.logits_processors = tuple(self.logits_processors)
        if not all(callable(p) for p in self.logits_processors):
            raise bad("logits_processors", "must be callables (output_ids, logits_row)")
        self._check_dry_xtc_words(bad)

    def _check_dry_xtc_words(self, bad: Callable[[str, str], ValueError]) -> None:
        """DRY's, XTC's and bad_words' fields (as float32 where the sampler reads
        float32)."""
        def number(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not abs(v) <= FLOAT32_MAX:
                raise bad(name, "must be a finite number")
            return float(v)
        if not number("dry_multiplier") >= 0:
            raise bad("dry_multiplier", "must be >= 0 (0: off)")
        if not number("dry_base") >= 1:
            raise bad("dry_base", "must be >= 1")
        for name, low in (("dry_allowed_length", 0), ("dry_penalty_last_n", -1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_DRY_LENGTH:
                raise bad(name, f"must be an integer in [{low}, {MAX_DRY_LENGTH}]")
        for name in ("xtc_probability", "xtc_threshold"):
            if not 0 <= number(name) <= 1:
                raise bad(name, "must be in [0, 1]")
        for name in ("dry_sequence_breakers", "bad_words"):
            v = getattr(self, name)
            if isinstance(v, str):
                v = [v]
            if not isinstance(v, (list, tuple)) or not all(isinstance(w, str) and w for w in v):
                raise bad(name, "must be a list of non-empty strings")
            setattr(self, name, list(v))

    @property
    def dry(self) -> bool:
        """Whether DRY is on (sample.h step 4b)."""
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0

    @property
    def xtc(self) -> bool:
        """Whether XTC is on (sample.h step 6)."""
        return self.xtc_probability > 0 and np.float32(self.xtc_threshold) <= np.float32(0.5)

    @property
    def kernel_only(self) -> bool:
        """Whether a sampler only the batched kernel runs is on (DRY, XTC, bad words):
        such a request's drafts are point masses, verified by the kernel (the numpy
        forms here have none of them)."""
        return self.dry or self.xtc or bool(self.bad_words)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SampleResult:
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None




def _logit_bias(bias) -> dict[int, float]:
    """A logit_bias map with int ids (as JSON gives them: strings of digits) and float
    values in [-100, 100]; a ValueError naming the bad entry."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a map of token ids to values, got {bias!r}")
    out = {}
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else key
        if type(token) is not int or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (non-negative integers), "
                             f"got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                             f"{MAX_LOGIT_BIAS:g}], got {value!r} for {key!r}")
        out[token] = float(value)
    return out


def raw_logprobs(row: np.ndarray) -> np.ndarray:
    """log softmax of a float32 row, in float64 (the logprobs a request sees are of
    the row after its mask and logit bias, before penalties and temperature)."""
    x64 = row.astype(np.float64)
    m = x64.max()
    return x64 - m - np.log(np.exp(x64 - m).sum())


def apply_bias(row: np.ndarray, params: SamplingParams) -> None:
    """The request's logit_bias added to one float32 logits row, in place."""
    if params.logit_bias:
        for token, value in params.logit_bias.items():
            row[token] += np.float32(value)


def apply_penalties(row: np.ndarray, params: SamplingParams, prompt_ids: list[int],
                    output_ids: list[int]) -> None:
    """In place on one float32 logits row, as sample.h: repetition_penalty on every
    distinct prompt and output id (x / rp above 0, x * rp otherwise), then presence
    and frequency on each distinct output id with count c (x -= presence + frequency
    * c, in float32)."""
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(prompt_ids + output_ids, dtype=np.int64))
        vals = row[seen]
        rp = np.float32(params.repetition_penalty)
        row[seen] = np.where(vals > 0, vals / rp, vals * rp)
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        row[ids] -= np.float32(params.presence_penalty) \
            + np.float32(params.frequency_penalty) * counts.astype(np.float32)


def sampling_probs(row: np.ndarray, params: SamplingParams, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """The probabilities (float32, summing to 1) with which the sampler draws each
    token of a prepared float32 logits row (mask, bias and penalties applied) under
    params' temperature (> 0), top_k, top_p and min_p: sample.h's definition, where
    the kernel only returns the token (what rejection sampling weighs draft tokens
    with); written into `out` (as long as row) when given. The exp is the kernels'
    own (ops.exp), the sums numpy's: equal to the kernel's up to their order."""
    from armllm import ops  # the kernels load with the engine, not with SamplingParams
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
        x = row[candidates]
    else:
        candidates, x = None, row
    inv_t = np.float32(1.0 / params.temperature)
    d = (x - x.max()) * inv_t
    e = np.where(d >= -EXP_CUT, ops.exp(np.maximum(d, np.float32(-EXP_CUT))), 0.0)
    if params.min_p > 0:
        e = np.where(e >= np.float32(params.min_p), e, 0.0)
    if params.top_p < 1.0:
        e = np.where(_top_p_set(e, params.top_p), e, 0.0)
    q = e.astype(np.float64) / e.sum(dtype=np.float64)
    out[:] = 0
    if candidates is None:
        out[:] = q
    else:
        out[candidates] = q
    return out


def _top_p_set(e: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of the highest e (ties: lower index first) whose sum, added in
    that order, reaches top_p of the total (every token when rounding keeps it from
    doing so)."""
    order = np.lexsort((np.arange(len(e)), -e))
    cum = np.cumsum(e[order], dtype=np.float64)
    reached = np.flatnonzero(cum >= top_p * cum[-1])
    keep = np.zeros(len(e), bool)
    if len(reached):
        keep[order[:reached[0] + 1]] = True
    else:
        keep[:] = True
    return keep
