"""formats: a transcription as OpenAI's /v1/audio/transcriptions returns it, for
each response_format (json, text, srt, vtt, verbose_json), and as the events of
its `stream=true` form (transcript.text.delta, then transcript.text.done).

The transcript's text is its segments' texts joined as Whisper writes them (each
starts with the space before its first word, where the language has spaces),
stripped. verbose_json holds the segments, or the words (OpenAI's {word, start,
end}, the word without its leading space) where word timestamps were asked for,
or both."""
from __future__ import annotations

import math
from collections.abc import AsyncIterable, AsyncIterator, Collection, Iterable
from typing import TYPE_CHECKING

from armllm.audio.tokens import LANGUAGES

if TYPE_CHECKING:
    from armllm.audio.transcribe import Segment, TranscriptionInfo
    from armllm.audio.words import Word

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "text/plain; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def check_response_format(response_format: str) -> str:
    """The format, or ValueError naming it and the valid ones."""
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(f"response_format {response_format!r} is not one of "
                         f"{', '.join(RESPONSE_FORMATS)}")
    return response_format


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """HH:MM:SS,mmm (SRT) or with decimal_marker "." HH:MM:SS.mmm (WebVTT), to
    the nearest millisecond; hours are always written."""
    if not seconds >= 0:
        raise ValueError(f"a timestamp must be >= 0 seconds, got {seconds!r}")
    milliseconds = round(seconds * 1000)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    whole, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{decimal_marker}{milliseconds:03d}"


def transcript_text(segments: Iterable[Segment]) -> str:
    return "".join(segment.text for segment in segments).strip()


def _cue_text(segment: Segment) -> str:
    # a cue's text may not hold the cue timing arrow
    return segment.text.strip().replace("-->", "->")


def as_srt(segments: Iterable[Segment]) -> str:
    """SubRip: numbered cues from 1, "start --> end" with commas, a blank line after each."""
    return "".join(f"{number}\n{format_timestamp(s.start)} --> {format_timestamp(s.end)}\n"
                   f"{_cue_text(s)}\n\n" for number, s in enumerate(segments, start=1))


def as_vtt(segments: Iterable[Segment]) -> str:
    """WebVTT: the header, then cues "start --> end" with dots, a blank line after each."""
    return "WEBVTT\n\n" + "".join(
        f"{format_timestamp(s.start, '.')} --> {format_timestamp(s.end, '.')}\n"
        f"{_cue_text(s)}\n\n" for s in segments)


def as_text(segments: Iterable[Segment]) -> str:
    """The transcript and a newline."""
    return transcript_text(segments) + "\n"


def _usage(info: TranscriptionInfo) -> dict:
    # whisper-1 counts the audio's whole seconds, rounded up
    return {"type": "duration", "seconds": math.ceil(info.duration)}


def as_json(segments: Iterable[Segment], info: TranscriptionInfo) -> dict:
    return {"text": transcript_text(segments), "usage": _usage(info)}


def segment_json(segment: Segment) -> dict:
    """One verbose_json segment (times to the millisecond)."""
    return {"id": segment.id, "seek": segment.seek, "start": round(segment.start, 3),
            "end": round(segment.end, 3), "text": segment.text, "tokens": list(segment.tokens),
            "temperature": segment.temperature, "avg_logprob": segment.avg_logprob,
            "compression_ratio": segment.compression_ratio,
            "no_speech_prob": segment.no_speech_prob}


def word_json(word: Word) -> dict:
    """One verbose_json word (times to the millisecond)."""
    return {"word": word.word.strip(), "start": round(word.start, 3),
            "end": round(word.end, 3)}


def as_verbose_json(segments: Iterable[Segment], info: TranscriptionInfo,
                    task: str = "transcribe",
                    granularities: Collection[str] = ("segment",)) -> dict:
    """task, language (its English name, lowercase, as OpenAI returns it), duration,
    text, then segments and words as `granularities` ask (words: the segments'
    words, which word timestamps gave), and usage."""
    segments = list(segments)
    body = {"task": task, "language": LANGUAGES.get(info.language, info.language),
            "duration": info.duration, "text": transcript_text(segments)}
    if "word" in granularities:
        body["words"] = [word_json(w) for s in segments for w in s.words or ()]
    if "segment" in granularities or not granularities:
        body["segments"] = [segment_json(s) for s in segments]
    body["usage"] = _usage(info)
    return body


def render(response_format: str, segments: Iterable[Segment], info: TranscriptionInfo,
           task: str = "transcribe",
           granularities: Collection[str] = ("segment",)) -> dict | str:
    """The response body: a dict for json and verbose_json, text for the others
    (MEDIA_TYPES has their content types)."""
    check_response_format(response_format)
    segments = list(segments)
    if response_format == "json":
        return as_json(segments, info)
    if response_format == "verbose_json":
        return as_verbose_json(segments, info, task, granularities)
    return {"text": as_text, "srt": as_srt, "vtt": as_vtt}[response_format](segments)


def text_delta_event(delta: str) -> dict:
    return {"type": "transcript.text.delta", "delta": delta}


def text_done_event(text: str) -> dict:
    return {"type": "transcript.text.done", "text": text}


class TextDeltas:
    """The transcript's text in pieces, one per segment, that join into
    transcript_text (but for trailing whitespace, which only `text` strips)."""

    def __init__(self):
        self.pieces: list[str] = []

    def add(self, segment: Segment) -> str:
        """The new text a segment brings ("" for none)."""
        piece = segment.text if self.pieces else segment.text.lstrip()
        if piece:
            self.pieces.append(piece)
        return piece

    @property
    def text(self) -> str:
        return "".join(self.pieces).strip()


async def stream_events(segments: AsyncIterable[Segment]) -> AsyncIterator[dict]:
    """transcript.text.delta events as segments are decoded, then
    transcript.text.done with the whole text."""
    deltas = TextDeltas()
    async for segment in segments:
        piece = deltas.add(segment)
        if piece:
            yield text_delta_event(piece)
    yield text_done_event(deltas.text)
