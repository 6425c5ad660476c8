"""Window decoders over CTranslate2's Whisper, to test the decoding driver
(armllm.audio.transcribe) apart from armllm's engine.

Ct2Decoder: CTranslate2's own generate decodes the window and applies Whisper's
rules itself; our processors only say what to apply (the suppressed ids, the blank
rule, the initial-timestamp limit) and the result comes from CTranslate2's score
(the sum of the chosen tokens' log-probabilities divided by the token count,
<|endoftext|> counted in the sum but not in the count; a forced prefix counts in
the count with log-probability 0) and its no-speech probability.

Ct2StepDecoder: the engine's way. Each position's logits row comes from
CTranslate2 (one generate call per position, the tokens so far forced), our
processors apply the rules and record, and result_from builds the result.
CTranslate2 applies its own timestamp processor on the rows it returns: it sets
<|notimestamps|> to the lowest float everywhere, and at a first position without a
prefix every text token (those are -inf under our rules too); so the rows are
the raw ones wherever our rules leave a token possible, except that the raw row of
a first position is not returned, and its no-speech probability is CTranslate2's."""
from __future__ import annotations

import asyncio
import math

import numpy as np

from armllm.audio.logits import (
    ApplyTimestampRules,
    LanguageMask,
    NoSpeechProbe,
    SuppressBlank,
    SuppressTokens,
)
from armllm.audio.tokens import WhisperTokens
from armllm.audio.window import DecodeResult, PromptLayout, result_from
from armllm.sampling import SamplingParams


def _find(params: SamplingParams, kind: type):
    return next((p for p in params.logits_processors if isinstance(p, kind)), None)


def _storage(ctranslate2, features: np.ndarray):
    return ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))


class Ct2Decoder:
    """CTranslate2 decodes whole windows, applying Whisper's rules itself."""

    def __init__(self, model, tokens: WhisperTokens):
        import ctranslate2
        self.ct2 = ctranslate2
        self.model = model
        self.tokens = tokens
        self.calls = 0

    async def decode(self, features: np.ndarray, prompt_ids: list[int],
                     params: SamplingParams) -> DecodeResult:
        return await asyncio.to_thread(self._decode, features, prompt_ids, params)

    def _decode(self, features, prompt_ids, params) -> DecodeResult:
        self.calls += 1
        mask = _find(params, LanguageMask)
        if mask is not None:
            return self._detect(features, mask)
        suppress = _find(params, SuppressTokens)
        rules = _find(params, ApplyTimestampRules)
        kwargs = {}
        if params.temperature > 0:
            kwargs = dict(sampling_topk=0, sampling_temperature=params.temperature)
            if params.seed is not None:
                self.ct2.set_random_seed(params.seed)
        layout = PromptLayout.of(self.tokens, prompt_ids)
        # one step for a one-token request, else CTranslate2's own window limit
        max_length = max(2, layout.task_end) if params.max_tokens == 1 else 448
        result = self.model.generate(
            _storage(self.ct2, features), [prompt_ids], beam_size=1, max_length=max_length,
            return_scores=True, return_no_speech_prob=True,
            suppress_blank=_find(params, SuppressBlank) is not None,
            suppress_tokens=[int(t) for t in suppress.token_ids] if suppress else [],
            max_initial_timestamp_index=(rules.max_initial_timestamp_index
                                         if rules and rules.max_initial_timestamp_index
                                         is not None else 50),
            **kwargs)[0]
        with_prefix = result.sequences_ids[0]
        forced = len(layout.forced(prompt_ids))
        probe = _find(params, NoSpeechProbe)
        if probe is not None:
            probe.prob = result.no_speech_prob
        return DecodeResult(with_prefix[forced:], result.scores[0] * len(with_prefix),
                            result.no_speech_prob if probe else math.nan)

    def _detect(self, features, mask: LanguageMask) -> DecodeResult:
        found = dict(self.model.detect_language(_storage(self.ct2, features))[0])
        names = {i: f"<|{code}|>" for code, i in self.tokens.language_ids.items()}
        mask.probs = np.array([found[names[int(i)]] for i in mask.language_ids])
        return DecodeResult([int(mask.language_ids[np.argmax(mask.probs)])], 0.0)


class Ct2StepDecoder:
    """Our processors decide each token over CTranslate2's logits rows."""

    def __init__(self, model, tokens: WhisperTokens):
        import ctranslate2
        self.ct2 = ctranslate2
        self.model = model
        self.tokens = tokens
        self.steps = 0

    async def decode(self, features: np.ndarray, prompt_ids: list[int],
                     params: SamplingParams) -> DecodeResult:
        return await asyncio.to_thread(self._decode, features, prompt_ids, params)

    def _decode(self, features, prompt_ids, params) -> DecodeResult:
        encoded = self.model.encode(_storage(self.ct2, features))
        rng = np.random.default_rng(params.seed)
        output: list[int] = []
        for _ in range(params.max_tokens):
            row, no_speech = self._row(encoded, prompt_ids + output)
            for processor in params.logits_processors:
                if isinstance(processor, NoSpeechProbe) and not output:
                    processor.prob = no_speech
                else:
                    processor(output, row)
            if params.temperature == 0:
                token = int(np.argmax(row))
            else:
                scaled = row.astype(np.float64) / params.temperature
                probs = np.exp(scaled - scaled.max())
                token = int(rng.choice(len(row), p=probs / probs.sum()))
            output.append(token)
            if token in params.stop_token_ids:
                break
        return result_from(output, params)

    def _row(self, encoded, prompt: list[int]) -> tuple[np.ndarray, float]:
        """The logits row after prompt, and CTranslate2's no-speech probability."""
        self.steps += 1
        layout = PromptLayout.of(self.tokens, prompt)
        forced = len(layout.forced(prompt))
        start_step = layout.task_end - 1
        # CTranslate2 decodes min(max_length // 2, max_length - start_step) positions,
        # the forced ones included: make that forced + 1
        max_length = max(start_step + forced + 1, 2 * (forced + 1))
        result = self.model.generate(
            encoded, [prompt], beam_size=1, max_length=max_length, return_logits_vocab=True,
            return_no_speech_prob=True, suppress_blank=False, suppress_tokens=[],
            max_initial_timestamp_index=10_000)[0]
        return np.array(result.logits[0][forced], dtype=np.float32), result.no_speech_prob
