"""`armllm bench serve` against a real armllm server (exact counts and lengths,
the JSON schema, the sampling every request states), against llama.cpp's
llama-server (its sampling fields and sampler chain), and against a small real
HTTP server that streams at known intervals (TTFT/ITL/TPOT arithmetic,
failures, SLOs and sweeps)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from armllm.cli import main
from tests import llama_cpp_tools
from tests.server.conftest import ServerProcess, free_port
from tests.tiny_model import write_tiny_llama

SUMMARY_KEYS = {"max_concurrency", "request_rate", "completed", "failed", "duration_s",
                "request_throughput", "output_throughput", "total_token_throughput",
                "total_input_tokens", "total_output_tokens", "total_cached_input_tokens",
                "peak_concurrency", "errors", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}
STAT_KEYS = {"mean", "median", "std", "p50", "p90", "p95", "p99"}
RECORD_KEYS = {"index", "input_tokens", "output_tokens_requested", "success", "error",
               "start_s", "ttft_s", "e2e_s", "itl_s", "output_tokens", "server_prompt_tokens",
               "server_cached_tokens", "tpot_s"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-bench"))


@pytest.fixture(scope="module")
def armllm_server(tiny, tmp_path_factory):
    srv = ServerProcess(tiny, "--dtype", "float32", "--kv-cache-gib", "0.01",
                        "--served-model-name", "tiny",
                        log=tmp_path_factory.mktemp("log") / "server.log")
    srv.wait_ready()
    yield srv
    srv.stop()


def test_counts_exact_lengths_and_json_schema(armllm_server, tiny, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["bench", "serve", "--base-url", armllm_server.url + "/v1", "--tokenizer",
               str(tiny), "--input-len", "10", "--output-len", "7", "--num-prompts", "12",
               "--max-concurrency", "4", "--json", str(out), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "completed 12, failed 0" in text and "model 'tiny'" in text
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 2 and set(doc) == {"schema_version", "tool", "settings",
                                                       "sampling", "runs"}
    (run,) = doc["runs"]
    s = run["summary"]
    assert set(s) == SUMMARY_KEYS
    assert all(set(s[f"{m}_ms"]) == STAT_KEYS for m in ("ttft", "tpot", "itl", "e2e"))
    assert s["completed"] == 12 and s["failed"] == 0 and s["peak_concurrency"] == 4
    assert s["total_output_tokens"] == 12 * 7 and s["total_input_tokens"] == 12 * 10
    assert len(run["requests"]) == 12
    for r in run["requests"]:
        assert set(r) == RECORD_KEYS
        assert r["server_prompt_tokens"] == 10 and r["output_tokens"] == 7
        assert r["server_cached_tokens"] == 0   # random prompts share no block
        assert len(r["itl_s"]) == 6   # one chunk per token from armllm
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / 6)
    assert s["output_throughput"] == pytest.approx(84 / s["duration_s"])


# -- the sampling every request states -----------------------------------------------------

# what the generation_config.json of tiny_with_defaults sets; the server's model (tiny)
# sets nothing, so what a request omits gets armllm's fallback (min_p 0.05 among them)
MODEL_DEFAULTS = {"temperature": 0.6, "top_p": 0.95}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@pytest.fixture(scope="module")
def tiny_with_defaults(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny-defaults"))
    (path / "generation_config.json").write_text(json.dumps(MODEL_DEFAULTS))
    return path


@pytest.fixture(scope="module")
def observed_server(tiny):
    """An armllm server on tiny, in this process (uvicorn in a thread), and the
    SamplingParams of every request it hands its engine (AsyncLLM.generate, recorded
    on the way through)."""
    from armllm.api import AsyncLLM
    from armllm.server.app import ServerConfig, create_app
    llm = AsyncLLM(tiny, dtype="float32", kv_cache_gib=0.01)
    seen = []
    generate = llm.generate

    def recording(prompt, params, *args, **kwargs):
        seen.append(params)
        return generate(prompt, params, *args, **kwargs)

    llm.generate = recording
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ServerConfig(tiny, "tiny"), llm),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(30)
    llm.shutdown()


def sampling_of(params) -> dict:
    return {k: getattr(params, k) for k in SAMPLING_FIELDS}


def test_requests_state_the_tokenizer_model_s_defaults(observed_server, tiny_with_defaults,
                                                       tmp_path, capsys):
    """The defaults come from --tokenizer's model, and every field goes in the request:
    min_p 0 where the server would fill in its own model's fallback 0.05."""
    url, seen = observed_server
    seen.clear()
    out = tmp_path / "r.json"
    assert main(["bench", "serve", "--base-url", url, "--tokenizer", str(tiny_with_defaults),
                 "--input-len", "6", "--output-len", "4", "--num-prompts", "3", "--seed", "5",
                 "--json", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    want = {**MODEL_DEFAULTS, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    doc = json.loads(out.read_text())
    assert {k: doc["sampling"][k] for k in want} == want
    assert doc["sampling"]["defaults"] == "model" and not doc["sampling"]["greedy"]
    assert not set(SAMPLING_FIELDS) & set(doc["settings"])   # stated once, as used
    assert f"sampling: {doc['sampling']['description']}; openai fields" in text
    assert doc["runs"][0]["summary"]["completed"] == 3
    assert all(sampling_of(p) == want for p in seen)
    assert sorted(p.seed for p in seen) == [5, 6, 7, 8]   # 3 measured, then the warm-up


def test_greedy_and_overrides_reach_the_server(observed_server, tiny_with_defaults, capsys):
    url, seen = observed_server
    seen.clear()
    assert main(["bench", "serve", "--base-url", url, "--tokenizer", str(tiny_with_defaults),
                 "--endpoint", "chat", "--input-len", "6", "--output-len", "3",
                 "--num-prompts", "2", "--greedy", "--top-k", "3", "--min-p", "0.1",
                 "--repetition-penalty", "1.3", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "completed 2, failed 0" in text
    assert "sampling: greedy (temperature 0, repetition_penalty 1.3; temperature, top_k, " \
           "min_p, repetition_penalty from the command line, the rest the model's defaults)" \
           in text
    want = {"temperature": 0.0, "top_p": 0.95, "top_k": 3, "min_p": 0.1,
            "repetition_penalty": 1.3}
    assert len(seen) == 3 and all(sampling_of(p) == want for p in seen)


def test_llama_cpp_backend_sets_llama_server_s_sampler(smollm2_gguf, tmp_path, capsys):
    """llama-server takes the same values under its own names, its sampler chain cut to
    armllm's steps in armllm's order and its repetition window over the whole context;
    its /slots says what the last request ran with."""
    server = llama_cpp_tools.binary("llama-server")
    port = free_port()
    with open(tmp_path / "llama-server.log", "w") as log:
        proc = subprocess.Popen([str(server), "-m", str(smollm2_gguf), "--host", "127.0.0.1",
                                 "--port", str(port), "-np", "1", "-c", "256", "-t", "1"],
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "LD_LIBRARY_PATH": str(server.parent)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "llama-server.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert main(["bench", "serve", "--base-url", url + "/v1", "--tokenizer",
                     str(smollm2_gguf), "--backend", "llama.cpp", "--input-len", "8",
                     "--output-len", "4", "--num-prompts", "1", "--warmup", "0", "--top-k",
                     "7", "--repetition-penalty", "1.1", "--seed", "9",
                     "--no-progress"]) == 0
        assert "completed 1, failed 0" in capsys.readouterr().out
        params = httpx.get(url + "/slots", timeout=10, trust_env=False).json()[0]["params"]
    finally:
        proc.terminate()
        proc.wait(30)
    # SmolLM2's GGUF sets no sampling keys: armllm's fallback, then the command line
    assert params["samplers"] == ["penalties", "top_k", "temperature", "top_p", "min_p"]
    assert {k: params[k] for k in ("temperature", "top_p", "min_p", "repeat_penalty")} == \
        pytest.approx({"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1})
    assert params["top_k"] == 7 and params["seed"] == 9 and params["ignore_eos"]
    assert params["repeat_last_n"] >= 8 + 4
    assert (params["mirostat"], params["dynatemp_range"]) == (0, 0.0)


def prefix_cache_hits(server: ServerProcess) -> int:
    """armllm:prefix_cache_hits_total on the server's /metrics."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    found = re.search(r"^armllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert found, text
    return int(float(found.group(1)))


def test_chat_endpoint_and_shared_prefix(armllm_server, tiny, tmp_path, capsys):
    out = tmp_path / "r.json"
    hits_before = prefix_cache_hits(armllm_server)
    assert main(["bench", "serve", "--base-url", armllm_server.url + "/v1", "--tokenizer",
                 str(tiny), "--endpoint", "chat", "--dataset", "shared-prefix",
                 "--prefix-len", "32", "--input-len", "4", "--output-len", "3",
                 "--num-prompts", "6", "--json", str(out), "--no-progress"]) == 0
    run = json.loads(out.read_text())["runs"][0]
    s = run["summary"]
    assert s["completed"] == 6 and s["total_output_tokens"] == 18
    assert all(len(r["itl_s"]) == 2 for r in run["requests"])   # the role chunk is no token
    # every prompt, the warm-up's too, shares its first 32 tokens (after the chat
    # template's first one): once the warm-up has run, the server's prefix cache serves
    # them to every measured request, two KV blocks of 16 tokens each
    assert all(r["server_cached_tokens"] == 32 for r in run["requests"])
    assert s["total_cached_input_tokens"] == 6 * 32
    # and the server's own counter agrees (the warm-up found nothing cached)
    assert prefix_cache_hits(armllm_server) - hits_before == 6 * 32


# -- a server that streams at known intervals ----------------------------------------------

FIRST, GAP, TOKENS = 0.30, 0.10, 6


def slow_app() -> Starlette:
    async def completions(request: Request):
        body = await request.json()
        if "fail" in body["prompt"]:
            return JSONResponse({"error": {"message": "refused on purpose", "type": "x",
                                           "param": None, "code": None}}, status_code=500)

        async def stream():
            await asyncio.sleep(FIRST)
            for i in range(TOKENS):
                if i:
                    await asyncio.sleep(GAP)
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": f" t{i}"}]}) + \
                    "\n\n"
            yield "data: " + json.dumps({"choices": [], "usage": {
                "prompt_tokens": 3, "completion_tokens": TOKENS}}) + "\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(request: Request):
        return JSONResponse({"data": [{"id": "slow"}]})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/models", models)])


@pytest.fixture(scope="module")
def slow_server():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(slow_app(), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(10)


def test_latency_arithmetic_failures_and_slo(slow_server, tiny, tmp_path, capsys):
    data = tmp_path / "prompts.json"
    data.write_text(json.dumps(["w1 w2", {"prompt": "fail w3"}, "w4",
                                {"conversations": [{"from": "human", "value": "w5 w6"},
                                                   {"from": "gpt", "value": "w7 w8 w9"}]}]))
    out = tmp_path / "r.json"
    assert main(["bench", "serve", "--base-url", slow_server, "--tokenizer", str(tiny),
                 "--dataset", "json", "--dataset-path", str(data), "--num-prompts", "8",
                 "--output-len", "6", "--warmup", "0", "--slo",
                 "ttft_p95_ms=450,tpot_median_ms=150", "--json", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    s, reqs = doc["runs"][0]["summary"], doc["runs"][0]["requests"]
    assert s["completed"] == 6 and s["failed"] == 2
    assert s["errors"] == {"RuntimeError: HTTP 500: refused on purpose": 2}
    assert "error x2: RuntimeError: HTTP 500: refused on purpose" in text
    for r in (r for r in reqs if r["success"]):
        assert r["ttft_s"] == pytest.approx(FIRST, abs=0.12)
        assert len(r["itl_s"]) == TOKENS - 1
        assert all(g == pytest.approx(GAP, abs=0.06) for g in r["itl_s"])
        assert r["e2e_s"] == pytest.approx(FIRST + GAP * (TOKENS - 1), abs=0.15)
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / (TOKENS - 1))
    assert s["ttft_ms"]["median"] == pytest.approx(FIRST * 1e3, abs=120)
    assert s["itl_ms"]["median"] == pytest.approx(GAP * 1e3, abs=60)
    assert s["slo"]["ttft_p95_ms"]["pass"] and s["slo"]["tpot_median_ms"]["pass"]
    assert s["slo_pass"] is False          # failures fail the run
    assert s["goodput"] == pytest.approx(6 / s["duration_s"])


def test_sweep_reports_the_highest_passing_concurrency(slow_server, tiny, tmp_path, capsys):
    # one request takes ~0.8 s; E2E p95 under 3 s holds at any concurrency, even on a busy
    # machine, and under 0.1 s at none
    plot = tmp_path / "sweep.png"
    assert main(["bench", "serve", "--base-url", slow_server, "--tokenizer", str(tiny),
                 "--input-len", "4", "--output-len", "6", "--num-prompts", "4",
                 "--concurrency-sweep", "1,4", "--slo", "e2e_p95_ms=3000",
                 "--plot", str(plot), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "== sweep ==" in text and "highest concurrency meeting the SLO: 4" in text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bench", "serve", "--base-url", slow_server, "--tokenizer", str(tiny),
                 "--input-len", "4", "--output-len", "6", "--num-prompts", "2",
                 "--concurrency-sweep", "1,2", "--slo", "e2e_p95_ms=100",
                 "--no-progress"]) == 0
    assert "highest concurrency meeting the SLO: none" in capsys.readouterr().out


def test_poisson_rate_spreads_arrivals(slow_server, tiny, tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "serve", "--base-url", slow_server, "--tokenizer", str(tiny),
                 "--input-len", "4", "--output-len", "6", "--num-prompts", "6",
                 "--request-rate", "20", "--seed", "3", "--json", str(out),
                 "--no-progress"]) == 0
    starts = sorted(r["start_s"] for r in json.loads(out.read_text())["runs"][0]["requests"])
    assert 0.02 < starts[-1] - starts[0] < 2.0     # 5 gaps of mean 50 ms


@pytest.mark.parametrize("argv, message", [
    (["--slo", "ttft_p95=3"], "--slo"),
    (["--slo", "speed_p95_ms=3"], "--slo"),
    (["--request-rate", "0"], "--request-rate"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--concurrency-sweep", "1,x"], "--concurrency-sweep"),
    (["--dataset", "json"], "--dataset-path"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--greedy", "--temperature", "1"], "--greedy is --temperature 0"),
    (["--seed", "-3"], "--seed must be >= 0, got -3"),
])
def test_bad_arguments_exit_2(slow_server, tiny, capsys, argv, message):
    assert main(["bench", "serve", "--base-url", slow_server, "--tokenizer", str(tiny),
                 *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plot_without_matplotlib_is_refused_before_any_request(tiny, capsys, monkeypatch):
    """`--plot` on an install without matplotlib: exit 2 naming it, before the sweep runs
    (the base URL points nowhere, so a request would fail differently)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec: not installed
    assert main(["bench", "serve", "--base-url", "http://127.0.0.1:9/v1", "--tokenizer",
                 str(tiny), "--concurrency-sweep", "1,2", "--plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and err.count("\n") == 1
