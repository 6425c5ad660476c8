"""What bounds a server's load and how it stops, against real `armllm serve`
processes: admission counts every completion (n per prompt) from admission to
the end of its response, streaming or not; slow and idle connections are
closed and connections are capped; SIGINT/SIGTERM lets in-flight requests
finish within the grace period and then ends each remaining one with an error,
without a traceback."""
from __future__ import annotations

import asyncio
import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server.conftest import ServerProcess, metric, running_server
from tests.tiny_model import write_tiny_llama

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
REJECTED = "armllm:requests_rejected_overload_total"
IN_FLIGHT = "armllm:num_requests_in_flight"


@pytest.fixture(scope="module")
def small(tiny_model, tmp_path_factory):
    """Four sequences running and four waiting at most: a limit of 8 completions."""
    with running_server(tiny_model, tmp_path_factory, "small", "--dtype", "float32",
                        "--kv-cache-gib", "0.02", "--max-num-seqs", "4",
                        "--max-waiting-requests", "4", "--served-model-name", "tiny") as srv:
        yield srv


async def stream_or_refusal(client: httpx.AsyncClient, url: str, body: dict):
    """(status, events or error body, Retry-After) of one streaming request."""
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.json(), r.headers.get("retry-after")
        events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
        return 200, events, None


def burst(url: str, bodies: list[dict], watch=None) -> list:
    """The bodies sent at once as streaming requests; `watch()` runs in a thread while
    they are in flight and its result is returned last."""
    async def main():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(
                max_connections=len(bodies))) as client:
            return await asyncio.gather(*(stream_or_refusal(client, url, b) for b in bodies))

    seen = []
    watcher = threading.Thread(target=lambda: seen.append(watch())) if watch else None
    if watcher:
        watcher.start()
    results = asyncio.run(main())
    if watcher:
        watcher.join(60)
    return results + seen


def wait_idle(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(url, IN_FLIGHT) == 0 and metric(url, "armllm:num_requests_running") == 0:
            return
        time.sleep(0.05)
    raise AssertionError(httpx.get(url + "/metrics").text)


def max_in_flight(url: str, seconds: float = 1.5) -> float:
    """The highest in-flight count /metrics shows over a while."""
    top, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        top = max(top, metric(url, IN_FLIGHT))
        time.sleep(0.02)
    return top


def test_a_streaming_burst_is_admitted_up_to_the_limit(small):
    """60 concurrent streaming chats against a limit of 8: exactly 8 are served to the
    end, the others are refused at once with 503 and Retry-After, counted on /metrics."""
    before = metric(small.url, REJECTED)
    body = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 480,
            "ignore_eos": True}
    *results, top = burst(small.url + CHAT, [body] * 60, lambda: max_in_flight(small.url))
    served = [events for status, events, _ in results if status == 200]
    refused = [(err, retry) for status, err, retry in results if status == 503]
    assert len(served) == 8 and len(refused) == 52
    for err, retry in refused:
        assert err["error"]["code"] == "server_overloaded" and retry == "1"
    for events in served:
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])["choices"][0]
        assert last["finish_reason"] == "length"
    assert top == 8
    assert metric(small.url, REJECTED) == before + 52
    wait_idle(small.url)


def test_admission_counts_n_completions_not_prompts(small):
    """Three streaming requests with n = 3 (9 completions) against a limit of 8: two
    are served."""
    body = {"prompt": "w1", "max_tokens": 480, "ignore_eos": True, "n": 3}
    results = burst(small.url + CMPL, [body] * 3)
    assert sorted(status for status, _, _ in results) == [200, 200, 503]
    for status, events, _ in results:
        if status == 200:
            done = [c for e in events[:-1] for c in json.loads(e)["choices"]
                    if c["finish_reason"]]
            assert sorted(c["index"] for c in done) == [0, 1, 2]
    wait_idle(small.url)


def test_streams_closed_early_release_their_admission(small):
    """Streams whose client goes away after the first event leave nothing counted in
    flight: twelve in a row of n = 4 against a limit of 8, then n = 4 is admitted."""
    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(12):
                async with client.stream("POST", small.url + CMPL, json={
                        "prompt": "w1", "max_tokens": 480, "ignore_eos": True,
                        "stream": True, "n": 4}) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_lines():
                        break

    asyncio.run(main())
    wait_idle(small.url)
    r = httpx.post(small.url + CMPL, json={"prompt": "w1", "max_tokens": 2, "n": 4},
                   timeout=30)
    assert r.status_code == 200


# -- connections -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(tiny_model, tmp_path_factory):
    with running_server(tiny_model, tmp_path_factory, "guarded", "--dtype", "float32",
                        "--kv-cache-gib", "0.01", "--timeout-request-read", "1",
                        "--timeout-keep-alive", "1", "--limit-concurrency", "8") as srv:
        yield srv


def connect(srv: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=5)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed the connection (without blocking)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_a_client_trickling_its_headers_is_dropped(guarded):
    """One byte every 0.2 s never completes the headers: the connection is closed
    about 1 s (--timeout-request-read) after it opened, however steady the bytes."""
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
    with connect(guarded) as sock:
        start = time.monotonic()
        for byte in request:
            if closed_by_server(sock):
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.2)
        held = time.monotonic() - start
    assert 0.9 < held < 3.0, f"held for {held:.1f} s"


def test_a_body_that_does_not_arrive_in_time_is_a_408(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     b'{"prompt": ')
        start = time.monotonic()
        response = b""
        while b"request_timeout" not in response:
            chunk = sock.recv(4096)
            assert chunk, response
            response += chunk
        assert response.startswith(b"HTTP/1.1 408 ") and 0.9 < time.monotonic() - start < 3
        assert b"did not arrive within 1 s" in response


def test_idle_connections_are_closed_and_count_against_the_cap(guarded):
    """Connections that send nothing are closed after --timeout-request-read, and
    while open they count against --limit-concurrency (beyond it: 503); so is a
    connection idle after a response, after --timeout-keep-alive."""
    socks = [connect(guarded) for _ in range(8)]
    try:
        time.sleep(0.2)
        assert httpx.get(guarded.url + "/health", timeout=5).status_code == 503
        time.sleep(1.5)
        assert all(closed_by_server(s) for s in socks)
        assert httpx.get(guarded.url + "/health", timeout=5).status_code == 200
    finally:
        for s in socks:
            s.close()
    with connect(guarded) as sock:
        assert health_over(sock).startswith(b"HTTP/1.1 200 OK")
        time.sleep(0.5)
        assert not closed_by_server(sock)
        assert health_over(sock).startswith(b"HTTP/1.1 200 OK")  # kept alive: still served
        time.sleep(1.5)
        assert closed_by_server(sock)


def health_over(sock: socket.socket) -> bytes:
    """GET /health on an open connection: the whole response."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    response = b""
    while not response.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(4096)
        assert chunk, response
        response += chunk
    return response


# -- shutdown --------------------------------------------------------------------------------

def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=60)


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


def test_the_grace_period_ends_each_request_with_an_error(tmp_path):
    """SIGTERM with a 0.1 s grace: a stream still running then ends with an error
    event and [DONE], a non-streaming request with a 503 error body; the process
    exits 0 and logs no traceback."""
    # wider and deeper than the shared tiny model: 500 decode steps of it take long enough
    # (about a millisecond each) that both requests are still running when SIGTERM comes
    model = write_tiny_llama(tmp_path / "model", hidden=256, layers=8, inter=512)
    srv = ServerProcess(model, "--dtype", "float32", "--kv-cache-gib", "0.01",
                        "--shutdown-grace", "0.1", "--max-model-len", "512",
                        log=tmp_path / "s.log")
    srv.wait_ready()
    result, events = {}, []

    def blocking():
        result["r"] = post(srv.url + CMPL, {"prompt": "w2", "max_tokens": 500,
                                            "ignore_eos": True, "n": 4})

    def streaming():
        body = {"prompt": "w1", "max_tokens": 500, "ignore_eos": True, "stream": True,
                "n": 12}
        with httpx.stream("POST", srv.url + CMPL, json=body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if len(events) == 2:
                    srv.proc.send_signal(signal.SIGTERM)

    threads = [threading.Thread(target=blocking), threading.Thread(target=streaming)]
    threads[0].start()
    deadline = time.monotonic() + 30
    while metric(srv.url, IN_FLIGHT) < 4:   # the non-streaming request is admitted
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.01)
    threads[1].start()
    for t in threads:
        t.join(60)
    assert srv.proc.wait(60) == 0, srv.log()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    done = sum(c["finish_reason"] == "length" for e in events[:-2]
               for c in json.loads(e)["choices"])
    assert done < 12, "the stream ran to the end despite the 0.1 s grace"
    assert result["r"].status_code == 503
    assert result["r"].json()["error"]["code"] == "server_shutting_down"
    log = srv.log()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    srv.stop()


@pytest.mark.parametrize("flag, value, message", [
    ("--timeout-request-read", "0", "--timeout-request-read must be > 0, got 0.0"),
    ("--timeout-keep-alive", "nan", "--timeout-keep-alive must be > 0, got nan"),
    ("--limit-concurrency", "0", "--limit-concurrency must be >= 1, got 0"),
])
def test_bad_limit_flags_are_a_usage_error(tiny_model, flag, value, message):
    run = subprocess.run([sys.executable, "-m", "armllm", "serve", str(tiny_model), flag, value],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr, run.stderr
