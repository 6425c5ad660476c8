"""`armllm serve --speculative-config ...`: the official OpenAI client gets the
answers of the engine without speculation (completions, streamed completions, and
seeded tool calls held to their schemas), and /metrics counts the drafts proposed
and accepted, per position."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from armllm import LLM, SamplingParams
from tests.server.conftest import metric, running_server
from tests.server.test_tools import ASK, TOOLS

PROMPT = "w1 w2 w3 w4 w5 w1 w2 w3 w4 w5 w1 w2"


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    config = json.dumps({"method": "suffix", "num_speculative_tokens": 4})
    with running_server(tiny_model, tmp_path_factory, "speculative", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
                        "--served-model-name", "tiny", "--speculative-config", config) as srv:
        yield srv


def test_answers_are_the_answers_without_speculation(tiny_model, server):
    ref = LLM(tiny_model, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.02)
    want = ref.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0,
                                               ignore_eos=True))[0].text
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    drafted = metric(server.url, "armllm:spec_decode_num_draft_tokens_total")
    for _ in range(2):   # the second time, the suffix tree holds the first answer
        got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert got.choices[0].text == want
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(chunk.choices[0].text for chunk in stream) == want
    assert metric(server.url, "armllm:spec_decode_num_draft_tokens_total") > drafted
    assert metric(server.url, "armllm:spec_decode_num_accepted_tokens_total") > 0
    text = httpx.get(server.url + "/metrics").text
    assert 'armllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",' \
           'position="0"}' in text


def test_tool_calls_are_the_calls_without_speculation(chat_model, chat_client,
                                                     tmp_path_factory):
    """Seeded sampled tool calls (required: the grammar masks every verified row) from
    a server that drafts by n-gram lookup are the plain server's, call for call."""
    config = json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                         "prompt_lookup_min": 1})
    with running_server(chat_model, tmp_path_factory, "speculative-chat", "--dtype",
                        "float32", "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.05",
                        "--served-model-name", "tiny", "--speculative-config", config) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        drafted = metric(srv.url, "armllm:spec_decode_num_draft_tokens_total")
        for seed in (2, 4, 5):   # seeds whose calls end within max_tokens
            ask = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                       max_tokens=300, temperature=1.0, seed=seed)
            want = chat_client.chat.completions.create(**ask).choices[0]
            got = client.chat.completions.create(**ask).choices[0]
            assert got.finish_reason == want.finish_reason == "tool_calls"
            assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] \
                == [(c.function.name, c.function.arguments) for c in want.message.tool_calls]
        assert metric(srv.url, "armllm:spec_decode_num_draft_tokens_total") > drafted
