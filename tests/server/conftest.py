"""A real `armllm serve` process on 127.0.0.1 (a free port) for server tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.tiny_model import write_tiny_chat_llama, write_tiny_llama


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model: Path | str, *args: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "armllm", "serve", str(model), "--port", str(self.port),
             "--log-interval", "0", *args],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ,
                                                              "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float = 120.0) -> list[int]:
        """Polls /health until 200; returns the statuses seen."""
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).status_code
                seen.append(status)
                if status == 200:
                    return seen
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-server"))


@contextmanager
def running_server(model: Path, tmp_path_factory, name: str, *flags: str):
    """`armllm serve model *flags`, ready; stopped on exit. Logs to NAME.log."""
    srv = ServerProcess(model, *flags, log=tmp_path_factory.mktemp("log") / f"{name}.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """The tiny model served with default settings (float32 weights and KV cache, so
    its greedy tokens equal the in-process reference's)."""
    with running_server(tiny_model, tmp_path_factory, "server", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
                        "--max-num-seqs", "16", "--served-model-name", "tiny") as srv:
        yield srv


def metric(url: str, name: str, headers: dict | None = None) -> float:
    """One sample of /metrics (the first line starting with name{ or name )."""
    text = httpx.get(url + "/metrics", headers=headers or {}).text
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """The tiny random model with a byte-level tokenizer and Qwen's chat template
    (tools, <think>): for structured outputs and tool calls."""
    return write_tiny_chat_llama(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="module")
def chat_server(chat_model, tmp_path_factory):
    with running_server(chat_model, tmp_path_factory, "chat", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.05",
                        "--max-num-seqs", "16", "--served-model-name", "tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def chat_client(chat_server):
    import openai
    return openai.OpenAI(base_url=chat_server.url + "/v1", api_key="none", max_retries=0)
