"""mapped: opens a model file as a read-only memory map (weights are never
read twice), with the errors a missing or empty file deserves."""
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
