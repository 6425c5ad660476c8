"""The decoding driver (armllm.audio.transcribe) equals faster-whisper segment for
segment: the same model (whisper-tiny.en as CTranslate2 runs it, and a tiny random
multilingual Whisper), the same speech (espeak-ng), the same features
(faster-whisper's FeatureExtractor until armllm.audio.mel is merged), beam size 1.

The driver reaches the model through two window decoders (tests/audio/ct2_decoder.py):
CTranslate2's generate, which applies Whisper's rules itself, so that the driver's
own logic (prompts, seeking, segment splitting, fallback, no-speech skip, language
detection, batched chunks) is what is compared; and a step-by-step decoder in
which our logits processors apply the rules and record the log-probabilities, as
the engine will run them."""
from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest

from armllm.audio.logits import (
    ApplyTimestampRules,
    LogprobRecorder,
    NoSpeechProbe,
    SuppressBlank,
    SuppressTokens,
)
from armllm.audio.tokens import WhisperTokens
from armllm.audio.transcribe import (
    TranscribeOptions,
    chunk_bounds,
    compression_ratio,
    detect_language,
    split_segments,
    transcribe,
    transcribe_batched,
)
from armllm.audio.window import DecodeResult, result_from, window_params
from tests.audio.conftest import SENTENCES, need, speech_clip
from tests.audio.ct2_decoder import Ct2Decoder, Ct2StepDecoder

FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@pytest.fixture(scope="module")
def tiny_en(model_dir):
    ctranslate2 = need("ctranslate2")
    faster_whisper = need("faster_whisper")
    return SimpleNamespace(
        model=ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32",
                                         intra_threads=2),
        faster=faster_whisper.WhisperModel(str(model_dir), compute_type="float32",
                                           cpu_threads=2),
        tokens=WhisperTokens.from_file(model_dir / "tokenizer.json", 51864))


@pytest.fixture(scope="module")
def tiny_multilingual(tmp_path_factory):
    ctranslate2 = need("ctranslate2")
    faster_whisper = need("faster_whisper")
    from tests.audio.tiny_multilingual import build_model, build_tokenizer
    model_dir, vocab_size = build_model(tmp_path_factory.mktemp("tiny-multilingual"))
    return SimpleNamespace(
        model=ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32",
                                         intra_threads=2),
        faster=faster_whisper.WhisperModel(str(model_dir), compute_type="float32",
                                           cpu_threads=2),
        tokens=WhisperTokens(build_tokenizer(), vocab_size, multilingual=True))


@pytest.fixture(scope="module")
def clip_gap():
    """Four sentences with 33 s of silence in the middle: a window of silence."""
    return speech_clip(SENTENCES[3:7], (0.5, 33.0, 0.5))


def audio_and_features(path):
    faster_whisper = need("faster_whisper")
    from faster_whisper.feature_extractor import FeatureExtractor
    audio = faster_whisper.decode_audio(str(path))
    return audio, FeatureExtractor()(audio)


def ours(decoder, tokens, path, **options):
    audio, features = audio_and_features(path)

    async def run():
        info, segments = await transcribe(decoder, tokens, features, len(audio) / 16000,
                                          TranscribeOptions(**options))
        return info, [s async for s in segments]
    return asyncio.run(run())


def theirs(faster, path, **options):
    segments, info = faster.transcribe(str(path), beam_size=1, vad_filter=False,
                                       word_timestamps=False, **options)
    return info, list(segments)


def assert_same_segments(mine, reference, logprob_tolerance=1e-6):
    assert [s.text for s in mine] == [s.text for s in reference]
    for a, b in zip(mine, reference, strict=True):
        assert (a.id + 1, a.seek, a.start, a.end, a.tokens, a.temperature) == \
            (b.id, b.seek, b.start, b.end, b.tokens, b.temperature)
        assert a.avg_logprob == pytest.approx(b.avg_logprob, abs=logprob_tolerance)
        assert a.compression_ratio == b.compression_ratio
        assert a.no_speech_prob == pytest.approx(b.no_speech_prob, abs=1e-6)


@pytest.mark.parametrize("clip", ["clip_8s", "clip_60s", "clip_gap"])
def test_greedy_equals_faster_whisper(tiny_en, clip, request):
    path = request.getfixturevalue(clip)
    info, mine = ours(Ct2Decoder(tiny_en.model, tiny_en.tokens), tiny_en.tokens, path,
                      language="en", temperature=0.0)
    _, reference = theirs(tiny_en.faster, path, language="en", temperature=0,
                          condition_on_previous_text=True)
    assert len(mine) >= 3
    assert_same_segments(mine, reference)
    assert (info.language, info.language_probability) == ("en", 1.0)


def test_clip_timestamps_equal_faster_whisper(tiny_en, clip_60s):
    """Only 5-20 s and 40 s to the end: the windows start at each clip."""
    info, mine = ours(Ct2Decoder(tiny_en.model, tiny_en.tokens), tiny_en.tokens, clip_60s,
                      language="en", temperature=0.0, clip_timestamps=(5, 20, 40))
    _, reference = theirs(tiny_en.faster, clip_60s, language="en", temperature=0,
                          clip_timestamps=[5, 20, 40])
    assert mine[0].seek == 500
    assert_same_segments(mine, reference)


def test_fallback_schedule_and_detection_equal_faster_whisper(tiny_en, clip_60s):
    """No language given (an English-only model says "en"), the fallback schedule."""
    info, mine = ours(Ct2Decoder(tiny_en.model, tiny_en.tokens), tiny_en.tokens, clip_60s)
    ref_info, reference = theirs(tiny_en.faster, clip_60s, temperature=list(FALLBACK))
    assert_same_segments(mine, reference)
    assert (info.language, info.language_probability) == (ref_info.language, 1.0)
    assert info.duration == pytest.approx(ref_info.duration)


def test_our_processors_decode_as_ctranslate2(tiny_en, clip_8s):
    """The engine's way: our processors choose every token over CTranslate2's
    logits, our LogprobRecorder gives avg_logprob (CTranslate2 sums in float32)."""
    decoder = Ct2StepDecoder(tiny_en.model, tiny_en.tokens)
    _, mine = ours(decoder, tiny_en.tokens, clip_8s, language="en", temperature=0.0)
    _, reference = theirs(tiny_en.faster, clip_8s, language="en", temperature=0)
    assert_same_segments(mine, reference, logprob_tolerance=1e-4)


def test_multilingual_detection_equals_faster_whisper(tiny_multilingual, clip_60s):
    """A random model is unsure (no language above 0.5): faster-whisper tries
    language_detection_segments windows and takes the majority."""
    decoder = Ct2Decoder(tiny_multilingual.model, tiny_multilingual.tokens)
    _, features = audio_and_features(clip_60s)
    for segments in (1, 3):
        code, prob, ranked = asyncio.run(detect_language(
            decoder, tiny_multilingual.tokens, features, segments=segments))
        ref = tiny_multilingual.faster.detect_language(
            features=features, language_detection_segments=segments)
        assert code == ref[0] and prob == pytest.approx(ref[1], rel=1e-6)
        assert [c for c, _ in ranked] == [c for c, _ in ref[2]]
        np.testing.assert_allclose([p for _, p in ranked], [p for _, p in ref[2]], rtol=1e-6)


@pytest.mark.parametrize("options", [
    dict(temperature=0.0),
    dict(temperature=0.0, language="de", task="translate", initial_prompt="Hallo Welt"),
    dict(temperature=0.0, language="fr", without_timestamps=True),
    dict(temperature=0.0, language="es", prefix="hola", condition_on_previous_text=False),
], ids=["detected", "translate-prompt", "no-timestamps", "prefix"])
def test_multilingual_equals_faster_whisper(tiny_multilingual, clip_60s, options):
    """The <|startoftranscript|> <|xx|> <|task|> prompt, the no-speech probability
    read at <|startoftranscript|> (a request of its own), timestamps, prompts."""
    m = tiny_multilingual
    info, mine = ours(Ct2Decoder(m.model, m.tokens), m.tokens, clip_60s, **options)
    ref_info, reference = theirs(m.faster, clip_60s, **options)
    assert len(reference) > 0
    assert_same_segments(mine, reference)
    assert info.language == ref_info.language
    assert info.language_probability == pytest.approx(ref_info.language_probability, rel=1e-6)


def test_multilingual_fallback_equals_faster_whisper(tiny_multilingual, clip_8s):
    """A random model's windows fail the log-probability threshold at every
    temperature: each is sampled (best_of 1: one CTranslate2 call per temperature,
    as faster-whisper makes, so that both draw the same random numbers from the
    same seed) and the likeliest result is kept, then the prompt resets."""
    ctranslate2 = need("ctranslate2")
    m = tiny_multilingual
    ctranslate2.set_random_seed(1234)
    _, mine = ours(Ct2Decoder(m.model, m.tokens), m.tokens, clip_8s, language="en",
                   best_of=1)
    ctranslate2.set_random_seed(1234)
    _, reference = theirs(m.faster, clip_8s, language="en", best_of=1,
                          temperature=list(FALLBACK))
    assert {s.temperature for s in reference} != {0.0}
    assert_same_segments(mine, reference)


def test_batched_equals_faster_whisper_on_the_same_chunks(tiny_en, clip_60s):
    """faster-whisper's BatchedInferencePipeline given our chunks (clip_timestamps:
    it would find them with its VAD): the same segments."""
    faster_whisper = need("faster_whisper")
    from faster_whisper.feature_extractor import FeatureExtractor
    audio, _ = audio_and_features(clip_60s)
    bounds = chunk_bounds(audio)
    assert len(bounds) == 3

    async def run():
        info, segments = await transcribe_batched(
            Ct2Decoder(tiny_en.model, tiny_en.tokens), tiny_en.tokens, audio,
            TranscribeOptions(language="en", temperature=0.0), log_mel=FeatureExtractor())
        return [s async for s in segments]
    mine = asyncio.run(run())
    pipeline = faster_whisper.BatchedInferencePipeline(tiny_en.faster)
    segments, _ = pipeline.transcribe(
        audio, language="en", beam_size=1, temperature=0, without_timestamps=False,
        vad_filter=False, clip_timestamps=[{"start": s / 16000, "end": e / 16000}
                                           for s, e in bounds])
    reference = list(segments)
    assert [s.text for s in mine] == [s.text for s in reference]
    for a, b in zip(mine, reference, strict=True):
        assert (a.id + 1, a.seek, a.start, a.end, a.tokens) == (b.id, b.seek, b.start, b.end,
                                                                b.tokens)
        assert a.avg_logprob == pytest.approx(b.avg_logprob, abs=1e-6)
        assert a.compression_ratio == pytest.approx(b.compression_ratio)


def test_batched_decodes_chunks_concurrently():
    """Every chunk's request is in flight before the first one answers."""
    in_flight, most = 0, 0

    class Slow:
        async def decode(self, features, prompt_ids, params):
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return DecodeResult([], -0.1, 0.0)

    from tests.audio.test_tokens import english_tokens
    audio = np.zeros(16000 * 75, np.float32)

    async def run():
        _, segments = await transcribe_batched(
            Slow(), english_tokens(), audio, TranscribeOptions(language="en"),
            log_mel=lambda a: np.zeros((80, len(a) // 160 + 1), np.float32))
        return [s async for s in segments]
    assert asyncio.run(run()) == []
    assert most == 3


def test_split_segments_equals_faster_whisper(tiny_en):
    """Random token runs through our split and faster-whisper's."""
    faster_whisper = need("faster_whisper")
    from faster_whisper.tokenizer import Tokenizer
    t = tiny_en.tokens
    their_tokenizer = Tokenizer(t.tokenizer, False)
    model = SimpleNamespace(time_precision=0.02, input_stride=2)
    split = faster_whisper.WhisperModel._split_segments_by_timestamps
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 12))
        run = [int(x) for x in rng.choice([*range(300, 305), *range(t.timestamp_begin,
                                                                    t.timestamp_begin + 6)], n)]
        size = int(rng.integers(100, 3001))
        args = (run, 12.34, size, size * 0.01, 1234)
        assert split_segments(t, *args) == split(model, their_tokenizer, *args)


def test_compression_ratio_equals_faster_whisper():
    from faster_whisper.transcribe import get_compression_ratio
    for text in ("Hello there.", "la " * 200, "日本語のテキスト", "x"):
        assert compression_ratio(text) == get_compression_ratio(text)


def test_chunk_bounds_cut_in_pauses():
    rate = 16000
    rng = np.random.default_rng(0)
    audio = rng.normal(0, 0.1, rate * 95).astype(np.float32)
    for pause in (27.0, 55.5, 84.0):   # 0.3 s pauses before the 30, 60, 90 s marks
        audio[int(pause * rate):int((pause + 0.3) * rate)] = 0.0
    bounds = chunk_bounds(audio)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(audio)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(end - start <= 30 * rate for start, end in bounds)
    cuts = [end / rate for _, end in bounds[:-1]]
    assert len(cuts) == 3
    for cut, pause in zip(cuts, (27.0, 55.5, 84.0), strict=True):
        assert pause <= cut <= pause + 0.3
    assert chunk_bounds(audio[:rate * 10]) == [(0, rate * 10)]
    assert chunk_bounds(np.zeros(0, np.float32)) == [(0, 0)]


def test_window_params_build_the_rules_in_order():
    from tests.audio.test_tokens import english_tokens
    t = english_tokens()
    params, probes = window_params(t, [t.sot_prev, 100, 200, t.sot],
                                   suppress_tokens=t.suppress_set([-1]))
    kinds = [type(p) for p in params.logits_processors]
    assert kinds == [NoSpeechProbe, SuppressBlank, SuppressTokens, ApplyTimestampRules,
                     LogprobRecorder]
    assert probes.no_speech is params.logits_processors[0]
    assert params.stop_token_ids == [t.eot] and params.temperature == 0.0
    assert params.max_tokens == 224
    # a long previous text: CTranslate2's limit is the context left after it
    long = [t.sot_prev, *range(300, 300 + 223), t.sot]
    assert window_params(t, long)[0].max_tokens == 448 - 224
    # without timestamps: no timestamp rules, and no probe (SOT does not end it)
    params, probes = window_params(t, [t.sot, t.no_timestamps], suppress_blank=False)
    assert [type(p) for p in params.logits_processors] == [LogprobRecorder]
    assert probes.no_speech is None
    # a forced prefix: CTranslate2's rule after it, and its tokens count in the limit
    params, _ = window_params(t, [t.sot, t.timestamp_begin, 400, 500])
    rules = next(p for p in params.logits_processors if isinstance(p, ApplyTimestampRules))
    assert rules.after_prefix and params.max_tokens == 224 - 3


def test_result_from_sums_and_strips_the_end():
    """Flat rows: the rules leave 51 initial timestamps, then (after a lone
    timestamp) the 50362 text and special tokens but <|notimestamps|>, then (after
    text) those and the 1500 later timestamps, where <|endoftext|> stands out."""
    from tests.audio.test_tokens import english_tokens
    t = english_tokens()
    params, _ = window_params(t, [t.sot])
    chosen = [t.timestamp_begin, 400, t.eot]
    for i in range(3):
        row = np.zeros(51864, np.float32)
        row[t.eot] = 20.0 if i == 2 else 0.0
        for processor in params.logits_processors:
            processor(chosen[:i], row)
    result = result_from(chosen, params)
    assert result.token_ids == chosen[:2]
    assert result.no_speech_prob == pytest.approx(1 / 51864)
    expected = -math.log(51) - math.log(50362) + 20 - math.log(math.exp(20) + 50361 + 1500)
    assert result.sum_logprob == pytest.approx(expected, rel=1e-9)
    # a completion cut by max_tokens: the last token is text, all of it counts
    params, _ = window_params(t, [t.sot])
    for i in range(2):
        row = np.zeros(51864, np.float32)
        for processor in params.logits_processors:
            processor(chosen[:i], row)
    assert result_from(chosen[:2], params).sum_logprob == \
        pytest.approx(-math.log(51) - math.log(50362), rel=1e-9)


def test_window_params_pickle():
    """Processors hold no lambdas: a request's params can cross a process boundary
    (whatever they record stays on the side that ran them)."""
    import pickle

    from tests.audio.test_tokens import english_tokens
    t = english_tokens()
    params, _ = window_params(t, [t.sot], suppress_tokens=t.suppress_set([-1]))
    copy = pickle.loads(pickle.dumps(params))
    assert [type(p) for p in copy.logits_processors] == \
        [type(p) for p in params.logits_processors]


def test_options_reject_bad_values():
    with pytest.raises(ValueError, match="beam_size"):
        TranscribeOptions(beam_size=5)
    with pytest.raises(ValueError, match="task"):
        TranscribeOptions(task="summarize")
    with pytest.raises(ValueError, match="temperature"):
        TranscribeOptions(temperature=())
    with pytest.raises(ValueError, match="best_of"):
        TranscribeOptions(best_of=0)
    assert TranscribeOptions(temperature=0.4).temperatures == (0.4,)
    assert TranscribeOptions().temperatures == FALLBACK
