"""service: speech to text over a loaded Whisper model: the one path that the library
(LLM.transcribe, AsyncLLM.transcribe), `armllm transcribe` and the server's
/v1/audio routes share. Audio (a file's bytes or path, or 16 kHz samples) becomes
log-mel features (audio/decode.py, audio/mel.py); the driver (audio/transcribe.py)
turns windows of them into requests, each one window's decoder prompt with the
window as its encoder input, so that windows of every file and request in flight
are batched by the engine; the segments come back as they are decoded.

Requests go through a `generate` with AsyncLLM.generate's signature: an
AsyncLLM's own, or a stepped engine's (LLM: api.py), so this module knows no
engine. Whisper's rules run as logits processors inside the engine and record
their results in place, so the engine must run in this process (a data-parallel
replica in another one cannot report them)."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from armllm.audio.decode import SAMPLE_RATE, load_audio
from armllm.audio.mel import features_for_file
from armllm.audio.tokens import MULTILINGUAL_VOCAB_SIZE, WhisperTokens
from armllm.audio.transcribe import (
    Segment,
    TranscribeOptions,
    TranscriptionInfo,
    transcribe,
    transcribe_batched,
)
from armllm.audio.window import DecodeResult, result_from
from armllm.engine.llm_engine import RequestRejected
from armllm.sampling import SamplingParams

Audio = bytes | str | os.PathLike | np.ndarray
# AsyncLLM.generate's shape: (prompt ids, params, request_id=, priority=, encoder_input=)
Generate = Callable[..., AsyncIterator[Any]]
_request_ids = itertools.count()
# the English-only models' vocabulary (tiny.en ... medium.en); a multilingual one holds at
# least MULTILINGUAL_VOCAB_SIZE (Whisper's own test), a small test model declares its
# languages
ENGLISH_ONLY_VOCAB_SIZE = 51864


class EngineDecoder:
    """audio/transcribe.py's WindowDecoder over an engine's generate: a window's
    request is its prompt with the window's features as encoder input.

    Word timestamps' alignment pass runs on `model` (the engine's WhisperModel)
    in a worker thread, outside the engine: the window is encoded again into
    arrays of its own, so the engine's cache and slots are not touched, and the
    weights are only read. The kernels may be called from that thread while the
    engine steps: the thread pool runs one job at a time (pool.c's run_lock), so
    the two interleave kernel by kernel."""

    def __init__(self, generate: Generate, max_model_len: int,
                 request_prefix: str = "transcribe", priority: int = 0, model=None):
        self.generate, self.max_model_len = generate, max_model_len
        self.request_prefix, self.priority = request_prefix, priority
        self.model = model

    async def decode(self, features: np.ndarray, prompt_ids: list[int],
                     params: SamplingParams) -> DecodeResult:
        # CTranslate2 may sample one token past the context (its last token is never
        # fed back); the engine keeps prompt and output within it
        room = self.max_model_len - len(prompt_ids)
        if params.max_tokens > room:
            params = dataclasses.replace(params, max_tokens=max(room, 1))
        out = None
        rid = f"{self.request_prefix}-{next(_request_ids)}"
        async for out in self.generate(prompt_ids, params, request_id=rid,  # noqa: B007
                                       priority=self.priority, encoder_input=features):
            pass
        if out.error is not None:
            raise RuntimeError(f"decoding a window failed: {out.error}")
        return result_from(list(out.outputs[0].token_ids), params)

    async def alignment(self, features: np.ndarray, sequence: list[int],
                        ) -> tuple[np.ndarray, np.ndarray]:
        if self.model is None:
            raise RuntimeError("word timestamps need the model in this process")

        def run() -> tuple[np.ndarray, np.ndarray]:
            return self.model.alignment_weights(sequence,
                                                self.model.cross_attention_kv(features))
        return await asyncio.to_thread(run)


@dataclass
class Transcription:
    """A whole transcription: its info, its segments and their text joined."""
    info: TranscriptionInfo
    segments: list[Segment] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()


def samples(audio: Audio, max_seconds: float | None = None) -> np.ndarray:
    """16 kHz mono float32 samples of a file's bytes or path (decoded, resampled), or
    of samples given as such (checked); audio.decode.AudioError (a ValueError) names
    what is wrong."""
    if isinstance(audio, np.ndarray):
        if audio.ndim != 1 or not np.issubdtype(audio.dtype, np.floating):
            raise ValueError(f"audio samples must be 1-D float (16 kHz mono), got "
                             f"{audio.dtype} of shape {list(audio.shape)}")
        if max_seconds is not None and len(audio) > max_seconds * SAMPLE_RATE:
            raise ValueError(f"the audio lasts {len(audio) / SAMPLE_RATE:.1f} s, longer "
                             f"than the limit of {max_seconds:g} s")
        return np.ascontiguousarray(audio, np.float32)
    return load_audio(audio, max_seconds=max_seconds)


def whisper_tokens(loaded) -> WhisperTokens:
    """The Whisper token ids of a loaded model (model/loader.LoadedModel), multilingual
    by its vocabulary's size or the languages its directory declares; a ValueError
    for a model that is not Whisper."""
    if loaded.config.encoder is None:
        raise ValueError(f"{loaded.path}: not a speech-to-text model (Whisper): it has no "
                         f"audio encoder")
    vocab = loaded.config.vocab_size
    return WhisperTokens(loaded.tokenizer, vocab, vocab >= MULTILINGUAL_VOCAB_SIZE or (
        vocab != ENGLISH_ONLY_VOCAB_SIZE and bool(_language_ids(loaded.path))))


def _language_ids(path) -> list:
    """The language token ids a model directory declares: a CTranslate2 config.json's
    lang_ids, or a Hugging Face generation_config.json's lang_to_id."""
    for name, key in (("config.json", "lang_ids"), ("generation_config.json", "lang_to_id")):
        try:
            value = json.loads((Path(path) / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if value:
            return list(value)
    return []


def check_options(loaded, options: TranscribeOptions | None = None) -> WhisperTokens:
    """The Whisper tokens of a loaded model, once `options` are known to run on it;
    RequestRejected (a ValueError) naming in `field` what to change otherwise: "model"
    for a model that is not Whisper, "language" for a language it does not know."""
    try:
        tokens = whisper_tokens(loaded)
    except ValueError as exc:
        raise RequestRejected(str(exc), "model") from None
    if options is not None and options.language is not None:
        try:
            tokens.language_code(options.language)
        except ValueError as exc:
            raise RequestRejected(str(exc), "language") from None
    return tokens


async def transcribe_stream(generate: Generate, loaded, audio: Audio,
                            options: TranscribeOptions | None = None, *, batched: bool = False,
                            max_seconds: float | None = None, priority: int = 0
                            ) -> tuple[TranscriptionInfo, AsyncIterator[Segment]]:
    """The info (language, duration) and the segments of one audio, decoded as they are
    read. batched: every ≤30 s chunk at once, none conditioned on the text before
    (throughput); else Whisper's long-form algorithm, window after window. The file's
    decoding and its log-mel run in a worker thread, off the event loop."""
    tokens = check_options(loaded, options)
    pcm = await asyncio.to_thread(samples, audio, max_seconds)
    if not len(pcm):
        raise ValueError("the audio holds no samples")
    n_mels = loaded.config.encoder.n_mels
    decoder = EngineDecoder(generate, loaded.config.max_position_embeddings,
                            priority=priority, model=loaded.model)
    if batched:
        return await transcribe_batched(decoder, tokens, pcm, options,
                                        log_mel=partial(features_for_file, n_mels=n_mels))
    features = await asyncio.to_thread(features_for_file, pcm, n_mels)
    return await transcribe(decoder, tokens, features, len(pcm) / SAMPLE_RATE, options)
