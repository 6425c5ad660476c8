"""Output formats (armllm.audio.formats) on hand-made segments, against literal
expected outputs; verbose_json and the stream events also parse as the openai
client's own types."""
from __future__ import annotations

import asyncio

import pytest

from armllm.audio.formats import (
    MEDIA_TYPES,
    RESPONSE_FORMATS,
    TextDeltas,
    format_timestamp,
    render,
    stream_events,
)
from armllm.audio.transcribe import Segment, TranscriptionInfo

SEGMENTS = [
    Segment(0, 0, 0.0, 2.4, " The birch canoe slid on the smooth planks.", [50363, 383, 50483],
            0.0, -0.25, 1.2, 0.01),
    Segment(1, 0, 3.2, 14.200000000000001, " Glue the sheet --> to the background.",
            [50523, 4, 50573], 0.2, -0.5, 1.3, 0.02),
    Segment(2, 2820, 3661.5, 3723.0044, " Done.", [50363, 5, 50400], 0.0, -0.1, 0.9, 0.5),
]
INFO = TranscriptionInfo("en", 1.0, 3723.25)


def test_format_timestamp():
    assert format_timestamp(3661.5) == "01:01:01,500"
    assert format_timestamp(3661.5, ".") == "01:01:01.500"
    assert format_timestamp(0.0) == "00:00:00,000"
    assert format_timestamp(14.200000000000001) == "00:00:14,200"
    assert format_timestamp(59.9996) == "00:01:00,000"
    assert format_timestamp(36000.0) == "10:00:00,000"
    with pytest.raises(ValueError, match="-1"):
        format_timestamp(-1.0)


def test_srt():
    assert render("srt", SEGMENTS, INFO) == (
        "1\n00:00:00,000 --> 00:00:02,400\nThe birch canoe slid on the smooth planks.\n\n"
        "2\n00:00:03,200 --> 00:00:14,200\nGlue the sheet -> to the background.\n\n"
        "3\n01:01:01,500 --> 01:02:03,004\nDone.\n\n")


def test_vtt():
    assert render("vtt", SEGMENTS, INFO) == (
        "WEBVTT\n\n"
        "00:00:00.000 --> 00:00:02.400\nThe birch canoe slid on the smooth planks.\n\n"
        "00:00:03.200 --> 00:00:14.200\nGlue the sheet -> to the background.\n\n"
        "01:01:01.500 --> 01:02:03.004\nDone.\n\n")


def test_text_and_json():
    text = ("The birch canoe slid on the smooth planks. Glue the sheet --> to the "
            "background. Done.")
    assert render("text", SEGMENTS, INFO) == text + "\n"
    assert render("json", SEGMENTS, INFO) == {"text": text,
                                              "usage": {"type": "duration", "seconds": 3724}}
    assert render("text", [], INFO) == "\n"


def test_verbose_json():
    body = render("verbose_json", SEGMENTS, TranscriptionInfo("de", 0.9, 3723.25), "translate")
    assert body["task"] == "translate" and body["language"] == "german"
    assert body["duration"] == 3723.25
    assert body["text"].startswith("The birch") and "words" not in body
    assert body["segments"][1] == {
        "id": 1, "seek": 0, "start": 3.2, "end": 14.2,
        "text": " Glue the sheet --> to the background.", "tokens": [50523, 4, 50573],
        "temperature": 0.2, "avg_logprob": -0.5, "compression_ratio": 1.3,
        "no_speech_prob": 0.02}
    assert body["segments"][2]["end"] == 3723.004
    audio_types = pytest.importorskip("openai.types.audio")
    parsed = audio_types.TranscriptionVerbose.model_validate(body)
    assert parsed.segments[0].text == SEGMENTS[0].text and parsed.usage.seconds == 3724


def test_formats_and_media_types():
    assert set(MEDIA_TYPES) == set(RESPONSE_FORMATS)
    with pytest.raises(ValueError, match="'docx' is not one of json, text, srt"):
        render("docx", SEGMENTS, INFO)


def test_stream_events():
    async def segments():
        for segment in SEGMENTS:
            yield segment

    async def collect():
        return [event async for event in stream_events(segments())]
    events = asyncio.run(collect())
    assert events == [
        {"type": "transcript.text.delta", "delta": "The birch canoe slid on the smooth planks."},
        {"type": "transcript.text.delta", "delta": " Glue the sheet --> to the background."},
        {"type": "transcript.text.delta", "delta": " Done."},
        {"type": "transcript.text.done", "text": render("json", SEGMENTS, INFO)["text"]},
    ]
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"]
    audio_types = pytest.importorskip("openai.types.audio")
    audio_types.TranscriptionTextDeltaEvent.model_validate(events[0])
    audio_types.TranscriptionTextDoneEvent.model_validate(events[-1])


def test_text_deltas_skip_empty_and_leading_space():
    deltas = TextDeltas()
    blank = Segment(0, 0, 0.0, 1.0, " ", [], 0.0, 0.0, 1.0, 0.0)
    assert deltas.add(blank) == ""
    assert deltas.add(SEGMENTS[2]) == "Done."
    assert deltas.text == "Done."
