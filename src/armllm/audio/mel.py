"""Whisper's input features: the log-mel spectrogram of 16 kHz mono audio.

Owns the STFT and Slaney mel filterbank constants, `mel_filters`, `log_mel_spectrogram`
(step for step as Whisper's reference computes it), `pad_or_trim` (a window's frames to
the encoder's 3000) and `features_for_file` (the features faster-whisper computes for a
whole file, which its long-form decoding then slices into windows).
"""
from __future__ import annotations

import functools

import numpy as np

from armllm.audio.decode import SAMPLE_RATE

N_FFT = 400  # STFT window: 25 ms at 16 kHz
HOP_LENGTH = 160  # between STFT frames: 10 ms, 100 frames a second
CHUNK_SECONDS = 30  # the encoder hears 30 s at a time
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000: samples in one encoder window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000: mel frames in one window (1500 encoder positions)

N_BINS = N_FFT // 2 + 1  # 201 frequency bins of the real FFT, 0 to 8 kHz by 40 Hz
_LOG_FLOOR = 1e-10  # mel power clamped here before log10
_DYNAMIC_RANGE = 8.0  # log10 units (80 dB) kept below the loudest value
_BLOCK_FRAMES = 2048  # frames transformed at once: bounds the working memory of long files

# Slaney's mel scale (librosa's htk=False): linear below 1 kHz, logarithmic above
_MEL_HZ = 200.0 / 3  # Hz per mel in the linear part
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _MEL_HZ  # 15 mels
_LOG_STEP = np.log(6.4) / 27.0  # ln(Hz ratio) per mel in the log part


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    log_part = _LOG_START_MEL + np.log(np.maximum(hz, _LOG_START_HZ) / _LOG_START_HZ) / _LOG_STEP
    return np.where(hz >= _LOG_START_HZ, log_part, hz / _MEL_HZ)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    above = np.maximum(mel, _LOG_START_MEL) - _LOG_START_MEL
    log_part = _LOG_START_HZ * np.exp(_LOG_STEP * above)
    return np.where(mel >= _LOG_START_MEL, log_part, mel * _MEL_HZ)


@functools.cache
def mel_filters(n_mels: int) -> np.ndarray:
    """[n_mels, 201] float64 (read-only, one per n_mels): triangles between mel points
    evenly spaced from 0 Hz to 8 kHz on Slaney's scale, each scaled by 2 / its width in
    Hz so every band holds about the same energy (librosa's norm='slaney')."""
    if n_mels < 1:
        raise ValueError(f"n_mels must be positive, got {n_mels}")
    bin_hz = np.arange(N_BINS) * (SAMPLE_RATE / N_FFT)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    widths = np.diff(edges)
    rising = (bin_hz[None, :] - edges[:-2, None]) / widths[:-1, None]
    falling = (edges[2:, None] - bin_hz[None, :]) / widths[1:, None]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    filters.setflags(write=False)
    return filters


@functools.cache
def _hann() -> np.ndarray:
    """The periodic Hann window of N_FFT (torch.hann_window's default)."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """[n_mels, (len(audio) + padding) // 160] float32: `padding` zeros appended, STFT
    (periodic Hann of 400, hop 160, centred with reflect padding, the last frame
    dropped), power, mel projection, log10 of at least 1e-10, floored 8 below the
    maximum over the whole input, then (x + 4) / 4. Computed in float64 over float32
    samples (the references' input), a block of frames at a time; fewer samples than
    one hop give no frames."""
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise ValueError(f"audio must be 1-D samples, got shape {samples.shape}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    filters = mel_filters(n_mels)
    if samples.size + padding < HOP_LENGTH:  # not one whole hop: no frames
        return np.zeros((n_mels, 0), np.float32)
    # float32 samples (what the references take), each block's frames in float64
    signal = samples.astype(np.float32, copy=False)
    if padding:
        signal = np.concatenate([signal, np.zeros(padding, np.float32)])
    signal = np.pad(signal, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(signal, N_FFT)[::HOP_LENGTH][:-1]
    window = _hann()
    log_mel = np.empty((n_mels, len(frames)), np.float32)
    for start in range(0, len(frames), _BLOCK_FRAMES):
        block = frames[start:start + _BLOCK_FRAMES]
        spectrum = np.fft.rfft(block * window, axis=-1)
        power = spectrum.real ** 2 + spectrum.imag ** 2
        mel = filters @ power.T
        log_mel[:, start:start + len(block)] = np.log10(np.maximum(mel, _LOG_FLOOR, out=mel))
    np.maximum(log_mel, log_mel.max() - _DYNAMIC_RANGE, out=log_mel)
    log_mel += 4.0
    log_mel /= 4.0
    return log_mel


def pad_or_trim(features: np.ndarray, frames: int = N_FRAMES) -> np.ndarray:
    """`features` cut or zero-padded to `frames` along the last axis (the encoder's window;
    zeros are what the reference pads a short window with, in feature space), as a new
    contiguous array."""
    have = features.shape[-1]
    if have < frames:
        widths = [(0, 0)] * (features.ndim - 1) + [(0, frames - have)]
        return np.pad(features, widths)
    # contiguous: every request of a window then shares this one array (the engine
    # encodes it once)
    return np.ascontiguousarray(features[..., :frames])


def features_for_file(audio: np.ndarray, n_mels: int) -> np.ndarray:
    """[n_mels, len(audio) // 160 + 1]: the whole file's features as faster-whisper's
    `WhisperModel.transcribe` computes them: one hop of zeros appended (not Whisper's
    30 s), and the loudest value of the whole file sets the floor of every window. Its
    long-form decoding counts content = shape[-1] - 1 frames and encodes windows
    `pad_or_trim(features[:, seek:seek + min(3000, content - seek)])`, so a short last
    window is padded with 0.0 in feature space, where Whisper's reference would have
    the features of silence (the floor)."""
    return log_mel_spectrogram(audio, n_mels, padding=HOP_LENGTH)
