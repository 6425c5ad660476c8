"""window: one 30-second window as requests to the model. WindowDecoder is the seam
between Whisper's driver (audio/transcribe.py) and whatever runs the model (the
engine: audio/service.py): a window's log-mel features, the whole decoder prompt and
SamplingParams whose logits_processors (audio/logits.py) carry Whisper's rules and
record what the result needs. window_params, no_speech_params and language_params
build a window's requests (as CTranslate2 lays out a prompt and caps its tokens);
result_from reads a finished request back into a DecodeResult."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from armllm.audio.logits import (
    ApplyTimestampRules,
    LanguageMask,
    LogprobRecorder,
    NoSpeechProbe,
    SuppressBlank,
    SuppressTokens,
)
from armllm.audio.tokens import WhisperTokens
from armllm.sampling import SamplingParams

MAX_TARGET_POSITIONS = 448  # the decoder's context
MAX_SAMPLED = MAX_TARGET_POSITIONS // 2  # tokens a window may sample (prompt aside)


@dataclass
class DecodeResult:
    """One window's decode: token_ids as sampled, without the prompt and without
    the final <|endoftext|>; sum_logprob over the chosen tokens, that
    <|endoftext|> included (the rules' distribution, no temperature);
    no_speech_prob (nan where the request had no NoSpeechProbe)."""
    token_ids: list[int]
    sum_logprob: float
    no_speech_prob: float = math.nan


class WindowDecoder(Protocol):
    """The model seen from the driver: sample one completion of prompt_ids
    over one window's log-mel features [n_mels, 3000] float32, as params says
    (temperature, max_tokens, stop_token_ids [<|endoftext|>], seed,
    logits_processors)."""

    async def decode(self, features: np.ndarray, prompt_ids: list[int],
                     params: SamplingParams) -> DecodeResult: ...

    async def alignment(self, features: np.ndarray, sequence: list[int],
                        ) -> tuple[np.ndarray, np.ndarray]:
        """The decoder over the whole token sequence at once on this window: the
        alignment heads' cross-attention probabilities [heads, tokens, positions]
        and the logits [tokens, vocab] (WhisperModel.alignment_weights)."""
        ...


@dataclass
class Probes:
    """What a window request's processors record, for result_from."""
    logprobs: LogprobRecorder
    no_speech: NoSpeechProbe | None = None
    language: LanguageMask | None = None

    @classmethod
    def of(cls, params: SamplingParams) -> Probes:
        """The probes among params.logits_processors."""
        found = {type(p): p for p in params.logits_processors
                 if isinstance(p, LogprobRecorder | NoSpeechProbe | LanguageMask)}
        return cls(found.get(LogprobRecorder) or LogprobRecorder(),
                   found.get(NoSpeechProbe), found.get(LanguageMask))


@dataclass(frozen=True)
class PromptLayout:
    """Where a decoder prompt's parts are, as CTranslate2 reads it: sot_index;
    task_end, the index after the run of special tokens from
    <|startoftranscript|> to <|notimestamps|>; what follows is a forced prefix."""
    sot_index: int
    task_end: int
    timestamps: bool

    @classmethod
    def of(cls, tokens: WhisperTokens, prompt_ids: list[int]) -> PromptLayout:
        try:
            sot_index = prompt_ids.index(tokens.sot)
        except ValueError:
            raise ValueError(f"prompt_ids has no <|startoftranscript|> ({tokens.sot}): "
                             f"{prompt_ids[:8]}…") from None
        end = sot_index
        while end < len(prompt_ids) and tokens.sot <= prompt_ids[end] <= tokens.no_timestamps:
            end += 1
        return cls(sot_index, end, prompt_ids[end - 1] != tokens.no_timestamps)

    def forced(self, prompt_ids: list[int]) -> list[int]:
        """The forced prefix: <|0.00|> and the prefix text, or nothing."""
        return prompt_ids[self.task_end:]

    def max_tokens(self, prompt_ids: list[int]) -> int:
        """CTranslate2's limit on a window's sampled tokens (<|endoftext|>
        included): half the context, or less where the prompt before the task
        tokens' end leaves less, less the forced prefix (which CTranslate2
        counts as decoded tokens)."""
        limit = min(MAX_SAMPLED, MAX_TARGET_POSITIONS - (self.task_end - 1))
        return max(limit - len(self.forced(prompt_ids)), 1)


def window_params(tokens: WhisperTokens, prompt_ids: list[int], *, temperature: float = 0.0,
                  seed: int | None = None, suppress_tokens: tuple[int, ...] = (),
                  suppress_blank: bool = True,
                  max_initial_timestamp_index: int | None = 50,
                  ) -> tuple[SamplingParams, Probes]:
    """The SamplingParams of one window request and the probes its processors
    fill. suppress_tokens: ids (WhisperTokens.suppress_set). The no-speech probe
    is there only where <|startoftranscript|> ends the prompt (English-only models
    with timestamps); elsewhere Whisper reads it inside the prompt and the driver
    asks for it apart (no_speech_params)."""
    layout = PromptLayout.of(tokens, prompt_ids)
    probes = Probes(LogprobRecorder())
    processors: list = []
    if layout.sot_index == len(prompt_ids) - 1:
        probes.no_speech = NoSpeechProbe(tokens.no_speech)
        processors.append(probes.no_speech)
    if suppress_blank:
        processors.append(SuppressBlank(tokens.blank))
    if suppress_tokens:
        processors.append(SuppressTokens(suppress_tokens))
    if layout.timestamps:
        processors.append(ApplyTimestampRules(
            tokens.eot, tokens.no_timestamps, tokens.timestamp_begin,
            max_initial_timestamp_index, after_prefix=bool(layout.forced(prompt_ids))))
    processors.append(probes.logprobs)
    params = SamplingParams(max_tokens=layout.max_tokens(prompt_ids), temperature=temperature,
                            seed=seed, stop_token_ids=[tokens.eot],
                            skip_special_tokens=False, logits_processors=tuple(processors))
    return params, probes


def no_speech_params(tokens: WhisperTokens) -> tuple[SamplingParams, Probes]:
    """A one-token request whose prompt ends at <|startoftranscript|> (the window
    prompt cut after it), for the no-speech probability there."""
    probes = Probes(LogprobRecorder(), NoSpeechProbe(tokens.no_speech))
    return SamplingParams(max_tokens=1, temperature=0.0, skip_special_tokens=False,
                          logits_processors=(probes.no_speech,)), probes


def language_params(tokens: WhisperTokens) -> tuple[SamplingParams, Probes]:
    """A one-token request over the prompt [<|startoftranscript|>] that may only
    choose a language token, recording every language's probability."""
    probes = Probes(LogprobRecorder(), language=LanguageMask(tokens.language_ids.values()))
    return SamplingParams(max_tokens=1, temperature=0.0, skip_special_tokens=False,
                          logits_processors=(probes.language,)), probes


def result_from(token_ids: list[int], params: SamplingParams, eot: int | None = None
                ) -> DecodeResult:
    """The DecodeResult of a finished request: token_ids are the completion's
    sampled tokens, with the final <|endoftext|> when it chose it (params'
    stop_token_ids[0], or eot)."""
    probes = Probes.of(params)
    sum_logprob = probes.logprobs.finish(token_ids)
    eot = params.stop_token_ids[0] if eot is None and params.stop_token_ids else eot
    if token_ids and token_ids[-1] == eot:
        token_ids = token_ids[:-1]
    no_speech = probes.no_speech.prob if probes.no_speech else None
    return DecodeResult(list(token_ids), sum_logprob,
                        math.nan if no_speech is None else no_speech)
