"""Reasoning parsers: a reasoning model's thinking goes to `reasoning`, its answer
to `text`, routed by token ids (qwen3, deepseek_r1); structured outputs
constrain the answer only. The engine tests use a tiny model made to think
(tests/tiny_model.py's write_tiny_thinking_llama: its greedy answer opens and
closes a <think> block)."""
from __future__ import annotations

import json

import pytest

from armllm import LLM
from armllm.engine.completion import CompletionState
from armllm.model.loader import load_tokenizer
from armllm.model.reasoning import CONTENT, HIDDEN, REASONING, ThinkRouter, think_tags
from armllm.sampling import SamplingParams
from tests.tiny_model import (
    THINKING_MESSAGES,
    write_tiny_chat_llama,
    write_tiny_llama,
    write_tiny_thinking_llama,
)


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    path = tmp_path_factory.mktemp("thinking") / "m"
    info = write_tiny_thinking_llama(path)
    return path, info


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(write_tiny_chat_llama(tmp_path_factory.mktemp("chat-tok")))


def routes(tok, parser: str, prompt: str, output: str) -> tuple[list[str], str]:
    router = ThinkRouter(think_tags(tok, parser), tok, tok.encode(prompt))
    ids = tok.encode(output)
    return [router.route(t) for t in ids], router.phase


def test_qwen3_routes_by_marker_tokens(tok):
    got, phase = routes(tok, "qwen3", "<|im_start|>assistant\n", "<think>ab</think>cd")
    assert got == [HIDDEN, REASONING, REASONING, HIDDEN, CONTENT, CONTENT]
    assert phase == CONTENT
    # no block opened: the answer at once; a later <think> is text of the answer
    got, _ = routes(tok, "qwen3", "<|im_start|>assistant\n", "ab<think>")
    assert got == [CONTENT, CONTENT, CONTENT]
    # a prompt ending in a closed, empty block (enable_thinking=false): the answer
    got, _ = routes(tok, "qwen3", "assistant\n<think>\n\n</think>\n\n", "<think>a")
    assert got == [CONTENT, CONTENT]
    # a prompt that leaves the block open: reasoning first
    got, _ = routes(tok, "qwen3", "assistant\n<think>\n", "a</think>b")
    assert got == [REASONING, HIDDEN, CONTENT]


def test_deepseek_r1_starts_inside_the_block(tok):
    got, _ = routes(tok, "deepseek_r1", "assistant\n", "ab</think>c")
    assert got == [REASONING, REASONING, HIDDEN, CONTENT]


def test_completion_state_splits_text_and_reasoning(tok):
    params = SamplingParams(max_tokens=50)
    router = ThinkRouter(think_tags(tok, "qwen3"), tok, [])
    state = CompletionState(tok, [], params, frozenset({tok.token_id("<|im_end|>")}), 1000,
                            router)
    text, thought = [], []
    for t in tok.encode("<think>plan: add</think>4<|im_end|>"):
        delta, reasoning, reason = state.add(t)
        text.append(delta)
        thought.append(reasoning)
    assert "".join(text) == "4" and "".join(thought) == "plan: add" and reason == "stop"


def test_a_parser_needs_its_tokens(tmp_path):
    with pytest.raises(ValueError, match="needs the tokens <think> and </think>"):
        LLM(write_tiny_llama(tmp_path / "words"), reasoning_parser="qwen3")
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        LLM(write_tiny_llama(tmp_path / "words2"), reasoning_parser="o1")


def test_the_engine_splits_a_thinking_models_output(thinking):
    path, info = thinking
    out_ids, start, end = info["output_ids"], info["start"], info["end"]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01,
              reasoning_parser="qwen3")
    prompt = llm.chat_prompt(THINKING_MESSAGES)
    out = llm.generate(prompt, greedy)[0]
    assert out.token_ids == out_ids
    cut = out_ids.index(end)
    tok = llm.tokenizer
    assert out.reasoning == tok.decode(out_ids[1:cut])
    assert out.text == tok.decode(out_ids[cut + 1:])
    # without the parser the text is everything, markers included
    raw = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01)
    whole = raw.generate(prompt, greedy)[0]
    assert whole.reasoning == "" and whole.text == tok.decode(out_ids)
    assert "<think>" in whole.text
    # skip_special_tokens=False: the raw output, as without a parser
    kept = llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0.0,
                                               ignore_eos=True, skip_special_tokens=False))[0]
    assert kept.reasoning == "" and kept.text.startswith("<think>")
    assert start in out_ids


def test_a_grammar_constrains_the_answer_not_the_reasoning(thinking):
    """The reasoning is the unconstrained model's (its <think> allowed at the
    first token, nothing masked inside), the answer follows the grammar."""
    path, info = thinking
    out_ids, end = info["output_ids"], info["end"]
    llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01,
              reasoning_parser="qwen3")
    prompt = llm.chat_prompt(THINKING_MESSAGES)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    out = llm.generate(prompt, SamplingParams(max_tokens=60, temperature=0.0,
                                              structured_output={"json": schema}))[0]
    cut = out_ids.index(end)
    assert out.token_ids[:cut + 1] == out_ids[:cut + 1]
    assert out.reasoning == llm.tokenizer.decode(out_ids[1:cut])
    assert out.finish_reason == "stop" and set(json.loads(out.text)) == {"answer"}
    # enable_thinking=false closes the block in the prompt: the grammar from the start
    closed = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(
        THINKING_MESSAGES, True, enable_thinking=False), add_special_tokens=False)
    out = llm.generate(closed, SamplingParams(max_tokens=60, temperature=0.0,
                                              structured_output={"json": schema}))[0]
    assert out.reasoning == "" and set(json.loads(out.text)) == {"answer"}
