"""armllm on aarch64 end to end (tools/arm_e2e.sh): the cross-built wheel in
an arm64 Debian root under qemu-user at Armv8.0 (NEON, no LSE), Neoverse-N1
(dotprod + LSE), Armv8.6 (BF16/I8MM, no SVE) and SVE-256: `armllm info`
picks the right kernels, the kernel tests pass, and greedy tokens of a tiny
model equal this host's (f32 and bf16 weights)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def missing_piece() -> str | None:
    """What this machine lacks to run tools/arm_e2e.sh (which installs its own apt
    packages), or None."""
    if os.geteuid() != 0:
        return f"root (it chroots into an arm64 root; this runs as uid {os.geteuid()})"
    if not shutil.which("unshare"):
        return "the unshare command (util-linux) on PATH"
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                       capture_output=True, text=True)
    if r.returncode:
        return f"mount namespaces (unshare --mount: {r.stderr.strip() or r.returncode})"
    return None


def test_aarch64_end_to_end():
    missing = missing_piece()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the aarch64 end-to-end test; this runner lacks {missing}")
        pytest.skip(f"needs {missing}")
    r = subprocess.run([str(ROOT / "tools/arm_e2e.sh")], capture_output=True, text=True,
                       timeout=3600)
    print(r.stdout[-20000:], r.stderr[-20000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = r.stdout.split("=== aarch64 end to end")[1]
    for level in ("neon", "dotprod", "i8mm", "sve256"):
        assert f"\n{level} " in summary
    assert "FAIL" not in summary
    assert r.stdout.count("greedy tokens equal the x86-64 run") == 4
    assert "fetch-add ldaxr/stlxr" in r.stdout and "fetch-add ldaddal" in r.stdout
