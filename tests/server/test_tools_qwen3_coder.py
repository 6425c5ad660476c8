"""Tool calling through a real `armllm serve --reasoning-parser qwen3` and the
openai client on a tiny random model with Qwen3.5's chat template (Qwen3-Coder's
XML calls, the qwen3_coder parser auto-detected): a required or named call
always made, written in XML by the grammar and read back as OpenAI tool_calls
whose arguments are a JSON object valid for the function's schema, streamed
deltas that reassemble to the non-streamed call, and a tool round trip rendered
as transformers renders it."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.server.conftest import running_server
from tests.server.test_tools import ASK, SCHEMAS, SEARCH, TOOLS, collect_stream
from tests.tiny_model import QWEN3_5_TEMPLATE, write_tiny_chat_llama

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen35_model(tmp_path_factory):
    return write_tiny_chat_llama(tmp_path_factory.mktemp("tiny-qwen35"),
                                 template=QWEN3_5_TEMPLATE)


@pytest.fixture(scope="module")
def client(qwen35_model, tmp_path_factory):
    import openai
    with running_server(qwen35_model, tmp_path_factory, "qwen35", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.05",
                        "--max-num-seqs", "8", "--reasoning-parser", "qwen3",
                        "--served-model-name", "tiny") as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def create(client, **kw):
    return client.chat.completions.create(**{"model": "tiny", "messages": ASK, "tools": TOOLS,
                                             "max_tokens": 200, "extra_body": NO_THINKING,
                                             **kw})


def test_required_calls_come_back_as_tool_calls(client):
    for seed in range(6):
        choice = create(client, tool_choice="required", parallel_tool_calls=False,
                        temperature=1.0, seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_named_function_is_the_one_called(client):
    for seed in range(3):
        choice = create(client, seed=seed,
                        tool_choice={"type": "function", "function": {"name": "search"}}
                        ).choices[0]
        (call,) = choice.message.tool_calls
        assert call.function.name == "search" and choice.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(call.function.arguments), SEARCH)


def test_parallel_required_calls(client):
    calls = create(client, tool_choice="required", seed=5).choices[0].message.tool_calls
    assert calls and all(c.function.name in SCHEMAS for c in calls)
    assert len({c.id for c in calls}) == len(calls)


def test_streamed_deltas_reassemble_to_the_whole(client):
    for seed in range(4):
        kw = dict(tool_choice="required", parallel_tool_calls=False, seed=seed)
        whole = create(client, **kw).choices[0]
        calls, order, finish, content = collect_stream(create(client, stream=True, **kw))
        assert order == ["head"]        # a call is sent whole, once it has ended
        assert "<tool_call>" not in content and "<parameter=" not in content
        assert finish == whole.finish_reason == "tool_calls"
        (w,) = whole.message.tool_calls
        assert calls == {0: {"name": w.function.name, "arguments": w.function.arguments}}


def test_auto_lets_the_model_answer(client):
    choice = create(client, max_tokens=20, seed=1).choices[0]
    assert choice.message.tool_calls is None and choice.message.content


def test_a_round_trip_renders_as_transformers_renders_it(client, qwen35_model):
    """The prompt of a tool round trip (an assistant call with its arguments as a JSON
    string, the tool's result) has as many tokens as transformers' apply_chat_template
    gives with the same template: the call comes back as XML."""
    from transformers import AutoTokenizer
    arguments = {"city": "Paris", "days": 2}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                       max_tokens=1)
    hf = AutoTokenizer.from_pretrained(qwen35_model)
    hf_messages = [*ASK, {**messages[1], "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": arguments}}]}, messages[2]]
    text = hf.apply_chat_template(hf_messages, tools=TOOLS, add_generation_prompt=True,
                                  tokenize=False)
    assert r.usage.prompt_tokens == len(hf(text, add_special_tokens=False)["input_ids"])
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in text



def test_a_responses_round_trip_with_reasoning_renders_as_transformers_does(client,
                                                                           qwen35_model):
    """/v1/responses items of an agent's turn (its reasoning, its call, the call's
    output) after the user's message: Qwen3.5's template writes that turn's
    reasoning back, and the prompt is transformers' with reasoning_content."""
    from transformers import AutoTokenizer
    arguments = {"city": "Paris", "days": 2}
    items = [{"role": "user", "content": ASK[0]["content"]},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "The user wants weather."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": json.dumps(arguments)},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"}]
    r = client.responses.create(model="tiny", input=items, max_output_tokens=1, store=False,
                                tools=[{"type": "function", **t["function"]} for t in TOOLS])
    hf_messages = [*ASK, {"role": "assistant", "content": "",
                          "reasoning_content": "The user wants weather.",
                          "tool_calls": [{"id": "call_1", "type": "function", "function": {
                              "name": "get_weather", "arguments": arguments}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    hf = AutoTokenizer.from_pretrained(qwen35_model)
    text = hf.apply_chat_template(hf_messages, tools=TOOLS, add_generation_prompt=True,
                                  tokenize=False)
    assert "The user wants weather." in text
    assert r.usage.input_tokens == len(hf(text, add_special_tokens=False)["input_ids"])
