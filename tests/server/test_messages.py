"""/v1/messages (Anthropic's Messages API) through a real `armllm serve` and the
official anthropic client (its typed messages, its stream helper that builds
the message from the events): text as chat renders the same conversation, a
tool_use turn and its tool_result as transformers renders them, tool inputs
valid for their schemas, streamed events that rebuild the whole message, the
stop reasons (end_turn, max_tokens, stop_sequence with the sequence, tool_use),
an output_config format, count_tokens, x-api-key beside Bearer, and bad input
answered 400 in Anthropic's error body naming the field."""
from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.server.conftest import running_server
from tests.server.test_tools import SCHEMAS, SEARCH, TOOLS, WEATHER

CLIENT_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in TOOLS]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def keyed(chat_model, tmp_path_factory):
    with running_server(chat_model, tmp_path_factory, "messages", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.05",
                        "--served-model-name", "tiny", "--api-key", "sk-local") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(keyed):
    return anthropic.Anthropic(base_url=keyed.url, api_key="sk-local", max_retries=0)


def blocks(message) -> list[tuple]:
    return [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input)
            if b.type == "tool_use" else (b.type, b.thinking) for b in message.content]


def test_text_is_chats_answer_to_the_same_conversation(client, keyed):
    m = client.messages.create(model="tiny", max_tokens=10, system="Be brief.",
                               messages=ASK, extra_body=GREEDY)
    chat = httpx.post(keyed.url + "/v1/chat/completions", headers={
        "Authorization": "Bearer sk-local"}, json={
        "model": "tiny", "max_tokens": 10, "temperature": 0.0,
        "messages": [{"role": "system", "content": "Be brief."}, *ASK]}).json()
    assert m.content[0].text == chat["choices"][0]["message"]["content"]
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 10
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens \
        == chat["usage"]["prompt_tokens"]
    count = client.messages.count_tokens(model="tiny", system="Be brief.", messages=ASK)
    assert count.input_tokens == chat["usage"]["prompt_tokens"]


def test_the_stream_rebuilds_the_message(client):
    kw = dict(model="tiny", max_tokens=16, messages=ASK, extra_body=GREEDY)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert blocks(final) == blocks(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_says_which(client):
    free = client.messages.create(model="tiny", max_tokens=24, messages=ASK, extra_body=GREEDY)
    text = free.content[0].text
    word = text[len(text) // 2:len(text) // 2 + 3]    # a piece of the greedy answer
    stopped = client.messages.create(model="tiny", max_tokens=24, messages=ASK,
                                     stop_sequences=["\u2603never", word], extra_body=GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[:text.index(word)]


def test_tool_use_and_its_result(client, chat_model):
    """A forced tool_use (tool_choice any), streamed the same; its tool_result sent
    back renders as transformers renders the conversation."""
    from transformers import AutoTokenizer
    for seed in range(3):
        kw = dict(model="tiny", max_tokens=300, messages=ASK, tools=CLIENT_TOOLS,
                  tool_choice={"type": "any", "disable_parallel_tool_use": True},
                  extra_body={"seed": seed, "temperature": 1.0})
        m = client.messages.create(**kw)
        (use,) = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and use.id.startswith("toolu_")
        jsonschema.validate(use.input, SCHEMAS[use.name])
        with client.messages.stream(**kw) as stream:
            assert blocks(stream.get_final_message()) == blocks(m)
    named = client.messages.create(model="tiny", max_tokens=300, messages=ASK,
                                   tools=CLIENT_TOOLS, tool_choice={"type": "tool",
                                                                    "name": "search"})
    (use,) = named.content
    assert use.name == "search"
    jsonschema.validate(use.input, SEARCH)
    turn = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                     for b in named.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": [{"type": "text", "text": "3 hits"}]}]}]
    count = client.messages.count_tokens(model="tiny", messages=turn, tools=CLIENT_TOOLS)
    hf = AutoTokenizer.from_pretrained(chat_model)
    want = hf.apply_chat_template(
        [*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"id": use.id, "type": "function",
             "function": {"name": "search", "arguments": use.input}}]},
         {"role": "tool", "tool_call_id": use.id, "content": "3 hits"}],
        tools=TOOLS, add_generation_prompt=True, tokenize=True)
    want = want if isinstance(want, list) else want["input_ids"]
    assert count.input_tokens == len(want)


def test_an_output_format(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    m = client.messages.create(model="tiny", max_tokens=60, messages=ASK,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": schema}})
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_either_key_header(keyed):
    body = {"model": "tiny", "max_tokens": 1, "messages": ASK}
    for headers in ({"x-api-key": "sk-local"}, {"Authorization": "Bearer sk-local"}):
        assert httpx.post(keyed.url + "/v1/messages", json=body,
                          headers=headers).status_code == 200
    r = httpx.post(keyed.url + "/v1/messages", json=body, headers={"x-api-key": "nope"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keyed.url, api_key="nope", max_retries=0) \
            .messages.create(model="tiny", max_tokens=1, messages=ASK)


@pytest.mark.parametrize("extra, words", [
    ({"max_tokens": 0}, "max_tokens: must be >= 1"),
    ({"max_tokens": None}, "max_tokens: is required"),
    ({"messages": []}, "messages: must be a non-empty"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]: image blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tools": [{"name": "a b", "input_schema": WEATHER}]}, "tools[0].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice: must be"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"output_config": {"effort": "huge"}}, "output_config.effort"),
    ({"model": "claude-opus"}, "claude-opus"),
    ({"system": [{"type": "image"}]}, "system[0]: image blocks are not supported"),
    ({"system": 7}, "system: must be a string"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]},
     "messages[0].content[0]: a tool_use block needs"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
     "messages[0].content[0].type: a user's block"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ({"temperature": 1e9}, "temperature"),
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers: not supported"),
])
def test_bad_requests_get_anthropics_error_body(keyed, extra, words):
    body = {k: v for k, v in {"model": "tiny", "max_tokens": 4, "messages": ASK,
                              **extra}.items() if v is not None}
    r = httpx.post(keyed.url + "/v1/messages", json=body, headers={"x-api-key": "sk-local"})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert words in err["error"]["message"], err
