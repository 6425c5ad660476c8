"""The processes and shared-memory files a tensor- or data-parallel engine leaves,
as tests look for them (under /proc and /dev/shm)."""
from __future__ import annotations

from pathlib import Path


def tp_workers(parent: int, marker: bytes = b"tp_worker") -> list[int]:
    """Live worker processes (tensor-parallel ranks; with marker b"replica_worker",
    data-parallel replicas) whose parent is `parent`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == parent and fields[0] != "Z" and marker in cmd:
            pids.append(int(d.name))
    return pids


def segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("armllm-tp-*")}
