"""prefix_store: the prefix cache's blocks on disk, so that they outlive the
process (--prefix-cache-dir).

A full KV block's bytes (every attention layer's K, then V, as
model/kv_cache.py's read_block gives them) go to one file named by the
block's chained hash (engine/block_manager.py's block_hash), in a folder per
fingerprint: a digest of the model's config, its weight files and format, the
KV dtype and the block size (engine/setup.py's store_fingerprint), so another
model's or format's blocks are never found. Each file starts with a header:
magic, version, the fingerprint, the block's hash, the payload's length and
its blake2b digest. A file whose header or digest does not match is ignored
with one log line and removed, never served.

Writes run on a thread of their own: the engine hands over a copy of the
block's bytes before the block is reused, and the thread writes them to a
temporary name, fsyncs and renames, so a crash leaves the whole file under its
name or none. Reads are synchronous: the scheduler loads a prefix's blocks
before the step that uses them. A size cap evicts the least recently used
files (a read or a write makes a file recent). Processes sharing a folder
(data-parallel replicas) each index the files that were there when they
started and those they wrote."""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import queue
import struct
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("armllm")

MAGIC = b"ARMLLMKV"
VERSION = 1
# magic, version, fingerprint, block hash, payload bytes, payload digest
HEADER = struct.Struct("<8sI32s16sQ16s")
SUFFIX = ".kv"
PENDING_WRITES = 64   # blocks queued for the writer before save() waits for it
_names = itertools.count()


def payload_digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class PrefixStore:
    """KV blocks on disk under `directory`, keyed by their 16-byte chained hash:
    fingerprint (32 bytes) guards them, block_bytes is every block's payload,
    cap_bytes the most the files may take (headers included)."""

    def __init__(self, directory: str | Path, fingerprint: bytes, block_bytes: int,
                 cap_bytes: int):
        if len(fingerprint) != 32:
            raise ValueError(f"the fingerprint must be 32 bytes, got {len(fingerprint)}")
        self.fingerprint, self.block_bytes = fingerprint, block_bytes
        self.file_bytes = HEADER.size + block_bytes
        if cap_bytes < self.file_bytes:
            raise ValueError(f"prefix_cache_gib ({cap_bytes / 2**30:.6g} GiB) must hold at "
                             f"least one block of {self.file_bytes} bytes")
        self.cap_bytes = cap_bytes
        self.dir = Path(directory) / fingerprint.hex()[:32]
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"prefix_cache_dir {str(directory)!r}: {exc.strerror}") from None
        self._lock = threading.Lock()
        self._files: OrderedDict[bytes, int] = OrderedDict()  # hash -> bytes, LRU first
        self._pending: dict[bytes, bytes] = {}                # queued, not yet written
        self._used = 0
        self._failed = False     # a write failed (logged once)
        self.loaded = self.written = self.rejected = 0
        self._scan()
        self._queue: queue.Queue[bytes | None] = queue.Queue(PENDING_WRITES)
        self._writer = threading.Thread(target=self._write_loop, name="armllm-prefix-store",
                                        daemon=True)
        self._writer.start()

    def _path(self, h: bytes) -> Path:
        return self.dir / (h.hex() + SUFFIX)

    def _scan(self) -> None:
        """Indexes the folder's block files, oldest first; removes the temporary files
        a crash left."""
        found = []
        for path in self.dir.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            stem = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
            try:
                h = bytes.fromhex(stem)
                st = path.stat()
            except (ValueError, OSError):
                continue
            if len(h) == 16:
                found.append((st.st_mtime_ns, h, st.st_size))
        for _, h, size in sorted(found):
            self._files[h] = size
            self._used += size
        self._evict()

    def __contains__(self, h: bytes) -> bool:
        with self._lock:
            return h in self._files or h in self._pending

    def __len__(self) -> int:
        with self._lock:
            return len(self._files.keys() | self._pending.keys())

    @property
    def nbytes(self) -> int:
        """Bytes of the files written (not those still queued)."""
        return self._used

    def save(self, h: bytes, payload: bytes) -> None:
        """Queues a block's bytes for the writer (nothing if it is stored already)."""
        if len(payload) != self.block_bytes:
            raise ValueError(f"a block is {self.block_bytes} bytes, got {len(payload)}")
        with self._lock:
            if h in self._files or h in self._pending:
                return
            self._pending[h] = payload
        self._queue.put(h)

    def load(self, h: bytes) -> bytes | None:
        """The block's bytes, or None when the store does not have them (a file that
        fails its checks is logged, removed and forgotten)."""
        with self._lock:
            payload = self._pending.get(h)
            if payload is not None:
                return payload
            if h not in self._files:
                return None
        path = self._path(h)
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(h, path, None)
            return None
        why = self._check(h, data)
        if why is not None:
            self._forget(h, path, why)
            return None
        with self._lock:
            if h in self._files:
                self._files.move_to_end(h)
        try:
            os.utime(path)    # recent for the next process's scan too
        except OSError:
            pass
        self.loaded += 1
        return data[HEADER.size:]

    def _check(self, h: bytes, data: bytes) -> str | None:
        """Why the file's bytes may not be served as block h, or None."""
        if len(data) < HEADER.size:
            return "shorter than its header"
        magic, version, fp, key, n, digest = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            return "not a block file of this version"
        if fp != self.fingerprint:
            return "written for another model, weight format or KV dtype"
        if key != h:
            return "holds another block"
        if n != self.block_bytes or len(data) != HEADER.size + n:
            return f"{len(data) - HEADER.size} payload bytes, a block is {self.block_bytes}"
        if payload_digest(memoryview(data)[HEADER.size:]) != digest:
            return "its digest does not match (corrupt)"
        return None

    def _forget(self, h: bytes, path: Path, why: str | None) -> None:
        if why is not None:
            log.warning("prefix cache: ignoring %s: %s", path, why)
            self.rejected += 1
            path.unlink(missing_ok=True)
        with self._lock:
            size = self._files.pop(h, None)
            if size is not None:
                self._used -= size

    def _write_loop(self) -> None:
        while (h := self._queue.get()) is not None:
            try:
                self._write(h, self._pending[h])
            finally:
                with self._lock:
                    del self._pending[h]
                self._queue.task_done()
        self._queue.task_done()

    def _write(self, h: bytes, payload: bytes) -> None:
        header = HEADER.pack(MAGIC, VERSION, self.fingerprint, h, len(payload),
                             payload_digest(payload))
        path = self._path(h)
        tmp = self.dir / f"{h.hex()}.{os.getpid()}.{next(_names)}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if not self._failed:
                log.warning("prefix cache: cannot write to %s (%s); blocks are kept in memory "
                            "only until it can", self.dir, exc.strerror)
                self._failed = True
            return
        with self._lock:
            if h not in self._files:
                self._files[h] = self.file_bytes
                self._used += self.file_bytes
            self._files.move_to_end(h)
        self.written += 1
        self._evict()

    def _evict(self) -> None:
        """Removes the least recently used files until the rest fit the cap."""
        while True:
            with self._lock:
                if self._used <= self.cap_bytes or not self._files:
                    return
                h, size = self._files.popitem(last=False)
                self._used -= size
            self._path(h).unlink(missing_ok=True)

    def flush(self) -> None:
        """Returns once every queued block is written (or its write has failed)."""
        self._queue.join()

    def close(self) -> None:
        """Writes what is queued and stops the writer; the store is unusable afterwards."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()
