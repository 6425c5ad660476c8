"""/v1/responses through a real `armllm serve` and the official openai client
(its typed responses, its stream helper that checks the events' order and
indices): text as chat renders the same conversation, the prompt of a tool
round trip (previous_response_id, or the same items sent whole) as long as
transformers' apply_chat_template makes it, function calls valid for their
schemas, streamed events that rebuild the non-streamed response, text.format,
max_output_tokens giving "incomplete", the store (GET, DELETE, eviction by
size and age, counted on /metrics), and a 400 naming the Responses field for
each bad input."""
from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import metric, running_server
from tests.server.test_tools import SCHEMAS, SEARCH, TOOLS

FUNCTIONS = [{"type": "function", **t["function"]} for t in TOOLS]   # Responses' shape
QUESTION = "What is the weather in Paris?"


def events_and_final(client, **kw):
    """The stream's event types (sequence numbers checked), and its final response,
    whose output must be the items the stream finished; a completed one also through
    the SDK's stream helper, which checks the events' order and indices."""
    kinds, done, final = [], {}, None
    for i, event in enumerate(client.responses.create(stream=True, **kw)):
        assert event.sequence_number == i
        kinds.append(event.type)
        if event.type == "response.output_item.done":
            done[event.output_index] = event.item
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert [done[i] for i in sorted(done)] == final.output
    if final.status == "completed":
        with client.responses.stream(**kw) as stream:
            assert items(stream.get_final_response()) == items(final)
    return kinds, final


def items(response) -> list[tuple]:
    """A response's output without its item ids (new for every response)."""
    out = []
    for o in response.output:
        if o.type == "message":
            out.append(("message", o.status, o.content[0].text))
        elif o.type == "function_call":
            out.append(("function_call", o.name, o.arguments, o.status))
        else:
            out.append((o.type,))
    return out


def test_text_is_chats_answer_to_the_same_conversation(chat_client):
    r = chat_client.responses.create(model="tiny", input=QUESTION, instructions="Be brief.",
                                      max_output_tokens=12, temperature=0.0)
    chat = chat_client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": QUESTION}],
        max_tokens=12, temperature=0.0)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens == 12
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == "Be brief." and r.max_output_tokens == 12
    # input as message items with text parts is the same conversation
    same = chat_client.responses.create(
        model="tiny", instructions="Be brief.", max_output_tokens=12, temperature=0.0,
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert same.output_text == r.output_text


def test_the_stream_rebuilds_the_response(chat_client):
    kw = dict(model="tiny", input=QUESTION, max_output_tokens=20, temperature=0.0)
    whole = chat_client.responses.create(**kw)
    kinds, final = events_and_final(chat_client, **kw)
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete"
    assert kinds.count("response.output_text.delta") >= 2
    assert items(final) == items(whole)
    assert (final.usage.input_tokens, final.usage.output_tokens) == \
        (whole.usage.input_tokens, whole.usage.output_tokens)
    assert chat_client.responses.retrieve(final.id).output_text == whole.output_text


def test_a_tool_round_trip(chat_client, chat_model):
    """A required call, its result sent back through previous_response_id, and the
    same conversation sent as items: each prompt as transformers renders it."""
    from transformers import AutoTokenizer
    first = chat_client.responses.create(model="tiny", input=QUESTION, tools=FUNCTIONS,
                                          tool_choice="required", parallel_tool_calls=False,
                                          max_output_tokens=300, extra_body={"seed": 1})
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    second = chat_client.responses.create(model="tiny", previous_response_id=first.id,
                                           input=[result], tools=FUNCTIONS, max_output_tokens=1)
    hf = AutoTokenizer.from_pretrained(chat_model)
    conversation = [{"role": "user", "content": QUESTION},
                    {"role": "assistant", "content": "", "tool_calls": [{
                        "id": call.call_id, "type": "function", "function": {
                            "name": call.name, "arguments": json.loads(call.arguments)}}]},
                    {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, sunny"}]
    want = hf.apply_chat_template(conversation, tools=TOOLS, add_generation_prompt=True,
                                  tokenize=True)
    want = want if isinstance(want, list) else want["input_ids"]
    assert second.usage.input_tokens == len(want)
    as_items = chat_client.responses.create(
        model="tiny", tools=FUNCTIONS, max_output_tokens=1, store=False,
        input=[{"role": "user", "content": QUESTION},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments}, result])
    assert as_items.usage.input_tokens == len(want)
    with pytest.raises(openai.NotFoundError):   # store=False: not kept
        chat_client.responses.retrieve(as_items.id)


def test_streamed_calls_equal_the_whole(chat_client):
    for seed in range(3):
        kw = dict(model="tiny", input=QUESTION, tools=FUNCTIONS, tool_choice="required",
                  max_output_tokens=300, extra_body={"seed": seed}, temperature=1.0)
        whole = chat_client.responses.create(**kw)
        kinds, final = events_and_final(chat_client, **kw)
        assert items(final) == items(whole)
        calls = [o for o in final.output if o.type == "function_call"]
        assert calls and kinds.count("response.function_call_arguments.done") == len(calls)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_a_named_function_and_text_format(chat_client):
    named = chat_client.responses.create(model="tiny", input=QUESTION, tools=FUNCTIONS,
                                          tool_choice={"type": "function", "name": "search"},
                                          max_output_tokens=300, extra_body={"seed": 2})
    (call,) = named.output
    assert call.type == "function_call" and call.name == "search"
    jsonschema.validate(json.loads(call.arguments), SEARCH)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
              "required": ["city"], "additionalProperties": False}
    r = chat_client.responses.create(model="tiny", input=QUESTION, max_output_tokens=200,
                                      text={"format": {"type": "json_schema", "name": "city",
                                                       "schema": schema}}, extra_body={"seed": 3})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize("extra, param, words", [
    ({"input": []}, "input", "non-empty"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type", "must be"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "not supported"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id",
     "call_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", "letters"),
    ({"tools": FUNCTIONS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice", "not among"),
    ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name",
     "non-empty"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "must be"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id", "no stored response"),
    ({"background": True}, "background", "not supported"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "must be one of"),
    ({"include": ["file_search_call.results"]}, "include[0]", "not supported"),
    ({"temperature": "hot"}, "temperature", "number"),
    ({"instructions": 5}, "instructions", "string"),
    ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
     "input[0].name", "string"),
    ({"input": [{"type": "reasoning", "content": "x"}]}, "input[0].content", "reasoning_text"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "not supported"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "must be one of"),
    ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice", "not supported"),
    ({"text": {"verbosity": "chatty"}}, "text.verbosity", "must be"),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary", "must be"),
    ({"metadata": {"k": 5}}, "metadata", "string values"),
    ({"truncation": "auto"}, "truncation", "not supported"),
    ({"top_logprobs": 3}, "top_logprobs", "not supported"),
    ({"conversation": "conv_1"}, "conversation", "not supported"),
    ({"max_reasoning_tokens": -2}, "max_reasoning_tokens", ">= 0"),
])
def test_bad_requests_are_400s_naming_the_field(chat_server, extra, param, words):
    body = {"model": "tiny", "input": QUESTION, "max_output_tokens": 4, **extra}
    r = httpx.post(chat_server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_the_store_keeps_a_bounded_number_for_a_bounded_time(chat_model, tmp_path_factory):
    with running_server(chat_model, tmp_path_factory, "responses-store", "--dtype", "float32",
                        "--kv-cache-gib", "0.02", "--served-model-name", "tiny",
                        "--responses-store-size", "2", "--responses-store-ttl", "3") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        ids = [client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2).id
               for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])        # evicted: the store holds 2
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
        assert metric(srv.url, "armllm:responses_evicted_total") == 1
        assert metric(srv.url, "armllm:responses_stored") == 2
        client.responses.delete(ids[1])
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(ids[1])
        time.sleep(3.2)                              # past the age limit
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="tiny", input="and?", previous_response_id=ids[2])
        assert metric(srv.url, "armllm:responses_evicted_total") == 2


def test_an_agent_loop(chat_client, chat_model):
    """Three turns as an agent drives them: each answer's calls are run and their
    outputs sent with previous_response_id; the last prompt holds the whole loop as
    transformers renders it."""
    from transformers import AutoTokenizer
    conversation = [{"role": "user", "content": QUESTION}]
    sent, previous = QUESTION, {}
    for turn in range(3):
        response = chat_client.responses.create(
            model="tiny", input=sent, tools=FUNCTIONS, parallel_tool_calls=False,
            tool_choice="required" if turn < 2 else "auto",
            max_output_tokens=300 if turn < 2 else 1, extra_body={"seed": turn}, **previous)
        if turn == 2:
            break
        (call,) = [o for o in response.output if o.type == "function_call"]
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        result = f"result {turn}"
        sent = [{"type": "function_call_output", "call_id": call.call_id, "output": result}]
        conversation += [{"role": "assistant", "content": "", "tool_calls": [{
            "id": call.call_id, "type": "function",
            "function": {"name": call.name, "arguments": json.loads(call.arguments)}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": result}]
        previous = {"previous_response_id": response.id}
    hf = AutoTokenizer.from_pretrained(chat_model)
    want = hf.apply_chat_template(conversation, tools=TOOLS, add_generation_prompt=True,
                                  tokenize=True)
    want = want if isinstance(want, list) else want["input_ids"]
    assert response.usage.input_tokens == len(want)
