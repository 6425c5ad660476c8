"""`armllm serve -dp 2`: two engine replicas (this one and a process, one CPU
each on this 2-core box) behind one server, through a real HTTP client: the
same greedy text as one engine, 64 concurrent requests shared by both replicas
(each at least a quarter: the router gives more to whichever replica drains its
load faster, and their speeds differ on this shared box, 36/28 seen; the policy
itself is pinned exactly by tests/engine/test_replica_router.py), prompts
sharing their first blocks kept on one replica (its prefix cache hits),
per-replica /metrics, and a replica killed mid-request taken out of rotation
(its request ends with an error naming it; the next ones are served)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import httpx
import pytest

from tests.processes import tp_workers
from tests.server.conftest import running_server

ENGINE = ("--dtype", "float32", "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
          "--served-model-name", "tiny")


def replica_workers(parent: int) -> list[int]:
    return tp_workers(parent, b"replica_worker")


def per_replica(url: str, name: str) -> dict[int, float]:
    text = httpx.get(url + "/metrics").text
    return {int(m[1]): float(m[2]) for m in re.finditer(
        rf'^{re.escape(name)}{{[^}}]*replica="(\d+)"[^}}]*}} (\S+)$', text, re.M)}


def finished(url: str, total: float | None = None) -> dict[int, float]:
    """Completions each replica finished; with `total`, once they add up to it (a
    replica's figures reach the server within 0.1 s of a change)."""
    deadline = time.monotonic() + 5
    while True:
        text = httpx.get(url + "/metrics").text
        out: dict[int, float] = {}
        for m in re.finditer(
                r'^armllm:request_success_total{[^}]*replica="(\d+)"[^}]*} (\S+)$', text, re.M):
            out[int(m[1])] = out.get(int(m[1]), 0) + float(m[2])
        if total is None or sum(out.values()) >= total or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


@pytest.fixture(scope="module")
def dp_server(tiny_model, tmp_path_factory):
    with running_server(tiny_model, tmp_path_factory, "dp", "-dp", "2", *ENGINE) as srv:
        yield srv


def prompt(i: int) -> str:
    return " ".join(f"w{(i * 7 + j) % 50}" for j in range(5 + i % 4))


def test_balanced_and_equal_to_one_engine(dp_server, tiny_model):
    from armllm import LLM, SamplingParams
    assert len(replica_workers(dp_server.proc.pid)) == 1
    health = httpx.get(dp_server.url + "/health").json()
    assert health == {"status": "ok", "replicas": 2, "replicas_down": []}
    before = finished(dp_server.url)

    async def run() -> list[str]:
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(i: int) -> str:
                body = {"model": "tiny", "prompt": prompt(i), "max_tokens": 64,
                        "temperature": 0, "ignore_eos": True}
                r = await client.post(dp_server.url + "/v1/completions", json=body)
                r.raise_for_status()
                return r.json()["choices"][0]["text"]
            return await asyncio.gather(*(one(i) for i in range(64)))
    texts = asyncio.run(run())
    llm = LLM(tiny_model, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.02)
    want = llm.generate([prompt(i) for i in range(64)],
                        SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    assert texts == [o.text for o in want]
    counts = finished(dp_server.url, sum(before.values()) + 64)
    served = [counts[i] - before.get(i, 0) for i in (0, 1)]
    assert sum(served) == 64
    assert min(served) >= 64 // 4, served


def test_shared_prefix_stays_on_one_replica(dp_server):
    """Prompts sharing their first 4 blocks (64 tokens) go where the first went."""
    shared = " ".join(f"w{j % 50}" for j in range(70))
    hits0 = per_replica(dp_server.url, "armllm:prefix_cache_hits_total")
    routed0 = finished(dp_server.url)
    for i in range(6):
        body = {"model": "tiny", "prompt": f"{shared} w{i}", "max_tokens": 4}
        httpx.post(dp_server.url + "/v1/completions", json=body, timeout=60).raise_for_status()
    routed = finished(dp_server.url, sum(routed0.values()) + 6)
    hits = per_replica(dp_server.url, "armllm:prefix_cache_hits_total")
    took = [routed[i] - routed0.get(i, 0) for i in (0, 1)]
    assert sorted(took) == [0, 6], took
    home = took.index(6)
    assert hits[home] - hits0.get(home, 0) >= 5 * 64   # 5 later prompts, 64 tokens each


def test_killed_replica_leaves_rotation(tiny_model, tmp_path_factory):
    with running_server(tiny_model, tmp_path_factory, "dp-kill", "-dp", "2", *ENGINE) as srv:
        (worker,) = replica_workers(srv.proc.pid)

        async def run() -> list[dict]:
            """4 streams (2 a replica), replica 1 killed once each has started; the
            last event of each."""
            started = [asyncio.Event() for _ in range(4)]

            async def one(client, i: int) -> dict:
                body = {"model": "tiny", "prompt": prompt(i), "max_tokens": 480,
                        "ignore_eos": True, "stream": True}
                last = None
                async with client.stream("POST", srv.url + "/v1/completions",
                                         json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            last = json.loads(line[6:])
                            started[i].set()
                return last

            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [asyncio.create_task(one(client, i)) for i in range(4)]
                for e in started:
                    await e.wait()
                os.kill(worker, signal.SIGKILL)
                return await asyncio.gather(*tasks)
        results = asyncio.run(run())
        errors = [r["error"]["message"] for r in results if "error" in r]
        assert len(errors) == 2 and all("data-parallel replica 1" in e for e in errors)
        assert all("SIGKILL" in e or "signal 9" in e for e in errors)
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 200 and health.json()["replicas_down"] == [1]
        assert per_replica(srv.url, "armllm:replica_up") == {0: 1.0, 1: 0.0}
        for i in range(4):   # all on replica 0 now
            body = {"model": "tiny", "prompt": prompt(i), "max_tokens": 4}
            assert httpx.post(srv.url + "/v1/completions", json=body,
                              timeout=60).status_code == 200
    assert srv.proc.returncode == 0
    assert not replica_workers(srv.proc.pid)


def test_embeddings_through_the_replicas(dp_server, tiny_model):
    """Embedding requests ride to both replicas like completions (the causal model's
    default pooling: its last token's state, normalized) and equal one engine's."""
    from armllm import LLM
    texts = [prompt(i) for i in range(8)]

    async def run() -> list[list[float]]:
        async with httpx.AsyncClient(timeout=60) as client:
            rs = await asyncio.gather(*(client.post(dp_server.url + "/v1/embeddings",
                                                    json={"input": t}) for t in texts))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        return [r.json()["data"][0]["embedding"] for r in rs]

    before = finished(dp_server.url)
    got = asyncio.run(run())
    after = finished(dp_server.url, sum(before.values()) + len(texts))
    with LLM(tiny_model, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.02) as one:
        want = [o.embedding for o in one.embed(texts)]
    for g, w in zip(got, want, strict=True):
        assert max(abs(a - b) for a, b in zip(g, w, strict=True)) < 1e-5
    assert all(after[i] > before.get(i, 0) for i in (0, 1)), (before, after)
