"""words: word-level timestamps of a window's transcript, from the cross-attention
of the model's alignment heads (faster-whisper's add_word_timestamps over
CTranslate2's align, openai-whisper's timing.py).

The window's text tokens are decoded once more as one sequence, <|startoftranscript|>
… <|notimestamps|> text <|endoftext|> (WindowDecoder.alignment: the alignment heads'
attention probabilities and the logits). Each head's probabilities over the window's
speech frames are renormalized, standardized over the tokens, median-filtered over
time, and averaged over the heads; dynamic time warping of that matrix pairs each
text token with the frame where it starts. Tokens are grouped into words (at
spaces, or at whole characters for the languages written without them), with
punctuation merged into its word; a word's probability is its tokens' mean. The
segments' start and end then follow their first and last words, with faster-
whisper's corrections for words stretched over a pause."""
from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from armllm.audio.tokens import WhisperTokens

TOKENS_PER_SECOND = 50          # encoder frames (timestamp steps) a second
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
# languages written without spaces between words: a word is what decodes to whole
# characters
UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass
class Word:
    """One word: start and end in seconds of the file, its text (with its leading
    space), the mean probability of its tokens."""
    start: float
    end: float
    word: str
    probability: float


def negative_dtw(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path through matrix [tokens, frames] of the largest total (the
    cheapest over -matrix), as (token indices, frame indices). Ties go as in
    openai-whisper and CTranslate2: the diagonal where strictly cheapest, else the
    step down a token where strictly cheapest, else the step along time; the costs
    add up in float32 as theirs do."""
    n, m = matrix.shape
    x = np.asarray(matrix, np.float32)
    cost = np.full((n + 1, m + 1), np.inf, np.float32)
    cost[0, 0] = 0
    trace = np.full((n + 1, m + 1), -1, np.int8)
    # each anti-diagonal i + j = s depends only on the two before it
    for s in range(2, n + m + 1):
        i = np.arange(max(1, s - m), min(n, s - 1) + 1)
        j = s - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.choose(step, (c0, c1, c2))
        cost[i, j] = -x[i - 1, j - 1] + best
        trace[i, j] = step
    trace[0, :] = 2
    trace[:, 0] = 1
    path = []
    i, j = n, m
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    pairs = np.array(path, np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """The median of each `width` (odd) neighbours along the last axis, the edges
    mirrored without repeating the edge value; an axis no longer than width // 2
    is left as it is."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1).astype(x.dtype, copy=False)


def alignment_matrix(weights: np.ndarray, num_frames: int, sot_length: int,
                     n_text: int, median_width: int = MEDIAN_FILTER_WIDTH) -> np.ndarray:
    """The token-by-frame matrix [n_text + 1, frames] that the path follows, from
    the heads' attention probabilities [heads, tokens, positions]: each head's over
    the window's num_frames (log-mel frames; two per position) renormalized, then
    standardized over the tokens, median-filtered over time, averaged over heads;
    the rows of <|notimestamps|> and the text."""
    frames = num_frames // 2
    w = weights[:, :, :frames].astype(np.float32)
    w = w / w.sum(axis=-1, keepdims=True)
    mean = w.mean(axis=-2, keepdims=True)
    std = np.sqrt(((w - mean) ** 2).mean(axis=-2, keepdims=True))
    w = (w - mean) / std
    w = median_filter(w, median_width).mean(axis=0)
    return w[sot_length:sot_length + n_text + 1]


def text_token_probs(logits: np.ndarray, sequence: list[int], first: int,
                     n_text: int, eot: int) -> np.ndarray:
    """The probability of each of the n_text tokens after row `first` of the
    sequence, over the text vocabulary alone (tokens below <|endoftext|>)."""
    rows = logits[first:first + n_text, :eot].astype(np.float64)
    rows = np.exp(rows - rows.max(axis=-1, keepdims=True))
    rows /= rows.sum(axis=-1, keepdims=True)
    chosen = np.asarray(sequence[first + 1:first + 1 + n_text])
    return rows[np.arange(n_text), chosen].astype(np.float32)


def split_on_unicode(tokens: WhisperTokens, token_ids: list[int]) -> tuple[list[str],
                                                                          list[list[int]]]:
    """Token ids grouped where they decode to whole characters."""
    full = tokens.decode_with_timestamps(token_ids)
    words, groups, current, offset = [], [], [], 0
    for token in token_ids:
        current.append(token)
        decoded = tokens.decode_with_timestamps(current)
        bad = decoded.find("\ufffd")
        if bad < 0 or (offset + bad < len(full) and full[offset + bad] == "\ufffd"):
            words.append(decoded)
            groups.append(current)
            current = []
            offset += len(decoded)
    return words, groups


def split_to_words(tokens: WhisperTokens, token_ids: list[int],
                   language: str) -> tuple[list[str], list[list[int]]]:
    """Token ids grouped into words: at whole characters for the languages written
    without spaces, else a new word at a leading space, a punctuation mark or a
    special token."""
    pieces, groups = split_on_unicode(tokens, token_ids)
    if language in UNSPACED_LANGUAGES:
        return pieces, groups
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, group in zip(pieces, groups, strict=True):
        if (group[0] >= tokens.eot or piece.startswith(" ")
                or piece.strip() in string.punctuation or not words):
            words.append(piece)
            word_tokens.append(group)
        else:
            words[-1] += piece
            word_tokens[-1].extend(group)
    return words, word_tokens


def merge_punctuations(alignment: list[dict], prepended: str, appended: str) -> None:
    """Opening marks join the word after them, closing marks the word before, in
    place (the mark's own entry left empty)."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        before, after = alignment[i], alignment[j]
        if before["word"].startswith(" ") and before["word"].strip() in prepended:
            after["word"] = before["word"] + after["word"]
            after["tokens"] = before["tokens"] + after["tokens"]
            before["word"], before["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        before, after = alignment[i], alignment[j]
        if not before["word"].endswith(" ") and after["word"] in appended:
            before["word"] += after["word"]
            before["tokens"] = before["tokens"] + after["tokens"]
            after["word"], after["tokens"] = "", []
        else:
            i = j
        j += 1


def find_alignment(tokens: WhisperTokens, language: str, text_ids: list[int],
                   sot_sequence: list[int], weights: np.ndarray, logits: np.ndarray,
                   num_frames: int) -> list[dict]:
    """The words of text_ids (dicts of word, tokens, start and end in seconds of the
    window, probability), from the alignment pass over sot_sequence <|notimestamps|>
    text_ids <|endoftext|> (weights and logits: WhisperModel.alignment_weights)."""
    if not text_ids:
        return []
    sequence = [*sot_sequence, tokens.no_timestamps, *text_ids, tokens.eot]
    offset = len(sot_sequence)
    probs = text_token_probs(logits, sequence, offset, len(text_ids), tokens.eot)
    if num_frames // 2 == 0:
        return []
    matrix = alignment_matrix(weights, num_frames, offset, len(text_ids))
    text_indices, time_indices = negative_dtw(matrix)
    words, word_tokens = split_to_words(tokens, [*text_ids, tokens.eot], language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    # the last "word" is <|endoftext|>, with no end of its own: zip leaves it out
    return [dict(word=word, tokens=ids, start=start, end=end,
                 probability=float(np.mean(probs[i:j])))
            for word, ids, start, end, i, j in zip(words, word_tokens, starts, ends,
                                                   boundaries[:-1], boundaries[1:], strict=False)]


def add_word_timestamps(pieces: list[dict], alignment: list[dict], eot: int,
                        frames_per_second: int, prepended: str, appended: str,
                        last_speech_timestamp: float) -> float:
    """Gives each of a window's segments (split_segments' dicts, in place) its
    "words", from find_alignment's words of their text tokens together, and moves
    the segment's start and end to its first and last word's (faster-whisper's
    add_word_timestamps, with its corrections of words stretched over a pause or a
    sentence end). Returns the end of the last segment with words."""
    durations = np.array([w["end"] - w["start"] for w in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    max_duration = median_duration * 2
    if len(durations):
        # a sentence's last or first word is not longer than twice the median word
        for i in range(1, len(alignment)):
            if alignment[i]["end"] - alignment[i]["start"] > max_duration:
                if alignment[i]["word"] in SENTENCE_END_MARKS:
                    alignment[i]["end"] = alignment[i]["start"] + max_duration
                elif alignment[i - 1]["word"] in SENTENCE_END_MARKS:
                    alignment[i]["start"] = alignment[i]["end"] - max_duration
    merge_punctuations(alignment, prepended, appended)
    if not pieces:
        return last_speech_timestamp
    time_offset = pieces[0]["seek"] / frames_per_second
    word_index = 0
    for piece in pieces:
        n_text = sum(1 for t in piece["tokens"] if t < eot)
        saved = 0
        words: list[dict] = []
        while word_index < len(alignment) and saved < n_text:
            timing = alignment[word_index]
            if timing["word"]:
                words.append(dict(word=timing["word"],
                                  start=round(time_offset + timing["start"], 2),
                                  end=round(time_offset + timing["end"], 2),
                                  probability=timing["probability"]))
            saved += len(timing["tokens"])
            word_index += 1
        if words:
            _trim_after_pause(words, last_speech_timestamp, median_duration, max_duration)
            # the segment's own start or end where the first or last word is too long
            if piece["start"] < words[0]["end"] and piece["start"] - 0.5 > words[0]["start"]:
                words[0]["start"] = max(0, min(words[0]["end"] - median_duration,
                                               piece["start"]))
            else:
                piece["start"] = words[0]["start"]
            if piece["end"] > words[-1]["start"] and piece["end"] + 0.5 < words[-1]["end"]:
                words[-1]["end"] = max(words[-1]["start"] + median_duration, piece["end"])
            else:
                piece["end"] = words[-1]["end"]
            last_speech_timestamp = piece["end"]
        piece["words"] = words
    return last_speech_timestamp


def _trim_after_pause(words: list[dict], last_speech_timestamp: float,
                      median_duration: float, max_duration: float) -> None:
    """The first and second words after a pause are not longer than twice the
    median word."""
    first = words[0]
    if first["end"] - last_speech_timestamp > median_duration * 4 and (
            first["end"] - first["start"] > max_duration
            or (len(words) > 1 and words[1]["end"] - first["start"] > max_duration * 2)):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - max_duration)


def last_word_end(pieces: list[dict]) -> float | None:
    """The end of the last word of the window's segments, else of its last segment
    (None without segments)."""
    for piece in reversed(pieces):
        for word in reversed(piece.get("words") or []):
            return word["end"]
    return pieces[-1]["end"] if pieces else None
