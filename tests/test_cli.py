"""`armllm info` and errors on the command line, run as a real subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from armllm import ops


def armllm(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "armllm", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


def test_info_json_reports_cpu_threads_and_kernels():
    r = armllm("info", "--json", ARMLLM_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["arch"] in ("x86_64", "aarch64")
    assert info["num_threads"] == 2
    assert info["isa"] == ops.available_isas()[0]
    assert set(info["kernels"]) == {"gemm_f32", "gemm_bf16", "rmsnorm", "rope", "silu_mul",
                                    "embed", "exp", "kv_write", "attention"}
    assert set(info["kernels"].values()) <= set(info["isa_built"])
    if info["arch"] == "x86_64":
        assert ("avx2" in info["features"]) == ("avx2" in info["isa_available"])
        assert info["fetch_add"] == "lock xadd"


def test_info_text():
    r = armllm("info")
    assert r.returncode == 0, r.stderr
    assert "variant:" in r.stdout and "gemm_f32" in r.stdout


def test_forced_variant():
    r = armllm("info", "--json", ARMLLM_ISA="ref")
    info = json.loads(r.stdout)
    assert info["isa"] == "ref" and info["isa_source"] == "ARMLLM_ISA"
    assert set(info["kernels"].values()) == {"ref"}


def test_unknown_variant_is_a_one_line_error_with_exit_2():
    r = armllm("info", ARMLLM_ISA="avx9")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ARMLLM_ISA=avx9: unknown kernel variant 'avx9'" in lines[0]


def test_variant_the_cpu_lacks_is_refused():
    foreign = "sve" if ops.cpu_info()["arch"] == "x86_64" else "avx2"
    r = armllm("info", ARMLLM_ISA=foreign)
    assert r.returncode == 2 and f"kernel variant '{foreign}'" in r.stderr


def test_bad_bench_arguments():
    r = armllm("bench", "kernels", "--models", "gpt5")
    assert r.returncode == 2 and "unknown model 'gpt5'" in r.stderr
    r = armllm("bench", "kernels", "--m", "0")
    assert r.returncode == 2 and "--m values must be >= 1" in r.stderr


def test_bench_kernels_runs_a_small_shape(tmp_path):
    out = tmp_path / "bench.json"
    r = armllm("bench", "kernels", "--models", "smollm2-135m", "--m", "1", "--threads", "1",
               "--min-time", "0.01", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["machine"]["1"]["read_gbs"] > 0 and data["machine"]["1"]["fma_gflops"] > 0
    assert len(data["gemm"]) == 8  # 4 layers x 2 dtypes at M=1
    assert all(row["armllm_s"] > 0 and row["numpy_f32_s"] > 0 for row in data["gemm"])
