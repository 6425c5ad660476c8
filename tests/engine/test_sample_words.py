"""engine/sample_words: DRY breakers and bad words, strings, as the sampler's token
sequences, checked against llama.cpp's and vLLM's definitions worked out by hand on a
small word-level tokenizer."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from armllm.engine.sample_words import MAX_BREAKER_CHARS, SampleWords
from armllm.model.tokenizer import TextTokenizer
from tests.engine.test_step_sampler import sequences

# token texts: "ab" holds the breaker "ab"; "xa" and "a" end with its prefix "a"; "b" is
# its tail; "abc" and "zab" hold it too; "q" is unrelated
WORDS = ["q", "a", "b", "ab", "xa", "abc", "zab", "Ġhello", "hello", "c"]


@pytest.fixture(scope="module")
def words() -> SampleWords:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="q"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return SampleWords(TextTokenizer(tok, {}), len(WORDS))


def ids(*texts: str) -> tuple[int, ...]:
    return tuple(WORDS.index(t) for t in texts)


def test_breaker_tokens_as_llama_cpp_makes_them(words):
    got = set(map(tuple, sequences(words.breakers(("ab",)))))
    # a token holding "ab" is a breaker alone; one ending with "a" heads "a" + tokens("b")
    want = {ids("ab"), ids("abc"), ids("zab"), ids("a", "b"), ids("xa", "b")}
    assert got == want


def test_a_breaker_is_cut_to_llama_cpps_length(words):
    long = "q" + "z" * (2 * MAX_BREAKER_CHARS)
    got = set(map(tuple, sequences(words.breakers((long,)))))
    # "q" ends with the prefix "q": its tail is the rest of the cut breaker, one token (unk)
    assert got == {ids("q", "q")}


def test_bad_words_with_and_without_a_leading_space(words):
    got = set(map(tuple, sequences(words.bad_words(("hello", "a b")))))
    # WhitespaceSplit drops the space: " hello" is the same tokens, kept once
    assert got == {ids("hello"), ids("a", "b")}


def test_results_are_cached_per_list(words):
    assert words.bad_words(("hello",)) is words.bad_words(("hello",))
    assert words.breakers(("ab",)) is words.breakers(("ab",))
