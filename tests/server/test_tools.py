"""Tool calling through a real `armllm serve` and the openai client, on a tiny
random model with Qwen's chat template (hermes format, auto-detected): tools
rendered as transformers renders them, a required or named call always made
and its arguments valid for the function's schema (jsonschema), calls cut off
by the token limit never returned, "auto" with one call a turn ending after
it, streamed deltas that reassemble to the non-streamed call, the tool round
trip, a 400 for each bad input; and SmolLM2, whose template cannot write two
calls back, making one call a turn by default."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.server.conftest import running_server

CHAT = "/v1/chat/completions"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 20},
                                           "limit": {"type": "integer", "minimum": 1}},
          "required": ["query"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "description": "Search the web",
                                           "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_required_calls_are_valid_calls(chat_client):
    for seed in range(12):
        choice = chat_client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_named_function_is_the_one_called(chat_client):
    for seed in range(4):
        choice = chat_client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, max_tokens=300, seed=seed,
            tool_choice={"type": "function", "function": {"name": "search"}}).choices[0]
        (call,) = choice.message.tool_calls
        assert call.function.name == "search" and choice.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(call.function.arguments), SEARCH)


def test_calls_cut_off_are_never_returned(chat_client):
    """Parallel required calls under token limits that cut some off mid-way: every
    call returned, whole or streamed, has arguments valid for its function; a cut
    completion says "length" and keeps the calls that had ended."""
    finishes = set()
    for seed, max_tokens in [(0, 24), (1, 40), (2, 60), (3, 90), (4, 300), (5, 300)]:
        kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                  max_tokens=max_tokens, seed=seed, temperature=1.0)
        whole = chat_client.chat.completions.create(**kw).choices[0]
        calls = whole.message.tool_calls or []
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        assert whole.finish_reason in ("length", "tool_calls")
        assert calls or whole.finish_reason == "length"
        streamed, _, finish, _ = collect_stream(
            chat_client.chat.completions.create(stream=True, **kw))
        assert finish == whole.finish_reason
        assert streamed == {i: {"name": c.function.name, "arguments": c.function.arguments}
                            for i, c in enumerate(calls)}
        finishes.add((whole.finish_reason, bool(calls)))
    assert ("length", True) in finishes and ("tool_calls", True) in finishes, finishes


def test_auto_without_parallel_calls_ends_after_one(chat_client, chat_model):
    """"auto" with parallel_tool_calls false: the text is free until the model opens a
    call (here pushed to by a logit_bias on <tool_call>), the call is held to its
    function's schema, and the completion ends with it."""
    from transformers import AutoTokenizer
    opener = AutoTokenizer.from_pretrained(chat_model).convert_tokens_to_ids("<tool_call>")
    for seed in range(3):
        kw = dict(model="tiny", messages=ASK, tools=TOOLS, parallel_tool_calls=False,
                  max_tokens=300, seed=seed, logit_bias={str(opener): 100})
        whole = chat_client.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "tool_calls", whole
        (call,) = whole.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        calls, _, finish, _ = collect_stream(
            chat_client.chat.completions.create(stream=True, **kw))
        assert finish == "tool_calls"
        assert calls == {0: {"name": call.function.name, "arguments": call.function.arguments}}
    # allowed in parallel, the biased model goes on calling until the token limit
    many = chat_client.chat.completions.create(**{**kw, "parallel_tool_calls": True,
                                                   "max_tokens": 200}).choices[0]
    assert many.finish_reason == "length"
    for call in many.message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_model_that_calls_one_at_a_time(tmp_path_factory, smollm2_gguf):
    """SmolLM2's template drops tool calls, so it cannot make two in a turn: by
    default a required call is one call, after which the completion ends (the case
    that once gave three calls, the last cut mid-JSON, and "length")."""
    import openai
    weather = {"type": "object", "properties": {"city": {"type": "string"},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]
    with running_server(smollm2_gguf, tmp_path_factory, "smollm2-tools", "--tool-call-parser",
                        "hermes", "--kv-cache-gib", "0.05", "--served-model-name", "smol") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        for seed in range(4):
            choice = client.chat.completions.create(
                model="smol", messages=ASK, tools=tools, tool_choice="required",
                max_tokens=100, seed=seed).choices[0]
            assert choice.finish_reason == "tool_calls", choice
            (call,) = choice.message.tool_calls
            jsonschema.validate(json.loads(call.function.arguments), weather)


def collect_stream(stream) -> tuple[dict, list[str], str | None, str]:
    """A streamed chat completion's tool calls by index ({name, arguments} joined from
    their deltas), the order of head and fragment deltas, the finish reason and the
    content."""
    calls, order, finish, content = {}, [], None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": None, "arguments": ""})
            if d.id:
                order.append("head")
                call["name"] = d.function.name
            else:
                order.append("fragment")
            call["arguments"] += d.function.arguments or ""
    return calls, order, finish, content


def test_streamed_deltas_reassemble_to_the_whole(chat_client):
    for seed in range(4):
        kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False, max_tokens=300, seed=seed)
        whole = chat_client.chat.completions.create(**kw).choices[0]
        calls, order, finish, content = collect_stream(
            chat_client.chat.completions.create(stream=True, **kw))
        assert order[0] == "head" and "<tool_call>" not in content
        assert finish == whole.finish_reason == "tool_calls"
        (w,) = whole.message.tool_calls
        assert calls == {0: {"name": w.function.name, "arguments": w.function.arguments}}


def test_auto_lets_the_model_answer(chat_client):
    choice = chat_client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                            max_tokens=30, seed=1).choices[0]
    # a random model writes no <tool_call> block in 30 tokens: its text is the answer
    assert choice.message.tool_calls is None and choice.message.content
    none = chat_client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                               tool_choice="none", max_tokens=5, seed=1)
    assert none.choices[0].message.tool_calls is None
    auto = chat_client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                               max_tokens=1)
    # the model still sees the tools: the prompt is the same as with "auto"
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens


def test_tools_render_as_transformers_renders_them(chat_client, chat_model):
    """The prompt of a whole tool round trip (tools, an assistant call with its
    arguments as a JSON string, the tool's result) has as many tokens as
    transformers' apply_chat_template(tools=...) gives with the same template."""
    from transformers import AutoTokenizer
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": json.dumps({"city": "Paris", "days": 2})}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = chat_client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                       max_tokens=1)
    hf = AutoTokenizer.from_pretrained(chat_model)
    hf_messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris",
                                                                   "days": 2}}}]},
        messages[2]]
    want = hf.apply_chat_template(hf_messages, tools=TOOLS, add_generation_prompt=True,
                                  tokenize=True)
    want = want if isinstance(want, list) else want["input_ids"]
    assert r.usage.prompt_tokens == len(want)
    text = hf.apply_chat_template(hf_messages, tools=TOOLS, add_generation_prompt=True,
                                  tokenize=False)
    assert '"name": "get_weather"' in text and "<tool_response>\n18 C, sunny" in text


@pytest.mark.parametrize("extra, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the tools"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools[0].function.name", "letters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "str"}}]},
     "tools[0].function.parameters", "JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"if": {}}}}],
      "tool_choice": "required"}, "tools", "Unimplemented keys"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": "always"}, "tool_choice", "must be"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined"),
    ({"functions": [{"name": "f"}]}, "functions", "not supported"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls", "assistant"),
])
def test_bad_tool_requests_are_400s(chat_server, extra, param, words):
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 5, **extra}
    r = httpx.post(chat_server.url + CHAT, json={k: v for k, v in body.items() if v is not None},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_a_model_whose_template_names_no_format(tmp_path_factory):
    """The words model's template has no tool markup: tools need --tool-call-parser."""
    from tests.tiny_model import write_tiny_llama
    model = write_tiny_llama(tmp_path_factory.mktemp("plain"))
    with running_server(model, tmp_path_factory, "plain-tools", "--kv-cache-gib", "0.01",
                        "--served-model-name", "tiny") as srv:
        r = httpx.post(srv.url + CHAT, json={"messages": ASK, "tools": TOOLS}, timeout=30)
        assert r.status_code == 400 and "--tool-call-parser" in r.json()["error"]["message"]
