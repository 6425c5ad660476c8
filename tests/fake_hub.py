"""A Hugging Face Hub on localhost, for tests: serves a folder laid out as
ROOT/ORG/NAME/REVISION/files in the Hub's URL layout, as far as
huggingface_hub 2.4 reads it when it downloads:

  GET  /api/models/ORG/NAME[/revision/REV]   model info: sha, siblings (and gguf)
  HEAD /ORG/NAME/resolve/REV/PATH            X-Repo-Commit, ETag, X-Linked-Etag/-Size
  GET  /ORG/NAME/resolve/REV/PATH            the file; a Range gets 206 and the rest

and the Hub's errors (X-Error-Code RepoNotFound 401/404, GatedRepo 401/403,
RevisionNotFound 404, EntryNotFound 404; 401 "Invalid credentials" for a bad
token). REV is a revision folder's name or its commit, a SHA-1 of the repo and
folder. Every request is logged; a file named in cut_once has its first whole
GET cut halfway (the connection closed), as a flaky network does."""
from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.tiny_model import write_tiny_llama

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")   # what the Hub stores in LFS/Xet


@dataclass(frozen=True)
class Request:
    method: str
    path: str            # unquoted, without the query
    range: str | None    # the Range header
    token: str | None    # the bearer token sent


class FakeHub:
    """The server, started on a free port; `url` is its HF_ENDPOINT."""

    def __init__(self, root: Path):
        self.root = root
        self.token = "hf_valid_test_token"
        self.gated: set[str] = set()        # repo ids whose files need the token
        self.private: set[str] = set()      # repo ids that need the token at all
        self.gguf_arch: dict[str, str] = {}   # repo id -> the API's gguf.architecture
        self.cut_once: set[str] = set()     # "ORG/NAME/PATH": first whole GET cut halfway
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()   # open keep-alive connections
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Down as a Hub that cannot be reached: no listener, no open connection."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:   # closed already
                    pass

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._connections.add if open_ else self._connections.discard)(connection)

    def repo_dir(self, repo_id: str, revision: str = "main") -> Path:
        path = self.root / repo_id / revision
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def commit(repo_id: str, revision: str) -> str:
        return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def files_fetched(self) -> list[str]:
        """The repo paths of the whole or ranged GETs of /resolve/, in order."""
        return [r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in self.requests
                if r.method == "GET" and "/resolve/" in r.path]

    def files_asked(self) -> set[str]:
        """The repo paths of every /resolve/ request (HEAD or GET)."""
        return {r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in self.requests
                if "/resolve/" in r.path}

    def revision_dir(self, repo_id: str, revision: str) -> Path | None:
        """The folder of a revision named by folder name or commit."""
        repo = self.root / repo_id
        for folder in sorted(repo.iterdir()) if repo.is_dir() else []:
            if revision in (folder.name, self.commit(repo_id, folder.name)):
                return folder
        return None


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as the Hub's clients expect

        def log_message(self, *args) -> None:   # the log is hub.requests
            pass

        def setup(self) -> None:
            super().setup()
            hub.track(self.connection, True)

        def finish(self) -> None:
            hub.track(self.connection, False)
            super().finish()

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            auth = self.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
            hub.log(Request(self.command, path, self.headers.get("Range"), token))
            if token is not None and token != hub.token:
                return self._error(401, None, "Invalid credentials in Authorization header")
            parts = urlsplit(self.path).path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
                revision = unquote(parts[5]) if len(parts) == 6 else "main"
                return self._info(f"{parts[2]}/{parts[3]}", revision, token, body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file(f"{parts[0]}/{parts[1]}", unquote(parts[3]),
                                  unquote("/".join(parts[4:])), token, body)
            self._error(404, None, "Not found")

        def _repo(self, repo_id: str, token: str | None) -> bool:
            if (hub.root / repo_id).is_dir() and (repo_id not in hub.private or token):
                return True
            # the Hub does not tell a private repo from a missing one
            self._error(404 if token else 401, "RepoNotFound", "Repository not found")
            return False

        def _revision(self, repo_id: str, revision: str) -> Path | None:
            folder = hub.revision_dir(repo_id, revision)
            if folder is None:
                self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return folder

        def _info(self, repo_id: str, revision: str, token: str | None, body: bool) -> None:
            if not self._repo(repo_id, token):
                return
            folder = self._revision(repo_id, revision)
            if folder is None:
                return
            files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                           if p.is_file())
            info = {"id": repo_id, "modelId": repo_id, "private": repo_id in hub.private,
                    "gated": "auto" if repo_id in hub.gated else False,
                    "sha": hub.commit(repo_id, folder.name),
                    "siblings": [{"rfilename": f} for f in files]}
            if repo_id in hub.gguf_arch:
                info["gguf"] = {"architecture": hub.gguf_arch[repo_id], "total": 1}
            data = json.dumps(info).encode()
            self._send(200, {"Content-Type": "application/json"}, data if body else b"",
                       len(data))

        def _file(self, repo_id: str, revision: str, filename: str, token: str | None,
                  body: bool) -> None:
            if not self._repo(repo_id, token):
                return
            if repo_id in hub.gated and not token:
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is "
                                   "restricted. You must have access to it and be "
                                   "authenticated to access it. Please log in.")
            folder = self._revision(repo_id, revision)
            if folder is None:
                return
            commit = {"X-Repo-Commit": hub.commit(repo_id, folder.name)}
            path = folder / filename
            if not path.is_file():
                return self._error(404, "EntryNotFound", "Entry not found", commit)
            data = path.read_bytes()
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            headers = {**commit, "ETag": etag, "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if filename.endswith(LFS_SUFFIXES):
                headers.update({"X-Linked-Etag": etag, "X-Linked-Size": str(len(data))})
            start = _range_start(self.headers.get("Range"))
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                return self._send(206, headers, data[start:] if body else b"",
                                  len(data) - start)
            key = f"{repo_id}/{filename}"
            if body and key in hub.cut_once:
                hub.cut_once.discard(key)
                return self._cut(headers, data)
            self._send(200, headers, data if body else b"", len(data))

        def _cut(self, headers: dict, data: bytes) -> None:
            """The headers of the whole file, half of it, then the connection closed."""
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        def _error(self, status: int, code: str | None, message: str,
                   extra: dict | None = None) -> None:
            headers = {**(extra or {}), "X-Error-Message": message,
                       "Content-Type": "application/json"}
            if code:
                headers["X-Error-Code"] = code
            data = json.dumps({"error": message}).encode()
            self._send(status, headers, data if self.command == "GET" else b"", len(data))

        def _send(self, status: int, headers: dict, data: bytes, length: int) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(length)}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _range_start(header: str | None) -> int:
    """The first byte of a "bytes=N-" range (what huggingface_hub sends to resume)."""
    if not header or not header.startswith("bytes="):
        return 0
    return int(header.removeprefix("bytes=").split("-", 1)[0] or 0)


def tiny_repo(server: FakeHub, repo_id: str = "org/tiny", revision: str = "main",
              seed: int = 0) -> Path:
    """A tiny Llama as a Hub repo holds it: with files armllm must never fetch."""
    folder = write_tiny_llama(server.repo_dir(repo_id, revision), seed=seed)
    (folder / "generation_config.json").write_text('{"temperature": 0.7}')
    (folder / "pytorch_model.bin").write_bytes(b"a pickle")
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"onnx")
    (folder / "README.md").write_text("# tiny")
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs")
    return folder
