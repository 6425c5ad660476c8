"""The server through the official openai client (sync and async, streaming
and not) against a real `armllm serve` process: outputs equal the in-process
LLM's greedy outputs, every endpoint and sampling field works, usage and
finish reasons are right, concurrent streams get exactly their own tokens."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from armllm.api import LLM
from armllm.sampling import SamplingParams
from tests.server.conftest import metric

PROMPTS = ["w1 w2 w3", "w7 w8", "w20 w21 w22 w23 w24", "w5"]


@pytest.fixture(scope="module")
def reference(tiny_model):
    return LLM(tiny_model, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def greedy(ref: LLM, prompt, max_tokens: int = 8, **kw) -> str:
    return ref.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                               ignore_eos=True, **kw))[0].text


def test_models_version_health(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"] and models[0].max_model_len == 512
    assert httpx.get(server.url + "/version").json()["version"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_completion_forms_equal_the_engine(client, reference):
    name = client.models.list().data[0].id
    extra = {"ignore_eos": True}
    one = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=8,
                                    temperature=0, extra_body=extra)
    assert one.choices[0].text == greedy(reference, PROMPTS[0])
    assert one.choices[0].finish_reason == "length"
    ids = reference.tokenizer.encode(PROMPTS[0])
    assert one.usage.prompt_tokens == len(ids) and one.usage.completion_tokens == 8
    assert one.usage.total_tokens == len(ids) + 8
    many = client.completions.create(model=name, prompt=PROMPTS, max_tokens=8, temperature=0,
                                     extra_body=extra)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert [c.text for c in many.choices] == [greedy(reference, p) for p in PROMPTS]
    tokens = client.completions.create(model=name, prompt=ids, max_tokens=8, temperature=0,
                                       extra_body=extra)
    assert tokens.choices[0].text == one.choices[0].text
    lists = client.completions.create(model=name, prompt=[ids, [5, 6, 7]], max_tokens=8,
                                      temperature=0, extra_body=extra)
    assert [c.text for c in lists.choices] == [one.choices[0].text,
                                               greedy(reference, [5, 6, 7])]


def test_chat_equals_the_engine_sync_and_streaming(client, reference):
    msgs = [{"role": "system", "content": "w9"}, {"role": "user", "content": "w1 w2"}]
    want = reference.chat(msgs, SamplingParams(max_tokens=10, temperature=0,
                                               ignore_eos=True)).text
    out = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                         temperature=0, extra_body={"ignore_eos": True})
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == want
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    parts = client.chat.completions.create(
        model="tiny", max_tokens=10, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": [{"type": "text", "text": "w9"}]},
                  {"role": "user", "content": [{"type": "text", "text": "w1"},
                                               {"type": "text", "text": " w2"}]}])
    assert parts.choices[0].message.content == want


def test_max_completion_tokens_and_stop(client, reference):
    full = greedy(reference, PROMPTS[2], 12)
    words = full.split()
    out = client.chat.completions.create(model="tiny", max_completion_tokens=3,
                                         messages=[{"role": "user", "content": "w3"}])
    assert out.usage.completion_tokens <= 3
    cut = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=12,
                                    temperature=0, stop=[words[4]],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop" and words[4] not in cut.choices[0].text
    assert full.startswith(cut.choices[0].text)
    stop_id = reference.tokenizer.encode(words[2], add_special_tokens=False)[0]
    by_id = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True,
                                                                 "stop_token_ids": [stop_id]})
    assert by_id.choices[0].finish_reason == "stop"
    assert by_id.usage.completion_tokens == 3


def test_omitted_max_tokens_is_16_for_completions_and_the_context_for_chat(client, reference):
    """OpenAI's default for /v1/completions is 16 tokens; chat, as vLLM's, may fill the
    rest of the context (max_model_len 512)."""
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 16 and out.choices[0].finish_reason == "length"
    assert out.choices[0].text == greedy(reference, PROMPTS[0], 16)
    chat = client.chat.completions.create(model="tiny", temperature=0,
                                          messages=[{"role": "user", "content": "w1"}],
                                          extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 512


def test_sampling_fields_seed_and_n(client):
    kw = dict(model="tiny", prompt=PROMPTS[1], max_tokens=12, temperature=1.3, top_p=0.9,
              presence_penalty=0.5, frequency_penalty=0.2, seed=7,
              extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1,
                          "ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    several = client.completions.create(**{**kw, "n": 3})
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.choices[0].text == a.choices[0].text     # completion 0: the seed's stream
    assert len({c.text for c in several.choices}) > 1
    assert several.usage.completion_tokens == 36


def test_logprobs(client, reference):
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4,
                                    temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and value <= 0.0
        assert max(top.values()) == pytest.approx(value)   # greedy: the best token
        assert tok in top
    assert lp.text_offset[0] == 0
    chat = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=2,
                                          messages=[{"role": "user", "content": "w4"}],
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)
    assert "".join(c.token for c in content).replace(" ", "") == \
        chat.choices[0].message.content.replace(" ", "")


def test_async_client_concurrent_streams_get_their_own_tokens(server, reference):
    want = {p: greedy(reference, p, 16) for p in PROMPTS}

    async def one(client, prompt):
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=16,
                                                 temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
        text = ""
        async for chunk in stream:
            text += chunk.choices[0].text
        return text

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x") as client:
            return await asyncio.gather(*(one(client, p) for p in PROMPTS * 3))

    got = asyncio.run(main())
    assert got == [want[p] for p in PROMPTS * 3]


def test_async_client_chat(server, reference):
    msgs = [{"role": "user", "content": "w11 w12"}]
    want = reference.chat(msgs, SamplingParams(max_tokens=6, temperature=0,
                                               ignore_eos=True)).text

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x") as client:
            return await client.chat.completions.create(model="tiny", messages=msgs,
                                                        max_tokens=6, temperature=0,
                                                        extra_body={"ignore_eos": True})

    assert asyncio.run(main()).choices[0].message.content == want


def test_continue_final_message(client, reference):
    msgs = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2 w3"}]
    out = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True, "continue_final_message": True,
                    "add_generation_prompt": False})
    prompt = reference.tokenizer.apply_chat_template(msgs, False, True)
    assert prompt.endswith("w2 w3")
    assert out.choices[0].message.content == greedy(
        reference, reference.tokenizer.encode(prompt, add_special_tokens=False), 5)


def test_tokenize_detokenize(server, reference):
    r = httpx.post(server.url + "/tokenize", json={"prompt": "w1 w2 w3"}).json()
    assert r["tokens"] == reference.tokenizer.encode("w1 w2 w3") and r["count"] == 3
    assert r["max_model_len"] == 512
    chat = httpx.post(server.url + "/tokenize",
                      json={"messages": [{"role": "user", "content": "w1"}]}).json()
    assert chat["tokens"] == reference.chat_prompt([{"role": "user", "content": "w1"}])
    back = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "w1 w2 w3"


def test_metrics_count_requests_and_tokens(server, client):
    before = metric(server.url, "armllm:generation_tokens_total")
    done = metric(server.url, 'armllm:request_success_total{model_name="tiny",'
                  'finished_reason="length"}')
    client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    assert metric(server.url, "armllm:generation_tokens_total") == before + 5
    text = httpx.get(server.url + "/metrics").text
    for name in ("armllm:time_to_first_token_seconds_bucket",
                 "armllm:inter_token_latency_seconds_count",
                 "armllm:e2e_request_latency_seconds_sum", "armllm:request_queue_time_seconds",
                 "armllm:request_prompt_tokens", "armllm:request_generation_tokens",
                 'finished_reason="length"', "armllm:prefix_cache_hits_total",
                 "armllm:kv_cache_usage_perc", "armllm:num_requests_waiting"):
        assert name in text, name
    assert metric(server.url, 'armllm:request_success_total{model_name="tiny",'
                  'finished_reason="length"}') == done + 1


@pytest.mark.parametrize("scheme", ["w8a8", "w4a8-asym"])
def test_serve_quantization_flag_from_a_float_checkpoint(tiny_model, tmp_path, scheme):
    """`armllm serve MODEL --quantization w8a8` quantizes the float checkpoint at
    load: the HTTP answers equal the in-process engine with the same scheme, and
    the startup log names it."""
    from tests.server.conftest import ServerProcess
    srv = ServerProcess(tiny_model, "--dtype", "float32", "--kv-cache-dtype", "f32",
                        "--kv-cache-gib", "0.02", "--served-model-name", "tiny",
                        "--quantization", scheme, log=tmp_path / "server.log")
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
        ref = LLM(tiny_model, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01,
                  quantization=scheme)
        for prompt in PROMPTS:
            got = client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                            temperature=0.0, extra_body={"ignore_eos": True})
            assert got.choices[0].text == greedy(ref, prompt)
        assert f"linear layers: {scheme}" in srv.log()
    finally:
        srv.stop()
