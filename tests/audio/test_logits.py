"""Whisper's logits processors (armllm.audio.logits) against transformers' own
(SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor,
WhisperTimeStampLogitsProcessor, WhisperNoSpeechDetection) on random rows and token
histories, in the layout of whisper-tiny.en's vocabulary. Where CTranslate2 (so
faster-whisper, whose transcripts ours are compared to) differs from transformers
and openai-whisper, after a forced prefix, the test states CTranslate2's rule."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from armllm.audio.logits import (
    ApplyTimestampRules,
    LanguageMask,
    LogprobRecorder,
    NoSpeechProbe,
    SuppressBlank,
    SuppressTokens,
)

torch = pytest.importorskip("torch")
logits_process = pytest.importorskip("transformers.generation.logits_process")

# whisper-tiny.en's layout
EOT, SOT, NO_SPEECH, NO_TIMESTAMPS, VOCAB = 50256, 50257, 50361, 50362, 51864
BEGIN = NO_TIMESTAMPS + 1
PROMPT = [50360, 464, 2068, SOT]  # <|startofprev|>, two text tokens, <|startoftranscript|>


def hf_timestamp_rules(max_initial: int | None = 50):
    config = SimpleNamespace(no_timestamps_token_id=NO_TIMESTAMPS, eos_token_id=EOT,
                             bos_token_id=EOT, max_initial_timestamp_index=max_initial)
    return logits_process.WhisperTimeStampLogitsProcessor(
        config, begin_index=len(PROMPT), _detect_timestamp_from_logprob=True)


def run_hf(processor, output_ids: list[int], row: np.ndarray) -> np.ndarray:
    input_ids = torch.tensor([PROMPT + output_ids])
    return processor(input_ids, torch.from_numpy(row.copy())[None]).numpy()[0]


def run_ours(processor, output_ids: list[int], row: np.ndarray) -> np.ndarray:
    row = row.copy()
    processor(output_ids, row)
    return row


def random_row(rng: np.random.Generator, timestamp_boost: float = 0.0) -> np.ndarray:
    """Logits like a decoder's: a few likely tokens over a flat background;
    timestamp_boost raises the timestamps' mass (to reach the forcing rule)."""
    row = rng.normal(0.0, 2.0, VOCAB).astype(np.float32)
    row[rng.integers(0, VOCAB, 5)] += 8.0
    row[BEGIN:] += np.float32(timestamp_boost)
    return row


def random_history(rng: np.random.Generator) -> list[int]:
    """A history the rules could have produced: timestamp pairs around text, or
    arbitrary (text and timestamps in any order)."""
    if rng.random() < 0.3:
        return [int(t) for t in rng.choice([*range(100, 110), *range(BEGIN, BEGIN + 60)],
                                           rng.integers(0, 8))]
    history, time = [], int(rng.integers(0, 50))
    for _ in range(rng.integers(0, 4)):
        history.append(BEGIN + time)
        history += [int(t) for t in rng.integers(0, EOT, rng.integers(1, 5))]
        time += int(rng.integers(0, 40))
        history.append(BEGIN + time)
        if rng.random() < 0.5 and history:
            history.append(BEGIN + time)  # a pair: the next segment starts there
    cut = int(rng.integers(0, len(history) + 1))
    return history[:cut]


def assert_same_row(ours: np.ndarray, theirs: np.ndarray):
    assert np.array_equal(np.isneginf(ours), np.isneginf(theirs))
    kept = ~np.isneginf(theirs)
    np.testing.assert_array_equal(ours[kept], theirs[kept])


@pytest.mark.parametrize("history", [
    [],                                       # the first position: a timestamp ≤ 1.00 s
    [BEGIN + 3],                              # after one timestamp: text (or the end)
    [BEGIN, 400, 500, BEGIN + 40],            # a segment's end: its pair or the end
    [BEGIN, 400, BEGIN + 40, BEGIN + 40],     # after a pair: text or the end
    [BEGIN, 400, 500],                        # after text: a later timestamp or text
    [BEGIN, 400, BEGIN + 40, BEGIN + 40, 600],
    [400, 500],                               # text without any timestamp yet
], ids=["first", "one-timestamp", "segment-end", "pair", "text", "text-after-pair", "no-ts"])
@pytest.mark.parametrize("boost", [0.0, 6.0, 12.0], ids=["plain", "ts-likely", "ts-forced"])
def test_timestamp_rules_match_transformers(history, boost):
    rng = np.random.default_rng(len(history) * 10 + int(boost))
    for _ in range(5):
        row = random_row(rng, boost)
        ours = run_ours(ApplyTimestampRules(EOT, NO_TIMESTAMPS, BEGIN, 50), history, row)
        assert_same_row(ours, run_hf(hf_timestamp_rules(50), history, row))


def test_timestamp_forcing_happens_and_matches():
    """The log-sum-exp rule: a row where text is likeliest token by token but the
    timestamps together outweigh it gets its text suppressed."""
    row = np.full(VOCAB, -10.0, np.float32)
    row[BEGIN:BEGIN + 100] = 2.0      # 100 timestamps of e^2 each
    row[300] = 5.0                    # the single likeliest token is text
    history = [BEGIN, 400, 500]
    ours = run_ours(ApplyTimestampRules(EOT, NO_TIMESTAMPS, BEGIN), history, row)
    assert np.isneginf(ours[:BEGIN]).all() and ours[BEGIN + 1] == 2.0
    assert_same_row(ours, run_hf(hf_timestamp_rules(), history, row))
    row[300] = 8.0                    # now e^8 > 100 e^2: text stays possible
    ours = run_ours(ApplyTimestampRules(EOT, NO_TIMESTAMPS, BEGIN), history, row)
    assert ours[300] == 8.0
    assert_same_row(ours, run_hf(hf_timestamp_rules(), history, row))


@pytest.mark.parametrize("max_initial", [None, 0, 50, 1500])
def test_timestamp_rules_random_histories(max_initial):
    rng = np.random.default_rng(0 if max_initial is None else max_initial + 1)
    for _ in range(30):
        history = random_history(rng)
        row = random_row(rng, float(rng.choice([0.0, 5.0, 10.0])))
        ours = run_ours(ApplyTimestampRules(EOT, NO_TIMESTAMPS, BEGIN, max_initial), history, row)
        assert_same_row(ours, run_hf(hf_timestamp_rules(max_initial), history, row))


def test_after_prefix_follows_ctranslate2():
    """After a forced prefix (faster-whisper's `prefix`: <|0.00|> and text in the
    prompt) CTranslate2 forbids only <|notimestamps|> at the first sampled
    position; transformers and openai-whisper would force a timestamp there.
    Later positions follow the rules over the sampled tokens alone."""
    rng = np.random.default_rng(7)
    row = random_row(rng)
    rules = ApplyTimestampRules(EOT, NO_TIMESTAMPS, BEGIN, 50, after_prefix=True)
    ours = run_ours(rules, [], row)
    assert np.isneginf(ours).sum() == 1 and np.isneginf(ours[NO_TIMESTAMPS])
    history = [400, 500]
    assert_same_row(run_ours(rules, history, row), run_hf(hf_timestamp_rules(), history, row))


def test_suppress_tokens_match_transformers():
    rng = np.random.default_rng(1)
    ids = [1, 2, 7, 50357, 50361]
    hf = logits_process.SuppressTokensLogitsProcessor(ids)
    for history in ([], [BEGIN, 400]):
        row = random_row(rng)
        assert_same_row(run_ours(SuppressTokens(ids), history, row), run_hf(hf, history, row))


def test_suppress_blank_matches_transformers():
    rng = np.random.default_rng(2)
    hf = logits_process.SuppressTokensAtBeginLogitsProcessor([220, EOT], len(PROMPT))
    for history in ([], [BEGIN], [BEGIN, 400]):
        row = random_row(rng)
        ours = run_ours(SuppressBlank([220, EOT]), history, row)
        assert_same_row(ours, run_hf(hf, history, row))
        assert np.isneginf(ours[220]) == (not history)


def test_no_speech_probe_matches_transformers():
    rng = np.random.default_rng(3)
    row = random_row(rng)
    row[NO_SPEECH] = 9.0
    # its begin_index 1: <|startoftranscript|> ends the prompt, the one place the
    # first sampled row is the row Whisper reads the no-speech probability from
    hf = logits_process.WhisperNoSpeechDetection(NO_SPEECH, begin_index=1)
    hf(torch.tensor([[SOT]]), torch.from_numpy(row.copy())[None])
    probe = NoSpeechProbe(NO_SPEECH)
    assert run_ours(probe, [], row) is not None
    assert probe.prob == pytest.approx(float(hf.no_speech_prob[0]), rel=1e-5)
    probe([BEGIN], random_row(rng))   # later positions leave it as it was
    assert probe.prob == pytest.approx(float(hf.no_speech_prob[0]), rel=1e-5)


def test_logprob_recorder_sums_the_chosen_tokens():
    """Whisper's sum_logprob: each chosen token's log-softmax in the row the rules
    left, without temperature, <|endoftext|> included; finish() counts the last."""
    rng = np.random.default_rng(4)
    rows = [random_row(rng) for _ in range(3)]
    rows[0][:BEGIN] = -np.inf  # as the timestamp rules leave a first row
    chosen = [BEGIN + 2, 400, EOT]
    recorder = LogprobRecorder()
    expected = 0.0
    for i, (row, token) in enumerate(zip(rows, chosen, strict=True)):
        recorder(chosen[:i], row.copy())
        expected += float(torch.log_softmax(torch.from_numpy(row).double(), -1)[token])
    assert recorder.finish(chosen) == pytest.approx(expected, rel=1e-12)
    assert recorder.finish(chosen) == pytest.approx(expected, rel=1e-12)  # once only
    assert recorder.counted == 3
    cut = LogprobRecorder()
    cut([], rows[0].copy())
    assert cut.finish([]) == 0.0  # the chosen token unknown: nothing counted


def test_language_mask_keeps_languages_and_records_their_softmax():
    rng = np.random.default_rng(5)
    language_ids = list(range(SOT + 1, SOT + 100))
    row = random_row(rng)
    mask = LanguageMask(language_ids)
    out = run_ours(mask, [], row)
    assert np.isneginf(np.delete(out, language_ids)).all()
    np.testing.assert_array_equal(out[language_ids], row[language_ids])
    expected = torch.softmax(torch.from_numpy(row[language_ids]).double(), -1).numpy()
    np.testing.assert_allclose(mask.probs, expected, rtol=1e-12)
    assert int(np.argmax(out)) == language_ids[int(np.argmax(mask.probs))]
    assert math.isclose(mask.probs.sum(), 1.0)


def test_bad_max_initial_timestamp_index():
    with pytest.raises(ValueError, match="max_initial_timestamp_index"):
        ApplyTimestampRules(EOT, NO_TIMESTAMPS, BEGIN, -1)
