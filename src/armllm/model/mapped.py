"""mapped: opens a model file as a read-only memory map (weights are never
read twice), with the errors a missing or empty file deserves, and hands a
mapped range's pages back once a loader has packed them (`release`), so that
a file's pages do not stay resident next to the weights packed from them."""
from __future__ import annotations

import mmap
from pathlib import Path


def map_file(path: Path, kind: str) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {kind} file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a {kind} file") from None
    except ValueError:  # mmap of an empty file
        raise ValueError(f"{path}: empty file, not {kind}") from None


def release(mapping: mmap.mmap, start: int, end: int) -> None:
    """Drops this process's resident pages of bytes [start, end) of a read-only file
    mapping (MADV_DONTNEED): they leave its RSS and stay in the page cache, and a later
    read faults them back in with the same bytes, so rounding the range out to whole
    pages (which may cover a neighbouring tensor's first or last bytes) is safe."""
    first = start - start % mmap.PAGESIZE
    end = min(end, len(mapping))
    if end > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, end - first)
