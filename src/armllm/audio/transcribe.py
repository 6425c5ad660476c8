"""transcribe: Whisper's decoding driver over an abstract window decoder.

The driver owns what Whisper does around the model: the decoder prompt (previous
text, <|startoftranscript|>, language, task, prefix), language detection, the
temperature fallback (compression-ratio, log-probability and no-speech rules,
best_of samples), the long-form algorithm (30-second windows over the whole
file's log-mel, split into segments at timestamp pairs, seeking to the last
timestamp) and a batched mode that decodes ≤30 s chunks all at once. It follows
faster-whisper's `generate_segments` for beam size 1, so that its segments equal
faster-whisper's on the same model.

The model is behind audio/window.py's WindowDecoder: a window's requests are
built there, run by whatever decodes (the engine: audio/service.py)."""
from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from armllm.audio.decode import SAMPLE_RATE
from armllm.audio.mel import HOP_LENGTH, N_FRAMES, pad_or_trim
from armllm.audio.tokens import TASKS, TIME_PRECISION, WhisperTokens
from armllm.audio.window import (
    MAX_SAMPLED,
    DecodeResult,
    PromptLayout,
    WindowDecoder,
    language_params,
    no_speech_params,
    window_params,
)
from armllm.audio.words import (
    APPEND_PUNCTUATIONS,
    PREPEND_PUNCTUATIONS,
    Word,
    add_word_timestamps,
    find_alignment,
    last_word_end,
)

FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH   # 100 log-mel frames a second
SECONDS_PER_FRAME = 1 / FRAMES_PER_SECOND
INPUT_STRIDE = 2           # mel frames per encoder position (one timestamp step)
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass
class TranscribeOptions:
    """What a transcription asks for; the defaults are faster-whisper's (and
    openai-whisper's) for beam size 1.

    language: a code or name, None to detect it. temperature: one value, or the
    fallback schedule tried in order while a result fails compression_ratio_threshold
    (too repetitive) or log_prob_threshold (too unlikely) and is not silence
    (no_speech_prob above no_speech_threshold with a low log-probability). A
    sampled temperature runs best_of requests and keeps the likeliest. The text
    decoded so far prompts the next window (condition_on_previous_text) unless a
    window needed a temperature above prompt_reset_on_temperature. initial_prompt:
    text (or token ids) before the first window's; prefix: the first window's
    transcript starts with it. suppress_tokens: ids, -1 for the non-speech set.
    clip_timestamps: start, end, start, end … seconds to transcribe (an odd count
    runs to the end); empty: all. word_timestamps: each segment's words with their
    times (audio/words.py), prepend_punctuations and append_punctuations joining the
    word after or before them; the next window then starts at the last word's end.
    hallucination_silence_threshold is not implemented (without word timestamps it
    does nothing in faster-whisper either). language_detection_segments windows are tried until one
    is more likely than language_detection_threshold. seed: sampled requests use
    seed, seed+1, … (None: not reproducible)."""
    language: str | None = None
    task: str = "transcribe"
    temperature: float | tuple[float, ...] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    initial_prompt: str | list[int] | None = None
    prefix: str | None = None
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] | None = (-1,)
    best_of: int = 5
    beam_size: int = 1
    hallucination_silence_threshold: float | None = None
    word_timestamps: bool = False
    prepend_punctuations: str = PREPEND_PUNCTUATIONS
    append_punctuations: str = APPEND_PUNCTUATIONS
    clip_timestamps: tuple[float, ...] = ()
    language_detection_segments: int = 1
    language_detection_threshold: float = 0.5
    seed: int | None = None
    temperatures: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self):
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")
        if self.task not in TASKS:
            raise bad("task", f"must be one of {', '.join(TASKS)}")
        temps = (self.temperature if isinstance(self.temperature, list | tuple)
                 else (self.temperature,))
        if not temps or not all(isinstance(t, int | float) and 0.0 <= t <= 100.0
                                for t in temps):
            raise bad("temperature", "must be a value or a non-empty schedule in [0, 100]")
        self.temperatures = tuple(float(t) for t in temps)
        if self.beam_size != 1:
            raise bad("beam_size", "must be 1 (beam search is not supported)")
        if not isinstance(self.best_of, int) or self.best_of < 1:
            raise bad("best_of", "must be an integer >= 1")
        if self.max_initial_timestamp < 0:
            raise bad("max_initial_timestamp", "must be >= 0 seconds")
        if self.language_detection_segments < 1:
            raise bad("language_detection_segments", "must be >= 1")
        self.clip_timestamps = tuple(float(t) for t in self.clip_timestamps)
        if any(t < 0 for t in self.clip_timestamps):
            raise bad("clip_timestamps", "must be seconds >= 0")
        # the sampler's draws take the seed as a uint64 (sample.h)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(
                self.seed, bool) or not 0 <= self.seed < 2**64):
            raise bad("seed", "must be an integer in [0, 2^64)")


@dataclass
class Segment:
    """A stretch of transcript: id counts from 0 (OpenAI's verbose_json; faster-
    whisper counts from 1), seek is the window's start in mel frames (10 ms),
    start and end in seconds of the file, tokens with their timestamps; the
    window's temperature, avg_logprob, compression_ratio and no_speech_prob;
    words where word timestamps were asked for."""
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None


@dataclass
class TranscriptionInfo:
    """language: its code; language_probability: 1 where it was given;
    all_language_probs: (code, probability) best first, where it was detected."""
    language: str
    language_probability: float
    duration: float
    all_language_probs: list[tuple[str, float]] | None = None


def compression_ratio(text: str) -> float:
    """How well the text compresses (zlib, as Whisper measures repetition)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


async def detect_language(decoder: WindowDecoder, tokens: WhisperTokens, features: np.ndarray,
                          segments: int = 1, threshold: float = 0.5,
                          ) -> tuple[str, float, list[tuple[str, float]]]:
    """The language of the first `segments` windows of features [n_mels, n]: each
    window in turn until one is surer than threshold, else the language most
    windows chose (with its best probability). Returns (code, probability, all
    (code, probability) pairs best first, from the last window tried). An
    English-only model says ("en", 1.0)."""
    if not tokens.multilingual:
        return "en", 1.0, [("en", 1.0)]
    codes = list(tokens.language_ids)
    votes: dict[str, list[float]] = {}
    features = features[:, :segments * N_FRAMES]
    ranked: list[tuple[str, float]] = []
    for start in range(0, max(features.shape[-1], 1), N_FRAMES):
        params, probes = language_params(tokens)
        await decoder.decode(pad_or_trim(features[:, start:start + N_FRAMES]),
                             [tokens.sot], params)
        if probes.language is None or probes.language.probs is None:
            raise RuntimeError("the window decoder did not run the LanguageMask processor")
        probs = probes.language.probs
        order = np.argsort(-probs, kind="stable")
        ranked = [(codes[i], float(probs[i])) for i in order]
        code, prob = ranked[0]
        if prob > threshold:
            return code, prob, ranked
        votes.setdefault(code, []).append(prob)
    code = max(votes, key=lambda c: len(votes[c]))
    return code, max(votes[code]), ranked


@dataclass
class _Window:
    """One window's decode after the fallback."""
    result: DecodeResult
    avg_logprob: float
    temperature: float
    compression_ratio: float


class _Driver:
    """The per-file state of a transcription: the tokens, the options read once."""

    def __init__(self, decoder: WindowDecoder, tokens: WhisperTokens, options: TranscribeOptions,
                 language: str):
        self.decoder = decoder
        self.tokens = tokens
        self.options = options
        self.language = language
        self.sot_sequence = tokens.sot_sequence(language, options.task)
        self.suppress = tokens.suppress_set(options.suppress_tokens)
        self.max_initial_index = int(round(options.max_initial_timestamp / TIME_PRECISION))
        self.requests = 0  # seeds for sampled requests

    def prompt(self, previous: list[int], prefix: str | None) -> list[int]:
        """faster-whisper's get_prompt: <|startofprev|> and the last 223 previous
        tokens, the SOT sequence, <|notimestamps|>, then <|0.00|> and the prefix."""
        t = self.tokens
        prompt = [t.sot_prev, *previous[-(MAX_SAMPLED - 1):]] if previous else []
        prompt += self.sot_sequence
        if self.options.without_timestamps:
            prompt.append(t.no_timestamps)
        if prefix:
            prefix_ids = t.encode_prompt(prefix)
            if len(prefix_ids) >= MAX_SAMPLED:
                prefix_ids = prefix_ids[:MAX_SAMPLED - 1]
            if not self.options.without_timestamps:
                prompt.append(t.timestamp_begin)
            prompt += prefix_ids
        return prompt

    def _seed(self) -> int | None:
        self.requests += 1
        return None if self.options.seed is None else self.options.seed + self.requests - 1

    async def _decode(self, features: np.ndarray, prompt: list[int],
                      temperature: float) -> DecodeResult:
        """One request; its tokens start with the prompt's forced prefix, as
        CTranslate2 returns them (the prefix then counts in avg_logprob's length
        with a log-probability of 0)."""
        params, _ = window_params(
            self.tokens, prompt, temperature=temperature,
            seed=self._seed() if temperature > 0 else None, suppress_tokens=self.suppress,
            suppress_blank=self.options.suppress_blank,
            max_initial_timestamp_index=self.max_initial_index)
        result = await self.decoder.decode(features, prompt, params)
        forced = PromptLayout.of(self.tokens, prompt).forced(prompt)
        if forced:
            result.token_ids = forced + result.token_ids
        return result

    async def _no_speech(self, features: np.ndarray, prompt: list[int]) -> float:
        params, _ = no_speech_params(self.tokens)
        sot_end = prompt.index(self.tokens.sot) + 1
        return (await self.decoder.decode(features, prompt[:sot_end], params)).no_speech_prob

    async def _sample(self, features: np.ndarray, prompt: list[int],
                      temperature: float) -> DecodeResult:
        """One result at this temperature: greedy, or the likeliest (per token,
        <|endoftext|> aside, as CTranslate2 ranks them) of best_of samples."""
        if temperature == 0 or self.options.best_of == 1:
            return await self._decode(features, prompt, temperature)
        results = await asyncio.gather(*(self._decode(features, prompt, temperature)
                                          for _ in range(self.options.best_of)))
        return max(results, key=lambda r: (r.sum_logprob / len(r.token_ids) if r.token_ids
                                           else -math.inf))

    async def decode_with_fallback(self, features: np.ndarray, prompt: list[int]) -> _Window:
        """faster-whisper's generate_with_fallback, beam size 1."""
        o = self.options
        no_speech_task = None
        if PromptLayout.of(self.tokens, prompt).sot_index != len(prompt) - 1:
            no_speech_task = asyncio.ensure_future(self._no_speech(features, prompt))
        tried: list[_Window] = []
        kept: list[_Window] = []  # those under the compression-ratio threshold
        try:
            for temperature in o.temperatures:
                result = await self._sample(features, prompt, temperature)
                if no_speech_task is not None:
                    result.no_speech_prob = await no_speech_task
                avg_logprob = result.sum_logprob / (len(result.token_ids) + 1)
                ratio = compression_ratio(self.tokens.decode(result.token_ids).strip())
                window = _Window(result, avg_logprob, temperature, ratio)
                tried.append(window)
                fallback = False
                if o.compression_ratio_threshold is not None:
                    if ratio > o.compression_ratio_threshold:
                        fallback = True  # too repetitive
                    else:
                        kept.append(window)
                if o.log_prob_threshold is not None and avg_logprob < o.log_prob_threshold:
                    fallback = True  # too unlikely
                if (o.no_speech_threshold is not None and o.log_prob_threshold is not None
                        and result.no_speech_prob > o.no_speech_threshold
                        and avg_logprob < o.log_prob_threshold):
                    fallback = False  # silence: the window will be skipped
                if not fallback:
                    return window
        finally:
            if no_speech_task is not None and not no_speech_task.done():
                no_speech_task.cancel()
        best = max(kept or tried, key=lambda w: w.avg_logprob)
        # the last temperature tried, for the prompt reset
        return _Window(best.result, best.avg_logprob, temperature, best.compression_ratio)

    async def add_words(self, features: np.ndarray, pieces: list[dict], num_frames: int,
                        last_speech_timestamp: float) -> None:
        """Each of a window's segments gets its "words" (audio/words.py), its start
        and end following them."""
        eot = self.tokens.eot
        text_ids = [t for piece in pieces for t in piece["tokens"] if t < eot]
        alignment = []
        if text_ids:
            sequence = [*self.sot_sequence, self.tokens.no_timestamps, *text_ids, eot]
            weights, logits = await self.decoder.alignment(features, sequence)
            alignment = find_alignment(self.tokens, self.language, text_ids,
                                       self.sot_sequence, weights, logits, num_frames)
        add_word_timestamps(pieces, alignment, eot, FRAMES_PER_SECOND,
                            self.options.prepend_punctuations,
                            self.options.append_punctuations, last_speech_timestamp)

    def is_silence(self, window: _Window) -> bool:
        o = self.options
        if o.no_speech_threshold is None:
            return False
        if o.log_prob_threshold is not None and window.avg_logprob > o.log_prob_threshold:
            return False
        return window.result.no_speech_prob > o.no_speech_threshold


def split_segments(tokens: WhisperTokens, token_ids: list[int], time_offset: float,
                   segment_size: int, segment_duration: float, seek: int,
                   ) -> tuple[list[dict], int, bool]:
    """A window's tokens cut into segments at each pair of consecutive timestamps,
    and where the next window starts (faster-whisper's _split_segments_by_timestamps):
    a window that ends in a lone timestamp (no speech after it) or has no pair is
    consumed whole; otherwise the next window starts at the last pair, dropping
    the unfinished segment after it. Returns (segments as dicts of seek, start,
    end, tokens), the new seek in frames, whether the window ended in a lone
    timestamp)."""
    begin = tokens.timestamp_begin
    single_timestamp_ending = (len(token_ids) >= 2
                               and token_ids[-2] < begin <= token_ids[-1])
    pairs = [i for i in range(1, len(token_ids))
             if token_ids[i] >= begin and token_ids[i - 1] >= begin]
    segments = []
    if pairs:
        cuts = pairs + [len(token_ids)] if single_timestamp_ending else pairs
        last_cut = 0
        for cut in cuts:
            piece = token_ids[last_cut:cut]
            start = time_offset + (piece[0] - begin) * TIME_PRECISION
            end = time_offset + (piece[-1] - begin) * TIME_PRECISION
            segments.append(dict(seek=seek, start=start, end=end, tokens=piece))
            last_cut = cut
        if single_timestamp_ending:
            seek += segment_size
        else:
            seek += (token_ids[last_cut - 1] - begin) * INPUT_STRIDE
    else:
        duration = segment_duration
        stamps = [t for t in token_ids if t >= begin]
        if stamps and stamps[-1] != begin:
            duration = (stamps[-1] - begin) * TIME_PRECISION
        segments.append(dict(seek=seek, start=time_offset, end=time_offset + duration,
                             tokens=token_ids))
        seek += segment_size
    return segments, seek, single_timestamp_ending


async def _language(decoder: WindowDecoder, tokens: WhisperTokens, features: np.ndarray,
                    duration: float, options: TranscribeOptions) -> TranscriptionInfo:
    if options.language is not None:
        return TranscriptionInfo(tokens.language_code(options.language), 1.0, duration)
    code, prob, ranked = await detect_language(decoder, tokens, features,
                                               options.language_detection_segments,
                                               options.language_detection_threshold)
    return TranscriptionInfo(code, prob, duration, ranked if tokens.multilingual else None)


def _seek_clips(options: TranscribeOptions, content_frames: int) -> list[tuple[int, int]]:
    points = [round(t * FRAMES_PER_SECOND) for t in options.clip_timestamps] or [0]
    if len(points) % 2:
        points.append(content_frames)
    return list(zip(points[::2], points[1::2], strict=True))


async def transcribe(decoder: WindowDecoder, tokens: WhisperTokens, features: np.ndarray,
                     duration: float, options: TranscribeOptions | None = None,
                     ) -> tuple[TranscriptionInfo, AsyncIterator[Segment]]:
    """Whisper's long-form transcription of a whole file's log-mel features
    [n_mels, n] (armllm.audio.mel.features_for_file: faster-whisper's, whose last
    frame is padding, so the content is n - 1 frames) lasting duration seconds.
    Detects the language first if options has none; returns the info and the
    segments, decoded window by window as they are read."""
    options = options or TranscribeOptions()
    if features.ndim != 2 or features.shape[-1] < 1:
        raise ValueError(f"features must be a log-mel [n_mels, frames], got shape "
                         f"{features.shape}")
    content_frames = features.shape[-1] - 1
    clips = _seek_clips(options, content_frames)
    detect_from = clips[0][0] if clips[0][0] < content_frames else 0
    info = await _language(decoder, tokens, features[:, detect_from:], duration, options)
    driver = _Driver(decoder, tokens, options, info.language)
    return info, _long_form(driver, features, content_frames, clips)


async def _long_form(driver: _Driver, features: np.ndarray, content_frames: int,
                     clips: list[tuple[int, int]]) -> AsyncIterator[Segment]:
    tokens, options = driver.tokens, driver.options
    all_tokens: list[int] = []
    if isinstance(options.initial_prompt, str):
        all_tokens += tokens.encode_prompt(options.initial_prompt)
    elif options.initial_prompt is not None:
        all_tokens += list(options.initial_prompt)
    prompt_reset_since = 0
    next_id = 0
    last_speech_timestamp = 0.0
    seek = clips[0][0]
    for clip_start, clip_end in clips:
        clip_end = min(clip_end, content_frames)
        seek = max(seek, clip_start)
        while seek < clip_end:
            time_offset = seek * SECONDS_PER_FRAME
            segment_size = min(N_FRAMES, content_frames - seek, clip_end - seek)
            window = pad_or_trim(features[:, seek:seek + segment_size])
            segment_duration = segment_size * SECONDS_PER_FRAME
            prompt = driver.prompt(all_tokens[prompt_reset_since:],
                                   options.prefix if seek == 0 else None)
            decoded = await driver.decode_with_fallback(window, prompt)
            if driver.is_silence(decoded):
                seek += segment_size
                continue
            previous_seek = seek
            pieces, seek, single_timestamp_ending = split_segments(
                tokens, decoded.result.token_ids, time_offset, segment_size, segment_duration,
                seek)
            if options.word_timestamps:
                await driver.add_words(window, pieces, segment_size, last_speech_timestamp)
                end = last_word_end(pieces)
                if not single_timestamp_ending and end is not None and end > time_offset:
                    seek = round(end * FRAMES_PER_SECOND)
                if end is not None:
                    last_speech_timestamp = end
            for piece in pieces:
                text = tokens.decode(piece["tokens"])
                if piece["start"] == piece["end"] or not text.strip():
                    continue
                all_tokens += piece["tokens"]
                words = ([Word(w["start"], w["end"], w["word"], w["probability"])
                          for w in piece["words"]] if options.word_timestamps else None)
                yield Segment(next_id, previous_seek, piece["start"], piece["end"], text,
                              piece["tokens"], decoded.temperature, decoded.avg_logprob,
                              decoded.compression_ratio, decoded.result.no_speech_prob, words)
                next_id += 1
            if (not options.condition_on_previous_text
                    or decoded.temperature > options.prompt_reset_on_temperature):
                prompt_reset_since = len(all_tokens)


def chunk_bounds(audio: np.ndarray, chunk_seconds: float = 30.0, search_seconds: float = 5.0,
                 frame_seconds: float = 0.1, sample_rate: int = SAMPLE_RATE,
                 ) -> list[tuple[int, int]]:
    """Where to cut audio into chunks of at most chunk_seconds, in samples
    [(start, end), …]. faster-whisper's batched pipeline cuts at speech
    boundaries found by the Silero VAD model; without a VAD this cuts at the
    quietest frame_seconds frame (least mean square, the latest of equals) of the
    last search_seconds before each chunk_seconds boundary, in the middle of that
    frame, so that a cut falls in a pause where there is one."""
    if not 0 < search_seconds <= chunk_seconds:
        raise ValueError(f"search_seconds must be in (0, chunk_seconds], got {search_seconds}")
    chunk = int(chunk_seconds * sample_rate)
    frame = max(int(frame_seconds * sample_rate), 1)
    search = int(search_seconds * sample_rate) // frame * frame
    bounds = []
    start = 0
    while len(audio) - start > chunk:
        first = start + chunk - search
        frames = audio[first:start + chunk].astype(np.float64).reshape(-1, frame)
        energy = (frames ** 2).mean(axis=1)
        quietest = len(energy) - 1 - int(np.argmin(energy[::-1]))
        cut = first + quietest * frame + frame // 2
        bounds.append((start, cut))
        start = cut
    if len(audio) > start or not bounds:
        bounds.append((start, len(audio)))
    return bounds


async def transcribe_batched(decoder: WindowDecoder, tokens: WhisperTokens, audio: np.ndarray,
                             options: TranscribeOptions | None = None, *,
                             log_mel: Callable[[np.ndarray], np.ndarray] | None = None,
                             chunk_seconds: float = 30.0, search_seconds: float = 5.0,
                             ) -> tuple[TranscriptionInfo, AsyncIterator[Segment]]:
    """Throughput mode: audio (16 kHz mono float32) cut into ≤30 s chunks
    (chunk_bounds), each decoded on its own, all at once, never conditioned on
    the text before (initial_prompt prompts every chunk). Each chunk keeps the
    temperature fallback and the no-speech skip (faster-whisper's batched
    pipeline has neither: its VAD leaves no silent chunks). log_mel: a chunk's
    features, as features_for_file computes them (default
    armllm.audio.mel.features_for_file). Segments come in file order."""
    options = options or TranscribeOptions()
    if options.word_timestamps:
        raise ValueError("word timestamps are given by the long-form mode only, not the "
                         "batched one")
    if audio.ndim != 1:
        raise ValueError(f"audio must be mono samples [n], got shape {audio.shape}")
    if log_mel is None:
        from armllm.audio.mel import features_for_file
        log_mel = features_for_file
    duration = len(audio) / SAMPLE_RATE
    bounds = chunk_bounds(audio, chunk_seconds, search_seconds)
    windows = [pad_or_trim(log_mel(audio[start:end])[:, :-1]) for start, end in bounds]
    info = await _language(decoder, tokens, windows[0], duration, options)
    driver = _Driver(decoder, tokens, options, info.language)
    return info, _batched(driver, windows, bounds)


async def _batched(driver: _Driver, windows: list[np.ndarray],
                   bounds: list[tuple[int, int]]) -> AsyncIterator[Segment]:
    tokens, options = driver.tokens, driver.options
    previous: list[int] = []
    if isinstance(options.initial_prompt, str):
        previous = tokens.encode_prompt(options.initial_prompt)
    elif options.initial_prompt is not None:
        previous = list(options.initial_prompt)
    # the prefix starts the file's transcript: the first chunk's
    prompts = [driver.prompt(previous, options.prefix if i == 0 else None)
               for i in range(len(windows))]
    tasks = [asyncio.ensure_future(driver.decode_with_fallback(w, p))
             for w, p in zip(windows, prompts, strict=True)]
    next_id = 0
    try:
        for task, (start, end) in zip(tasks, bounds, strict=True):
            decoded = await task
            if driver.is_silence(decoded):
                continue
            offset = start / SAMPLE_RATE
            duration = (end - start) / SAMPLE_RATE
            pieces, _, _ = split_segments(tokens, decoded.result.token_ids, offset,
                                          math.ceil(duration) * FRAMES_PER_SECOND, duration,
                                          int(offset * FRAMES_PER_SECOND))
            for piece in pieces:
                text = tokens.decode(piece["tokens"])
                if piece["start"] == piece["end"] or not text.strip():
                    continue
                yield Segment(next_id, piece["seek"], round(piece["start"], 3),
                              round(piece["end"], 3), text, piece["tokens"],
                              decoded.temperature, decoded.avg_logprob,
                              compression_ratio(text), decoded.result.no_speech_prob)
                next_id += 1
    finally:
        for task in tasks:
            task.cancel()
