"""prefix_store: the prefix cache's blocks on disk, so that they outlive the
process (--prefix-cache-dir).

A full KV block's bytes (every layer of its KV group's K, then V, as
model/kv_cache.py's read_block gives them) go to one file named by the
group and the block's chained hash (engine/block_manager.py's block_hash), in
a folder per fingerprint: a digest of the model's config, its weight files and
format, the KV dtype and the block size (engine/setup.py's store_fingerprint),
so another model's or format's blocks are never found. Each file starts with a
header: magic, version, the fingerprint, the group, the block's hash, the
payload's length and its blake2b digest. A file whose header or digest does not match is ignored
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
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("armllm")

MAGIC = b"ARMLLMKV"
VERSION = 1
# magic, version, fingerprint, KV group, block hash, payload bytes, payload digest
HEADER = struct.Struct("<8sI32sI16sQ16s")
SUFFIX = ".kv"
PENDING_WRITES = 64   # blocks queued for the writer before save() waits for it
_names = itertools.count()


def payload_digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


Key = tuple[int, bytes]   # (KV group, block hash)


class PrefixStore:
    """KV blocks on disk under `directory`, keyed by (KV group, 16-byte chained
    hash): fingerprint (32 bytes) guards them, block_bytes[g] is a block's payload
    in group g, cap_bytes the most the files may take (headers included)."""

    def __init__(self, directory: str | Path, fingerprint: bytes, block_bytes: Sequence[int],
                 cap_bytes: int):
        if len(fingerprint) != 32:
            raise ValueError(f"the fingerprint must be 32 bytes, got {len(fingerprint)}")
        self.fingerprint, self.block_bytes = fingerprint, tuple(block_bytes)
        largest = HEADER.size + max(self.block_bytes)
        if cap_bytes < largest:
            raise ValueError(f"prefix_cache_gib ({cap_bytes / 2**30:.6g} GiB) must hold at "
                             f"least one block of {largest} bytes")
        self.cap_bytes = cap_bytes
        self.dir = Path(directory) / fingerprint.hex()[:32]
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"prefix_cache_dir {str(directory)!r}: {exc.strerror}") from None
        self._lock = threading.Lock()
        self._files: OrderedDict[Key, int] = OrderedDict()  # key -> bytes, LRU first
        self._pending: dict[Key, bytes] = {}                # queued, not yet written
        self._used = 0
        self._failed = False     # a write failed (logged once)
        self.loaded = self.written = self.rejected = 0
        self._scan()
        self._queue: queue.Queue[Key | None] = queue.Queue(PENDING_WRITES)
        self._writer = threading.Thread(target=self._write_loop, name="armllm-prefix-store",
                                        daemon=True)
        self._writer.start()

    def _path(self, key: Key) -> Path:
        return self.dir / f"{key[0]}-{key[1].hex()}{SUFFIX}"

    def _scan(self) -> None:
        """Indexes the folder's block files, oldest first; removes the temporary files
        a crash left."""
        found = []
        for path in self.dir.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            group, _, stem = path.name.removesuffix(SUFFIX).partition("-")
            try:
                key = (int(group), bytes.fromhex(stem))
                st = path.stat()
            except (ValueError, OSError):
                continue
            if path.name.endswith(SUFFIX) and len(key[1]) == 16 and \
                    0 <= key[0] < len(self.block_bytes):
                found.append((st.st_mtime_ns, key, st.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size
            self._used += size
        self._evict()

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._files or key in self._pending

    def __len__(self) -> int:
        with self._lock:
            return len(self._files.keys() | self._pending.keys())

    @property
    def nbytes(self) -> int:
        """Bytes of the files written (not those still queued)."""
        return self._used

    def save(self, key: Key, payload: bytes) -> None:
        """Queues a block's bytes for the writer (nothing if it is stored already)."""
        if len(payload) != self.block_bytes[key[0]]:
            raise ValueError(f"a block of KV group {key[0]} is {self.block_bytes[key[0]]} "
                             f"bytes, got {len(payload)}")
        with self._lock:
            if key in self._files or key in self._pending:
                return
            self._pending[key] = payload
        self._queue.put(key)

    def load(self, key: Key) -> bytes | None:
        """The block's bytes, or None when the store does not have them (a file that
        fails its checks is logged, removed and forgotten)."""
        with self._lock:
            payload = self._pending.get(key)
            if payload is not None:
                return payload
            if key not in self._files:
                return None
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(key, path, None)
            return None
        why = self._check(key, data)
        if why is not None:
            self._forget(key, path, why)
            return None
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
        try:
            os.utime(path)    # recent for the next process's scan too
        except OSError:
            pass
        self.loaded += 1
        return data[HEADER.size:]

    def _check(self, key: Key, data: bytes) -> str | None:
        """Why the file's bytes may not be served as block `key`, or None."""
        if len(data) < HEADER.size:
            return "shorter than its header"
        magic, version, fp, group, h, n, digest = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            return "not a block file of this version"
        if fp != self.fingerprint:
            return "written for another model, weight format or KV dtype"
        if (group, h) != key:
            return "holds another block"
        want = self.block_bytes[group]
        if n != want or len(data) != HEADER.size + n:
            return f"{len(data) - HEADER.size} payload bytes, a block is {want}"
        if payload_digest(memoryview(data)[HEADER.size:]) != digest:
            return "its digest does not match (corrupt)"
        return None

    def _forget(self, key: Key, path: Path, why: str | None) -> None:
        if why is not None:
            log.warning("prefix cache: ignoring %s: %s", path, why)
            self.rejected += 1
            path.unlink(missing_ok=True)
        with self._lock:
            size = self._files.pop(key, None)
            if size is not None:
                self._used -= size

    def _write_loop(self) -> None:
        while (key := self._queue.get()) is not None:
            try:
                self._write(key, self._pending[key])
            finally:
                with self._lock:
                    del self._pending[key]
                self._queue.task_done()
        self._queue.task_done()

    def _write(self, key: Key, payload: bytes) -> None:
        header = HEADER.pack(MAGIC, VERSION, self.fingerprint, key[0], key[1], len(payload),
                             payload_digest(payload))
        path = self._path(key)
        tmp = self.dir / f"{path.stem}.{os.getpid()}.{next(_names)}.tmp"
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
        size = HEADER.size + len(payload)
        with self._lock:
            if key not in self._files:
                self._files[key] = size
                self._used += size
            self._files.move_to_end(key)
        self.written += 1
        self._evict()

    def _evict(self) -> None:
        """Removes the least recently used files until the rest fit the cap."""
        while True:
            with self._lock:
                if self._used <= self.cap_bytes or not self._files:
                    return
                key, size = self._files.popitem(last=False)
                self._used -= size
            self._path(key).unlink(missing_ok=True)

    def flush(self) -> None:
        """Returns once every queued block is written (or its write has failed)."""
        self._queue.join()

    def close(self) -> None:
        """Writes what is queued and stops the writer; the store is unusable afterwards."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()
