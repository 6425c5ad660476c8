"""Bad input (fuzzed bodies included: each a 400 naming the field, never a
500), auth, overload and requests that could never be admitted, disconnects,
cancellation storms and a failing request, over raw HTTP against real
servers."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import ServerProcess, free_port, metric, running_server
from tests.tiny_model import write_tiny_llama

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def post(url: str, body, **kw) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30, **kw)


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize("body, param", [
    ({"prompt": "w1", "temperature": "hot"}, "temperature"),
    ({"prompt": "w1", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "w1", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "w1", "n": 1000}, "n"),
    ({"prompt": "w1", "top_p": 0}, "top_p"),
    ({"prompt": "w1", "temperature": 1e9}, "temperature"),
    ({"prompt": "w1", "logprobs": 50}, "logprobs"),
    ({"prompt": "w1", "stop": [1, 2]}, "stop"),
    ({"prompt": "w1", "seed": -3}, "seed"),
    ({"prompt": "w1", "stream": "yes"}, "stream"),
    ({"prompt": "w1", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [5, 100000]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "w1", "model": "gpt-4"}, "model"),
    ({"prompt": "w1 " * 600}, "prompt"),
    ({"prompt": "w1", "max_tokens": 600}, "max_tokens"),
    ({"prompt": "w1", "echo": True}, "echo"),
    ({"prompt": "w1", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "w1", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": "w1", "logit_bias": {"100000": 1}}, "logit_bias"),
])
def test_completion_validation_names_the_field(server, body, param):
    err = error_of(post(server.url + CMPL, body))
    assert err["param"] == param and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools[0].function"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format.json_schema.name"),
    ({"messages": [{"role": "user", "content": "x"}], "max_reasoning_tokens": -1},
     "max_reasoning_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"},
     "reasoning_effort"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
     "continue_final_message"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
])
def test_chat_validation_names_the_field(server, body, param):
    err = error_of(post(server.url + CHAT, body))
    assert err["param"] == param


def test_unsupported_fields_say_so_and_unknown_ones_are_ignored(server):
    err = error_of(post(server.url + CHAT, {"messages": [{"role": "user", "content": "x"}],
                                            "functions": [{"name": "f"}]}))
    assert "not supported" in err["message"] and err["code"] == "unsupported_parameter"
    ok = post(server.url + CMPL, {"prompt": "w1", "max_tokens": 2, "frobnicate": 3})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
    assert "ignoring unknown fields frobnicate" in server.log()


def test_malformed_requests(server):
    r = httpx.post(server.url + CMPL, content=b"{nope", headers={"content-type":
                                                                 "application/json"})
    assert "not valid JSON" in error_of(r)["message"]
    r = httpx.post(server.url + CMPL, content=b'{"prompt": "w1"}',
                   headers={"content-type": "text/plain"})
    assert "Content-Type must be application/json" in error_of(r)["message"]
    r = httpx.post(server.url + CMPL, content=b"[1, 2]",
                   headers={"content-type": "application/json"})
    assert "must be a JSON object" in error_of(r)["message"]
    assert error_of(httpx.get(server.url + "/v1/nothing"), 404)["code"] == "not_found"
    assert error_of(httpx.get(server.url + CMPL), 405)["code"] == "method_not_allowed"
    assert error_of(post(server.url + "/detokenize", {"tokens": [1, -4]}))["param"] == "tokens"


def raw_post(url: str, raw: bytes) -> httpx.Response:
    """A body as written, for what json.dumps would not produce (lone surrogates
    escaped in JSON are valid JSON, but not valid Unicode text)."""
    return httpx.post(url, content=raw, headers={"content-type": "application/json"},
                      timeout=30)


@pytest.mark.parametrize("path, raw, param", [
    (CMPL, r'{"prompt": "\ud800x"}', "prompt"),
    (CMPL, r'{"prompt": ["w1", "w2 \udfff"]}', "prompt[1]"),
    (CHAT, r'{"messages": [{"role": "user", "content": "\ud83d"}]}', "messages[0].content"),
    (CHAT, r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}',
     "messages[0].content[0].text"),
    (CHAT, r'{"messages": [{"role": "user", "content": "w1"}], "stop": ["\ud800"]}', "stop[0]"),
    ("/tokenize", r'{"prompt": "w1 \ud800"}', "prompt"),
    (CMPL, r'{"prompt": "w1", "\ud800": 1}', "request"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, raw, param):
    err = error_of(raw_post(server.url + path, raw.encode()))
    assert err["param"] == param and "surrogate" in err["message"]


@pytest.mark.parametrize("name", ["messages", "add_generation_prompt", "continue_final_message",
                                  "bos_token", "eos_token", "raise_exception", "strftime_now"])
def test_chat_template_kwargs_may_not_replace_the_template_calls_own(server, name):
    r = post(server.url + CHAT, {"messages": [{"role": "user", "content": "w1"}],
                                 "chat_template_kwargs": {name: "x", "harmless": 1}})
    err = error_of(r)
    assert err["param"] == "chat_template_kwargs" and name in err["message"]
    ok = post(server.url + CHAT, {"messages": [{"role": "user", "content": "w1"}],
                                  "max_tokens": 2, "chat_template_kwargs": {"harmless": 1}})
    assert ok.status_code == 200


def test_deeply_nested_bodies_are_a_400(server):
    deep = b'{"prompt": "w1", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    err = error_of(raw_post(server.url + CMPL, deep))
    assert err["code"] == "invalid_json" and "nested deeper" in err["message"]
    nested = '{"prompt": "w1", "metadata": {"a": ' + "[" * 100 + "]" * 100 + "}}"
    err = error_of(raw_post(server.url + CMPL, nested.encode()))
    assert err["param"] == "metadata" and "nested deeper than 64" in err["message"]
    fine = '{"prompt": "w1", "max_tokens": 2, "metadata": {"a": ' + "[" * 30 + "]" * 30 + "}}"
    assert raw_post(server.url + CMPL, fine.encode()).status_code == 200


# -- a server with small limits and an API key --------------------------------------------

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def strict(tiny_model, tmp_path_factory):
    with running_server(tiny_model, tmp_path_factory, "strict", "--dtype", "float32",
                        "--kv-cache-gib", "0.01", "--served-model-name", "tiny",
                        "--api-key", KEY, "--max-request-bytes", "2000",
                        "--max-num-seqs", "1", "--max-waiting-requests", "1") as srv:
        yield srv


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_api_key(strict):
    assert httpx.get(strict.url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(strict.url + "/v1/models", headers=headers)
        assert error_of(r, 401)["code"] == "invalid_api_key"
        assert error_of(post(strict.url + CMPL, {"prompt": "w1"}, headers=headers),
                        401)["type"] == "authentication_error"
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key=KEY)
    assert client.completions.create(model="tiny", prompt="w1", max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=strict.url + "/v1", api_key="nope",
                      max_retries=0).models.list()


def test_oversized_body(strict):
    err = error_of(post(strict.url + CMPL, {"prompt": "w1 " * 1000}, headers=AUTH))
    assert err["code"] == "request_too_large" and "2000 bytes" in err["message"]


def test_overload_is_503_with_retry_after(strict):
    """One running + one waiting allowed: of 8 concurrent requests some are refused at
    once, the admitted ones complete, and the server accepts again afterwards."""
    async def main():
        async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
            return await asyncio.gather(*(c.post(strict.url + CMPL, json={
                "prompt": f"w{i}", "max_tokens": 300, "ignore_eos": True}) for i in range(8)))

    results = asyncio.run(main())
    refused = [r for r in results if r.status_code == 503]
    served = [r for r in results if r.status_code == 200]
    assert len(refused) + len(served) == 8 and refused and len(served) >= 2
    for r in refused:
        assert error_of(r, 503)["code"] == "server_overloaded"
        assert r.headers["retry-after"] == "1"
    assert all(r.json()["usage"]["completion_tokens"] == 300 for r in served)
    assert metric(strict.url, "armllm:requests_rejected_overload_total",
                  AUTH) == len(refused)
    assert post(strict.url + CMPL, {"prompt": "w1", "max_tokens": 2},
                headers=AUTH).status_code == 200


@pytest.mark.parametrize("body, param", [
    ({"prompt": ["w1", "w2", "w3"]}, "prompt"),             # three prompts, a bound of two
    ({"prompt": "w1", "n": 3}, "n"),
    ({"prompt": ["w1", "w2"], "n": 2}, "n"),
])
def test_a_request_that_could_never_be_admitted_is_a_400(strict, body, param):
    """Not a 503 the client would retry forever: it says why and what to change."""
    before = metric(strict.url, "armllm:requests_rejected_overload_total", AUTH)
    r = post(strict.url + CMPL, {**body, "max_tokens": 2}, headers=AUTH)
    err = error_of(r)
    assert err["param"] == param and err["code"] == "exceeds_server_capacity"
    assert "at most 2 at once" in err["message"] and "retry-after" not in r.headers
    assert metric(strict.url, "armllm:requests_rejected_overload_total", AUTH) == before


def test_a_thousand_prompts_are_a_400_on_a_server_holding_fewer(server):
    r = post(server.url + CMPL, {"prompt": [f"w{i % 50}" for i in range(1000)]})
    err = error_of(r)
    assert err["param"] == "prompt" and err["code"] == "exceeds_server_capacity"
    assert "1000 completions" in err["message"] and "at most 272 at once" in err["message"]


# -- disconnects and cancellation -----------------------------------------------------------

def wait_idle(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(url, "armllm:kv_cache_usage_perc") == 0.0 and \
                metric(url, "armllm:num_requests_running") == 0 and \
                metric(url, "armllm:num_requests_in_flight") == 0:
            return
        time.sleep(0.02)
    raise AssertionError(httpx.get(url + "/metrics").text)


def aborted(url: str) -> float:
    return metric(url, 'armllm:request_success_total{model_name="tiny",finished_reason="abort"}')


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """A wider, deeper tiny model (about a millisecond a decode step), so that 500 tokens
    outlast a client that hangs up after its first events: the shared tiny model can
    finish them before the disconnect is seen."""
    model = write_tiny_llama(tmp_path_factory.mktemp("slow-model"), hidden=256, layers=8,
                             inter=512)
    with running_server(model, tmp_path_factory, "slow", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.05",
                        "--max-num-seqs", "16", "--served-model-name", "tiny") as srv:
        yield srv


def test_streaming_disconnect_aborts_and_frees_blocks(slow_server):
    server = slow_server
    before = aborted(server.url)
    body = {"prompt": "w1 w2", "max_tokens": 500, "ignore_eos": True, "stream": True, "n": 8}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + CMPL, json=body) as s:
        lines = s.iter_lines()
        for _ in range(3):
            next(lines)
        assert metric(server.url, "armllm:kv_cache_usage_perc") > 0
    wait_idle(server.url)
    assert aborted(server.url) == before + 8


def test_non_streaming_disconnect_aborts(slow_server):
    """The client hangs up while its 8 completions run (seen on /metrics): all 8 abort. A
    fixed client timeout would race the engine's speed (8 x 500 tokens of the tiny model
    can finish in a fifth of a second)."""
    server = slow_server
    before = aborted(server.url)
    body = json.dumps({"prompt": "w3", "max_tokens": 500, "n": 8, "ignore_eos": True}).encode()
    head = (f"POST {CMPL} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 30
        while metric(server.url, "armllm:num_requests_running") < 8:
            assert time.monotonic() < deadline, "the 8 completions never ran together"
    wait_idle(server.url)
    assert aborted(server.url) == before + 8


def test_fifty_mixed_requests_with_cancellations_leak_nothing(server):
    async def one(client: openai.AsyncOpenAI, i: int):
        if i % 3 == 0:  # a streaming request cancelled after a few chunks
            stream = await client.completions.create(model="tiny", prompt=f"w{i}",
                                                     max_tokens=300, stream=True,
                                                     extra_body={"ignore_eos": True})
            got = 0
            async for _ in stream:
                got += 1
                if got == 3 + i % 5:
                    break
            await stream.close()
            return "cancelled"
        if i % 3 == 1:
            out = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"w{i}"}],
                max_tokens=5 + i % 7, stream=(i % 2 == 0), temperature=0.7, seed=i)
            if i % 2 == 0:
                async for _ in out:
                    pass
            return "ok"
        out = await client.completions.create(model="tiny", prompt=[f"w{i}", f"w{i + 1}"],
                                              max_tokens=4, n=2)
        return len(out.choices)

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x") as client:
            return await asyncio.gather(*(one(client, i) for i in range(50)))

    results = asyncio.run(main())
    assert results.count("cancelled") == 17 and results.count(4) == 16
    wait_idle(server.url)
    free = metric(server.url, "armllm:kv_cache_free_blocks")
    assert free == metric(server.url, "armllm:kv_cache_blocks")


# -- a request failing inside the engine -----------------------------------------------------

def test_a_failing_request_gets_500_and_others_are_served(tiny_model):
    """An in-process uvicorn server whose engine fails sampling for one prompt token."""
    import uvicorn

    from armllm.api import AsyncLLM
    from armllm.server.app import ServerConfig, create_app
    llm = AsyncLLM(tiny_model, dtype="float32", kv_cache_gib=0.01)
    sample = llm.engine.runner.sample

    def flaky(jobs, logits, masks):
        sample(jobs, logits, masks)
        for job in jobs:
            if job.seq.prompt_ids[-1] == 77:
                job.error = RuntimeError("injected sampling failure")

    llm.engine.runner.sample = flaky
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ServerConfig(tiny_model, "tiny"), llm),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        while not server.started:
            time.sleep(0.02)
        bad = post(url + CMPL, {"prompt": [5, 77], "max_tokens": 3})
        assert error_of(bad, 500)["code"] == "generation_error"
        assert "injected sampling failure" in bad.json()["error"]["message"]
        with httpx.stream("POST", url + CMPL, json={"prompt": [5, 77], "max_tokens": 3,
                                                    "stream": True}) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: {")]
        assert "injected sampling failure" in events[-1]["error"]["message"]
        good = post(url + CMPL, {"prompt": [5, 78], "max_tokens": 3, "ignore_eos": True})
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3
        deadline = time.monotonic() + 10  # the stats snapshot follows the step that answered
        while (stats := llm.stats()).num_free_blocks != stats.num_blocks:
            assert time.monotonic() < deadline, stats
            time.sleep(0.01)
    finally:
        server.should_exit = True
        thread.join(30)


def test_smollm2_health_while_loading_greedy_output_and_stats_log(tmp_path, smollm2_gguf):
    """SmolLM2: /health is 503 while the model loads, then greedy chat output over HTTP
    equals LLM.chat in process, and the periodic stats line is logged."""
    from armllm.api import LLM
    from armllm.sampling import SamplingParams
    model = smollm2_gguf
    srv = ServerProcess(model, "--kv-cache-gib", "0.05", "--log-interval", "0.2",
                        log=tmp_path / "s.log")
    try:
        seen = srv.wait_ready()
        assert seen[0] == 503 and seen[-1] == 200
        r = httpx.get(srv.url + "/v1/models").json()
        name = r["data"][0]["id"]
        assert name == "SmolLM2-135M-Instruct.Q4_1"
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
        got = client.chat.completions.create(model=name, messages=msgs, max_tokens=24,
                                             temperature=0)
        want = LLM(model, kv_cache_gib=0.05).chat(msgs, SamplingParams(max_tokens=24,
                                                                       temperature=0.0))
        assert got.choices[0].message.content == want.text
        assert got.choices[0].finish_reason == want.finish_reason
        time.sleep(0.5)
        assert "generation" in srv.log() and "KV usage" in srv.log()
    finally:
        assert srv.stop() == 0
