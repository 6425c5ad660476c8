"""`armllm serve --reasoning-parser qwen3` through the openai client: the thinking
of a tiny model made to think (tests/tiny_model.py) comes back as
reasoning_content, the answer as content, streamed as reasoning_content and
content deltas that reassemble to the same; chat_template_kwargs
enable_thinking=false reaches the template; a response_format constrains the
answer only."""
from __future__ import annotations

import json

import openai
import pytest

from armllm.model.loader import load_tokenizer
from tests.server.conftest import running_server
from tests.tiny_model import THINKING_MESSAGES, write_tiny_thinking_llama


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    path = tmp_path_factory.mktemp("thinking-server") / "m"
    return path, write_tiny_thinking_llama(path)


@pytest.fixture(scope="module")
def server(thinking, tmp_path_factory):
    path, _ = thinking
    with running_server(path, tmp_path_factory, "reasoning", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
                        "--reasoning-parser", "qwen3", "--served-model-name", "tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_reasoning_content_apart_from_content(client, thinking):
    path, info = thinking
    out_ids, end = info["output_ids"], info["end"]
    tok = load_tokenizer(path)
    cut = out_ids.index(end)
    kw = dict(model="tiny", messages=THINKING_MESSAGES, max_tokens=24, temperature=0.0,
              extra_body={"ignore_eos": True})
    message = client.chat.completions.create(**kw).choices[0].message
    assert message.reasoning_content == tok.decode(out_ids[1:cut])
    assert message.content == tok.decode(out_ids[cut + 1:])
    reasoning, content = [], []
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            content.append(delta.content or "")
    assert "".join(reasoning) == message.reasoning_content
    assert "".join(content) == message.content
    # completions (no chat) have no reasoning field: their text is the answer
    text = client.completions.create(model="tiny", prompt=tok.decode(
        tok.encode(tok.apply_chat_template(THINKING_MESSAGES, True), add_special_tokens=False),
        skip_special_tokens=False), max_tokens=24, temperature=0.0,
        extra_body={"ignore_eos": True}).choices[0].text
    assert text == message.content


def test_enable_thinking_false_and_a_constrained_answer(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    thought = client.chat.completions.create(model="tiny", messages=THINKING_MESSAGES,
                                             max_tokens=80, temperature=0.0,
                                             response_format=fmt).choices[0]
    assert thought.message.reasoning_content and set(json.loads(thought.message.content)) \
        == {"n"}
    plain = client.chat.completions.create(
        model="tiny", messages=THINKING_MESSAGES, max_tokens=80, temperature=0.0,
        response_format=fmt, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    ).choices[0]
    assert not getattr(plain.message, "reasoning_content", None)
    assert set(json.loads(plain.message.content)) == {"n"}


def test_responses_give_the_thinking_as_a_reasoning_item(client, thinking):
    """/v1/responses: the thinking is a reasoning item before the message, its tokens
    counted as reasoning_tokens, the same streamed, and its text again in
    encrypted_content when asked for."""
    path, info = thinking
    out_ids, end = info["output_ids"], info["end"]
    tok = load_tokenizer(path)
    cut = out_ids.index(end)
    kw = dict(model="tiny", input=THINKING_MESSAGES[0]["content"], max_output_tokens=24,
              temperature=0.0, include=["reasoning.encrypted_content"],
              extra_body={"ignore_eos": True})
    r = client.responses.create(**kw)
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.content[0].text == tok.decode(out_ids[1:cut])
    assert reasoning.encrypted_content == reasoning.content[0].text
    assert message.content[0].text == tok.decode(out_ids[cut + 1:])
    assert r.usage.output_tokens_details.reasoning_tokens == cut - 1   # no <think> tags
    streamed = [e for e in client.responses.create(stream=True, **kw)]
    final = streamed[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == reasoning.content[0].text
    assert final.output[1].content[0].text == message.content[0].text
    assert "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta") \
        == reasoning.content[0].text


@pytest.mark.parametrize("budget", [0, 2])
def test_a_reasoning_budget_ends_the_thinking(client, thinking, budget):
    """max_reasoning_tokens: after that many thinking tokens </think> is forced, and
    the answer goes on from there as transformers continues the same tokens."""
    import torch
    from transformers import AutoModelForCausalLM
    path, info = thinking
    out_ids, start, end = info["output_ids"], info["start"], info["end"]
    tok = load_tokenizer(path)
    r = client.chat.completions.create(
        model="tiny", messages=THINKING_MESSAGES, max_tokens=12, temperature=0.0,
        extra_body={"ignore_eos": True, "max_reasoning_tokens": budget})
    thought = out_ids[1:1 + budget]
    assert (getattr(r.choices[0].message, "reasoning_content", None) or "") \
        == tok.decode(thought)
    assert r.usage.completion_tokens_details.reasoning_tokens == budget
    prompt = tok.encode(tok.apply_chat_template(THINKING_MESSAGES, True),
                        add_special_tokens=False)
    forced = [start, *thought, end]
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    answer = model.generate(torch.tensor([prompt + forced]), max_new_tokens=12 - len(forced),
                            do_sample=False)[0, len(prompt) + len(forced):].tolist()
    assert r.choices[0].message.content == tok.decode(answer)


def test_reasoning_effort_none_turns_thinking_off(client):
    r = client.responses.create(model="tiny", input=THINKING_MESSAGES[0]["content"],
                                max_output_tokens=8, temperature=0.0,
                                reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_messages_give_the_thinking_as_a_thinking_block(server, thinking):
    """/v1/messages (the anthropic client): the thinking is a thinking block before the
    text, streamed the same; thinking.budget_tokens is a reasoning budget; thinking
    disabled turns it off."""
    import anthropic
    path, info = thinking
    out_ids, end = info["output_ids"], info["end"]
    tok = load_tokenizer(path)
    cut = out_ids.index(end)
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    kw = dict(model="tiny", max_tokens=24, messages=THINKING_MESSAGES,
              extra_body={"ignore_eos": True, "temperature": 0.0})
    m = client.messages.create(thinking={"type": "adaptive"}, **kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == tok.decode(out_ids[1:cut])
    assert m.content[1].text == tok.decode(out_ids[cut + 1:])
    with client.messages.stream(thinking={"type": "adaptive"}, **kw) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in final.content] == [("thinking", m.content[0].thinking),
                                        ("text", m.content[1].text)]
    budget = client.messages.create(thinking={"type": "enabled", "budget_tokens": 2}, **kw)
    assert budget.content[0].thinking == tok.decode(out_ids[1:3])
    off = client.messages.create(thinking={"type": "disabled"}, **kw)
    assert [b.type for b in off.content] == ["text"]
