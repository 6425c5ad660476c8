"""Speech to test with: known English sentences spoken by espeak-ng, a long clip of them
with pauses, and the same audio through ffmpeg into each container and codec.

Every file is made once into armllm's cache (<cache>/test-speech/), named by a hash of
what made it (text, voice, speed, tool versions), and carries a `.txt` beside it with
the words it speaks (`expected_text`). Without espeak-ng or ffmpeg the test that asks
skips, or fails when CI is set (tools/run-tests installs both). Tests in any folder
import this module: `from tests import speech_clips`.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import os
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
import pytest

from armllm import demo_model

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A cup of hot tea is a good way to start the day.",
    "Please close the window before it starts to rain.",
    "The children played in the park until the sun went down.",
    "Reading a book by the fire is a quiet pleasure.",
    "The train was late, so we walked home in the cold.",
    "Turn off the lights when you leave the room.",
    "We need to buy bread, milk and eggs from the store.",
]
VOICE = "en-us"
WORDS_PER_MINUTE = 160
PAUSES_S = [0.5, 1.0, 1.5, 0.75, 1.25]  # between sentences in long_clip, in turn

# fmt -> (file extension, ffmpeg output options)
FORMATS = {
    "flac": ("flac", ["-c:a", "flac"]),
    "mp3": ("mp3", ["-c:a", "libmp3lame", "-q:a", "2"]),
    "ogg": ("ogg", ["-c:a", "libopus", "-b:a", "48k"]),
    "webm": ("webm", ["-c:a", "libopus", "-b:a", "48k"]),
    "m4a": ("m4a", ["-c:a", "aac", "-b:a", "96k"]),
    # left channel the speech, right a quarter of it: the mono mixdown is 0.625 x
    "stereo": ("wav", ["-af", "pan=stereo|c0=c0|c1=0.25*c0", "-c:a", "pcm_s16le"]),
    "44k": ("wav", ["-ar", "44100", "-c:a", "pcm_s16le"]),
    "8k": ("wav", ["-ar", "8000", "-c:a", "pcm_s16le"]),
    "f32": ("wav", ["-c:a", "pcm_f32le"]),
    "s32": ("wav", ["-c:a", "pcm_s32le"]),
    "u8": ("wav", ["-c:a", "pcm_u8"]),
}


def require(*programs: str) -> None:
    """Skips the calling test (fails it under CI) when a program is not on PATH."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        message = f"needs {', '.join(missing)} on PATH (apt-get install {' '.join(missing)})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the speech tests; {message}")
        pytest.skip(message)


@functools.cache
def _version(program: str) -> str:
    require(program)
    flag = "--version" if program == "espeak-ng" else "-version"
    out = subprocess.run([program, flag], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0]


def cache_dir() -> Path:
    path = demo_model.cache_dir() / "test-speech"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _publish(made: Path, path: Path, text: str) -> Path:
    """Moves a finished file into place (atomically: concurrent test runs may race)."""
    path.with_suffix(".txt").write_text(text)
    made.chmod(0o644)
    os.replace(made, path)
    return path


def _scratch(path: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=path.suffix)
    os.close(fd)
    return Path(name)


def expected_text(path: Path) -> str:
    """The words a clip (or an encoding of one) speaks."""
    return path.with_suffix(".txt").read_text()


def clip(i: int) -> Path:
    """SENTENCES[i] spoken by espeak-ng: a 22050 Hz, 16-bit mono wav."""
    return _say(SENTENCES[i])


def _say(text: str) -> Path:
    path = cache_dir() / f"say-{_key(text, VOICE, WORDS_PER_MINUTE, _version('espeak-ng'))}.wav"
    if not path.exists():
        made = _scratch(path)
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-w", str(made),
                        text], check=True, capture_output=True)
        _publish(made, path, text)
    return path


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A 16-bit mono wav's samples (int16) and rate, read by the standard library."""
    with wave.open(str(path)) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, path
        return np.frombuffer(w.readframes(w.getnframes()), np.int16), w.getframerate()


def long_clip(seconds: float = 60) -> Path:
    """The sentences in turn with pauses of PAUSES_S between them, repeated for as long
    as the next sentence still ends within `seconds` (a 16-bit mono wav)."""
    rate = read_wav(clip(0))[1]
    lengths = [len(read_wav(clip(i))[0]) for i in range(len(SENTENCES))]
    sentences, total = [], 0
    for n in itertools.count():
        if (total + lengths[n % len(SENTENCES)]) / rate > seconds:
            break
        sentences.append(SENTENCES[n % len(SENTENCES)])
        total += lengths[n % len(SENTENCES)] + int(PAUSES_S[n % len(PAUSES_S)] * rate)
    if not sentences:
        raise ValueError(f"no sentence is as short as {seconds} s")
    return spoken(sentences, PAUSES_S)


def spoken(sentences: list[str] | tuple[str, ...], pauses: list[float] | tuple[float, ...]
           ) -> Path:
    """The sentences spoken one after another, pauses[i % len(pauses)] seconds of silence
    after the i-th (none after the last): a 16-bit mono wav at espeak-ng's rate."""
    key = _key(list(sentences), list(pauses), VOICE, WORDS_PER_MINUTE, _version("espeak-ng"))
    path = cache_dir() / f"spoken-{key}.wav"
    if path.exists():
        return path
    pieces: list[np.ndarray] = []
    rate = 0
    for n, sentence in enumerate(sentences):
        samples, rate = read_wav(_say(sentence))
        pieces.append(samples)
        if n < len(sentences) - 1:
            pieces.append(np.zeros(int(pauses[n % len(pauses)] * rate), np.int16))
    made = _scratch(path)
    with wave.open(str(made), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.concatenate(pieces).tobytes())
    return _publish(made, path, " ".join(sentences))


def encode(path: Path, fmt: str) -> Path:
    """`path` converted by the ffmpeg CLI into `fmt`, one of FORMATS: flac, mp3,
    ogg (opus), webm (opus), m4a (aac), stereo, 44k and 8k (wav at 44.1 / 8 kHz),
    f32, s32 and u8 (wav samples as 32-bit float, 32-bit int, unsigned 8-bit)."""
    extension, options = FORMATS[fmt]
    out = path.with_name(f"{path.stem}-{fmt}-{_key(options, _version('ffmpeg'))}.{extension}")
    if not out.exists():
        made = _scratch(out)
        ffmpeg(["-i", str(path), *options, str(made)])
        _publish(made, out, expected_text(path))
    return out


def ffmpeg(args: list[str]) -> None:
    """Runs the ffmpeg CLI (quiet, overwriting) with `args`."""
    require("ffmpeg")
    r = subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def ffmpeg_decode(path: Path, rate: int = 16000) -> np.ndarray:
    """`path` decoded by the ffmpeg CLI to float32 mono at `rate` (ffmpeg's own
    resampler and mixdown): an oracle independent of PyAV and soxr."""
    require("ffmpeg")
    r = subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-i", str(path),
                        "-ar", str(rate), "-ac", "1", "-f", "f32le", "-"], capture_output=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.frombuffer(r.stdout, np.float32)
