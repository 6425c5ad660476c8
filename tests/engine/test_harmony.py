"""GPT-OSS's harmony output: a completion's text is its final channel only (the
analysis channel is its reasoning; commentary and every header are stripped),
streamed token by token
as the whole final message decoded; plain text before any harmony token stays;
tokenizers without the harmony tokens are untouched; the engine turns it on for
a harmony tokenizer unless special tokens are asked for."""
from __future__ import annotations

import re

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from armllm.engine.completion import CompletionState
from armllm.model.harmony import HarmonyRouter, harmony_tokens
from armllm.model.tokenizer import TextTokenizer
from armllm.sampling import SamplingParams

WORDS = ["assistant", "analysis", "final", "commentary", "to=functions.get_weather", "json",
         "think", "more", "Paris", "is", "nice", "{}", "plain"]
SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>",
            "<|constrain|>", "<|call|>"]


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="plain"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return TextTokenizer(t, {})


def ids(tok: TextTokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def run(tok: TextTokenizer, text: str, skip_special_tokens: bool = True
        ) -> tuple[str, list, str]:
    """(the completion's text, its deltas, its reasoning) for the completion `text`
    after a chat prompt ending "<|start|>assistant", <|return|> as EOS."""
    prompt = ids(tok, "<|start|> assistant")
    eos = frozenset({tok.token_id("<|return|>")})
    params = SamplingParams(max_tokens=100, skip_special_tokens=skip_special_tokens)
    router = HarmonyRouter(harmony_tokens(tok), tok) if skip_special_tokens else None
    state = CompletionState(tok, prompt, params, eos, 1000, router)
    deltas, reasoning = [], []
    for token in ids(tok, text):
        delta, thought, reason = state.add(token)
        deltas.append(delta)
        reasoning.append(thought)
        if reason:
            break
    return "".join(deltas), deltas, "".join(reasoning)


def test_only_the_final_channel_is_text(tok):
    text, deltas, reasoning = run(tok, "<|channel|> analysis <|message|> think more <|end|> "
                                       "<|start|> assistant <|channel|> final <|message|> "
                                       "Paris is nice <|return|>")
    assert reasoning.split() == ["think", "more"]   # the analysis channel
    assert text.split() == ["Paris", "is", "nice"]   # (a word-level decoder: spaced words)
    assert not any("think" in d or "analysis" in d or "assistant" in d for d in deltas)


def test_commentary_and_constrained_messages_are_hidden(tok):
    text, _, reasoning = run(tok, "<|channel|> analysis <|message|> think <|end|> <|start|> "
                                  "assistant "
                       "<|channel|> commentary to=functions.get_weather <|constrain|> json "
                       "<|message|> {} <|call|> <|start|> assistant <|channel|> final "
                       "<|message|> nice <|return|>")
    assert text.split() == ["nice"] and reasoning.split() == ["think"]


def test_text_before_any_channel_stays(tok):
    assert run(tok, "Paris is nice")[0].split() == ["Paris", "is", "nice"]


def test_special_tokens_asked_for_show_everything(tok):
    text, _, reasoning = run(tok, "<|channel|> analysis <|message|> think <|end|>", False)
    assert not reasoning
    assert "analysis" in text and "think" in text and "<|channel|>" in text


def test_other_tokenizers_have_no_harmony(tok):
    plain = Tokenizer(models.WordLevel({"a": 0, "<|channel|>": 1}, unk_token="a"))
    assert harmony_tokens(TextTokenizer(plain, {})) is None
    assert harmony_tokens(tok) is not None


def final_channel_words(raw: str) -> list[str]:
    """An oracle over the raw text (special tokens kept): the words of every final-
    channel message body, and of plain text before the first harmony token."""
    words, state = [], "text"
    for piece in re.split(r"(<\|start\|>|<\|end\|>|<\|call\|>|<\|channel\|>|<\|message\|>"
                          r"|<\|constrain\|>)", raw):
        if piece in ("<|start|>", "<|end|>", "<|call|>", "<|constrain|>"):
            state = "header"
        elif piece == "<|channel|>":
            state, name = "channel", ""
        elif piece == "<|message|>":
            state = "final" if name.split()[:1] == ["final"] else "body"
        elif state == "channel":
            name += piece
        elif state in ("text", "final"):
            words += piece.split()
    return words


def test_the_engine_shows_only_the_final_channel(tmp_path):
    """A tiny model whose greedy output gets harmony structure: some of the words it
    samples renamed to the harmony tokens in its tokenizer (the ids, so the tokens,
    stay the same), the word after its first <|channel|> renamed "final". The text
    is the final-channel words of the raw output (special tokens kept)."""
    import json

    from armllm import LLM
    from tests.tiny_model import write_tiny_llama
    path = write_tiny_llama(tmp_path / "m")
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    first = LLM(path, dtype="float32", kv_cache_gib=0.01, max_num_seqs=1)
    out_ids = first.generate([5, 6, 7], params)[0].outputs[0].token_ids
    distinct = list(dict.fromkeys(i for i in out_ids if i > 1))
    assert len(distinct) >= 8, distinct
    marks = {distinct[1]: "<|channel|>", distinct[3]: "<|message|>", distinct[5]: "<|end|>",
             distinct[7]: "<|start|>"}
    after = out_ids[out_ids.index(distinct[1]) + 1]
    if after not in marks and after > 1:
        marks[after] = "final"
    tj = json.loads((path / "tokenizer.json").read_text())
    vocab = {w: i for w, i in tj["model"]["vocab"].items() if i not in marks}
    vocab.update({name: i for i, name in marks.items()})
    t = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens([AddedToken(s, special=True) for s in ("<s>", "</s>", *marks.values())
                          if s != "final"])
    t.save(str(path / "tokenizer.json"))
    llm = LLM(path, dtype="float32", kv_cache_gib=0.01, max_num_seqs=1)
    assert llm.speaks_harmony and llm.engine.harmony is not None
    out = llm.generate([5, 6, 7], params)[0].outputs[0]
    assert out.token_ids == out_ids    # the same weights: the same tokens
    raw = llm.tokenizer.decode(out.token_ids, skip_special_tokens=False)
    assert out.text.split() == final_channel_words(raw)
    assert len(out.text.split()) < len(out.token_ids) - raw.count("<|")   # some were hidden


def test_a_reasoning_budget_closes_the_analysis_channel(tok):
    """At max_reasoning_tokens analysis tokens the completion is made to take the end of
    the analysis message and a final message's header, one token a step; whatever it
    writes then is the answer."""
    prompt = ids(tok, "<|start|> assistant")
    params = SamplingParams(max_tokens=100, max_reasoning_tokens=2)
    state = CompletionState(tok, prompt, params, frozenset(), 1000,
                            HarmonyRouter(harmony_tokens(tok), tok))
    wanted = ids(tok, "<|channel|> analysis <|message|> think more think more")
    forced, text, reasoning = [], "", ""
    for token in [*wanted, *ids(tok, "think more think more think more Paris is nice")]:
        must = state.forced_token()
        if must is not None:
            forced.append(must)
            token = must
        delta, thought, _ = state.add(token)
        text, reasoning = text + delta, reasoning + thought
        if len(forced) == 6 and must is None:   # the first free token: the answer's
            break
    assert forced == ids(tok, "<|end|> <|start|> assistant <|channel|> final <|message|>")
    assert reasoning.split() == ["think", "more"] and state.num_reasoning_tokens == 2
    assert text.split() == ["think"] and state.forced_token() is None
