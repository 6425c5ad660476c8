"""The Arm kernels, cross-compiled and run under qemu-user at every CPU level
the dispatch distinguishes (tools/arm_kernel_check.sh): Armv8.0 NEON without
LSE (LL/SC fetch-add), Neoverse-N1 (dotprod + LSE), Armv8.6 BF16/I8MM without
SVE, and SVE at 128, 256, 384 and 512 bits, each variant against ref."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ["armv8.0 neon, no lse", "armv8.2 dotprod + lse", "armv8.6 bf16/i8mm, no sve",
          "sve 128", "sve 256", "sve 384", "sve 512"]


def test_arm_kernels_under_qemu(tmp_path):
    if not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64-static")):
        if os.environ.get("CI"):
            pytest.fail("CI must install gcc-aarch64-linux-gnu and qemu-user-static (.ci/run)")
        pytest.skip("no aarch64 cross compiler / qemu-user (tools/arm_kernel_check.sh --install)")
    r = subprocess.run([str(ROOT / "tools/arm_kernel_check.sh"), str(tmp_path / "build")],
                       capture_output=True, text=True, timeout=3600)
    print(r.stdout[-20000:])
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    assert "pool.c.o contains ldaddal: yes" in r.stdout
    assert "comm.c.o contains ldaddal: yes" in r.stdout
    # the all-reduce between forked processes: LL/SC on cortex-a72, LSE on neoverse-n1
    assert re.search(r"^comm +allreduce +ldaxr/stlxr .* PASS$", r.stdout, re.M)
    assert re.search(r"^comm +allreduce +ldaddal .* PASS$", r.stdout, re.M)
    summary = r.stdout.split("=== summary")[1]
    for level in LEVELS:
        assert f"{level}" in summary and "FAIL" not in summary
    # each Arm variant was exercised at a level that has it
    assert "\nneon       gemm_f32" in r.stdout
    assert "\nneon_mmla  gemm_bf16" in r.stdout
    assert "\nsve        gemm_bf16" in r.stdout
    # the Gated DeltaNet and Whisper slots run their own Arm ports (kernel_check names the
    # impl); attn_bidir is attention's bidirectional cases
    for slot in ("gdn_conv", "gdn_rule", "gated_rmsnorm", "sigmoid_mul", "layernorm", "gelu"):
        assert re.search(rf"^neon +{slot} +neon +.* PASS$", r.stdout, re.M)
        assert re.search(rf"^neon_mmla +{slot} +neon +.* PASS$", r.stdout, re.M)
        assert re.search(rf"^sve +{slot} +sve +.* PASS$", r.stdout, re.M)
    # the sampler's slots and whole batches against ref's (neon's; sve's exp pass)
    for check in ("sample_exp", "sample_rows"):
        assert re.search(rf"^neon +{check} +neon +.* PASS$", r.stdout, re.M)
        assert re.search(rf"^neon_mmla +{check} +neon +.* PASS$", r.stdout, re.M)
        assert re.search(rf"^sve +{check} +sve +.* PASS$", r.stdout, re.M)
    assert re.search(r"^neon_mmla +attn_bidir +neon_mmla +.* PASS$", r.stdout, re.M)
    assert re.search(r"^sve +attn_bidir +sve +.* PASS$", r.stdout, re.M)
    assert "fetch-add ldaxr/stlxr" in r.stdout  # the cortex-a72 run used the LL/SC loop
    # neon's quantized GEMM names its run-time choice: SDOT only where HWCAP has asimddp
    assert neon_gemm_wq_impl(r.stdout, "armv8.0 neon, no lse") == "neon"
    assert neon_gemm_wq_impl(r.stdout, "armv8.2 dotprod + lse") == "neon+dotprod"


def neon_gemm_wq_impl(output: str, level: str) -> str:
    """The impl column of the neon gemm_wq line in one level's run."""
    section = output.split(f"=== {level} (")[1].split("\n=== ")[0]
    return re.search(r"^neon +gemm_wq +(\S+)", section, re.M).group(1)
