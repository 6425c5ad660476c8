"""step_profile: where a decode step's time goes, for `armllm bench latency --profile`.

While a StepProfile is installed, the kernel table armllm.ops calls through,
the runner's sampler and the engine's postprocessing run behind timers (the
engine itself knows nothing of it: with --profile off nothing is wrapped and
nothing costs). Each decode-only step's wall time (`engine.step()`) is split
into GEMMs (the kernel calls that read weights), the sparse MLPs of
mixture-of-experts layers (routing, the experts' GEMMs and activations: one C
call per layer), attention, other kernels (norms, RoPE, KV writes,
activations, quantization of activations, embedding),
sampling, detokenize/postprocess, and the rest: Python and engine glue
(scheduling, building the batch, the model's Python graph, the Cython
wrappers' argument checks outside the kernel calls, the timers themselves).
A kernel call's time includes its Cython entry and argument checks; inside
a decoder layer's one call (ops.decoder_layer) and the head's
(ops.norm_head) the call times each kernel itself, and the rest of it counts
as glue.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from armllm import ops

if TYPE_CHECKING:
    from armllm.engine.llm_engine import LLMEngine

# Kernel-table methods whose time is weight reading: the GEMMs, and the fused calls
# whose work is a GEMM with a small epilogue or prologue on its rows.
GEMM_METHODS = frozenset({"gemm", "gemm_wq"})
# What a decode token's time splits into, in report order.
PARTS = ("gemm", "sparse_mlp", "attention", "other_kernels", "glue", "sampling",
         "postprocess")
LABELS = {"total": "total", "gemm": "GEMMs", "sparse_mlp": "sparse MLPs (experts)",
          "attention": "attention",
          "other_kernels": "other kernels",
          "glue": "Python/engine glue", "sampling": "sampling",
          "postprocess": "detokenize/postprocess"}


class _TimedKernels:
    """Stands in for ops' kernel table: each method call adds its time to a bucket."""

    def __init__(self, table: ops.Kernels, totals: dict[str, int]):
        self._table = table
        for name in dir(table):
            method = getattr(table, name)
            if name.startswith("_") or not callable(method):
                continue
            bucket = ("gemm" if name in GEMM_METHODS else
                      "attention" if name == "attention" else "other_kernels")
            setattr(self, name, _timed(method, totals, bucket))

    def __getattr__(self, name: str) -> Any:  # properties (impl, isa, ...) pass through
        return getattr(self._table, name)


def _timed(fn: Callable, totals: dict[str, int], bucket: str) -> Callable:
    clock = time.perf_counter_ns

    def call(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[bucket] += clock() - t0
    return call


def _timed_bound(times: np.ndarray, which: str) -> Callable:
    """ops.decoder_layer (which="layer") or ops.norm_head ("head") with the bound
    call's own timers on: they add their GEMM and other-kernel nanoseconds to times."""
    def decoder_layer(layer: ops.DecoderLayer, batch: ops.StepBatch) -> None:
        layer.run(batch, ops.get_pool(), times)

    def norm_head(head: ops.NormHead, rows: np.ndarray, batch_rows: int) -> None:
        head.run(rows, batch_rows, ops.get_pool(), times)
    return decoder_layer if which == "layer" else norm_head


class StepProfile:
    """Times the decode-only steps of `engine` while installed (a context manager)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._totals = {p: 0 for p in PARTS if p != "glue"}     # ns, all steps
        self.decode_steps = 0
        self.decode_tokens = 0
        self._sums = dict.fromkeys(("total", *PARTS), 0)        # ns, decode-only steps
        self._undo: list[Callable[[], None]] = []
        # ns in GEMMs, other kernels, attention, sparse MLPs (the bound calls' own timers)
        self._bound_times = np.zeros(4, np.int64)

    def __enter__(self) -> StepProfile:
        engine, totals = self.engine, self._totals
        self._patch(ops, "_KERNELS", _TimedKernels(ops._KERNELS, totals))
        self._patch(ops, "decoder_layer", _timed_bound(self._bound_times, "layer"))
        self._patch(ops, "norm_head", _timed_bound(self._bound_times, "head"))
        self._patch(engine.runner, "sample", _timed(engine.runner.sample, totals, "sampling"))
        self._patch(engine, "_postprocess", _timed(engine._postprocess, totals, "postprocess"))
        self._patch(engine, "step", self._step)
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        had_own = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old) if had_own else delattr(owner, name))

    def _step(self):
        sched, totals = self.engine.scheduler, self._totals
        rows0, decodes0 = sched.num_scheduled_tokens, sched.num_decode_tokens
        before = dict(totals)
        t0 = time.perf_counter_ns()
        outputs = type(self.engine).step(self.engine)
        elapsed = time.perf_counter_ns() - t0
        gemm, other, attention, sparse = self._bound_times.tolist()
        self._bound_times[:] = 0
        totals["gemm"] += gemm
        totals["other_kernels"] += other
        totals["attention"] += attention
        totals["sparse_mlp"] += sparse
        rows, decodes = sched.num_scheduled_tokens - rows0, sched.num_decode_tokens - decodes0
        if rows and rows == decodes:  # a decode-only step
            self.decode_steps += 1
            self.decode_tokens += decodes
            spent = {k: totals[k] - before[k] for k in totals}
            self._sums["total"] += elapsed
            self._sums["glue"] += elapsed - sum(spent.values())
            for k, v in spent.items():
                self._sums[k] += v
        return outputs

    def per_token_ms(self) -> dict[str, float]:
        """Mean milliseconds per decode token of each part, and their total."""
        n = max(self.decode_tokens, 1)
        return {k: v / n / 1e6 for k, v in self._sums.items()}


def format_profile(per_token_ms: dict[str, float], decode_tokens: int) -> list[str]:
    """The report lines of a profile (per_token_ms as StepProfile gives it)."""
    total = per_token_ms["total"]
    lines = [f"profile per decode token (mean of {decode_tokens} decode-only steps):"]
    for key in ("total", *PARTS):
        share = f"  {100 * per_token_ms[key] / total:5.1f}%" if total and key != "total" else ""
        lines.append(f"  {LABELS[key]:<24} {per_token_ms[key]:8.3f} ms{share}")
    outside = total - per_token_ms["gemm"]
    lines.append(f"  {'outside the GEMMs':<24} {outside:8.3f} ms")
    return lines
