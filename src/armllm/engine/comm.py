"""comm: the all-reduce (and rank 0's broadcast) between tensor-parallel ranks,
processes on one machine that map one shared memory segment (a file in
/dev/shm, created by rank 0 and opened by the others). The C kernel
(_kernels/comm.h) sums in a fixed rank order, so every rank holds the same
bits; this module owns the segment's life: creation, mapping, and removal
when the engine ends."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from armllm import ops

SHM_DIR = Path("/dev/shm")
# floats per slice of an all-reduce: a hidden vector of a few thousand floats times
# a step's tokens fits in one slice; longer ones go in slices of this many
DEFAULT_MAX_FLOATS = 1 << 20


class AllReduce:
    """One rank's handle on a shared all-reduce: `allreduce(x)` sums the float32
    array x over the ranks in place. Rank 0 creates the segment (create=True)
    before the others open it by name; `unlink()` (rank 0's, at shutdown) removes
    it."""

    def __init__(self, name: str, rank: int, ranks: int,
                 max_floats: int = DEFAULT_MAX_FLOATS, create: bool = False):
        if "/" in name or not name:
            raise ValueError(f"segment name must be a plain file name, got {name!r}")
        if not 0 <= rank < ranks:
            raise ValueError(f"rank must be in [0, {ranks}), got {rank}")
        self.name, self.rank, self.ranks, self.max_floats = name, rank, ranks, max_floats
        self.path = SHM_DIR / name
        size = ops.comm_segment_bytes(ranks, max_floats)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)  # zero-filled
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"{self.path} holds {os.fstat(fd).st_size} bytes; an "
                                 f"all-reduce for {ranks} ranks of {max_floats} floats "
                                 f"needs {size}")
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        segment = np.frombuffer(self._map, np.uint8)
        if create:
            ops.comm_init(segment, ranks, max_floats)
        # the collectives (ops.Comm: allreduce, broadcast, gather_cols, abort), which a
        # tensor-parallel model's layers also call
        self.comm = ops.Comm(segment, rank, ranks, max_floats)

    def allreduce(self, data: np.ndarray) -> None:
        self.comm.allreduce(data)

    def broadcast(self, data: np.ndarray) -> None:
        """Rank 0's `data` into every rank's `data` (same dtype and size on every
        rank): the step's batch, from the scheduler's rank to the others."""
        self.comm.broadcast(data)

    def abort(self) -> None:
        """Every rank's collective, now and later, raises ops.CommAborted."""
        if self.comm is not None:
            self.comm.abort()

    def close(self) -> None:
        """Unmaps the segment (the file stays until unlink); the caller must hold no
        other reference to `comm` (a bound model's layers do)."""
        if self._map is not None:
            self.comm = None
            try:
                self._map.close()
            except BufferError:  # still exported (a live layer): unmapped when freed
                pass
            self._map = None

    def unlink(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> AllReduce:
        return self

    def __exit__(self, *exc) -> None:
        if self.rank == 0:
            self.unlink()
        else:
            self.close()
