"""Audio in: any file ffmpeg can decode, as the float32 mono 16 kHz samples Whisper hears.

Owns `load_audio` (PyAV demuxes and decodes: wav, flac, mp3, ogg/vorbis, ogg/opus,
webm, m4a/aac, ...; channels are averaged; soxr resamples) and `AudioError`, the one
exception bad input raises, its message naming the problem (a server answers 400 with
it). Decoding streams: memory grows with the 16 kHz output, not with the input, and
`max_seconds` stops a long file early. PyAV and soxr are imported by the first call,
so a text-only user of armllm never loads them.
"""
from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

if TYPE_CHECKING:  # PyAV and soxr load with the first audio, not with armllm
    import av
    import soxr

SAMPLE_RATE = 16000  # Whisper's input rate (Hz)

# soxr 'HQ' (its default): linear phase, flat to ~7.5 kHz at 16 kHz out, aliases rejected
# by >120 dB; Whisper's log-mel keeps only 80 dB below the loudest bin (log10 power
# clamped at max - 8), so 'VHQ' (same passband, deeper stopband) would change nothing
# the model sees and costs more
RESAMPLE_QUALITY = "HQ"

# a container's duration can be an estimate (an mp3 without a Xing header: from its
# bitrate; a truncated file: from its header), so the early check rejects only what is
# clearly over; decoding counts the samples exactly
_HEADER_SLACK = 1.05
_HEADER_SLACK_S = 1.0
_RESAMPLE_BATCH = 65536  # input samples gathered per soxr call (mp3 frames are 1152)


class AudioError(ValueError):
    """Input that is not usable audio; the message says why."""


def load_audio(source: bytes | str | os.PathLike, *, max_seconds: float | None = None
               ) -> np.ndarray:
    """`source` (the file's bytes, or a local path) decoded to float32 mono samples at
    SAMPLE_RATE, in [-1, 1]. Only the first audio stream is read; a damaged packet is
    skipped and a truncated file gives what it holds (as ffmpeg does). Raises AudioError
    for empty input, input nothing decodes, no audio stream, no samples, or audio
    longer than `max_seconds`."""
    import av
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    with _input(source) as file:
        try:
            container = av.open(file, mode="r", metadata_errors="ignore")
        except av.FFmpegError as exc:
            raise AudioError(f"not a decodable audio file: {_reason(exc)}") from exc
        with container:
            stream = _audio_stream(container)
            if max_seconds is not None:
                _check_header(container, stream, max_seconds)
            return _decode(container, stream, max_seconds)


@contextlib.contextmanager
def _input(source: bytes | str | os.PathLike) -> Iterator[BinaryIO]:
    """A readable file over `source`. A path is opened here, not by ffmpeg, so a string
    is only ever a local file (never a URL or an ffmpeg protocol)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise AudioError("empty audio input (0 bytes)")
        yield io.BytesIO(source)
        return
    path = os.fspath(source)
    try:
        file = open(path, "rb")
    except OSError as exc:
        raise AudioError(f"cannot read audio file {path!r}: {exc.strerror}") from exc
    with file:
        if os.fstat(file.fileno()).st_size == 0:
            raise AudioError(f"empty audio file {path!r} (0 bytes)")
        yield file


def _reason(exc: av.FFmpegError) -> str:
    """What ffmpeg said, without its errno and the '<none>' file name."""
    if len(exc.args) >= 2 and isinstance(exc.args[1], str):
        return exc.args[1]
    return str(exc)


def _audio_stream(container: av.container.InputContainer) -> av.audio.stream.AudioStream:
    if not container.streams.audio:
        kinds = sorted({s.type for s in container.streams})
        held = f"only {', '.join(kinds)} streams" if kinds else "no streams"
        raise AudioError(f"no audio stream in the input ({container.format.name}: {held})")
    stream = container.streams.audio[0]
    if stream.codec_context is None:
        raise AudioError(f"unsupported audio codec ({container.format.name}: "
                         "no decoder for its audio stream)")
    return stream


def _check_header(container: av.container.InputContainer, stream: av.audio.stream.AudioStream,
                  max_seconds: float) -> None:
    import av
    if stream.duration is not None and stream.time_base is not None:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        seconds = container.duration / av.time_base
    else:
        return
    if seconds > max_seconds * _HEADER_SLACK + _HEADER_SLACK_S:
        raise AudioError(f"audio is {seconds:.1f} s long, over the {max_seconds:g} s limit")


def _decode(container: av.container.InputContainer, stream: av.audio.stream.AudioStream,
            max_seconds: float | None) -> np.ndarray:
    import av
    resampler = _Resampler()
    seconds = 0.0
    last_error: av.FFmpegError | None = None
    try:
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.FFmpegError as exc:  # a damaged packet: skip it, as ffmpeg does
                last_error = exc
                continue
            for frame in frames:
                if frame.sample_rate <= 0:
                    raise AudioError("the audio stream has no sample rate")
                seconds += frame.samples / frame.sample_rate
                if max_seconds is not None and seconds > max_seconds:
                    raise AudioError(f"audio is longer than the {max_seconds:g} s limit "
                                     f"(decoding stopped at {seconds:.2f} s)")
                resampler.add(_mono(frame), frame.sample_rate)
    except av.FFmpegError as exc:  # the demuxer gave up (a truncated file): keep what came
        last_error = exc
    samples = resampler.finish()
    if samples.size == 0:
        why = f": {_reason(last_error)}" if last_error is not None else ""
        raise AudioError(f"no audio samples decoded{why}")
    return np.clip(samples, -1.0, 1.0, out=samples)


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """A frame's samples as float32 in [-1, 1], channels averaged."""
    samples = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:  # interleaved: one row of samples x channels
        samples = samples.reshape(-1, channels).T
    if samples.dtype == np.uint8:  # unsigned 8-bit: silence is 128
        samples = samples.astype(np.float32) - 128.0
        scale = 1.0 / 128
    elif samples.dtype.kind == "i":
        scale = 1.0 / 2.0 ** (8 * samples.dtype.itemsize - 1)
    else:  # float samples may be anything: NaN or inf would spread through the resampler
        samples = np.clip(np.nan_to_num(samples, nan=0.0), -1.0, 1.0)
        scale = 1.0
    mono = samples.mean(axis=0, dtype=np.float64) if channels > 1 else samples[0]
    return (mono * scale).astype(np.float32)


class _Resampler:
    """Mono chunks at any rate in, SAMPLE_RATE out, streaming (one soxr stream per run
    of one input rate: a chained ogg or a concatenated mp3 may change rate midway)."""

    def __init__(self) -> None:
        self.rate = 0
        self.stream: soxr.ResampleStream | None = None
        self.pending: list[np.ndarray] = []
        self.pending_samples = 0
        self.out: list[np.ndarray] = []

    def add(self, samples: np.ndarray, rate: int) -> None:
        import soxr
        if rate != self.rate:
            self._flush(last=True)
            self.rate = rate
            self.stream = (None if rate == SAMPLE_RATE else
                           soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32",
                                               quality=RESAMPLE_QUALITY))
        self.pending.append(samples)
        self.pending_samples += samples.size
        if self.pending_samples >= _RESAMPLE_BATCH:
            self._flush(last=False)

    def finish(self) -> np.ndarray:
        self._flush(last=True)
        return np.concatenate(self.out) if self.out else np.zeros(0, np.float32)

    def _flush(self, last: bool) -> None:
        chunk = np.concatenate(self.pending) if self.pending else np.zeros(0, np.float32)
        self.pending, self.pending_samples = [], 0
        if self.stream is None:
            self.out.append(chunk)
        elif chunk.size or last:
            self.out.append(self.stream.resample_chunk(chunk, last=last))
        if last:
            self.stream = None
            self.rate = 0
