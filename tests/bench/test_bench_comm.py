"""`armllm bench comm`: two real rank processes, one row per size with a time
and bandwidths that agree with it, the JSON file, usage errors, and no segment
left in /dev/shm."""
from __future__ import annotations

import json
import subprocess
import sys

from armllm.bench.comm import SIZES_BYTES
from armllm.engine.comm import SHM_DIR


def test_bench_comm(tmp_path):
    before = set(SHM_DIR.glob("armllm-*"))
    out = tmp_path / "comm.json"
    r = subprocess.run([sys.executable, "-m", "armllm", "bench", "comm", "--reps", "5",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["ranks"] == 2 and [row["bytes"] for row in data["rows"]] == SIZES_BYTES
    for row in data["rows"]:
        assert row["us"] > 0
        assert abs(row["algbw_gb_s"] - row["bytes"] / row["us"] / 1e3) < 1e-6 * row["algbw_gb_s"]
        assert abs(row["busbw_gb_s"] - row["algbw_gb_s"]) < 1e-9   # 2(N-1)/N = 1 at N = 2
    assert len(r.stdout.strip().splitlines()) == 2 + len(SIZES_BYTES)
    assert set(SHM_DIR.glob("armllm-*")) == before
    bad = subprocess.run([sys.executable, "-m", "armllm", "bench", "comm", "--ranks", "1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--ranks must be in [2, 64], got 1" in bad.stderr
