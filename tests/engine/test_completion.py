"""CompletionState, token by token, against a reference that decodes the whole
output at every token: stop token ids, EOS and ignore_eos, max_tokens and the
end of the context, stop strings (cut with what follows, held back while
undecided, so the streamed text never holds one); and IncrementalDetokenizer
equal to decoding the whole sequence, multi-byte UTF-8 and byte-fallback
included."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armllm.engine.completion import CompletionState, IncrementalDetokenizer
from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf
from armllm.model.tokenizer import TextTokenizer
from armllm.sampling import SamplingParams
from tests.conftest import examples
from tests.engine.sim import fake_model

TOKENIZER = TextTokenizer(fake_model().tokenizer, {})   # token i is the word "t<i>"
PROMPT = [5, 6]
EOS = frozenset({1})


def text_of(output_ids: list[int]) -> str:
    """The output's text: the whole sequence decoded, less the prompt's text."""
    return TOKENIZER.decode(PROMPT + output_ids)[len(TOKENIZER.decode(PROMPT)):]


def reference(tokens: list[int], params: SamplingParams, max_model_len: int
              ) -> tuple[str, str | None, int]:
    """(final text, finish reason, tokens consumed) by the rules, decoding in full."""
    limit = min(params.max_tokens, max_model_len - len(PROMPT))
    stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else EOS)
    for k, token in enumerate(tokens):
        if token in stop_ids:
            return text_of(tokens[:k]), "stop", k + 1
        text = text_of(tokens[:k + 1])
        found = [text.find(s) for s in params.stop if s in text]
        if found:
            return text[:min(found)], "stop", k + 1
        if k + 1 == limit:
            return text, "length", k + 1
    return text_of(tokens), None, len(tokens)


def stream(tokens: list[int], params: SamplingParams, max_model_len: int
           ) -> tuple[list[str], str | None]:
    state = CompletionState(TOKENIZER, PROMPT, params, EOS, max_model_len)
    deltas = []
    for token in tokens:
        delta, _, reason = state.add(token)
        deltas.append(delta)
        if reason is not None:
            return deltas, reason
    return deltas, None


@st.composite
def stop_strings(draw, tokens: list[int]) -> list[str]:
    """Up to three stop strings: pieces of the output's text (so they occur, at any
    offset and of any length) or short strings of its characters."""
    text = text_of(tokens)
    pieces = st.tuples(st.integers(0, len(text) - 1), st.integers(1, 12)).map(
        lambda at: text[at[0]:at[0] + at[1]])
    return draw(st.lists(pieces | st.text("t123 ", min_size=1, max_size=6), max_size=3))


@settings(max_examples=examples(400), deadline=None)
@given(tokens=st.lists(st.sampled_from([1, 2, 3, 11, 12, 21]), min_size=1, max_size=24),
       data=st.data(), stop_token_ids=st.lists(st.sampled_from([2, 3, 40]), max_size=2),
       ignore_eos=st.booleans(), max_tokens=st.integers(1, 30),
       max_model_len=st.integers(len(PROMPT) + 1, 40))
def test_matches_decoding_the_whole_output(tokens, data, stop_token_ids, ignore_eos,
                                           max_tokens, max_model_len):
    stop = data.draw(stop_strings(tokens))
    params = SamplingParams(max_tokens=max_tokens, stop=stop, stop_token_ids=stop_token_ids,
                            ignore_eos=ignore_eos)
    deltas, reason = stream(tokens, params, max_model_len)
    want_text, want_reason, consumed = reference(tokens, params, max_model_len)
    assert reason == want_reason and len(deltas) == consumed
    hold = max(map(len, stop), default=1) - 1  # what may be the start of a stop string
    streamed = ""
    for k, delta in enumerate(deltas):
        streamed += delta
        assert not any(s in streamed for s in stop), "a stop string was streamed"
        so_far = text_of(tokens[:k + 1])
        assert so_far.startswith(streamed) or reason is not None
        if k + 1 < consumed or reason is None:  # undecided: only a stop string's start waits
            assert len(so_far) - len(streamed) <= hold
    if reason is not None:
        assert streamed == want_text


def test_without_stop_strings_each_token_streams_its_text():
    deltas, reason = stream([11, 12, 21], SamplingParams(max_tokens=3), 100)
    assert deltas == [text_of([11]), text_of([11, 12])[len(text_of([11])):],
                      text_of([11, 12, 21])[len(text_of([11, 12])):]]
    assert reason == "length"


def test_the_context_end_is_a_length_finish():
    deltas, reason = stream([11] * 10, SamplingParams(max_tokens=10), len(PROMPT) + 4)
    assert len(deltas) == 4 and reason == "length"


def test_eos_stops_without_its_text_unless_ignored():
    deltas, reason = stream([11, 1, 12], SamplingParams(max_tokens=5), 100)
    assert ("".join(deltas), len(deltas), reason) == (text_of([11]), 2, "stop")
    deltas, reason = stream([11, 1, 12], SamplingParams(max_tokens=3, ignore_eos=True), 100)
    assert "".join(deltas) == text_of([11, 1, 12]) and reason == "length"


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf) -> TextTokenizer:
    tok, config = tokenizer_from_gguf(GGUFFile(smollm2_gguf).metadata)
    return TextTokenizer(tok, config)


def test_incremental_detokenization_equals_full_decode(smollm2_tokenizer):
    tok = smollm2_tokenizer
    texts = ["Émile a mangé 🤖🦙 日本語 — ok", "  spaced\n\tout  ", "naïve café 123"]
    rng = np.random.default_rng(0)
    for text in texts + [None] * 5:
        ids = tok.encode(text) if text else list(rng.integers(3, tok.vocab_size, 40))
        prompt = tok.encode("Prompt:")
        detok = IncrementalDetokenizer(tok, prompt)
        pieces = [detok.add(int(t)) for t in ids]
        full = tok.decode(prompt + list(ids))[len(tok.decode(prompt)):]
        joined = "".join(pieces)
        assert full.startswith(joined) and len(full) - len(joined) <= 3, (joined, full)
        if text:
            assert joined == text or (joined + " " == text)
        assert "\ufffd" not in joined or "\ufffd" in full
