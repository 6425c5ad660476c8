"""logits: Whisper's decoding rules as logits processors.

A processor is a callable `(output_ids, logits) -> None` that edits one float32
logits row [vocab] in place; the engine runs a request's processors in order on the
raw row of each sampled position, before temperature, top-k and top-p, with
output_ids the tokens sampled so far for that completion (never the prompt), so
len(output_ids) is the index of the position being sampled. Some record what they
saw (the no-speech probability, the chosen tokens' log-probabilities, the language
probabilities) for the caller to read once the request is done.

The rules are CTranslate2's (faster-whisper's engine), which are openai-whisper's
except where a forced prefix ends the prompt (see ApplyTimestampRules). A processor
holds per-completion state: build one set per request, and since the n completions
of one request would share them, a request with n > 1 needs one instance per
completion; Whisper's best_of is therefore run as separate requests. Order, as
window_params (audio/transcribe.py) builds it: NoSpeechProbe, SuppressBlank,
SuppressTokens, ApplyTimestampRules, LogprobRecorder."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

LogitsProcessor = Callable[[list[int], np.ndarray], None]

_NEG_INF = np.float32(-np.inf)


def _ids(token_ids: Iterable[int]) -> np.ndarray:
    return np.array(sorted(set(token_ids)), dtype=np.int64)


def _log_softmax(row: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of a row that may hold -inf."""
    x = row.astype(np.float64)
    top = x.max()
    return x - top - np.log(np.exp(x - top).sum())


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    if top == -np.inf:
        return top
    return top + float(np.log(np.exp(x.astype(np.float64) - top).sum()))


class SuppressTokens:
    """Never sample these tokens (suppress_tokens: WhisperTokens.suppress_set)."""

    def __init__(self, token_ids: Iterable[int]):
        self.token_ids = _ids(token_ids)

    def __call__(self, output_ids: list[int], logits: np.ndarray) -> None:
        logits[self.token_ids] = _NEG_INF


class SuppressBlank:
    """At the first sampled position, forbid the tokens a transcript must not start
    with: " " and <|endoftext|> (WhisperTokens.blank)."""

    def __init__(self, token_ids: Iterable[int]):
        self.token_ids = _ids(token_ids)

    def __call__(self, output_ids: list[int], logits: np.ndarray) -> None:
        if not output_ids:
            logits[self.token_ids] = _NEG_INF


class ApplyTimestampRules:
    """Whisper's timestamp grammar, for a prompt that asks for timestamps.

    - <|notimestamps|> is never sampled;
    - the first sampled token is a timestamp, at most max_initial_timestamp_index
      steps of 0.02 s from the window's start (None: any);
    - timestamps come in pairs (a segment's end, the next one's start), except the
      last one before <|endoftext|>: after two timestamps, text or the end; after
      text and one timestamp, another timestamp or the end;
    - timestamps never decrease, and a segment has a non-zero length (after text,
      the next timestamp is above the last one);
    - where the probability mass of all the timestamps together exceeds that of
      the likeliest other token, a timestamp is forced.

    after_prefix: the prompt ends in forced text tokens (faster-whisper's `prefix`
    option, after <|0.00|>). CTranslate2 then applies neither the first-token rule
    nor the pair rules at the first sampled position (only <|notimestamps|> is
    forbidden there), where openai-whisper would force a timestamp; this follows
    CTranslate2. The rules only ever look at sampled tokens, never the prompt."""

    def __init__(self, eot: int, no_timestamps: int, timestamp_begin: int,
                 max_initial_timestamp_index: int | None = 50, after_prefix: bool = False):
        if max_initial_timestamp_index is not None and max_initial_timestamp_index < 0:
            raise ValueError(f"max_initial_timestamp_index must be >= 0 or None, "
                             f"got {max_initial_timestamp_index}")
        self.eot = eot
        self.no_timestamps = no_timestamps
        self.timestamp_begin = timestamp_begin
        self.max_initial_timestamp_index = max_initial_timestamp_index
        self.after_prefix = after_prefix

    def __call__(self, output_ids: list[int], logits: np.ndarray) -> None:
        begin = self.timestamp_begin
        logits[self.no_timestamps] = _NEG_INF
        if not output_ids:
            if not self.after_prefix:
                logits[:begin] = _NEG_INF
                if self.max_initial_timestamp_index is not None:
                    logits[begin + self.max_initial_timestamp_index + 1:] = _NEG_INF
            return
        last = output_ids[-1]
        if last >= begin:
            # a lone first token counts as the second of a pair
            penultimate = output_ids[-2] if len(output_ids) >= 2 else last
            if penultimate >= begin:
                logits[begin:] = _NEG_INF  # a pair is complete: text or the end
                return
            logits[:self.eot] = _NEG_INF  # a segment's end: its pair or the end
            logits[begin:last] = _NEG_INF
        else:
            last_timestamp = next((t for t in reversed(output_ids) if t >= begin), None)
            if last_timestamp is not None:
                logits[begin:last_timestamp + 1] = _NEG_INF
        # comparing log-softmax values: the normalizer cancels out
        if _logsumexp(logits[begin:]) > float(logits[:begin].max()):
            logits[:begin] = _NEG_INF


class NoSpeechProbe:
    """Records, at the first sampled position, the probability of <|nospeech|> (or
    <|nocaptions|>) over the raw row; runs first, before anything edits the row.
    Whisper reads it at the <|startoftranscript|> position, so this probe is
    Whisper's only where <|startoftranscript|> ends the prompt (window_params and
    no_speech_params arrange that). `prob` is None until it has seen a row."""

    def __init__(self, no_speech: int):
        self.no_speech = no_speech
        self.prob: float | None = None

    def __call__(self, output_ids: list[int], logits: np.ndarray) -> None:
        if not output_ids:
            self.prob = float(np.exp(_log_softmax(logits)[self.no_speech]))


class LogprobRecorder:
    """Sums the log-probabilities of the tokens the completion chose, each in the
    distribution the rules left (the row as this processor sees it, so it runs
    last) and without temperature, as Whisper's sum_logprob is. A call records the
    row's log-softmax; the next call, or finish(output_ids) once the completion has
    ended, adds the entry of the token that was chosen from it (output_ids[-1]).
    finish must see the final <|endoftext|> when the completion chose it: Whisper
    counts its log-probability."""

    def __init__(self):
        self.sum_logprob = 0.0
        self.counted = 0           # tokens whose log-probability is in the sum
        self._pending: np.ndarray | None = None  # the last row's log-probabilities

    def __call__(self, output_ids: list[int], logits: np.ndarray) -> None:
        self.finish(output_ids)
        self._pending = _log_softmax(logits)

    def finish(self, output_ids: list[int]) -> float:
        """Counts the token chosen from the last recorded row, if output_ids holds
        it; returns the sum so far."""
        if self._pending is not None and len(output_ids) == self.counted + 1:
            self.sum_logprob += float(self._pending[output_ids[-1]])
            self.counted += 1
            self._pending = None
        return self.sum_logprob


class LanguageMask:
    """Language detection's rule: only language tokens may be sampled. Records, at
    the first sampled position, the probability of each language (the softmax of
    the language tokens' logits alone, as Whisper computes it): `probs`, in the
    order of language_ids; None until it has seen a row."""

    def __init__(self, language_ids: Iterable[int]):
        self.language_ids = np.array(list(language_ids), dtype=np.int64)
        self.probs: np.ndarray | None = None

    def __call__(self, output_ids: list[int], logits: np.ndarray) -> None:
        kept = logits[self.language_ids].copy()
        logits[:] = _NEG_INF
        logits[self.language_ids] = kept
        if not output_ids:
            self.probs = np.exp(_log_softmax(kept))
