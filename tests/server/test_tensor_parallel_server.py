"""`armllm serve -tp 2` as a real process: it answers as one rank does, and a
rank killed mid-generation (SIGKILL: no cleanup of its own) ends the request in
flight with an error naming the rank, turns /health away and exits non-zero
within seconds, leaving no process and no /dev/shm segment behind."""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from tests.processes import segments, tp_workers
from tests.server.conftest import running_server


@pytest.fixture(scope="module")
def tp_server(smollm2_gguf, tmp_path_factory):
    with running_server(smollm2_gguf, tmp_path_factory, "tp", "-tp", "2", "--dtype",
                        "float32", "--quantization", "none", "--kv-cache-dtype", "f32",
                        "--kv-cache-gib", "0.05", "--max-model-len", "512",
                        "--served-model-name", "smol") as srv:
        yield srv


def test_answers_as_one_rank(tp_server, smollm2_gguf):
    from armllm import LLM, SamplingParams
    assert len(tp_workers(tp_server.proc.pid)) == 1
    body = {"model": "smol", "prompt": "The capital of France is", "max_tokens": 24,
            "temperature": 0}
    got = httpx.post(tp_server.url + "/v1/completions", json=body, timeout=60).json()
    llm = LLM(smollm2_gguf, dtype="float32", quantization="none", kv_cache_dtype="f32",
              kv_cache_gib=0.05, max_model_len=512)
    want = llm.generate("The capital of France is", SamplingParams(max_tokens=24,
                                                                    temperature=0))
    assert got["choices"][0]["text"] == want[0].text


def test_killed_rank_ends_the_server(smollm2_gguf, tmp_path_factory):
    with running_server(smollm2_gguf, tmp_path_factory, "tp-kill", "-tp", "2",
                        "--kv-cache-gib", "0.05", "--max-model-len", "1024") as srv:
        (worker,) = tp_workers(srv.proc.pid)
        body = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True,
                "stream": True, "temperature": 0}
        events = []
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            for line in lines:   # generation is under way
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 5:
                        break
            os.kill(worker, signal.SIGKILL)
            killed = time.monotonic()
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        ended = time.monotonic() - killed
        assert ended < 5, ended
        error = rest[-1]["error"]
        assert "tensor-parallel rank 1" in error["message"]
        assert "SIGKILL" in error["message"]
        try:
            health = httpx.get(srv.url + "/health", timeout=2).status_code
        except httpx.TransportError:
            health = None   # already gone
        assert health in (503, None)
        code = srv.proc.wait(timeout=5)
        assert code != 0
        assert "the engine stopped" in srv.log()
    assert not tp_workers(srv.proc.pid)
    assert not any(s.startswith(f"armllm-tp-{srv.proc.pid}-") for s in segments())


def test_normal_stop_leaves_nothing(smollm2_gguf, tmp_path_factory):
    with running_server(smollm2_gguf, tmp_path_factory, "tp-stop", "-tp", "2",
                        "--kv-cache-gib", "0.05", "--max-model-len", "256") as srv:
        (worker,) = tp_workers(srv.proc.pid)
    assert srv.proc.returncode == 0
    assert not os.path.exists(f"/proc/{worker}")
    assert not any(s.startswith(f"armllm-tp-{srv.proc.pid}-") for s in segments())


def test_rank_dying_while_idle_ends_the_server(smollm2_gguf, tmp_path_factory):
    with running_server(smollm2_gguf, tmp_path_factory, "tp-idle", "-tp", "2",
                        "--kv-cache-gib", "0.05", "--max-model-len", "256") as srv:
        (worker,) = tp_workers(srv.proc.pid)
        os.kill(worker, signal.SIGKILL)
        assert srv.proc.wait(timeout=5) != 0
        assert "tensor-parallel rank 1" in srv.log()
