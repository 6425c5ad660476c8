"""Structured outputs through a real `armllm serve` and the official openai client:
response_format (json_object, json_schema, the client's parse() with Pydantic
models), vLLM's structured_outputs (regex, choice, grammar), the 400s for bad
grammars, and a constrained request beside unconstrained ones leaving theirs
unchanged. The model is tiny and random: every output is what the grammar
forces, so validity is the grammar engine's and the mask's work alone."""
from __future__ import annotations

import enum
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field, create_model

from tests.server.conftest import running_server

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Describe a person."}]


# -- 20 random schemas through parse() -------------------------------------------------------

def random_model(rng: random.Random, name: str, depth: int = 0) -> type[BaseModel]:
    """A Pydantic model of 1-4 fields drawn from strings, bounded numbers, booleans,
    enums, arrays and nested models, some optional."""
    fields = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(["str", "int", "float", "bool", "enum", "list", "nested"]
                          if depth < 2 else ["str", "int", "bool", "enum"])
        if kind == "str":
            ann, default = str, Field(..., max_length=rng.randint(1, 12))
        elif kind == "int":
            lo = rng.randint(-50, 50)
            ann, default = int, Field(..., ge=lo, le=lo + rng.randint(0, 1000))
        elif kind == "float":
            ann, default = float, Field(..., ge=0.0, le=1.0)
        elif kind == "bool":
            ann, default = bool, ...
        elif kind == "enum":
            ann, default = enum.Enum(f"{name}E{i}", {f"V{j}": f"v{j}"
                                                     for j in range(rng.randint(1, 4))}), ...
        elif kind == "list":
            ann, default = list[int], Field(..., max_length=rng.randint(0, 3))
        else:
            ann, default = random_model(rng, f"{name}N{i}", depth + 1), ...
        if rng.random() < 0.3:
            ann, default = ann | None, None
        fields[f"f{i}_{kind}"] = (ann, default)
    return create_model(name, **fields)


def test_parse_returns_valid_objects_for_random_schemas(chat_client):
    rng = random.Random(7)
    models = [random_model(rng, f"M{k}") for k in range(20)]

    def one(k: int):
        return chat_client.chat.completions.parse(
            model="tiny", messages=MESSAGES, response_format=models[k], max_tokens=1000,
            temperature=1.0, seed=k)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(20)))
    for model, completion in zip(models, results, strict=True):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, model)  # Pydantic validated it too
        jsonschema.validate(json.loads(choice.message.content), model.model_json_schema())


def test_json_object_and_json_schema_on_both_endpoints(chat_server, chat_client):
    schema = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 3,
                                                      "maximum": 9},
                                               "tags": {"type": "array", "maxItems": 2,
                                                        "items": {"enum": ["a", "b"]}}},
              "required": ["id", "tags"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema,
                                                  "strict": True}}
    for seed in range(3):
        chat = chat_client.chat.completions.create(model="tiny", messages=MESSAGES, seed=seed,
                                              response_format=fmt, max_tokens=200)
        jsonschema.validate(json.loads(chat.choices[0].message.content), schema)
        text = chat_client.completions.create(model="tiny", prompt="Data:", seed=seed,
                                         max_tokens=200, extra_body={"response_format": fmt})
        jsonschema.validate(json.loads(text.choices[0].text), schema)
        any_object = chat_client.chat.completions.create(
            model="tiny", messages=MESSAGES, seed=seed, max_tokens=300,
            response_format={"type": "json_object"})
        c = any_object.choices[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
        else:  # max_tokens inside the object: cut, as OpenAI's, and a prefix of one
            assert c.finish_reason == "length" and c.message.content.startswith("{")


def test_regex_choice_and_grammars_always_match(chat_client):
    # [0-9], not \d: llguidance's \d takes every Unicode digit (newer Unicode than
    # Python's re knows, e.g. U+10D43), and a byte-level model may sample one
    pattern = r"[A-Z][a-z]{2,5}-[0-9]{3}"
    grammar = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'
    gbnf = 'root ::= "<" [a-c]+ ">"'
    for seed in range(6):
        def run(so, seed=seed):
            r = chat_client.chat.completions.create(model="tiny", messages=MESSAGES, seed=seed,
                                               max_tokens=60, temperature=1.0,
                                               extra_body={"structured_outputs": so})
            return r.choices[0]
        c = run({"regex": pattern})
        assert c.finish_reason == "stop" and re.fullmatch(pattern, c.message.content)
        c = run({"choice": ["red", "green", "blue"]})
        assert c.message.content in ("red", "green", "blue")
        c = run({"grammar": grammar})
        assert re.fullmatch(r"\(\d{1,3}(,\d{1,3})*\)", c.message.content), c.message.content
        c = run({"grammar": gbnf})
        assert re.fullmatch(r"<[a-c]+>", c.message.content), c.message.content


def test_streamed_constrained_output_equals_the_whole(chat_client):
    kw = dict(model="tiny", messages=MESSAGES, seed=3, max_tokens=80,
              extra_body={"structured_outputs": {"regex": r"[a-z ]{5,40}\."}})
    whole = chat_client.chat.completions.create(**kw).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in
             chat_client.chat.completions.create(stream=True, **kw) if c.choices]
    assert "".join(parts) == whole and re.fullmatch(r"[a-z ]{5,40}\.", whole)


@pytest.mark.parametrize("path, extra, param, words", [
    (CHAT, {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format", "Invalid type"),
    (CHAT, {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": {"if": {}}}}},
     "response_format", "Unimplemented keys"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format.json_schema.name", "non-empty string"),
    (CHAT, {"response_format": {"type": "yaml"}}, "response_format.type", "yaml"),
    (CMPL, {"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "unclosed group"),
    (CMPL, {"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs",
     "unknown name"),
    (CMPL, {"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty list"),
    (CMPL, {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one"),
    (CMPL, {"structured_outputs": {"xml": "<a/>"}}, "structured_outputs", "unknown fields"),
    (CMPL, {"structured_outputs": {"json": "{not json"}}, "structured_outputs",
     "not valid JSON"),
])
def test_bad_grammars_are_400s_naming_the_problem(chat_server, path, extra, param, words):
    body = {"model": "tiny", "max_tokens": 5, **extra,
            **({"messages": MESSAGES} if path == CHAT else {"prompt": "x"})}
    r = httpx.post(chat_server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    # nothing was queued: the server still answers at once
    ok = httpx.post(chat_server.url + CMPL, json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200


def test_a_constrained_request_leaves_its_batch_neighbours_unchanged(chat_server, chat_client):
    """Greedy unconstrained requests give the same tokens alone and beside
    constrained ones in the same steps."""
    prompts = [f"Story {i}:" for i in range(4)]

    def plain(p: str):
        return chat_client.completions.create(model="tiny", prompt=p, max_tokens=24,
                                         temperature=0.0).choices[0].text

    alone = [plain(p) for p in prompts]

    def constrained(k: int):
        return chat_client.completions.create(
            model="tiny", prompt="JSON:", max_tokens=24, temperature=1.0, seed=k,
            extra_body={"response_format": {"type": "json_object"}}).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        cons = [pool.submit(constrained, k) for k in range(4)]
        mixed = list(pool.map(plain, prompts))
        assert all(c.result().startswith("{") for c in cons)
    assert mixed == alone


def test_smollm2_parse_regex_and_choice(tmp_path_factory, smollm2_gguf):
    """The real SmolLM2 (vocabulary 49k, a GGUF-rebuilt tokenizer) under constraints:
    parse() returns a valid object of a nested Pydantic model; regex and choice match."""

    class Address(BaseModel):
        city: str = Field(max_length=20)
        zip_code: str = Field(pattern=r"^[0-9]{5}$")

    class Person(BaseModel):
        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=120)
        address: Address
        hobbies: list[str] = Field(max_length=3)

    with running_server(smollm2_gguf, tmp_path_factory, "smollm2-structured",
                        "--kv-cache-gib", "0.05", "--served-model-name", "smol") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "Invent a person living in Paris, as JSON."}]
        for seed in range(3):
            r = client.chat.completions.parse(model="smol", messages=msgs, seed=seed,
                                              response_format=Person, max_tokens=200)
            assert isinstance(r.choices[0].message.parsed, Person), r.choices[0].message
        r = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Is Paris in France?"}],
            max_tokens=10, temperature=0.0,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert r.choices[0].message.content in ("yes", "no")
        r = client.completions.create(model="smol", prompt="The year the Eiffel Tower opened:",
                                      max_tokens=10, temperature=0.0,
                                      extra_body={"structured_outputs": {"regex": r"1[89]\d\d"}})
        assert re.fullmatch(r"1[89]\d\d", r.choices[0].text)
