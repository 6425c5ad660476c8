"""DRY, XTC and bad_words on every generating route of a real `armllm serve` (the
tiny chat model, a byte-level tokenizer): bad words never appear in the output of
chat completions, completions, Responses and Messages; DRY changes a repetitive
greedy output; a seeded XTC request repeats itself; bad values are 400s naming the
field, in OpenAI's error body and in Anthropic's on /v1/messages."""
from __future__ import annotations

import httpx
import openai
import pytest

PROMPT = "Count: one two one two one two one two"
MESSAGES = [{"role": "user", "content": PROMPT}]


def chat_text(client, **extra) -> str:
    return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=32,
                                          temperature=0, extra_body={"ignore_eos": True,
                                                                     **extra}
                                          ).choices[0].message.content


def banned_char(text: str) -> str:
    """A character of the text that is one byte (one token of the byte-level
    tokenizer): banning it removes it."""
    return next(c for c in text if c.isascii() and c.isalnum())


def test_chat_bad_words_never_appear(chat_client):
    free = chat_text(chat_client)
    word = banned_char(free)
    assert word not in chat_text(chat_client, bad_words=[word])


def test_completions_responses_and_messages_take_bad_words(chat_client, chat_server):
    free = chat_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32,
                                          temperature=0, extra_body={"ignore_eos": True})
    word = banned_char(free.choices[0].text)
    got = chat_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32,
                                         temperature=0, extra_body={"ignore_eos": True,
                                                                    "bad_words": [word]})
    assert word not in got.choices[0].text
    free = chat_client.responses.create(model="tiny", input=PROMPT, max_output_tokens=32,
                                        temperature=0)
    word = banned_char(free.output_text)
    got = chat_client.responses.create(model="tiny", input=PROMPT, max_output_tokens=32,
                                       temperature=0, extra_body={"bad_words": [word]})
    assert word not in got.output_text
    body = {"model": "tiny", "max_tokens": 32, "messages": MESSAGES, "temperature": 0.0}
    free = httpx.post(chat_server.url + "/v1/messages", json=body, timeout=60).json()
    word = banned_char(free["content"][0]["text"])
    got = httpx.post(chat_server.url + "/v1/messages", json={**body, "bad_words": [word]},
                     timeout=60).json()
    assert word not in "".join(b.get("text", "") for b in got["content"])


def test_dry_changes_a_repetitive_output(chat_client, chat_server):
    free = chat_text(chat_client)
    dry = chat_text(chat_client, dry_multiplier=50.0, dry_allowed_length=1,
                    dry_sequence_breakers=["\u2603"])
    assert dry != free
    body = {"model": "tiny", "max_tokens": 32, "messages": MESSAGES, "temperature": 0.0}
    plain = httpx.post(chat_server.url + "/v1/messages", json=body, timeout=60).json()
    messages_dry = httpx.post(chat_server.url + "/v1/messages", json={
        **body, "dry_multiplier": 50.0, "dry_allowed_length": 1}, timeout=60).json()
    assert messages_dry["content"] != plain["content"]


def test_a_seeded_xtc_request_repeats_itself(chat_client):
    def run():
        return chat_client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=24, temperature=1.0, seed=5,
            extra_body={"xtc_probability": 0.7, "xtc_threshold": 0.01, "ignore_eos": True,
                        "dry_multiplier": 0.5}).choices[0].message.content
    assert run() == run()


BAD = [({"dry_base": 0.5}, "dry_base"), ({"dry_multiplier": -1}, "dry_multiplier"),
       ({"dry_allowed_length": -1}, "dry_allowed_length"),
       ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
       ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers"),
       ({"dry_sequence_breakers": "x"}, "dry_sequence_breakers"),
       ({"xtc_probability": 1.5}, "xtc_probability"),
       ({"xtc_threshold": -0.5}, "xtc_threshold"), ({"bad_words": [3]}, "bad_words")]


@pytest.mark.parametrize("extra,param", BAD)
@pytest.mark.parametrize("route", ["chat/completions", "completions", "responses"])
def test_bad_values_are_openai_400s_naming_the_field(chat_server, route, extra, param):
    body = {"chat/completions": {"messages": MESSAGES, "max_tokens": 4},
            "completions": {"prompt": PROMPT, "max_tokens": 4},
            "responses": {"input": PROMPT, "max_output_tokens": 4}}[route]
    r = httpx.post(f"{chat_server.url}/v1/{route}", json={"model": "tiny", **body, **extra},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err


@pytest.mark.parametrize("extra,param", BAD)
def test_bad_values_are_anthropic_400s_on_messages(chat_server, extra, param):
    body = {"model": "tiny", "max_tokens": 4, "messages": MESSAGES, **extra}
    r = httpx.post(chat_server.url + "/v1/messages", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert param in err["error"]["message"], err


def test_the_sdk_raises_bad_request(chat_client):
    with pytest.raises(openai.BadRequestError, match="xtc_threshold"):
        chat_text(chat_client, xtc_threshold=2)
