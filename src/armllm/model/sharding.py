"""sharding: which part of each weight a tensor-parallel rank holds, and the
checkpoint as one rank reads it.

Megatron's split, by heads and MLP columns, so that a layer needs two
all-reduces (after o and after down) and nothing else:
- q/k/v (and their biases, GPT-OSS's sinks): column-parallel by KV heads, each
  rank holding whole KV groups (its KV heads and the query heads that read
  them), as evenly as the heads allow; with fewer KV heads than ranks, each KV
  head is replicated on the ranks that share it (ranks must then be a multiple
  of the KV heads, and the query heads divide evenly). The KV cache follows:
  each rank caches only its own KV heads.
- o: row-parallel (its input columns by the same heads); gate/up (each
  expert's too): column-parallel by intermediate columns; down: row-parallel.
  A row-parallel layer's bias counts once: rank 0 holds it, the others zeros.
- Mixture of experts: every expert split within (its intermediate columns), not
  experts spread over ranks: each rank then reads 1/N of every chosen expert's
  bytes, while expert parallelism leaves the rank that holds the most chosen
  experts reading more than 1/N (top-k of a few dozen experts rarely spreads
  evenly); the router is replicated and routes identically on every rank, as
  the all-reduced residual stream holds the same bits everywhere.
- lm_head: by vocabulary rows, each rank's logits gathered onto rank 0, which
  samples. The embedding table is replicated: a step reads only its tokens'
  rows, so splitting it would save memory at the cost of one more all-reduce
  per step.
Shard boundaries fall on the weights' quantization groups (GGUF blocks,
compressed-tensors or scheme groups), so quantized shards load as stored,
without requantization; a split that cannot is refused with the reason."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from armllm.model import arch
from armllm.model.config import ModelConfig
from armllm.model.gguf import GGML_TYPES, TYPE_IDS
from armllm.model.quantize import QuantizedMatrix, Scheme
from armllm.model.sources import QuantFormat
from armllm.model.weights import layer_tensors

# rows of a vocabulary shard come in multiples of this (whole panels of the GEMMs)
VOCAB_UNIT = 64
# intermediate columns of an MLP shard come in multiples of this where the size
# allows (whole GEMM panels and int8 activation groups)
MLP_UNIT = 32


def _split(total: int, ranks: int, unit: int) -> list[int]:
    """Boundaries [0, ..., total] of `ranks` parts in multiples of `unit` (the last
    part takes any remainder), the first parts the larger."""
    units, extra = divmod(total // unit, ranks)
    bounds = [0]
    for r in range(ranks):
        bounds.append(bounds[-1] + (units + (r < extra)) * unit)
    bounds[-1] = total
    return bounds


@dataclass(frozen=True)
class ShardPlan:
    """One rank's share: query heads [q0, q1), KV heads [kv0, kv1), the dense MLP's
    intermediate columns [i0, i1), each expert's [m0, m1), vocabulary rows [v0, v1)
    of the lm_head; `vocab_bounds` every rank's vocabulary start (and the end)."""
    rank: int
    ranks: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    inter: tuple[int, int]
    moe_inter: tuple[int, int]
    vocab: tuple[int, int]
    vocab_bounds: tuple[int, ...]

    def config(self, c: ModelConfig) -> ModelConfig:
        """The model's config as this rank's layers see it (the vocabulary stays whole:
        the embedding is replicated; a size no layer uses stays as it was)."""
        return dataclasses.replace(
            c, num_heads=self.q_heads[1] - self.q_heads[0],
            num_kv_heads=self.kv_heads[1] - self.kv_heads[0],
            intermediate_size=self.inter[1] - self.inter[0] or c.intermediate_size,
            moe_intermediate_size=self.moe_inter[1] - self.moe_inter[0]
            or c.moe_intermediate_size)


def plan_shards(c: ModelConfig, ranks: int, k_unit: int = 1) -> list[ShardPlan]:
    """Every rank's ShardPlan, or a ValueError saying why the model does not split over
    `ranks`. k_unit: the column multiple the row-parallel weights' shards must keep (the
    lcm of their quantization groups or GGUF blocks; 1 for float weights)."""
    if ranks < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {ranks}")
    if ranks > 1 and (c.linear_layers or c.attn_output_gate):
        raise ValueError(f"{c.architecture}: tensor parallel does not split Gated DeltaNet "
                         f"layers or gated attention heads yet; run it with "
                         f"tensor_parallel_size 1 (data parallel replicas work)")
    h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
    group = h // kv
    if kv >= ranks:
        kv_bounds = _split(kv, ranks, 1)
        kv_ranges = list(zip(kv_bounds, kv_bounds[1:], strict=False))
        q_ranges = [(a * group, b * group) for a, b in kv_ranges]
    elif ranks % kv == 0 and h % ranks == 0:
        share = h // ranks   # ranks // kv ranks share each KV head
        q_ranges = [(r * share, (r + 1) * share) for r in range(ranks)]
        kv_ranges = [(r * kv // ranks, r * kv // ranks + 1) for r in range(ranks)]
    else:
        raise ValueError(f"{h} query / {kv} KV heads do not split over {ranks} ranks: with "
                         f"fewer KV heads than ranks, ranks must be a multiple of the KV heads "
                         f"and divide the query heads")
    for q0, _ in q_ranges:
        if (q0 * d) % k_unit:
            raise ValueError(f"tensor parallel over {ranks} ranks would cut the o projection "
                             f"at column {q0 * d}, inside a quantization block of {k_unit} "
                             f"columns; choose a tensor_parallel_size that splits the "
                             f"{h} heads of {d} into multiples of {k_unit} columns")
    def mlp_bounds(size: int, what: str) -> list[int]:
        if not size:
            return [0] * (ranks + 1)
        unit = math.lcm(MLP_UNIT, k_unit)   # whole 32-column blocks where the size allows
        if size % unit:
            unit = k_unit
        if size // unit < ranks:
            raise ValueError(f"the {what} size {size} does not split into {ranks} shards of "
                             f"whole {unit}-column blocks")
        return _split(size, ranks, unit)

    dense = max((c.intermediate_size for i in range(c.num_layers) if not c.is_moe_layer(i)),
                default=0)
    inter = mlp_bounds(dense, "intermediate")
    moe = mlp_bounds(c.moe_intermediate_size if c.moe_layers else 0, "expert intermediate")
    vocab = _split(c.vocab_size, ranks, VOCAB_UNIT if c.vocab_size >= VOCAB_UNIT * ranks else 1)
    return [ShardPlan(r, ranks, q_ranges[r], kv_ranges[r], (inter[r], inter[r + 1]),
                      (moe[r], moe[r + 1]), (vocab[r], vocab[r + 1]), tuple(vocab))
            for r in range(ranks)]


def k_unit(source, c: ModelConfig, quantization) -> int:
    """The column multiple the row-parallel weights' shards must keep: the lcm of the
    o/down (and experts' down) quantization groups or GGUF blocks as the checkpoint
    stores them or a Scheme makes them."""
    unit = 1
    if isinstance(quantization, Scheme) and quantization.group:
        unit = quantization.group
    if quantization == "none" or not hasattr(source, "native_format"):
        return unit
    for i in range(c.num_layers):
        tensors = layer_tensors(c, i)
        o, down = tensors[1][0], tensors[3][0]
        for name, shape in (o, down):
            if not source.has(name):
                continue
            fmt = source.native_format(name, shape)
            unit = math.lcm(unit, _format_block(fmt))
    return unit


def _format_block(fmt: QuantFormat | None) -> int:
    if fmt is None:
        return 1
    if fmt.gguf:
        return math.lcm(*(GGML_TYPES[TYPE_IDS[t]][1] for t, _ in fmt.gguf))
    return fmt.group or 1   # per channel: any column split keeps the row scales


Cut = tuple[int, int, int] | str   # (axis, start, stop), or "once": rank 0's bias


def _cuts(c: ModelConfig, p: ShardPlan, head_name: str) -> dict[str, Cut]:
    """How each tensor splits, by name, from the architecture's declaration: each
    layer's linear parts (model/arch: linear_parts, each expert's too) and what goes
    with them (q/k/v/o biases, attention sinks, GPT-OSS's stacked expert biases);
    the lm_head by vocabulary rows. A tensor not named here is replicated."""
    family, d = arch.of(c), c.head_dim
    q = (0, p.q_heads[0] * d, p.q_heads[1] * d)
    kv = (0, p.kv_heads[0] * d, p.kv_heads[1] * d)
    cuts: dict[str, Cut] = {head_name: (0, *p.vocab)}
    for i in range(c.num_layers):
        (qn, _), (kn, _), (vn, _) = family.linear_parts(c, i)[0]
        on = family.linear_parts(c, i)[1][0][0]
        for name, cut in ((qn, q), (kn, kv), (vn, kv)):
            cuts[name] = cuts[name.removesuffix("weight") + "bias"] = cut
        cuts[on], cuts[on.removesuffix("weight") + "bias"] = (1, *q[1:]), "once"
        prefix = f"model.layers.{i}."
        cuts[prefix + "self_attn.sinks"] = (0, *p.q_heads)
        if not c.is_moe_layer(i):
            (gate, _), (up, _) = family.linear_parts(c, i)[2]
            cuts[gate], cuts[up] = (0, *p.inter), (0, *p.inter)
            cuts[family.linear_parts(c, i)[3][0][0]] = (1, *p.inter)
            continue
        for e in range(c.num_experts):
            gate, up, down = family.expert_tensors(i, e)
            cuts[gate], cuts[up], cuts[down] = (0, *p.moe_inter), (0, *p.moe_inter), \
                (1, *p.moe_inter)
        # GPT-OSS's stacked biases: gate_up's columns 2j (gate j) and 2j + 1 (up j)
        cuts[prefix + "mlp.experts.gate_up_proj_bias"] = (1, 2 * p.moe_inter[0],
                                                          2 * p.moe_inter[1])
        cuts[prefix + "mlp.experts.down_proj_bias"] = "once"
    return cuts


class ShardedSource:
    """A checkpoint source (model/sources.py) as rank `plan.rank` reads it: the same
    names, each tensor its shard (see the module's docstring), so that load_weights
    with plan.config() loads this rank's weights, quantized ones as stored. `full`
    is the whole checkpoint (the replicated embedding table is read from it)."""

    def __init__(self, source, plan: ShardPlan, config: ModelConfig, head_name: str):
        self.full, self.plan, self.where = source, plan, source.where
        self._cuts = _cuts(config, plan, head_name)

    def _slice(self, name: str) -> Cut | None:
        """(axis, start, stop) of the tensor's shard; "once" for a bias that counts once
        (rank 0's; zeros elsewhere); None: replicated."""
        return self._cuts.get(name)

    def has(self, name: str) -> bool:
        return self.full.has(name)

    def shape(self, name: str) -> tuple[int, ...]:
        shape = tuple(self.full.shape(name))
        cut = self._slice(name)
        if not isinstance(cut, tuple):
            return shape
        axis, start, stop = cut
        return shape[:axis] + (stop - start,) + shape[axis + 1:]

    def get(self, name: str) -> np.ndarray:
        a = self.full.get(name)
        cut = self._slice(name)
        if cut == "once":
            return a if self.plan.rank == 0 else np.zeros_like(a)
        if cut is None:
            return a
        axis, start, stop = cut
        return a[start:stop] if axis == 0 else a[:, start:stop]

    def native_format(self, name: str, shape: tuple[int, int]) -> QuantFormat | None:
        fmt = self.full.native_format(name, tuple(self.full.shape(name)))
        if fmt is None or not fmt.gguf:
            return fmt
        return dataclasses.replace(fmt, gguf=((fmt.gguf[0][0], shape[0]),))

    def _rows(self, chunks, cut, take):
        """The chunks (first row, rows) of a full tensor cut to its shard: `take(rows,
        slice)` slices a chunk's rows (axis 0) or columns (axis 1)."""
        if cut is None or cut == "once":
            yield from chunks
            return
        axis, start, stop = cut
        for row0, rows in chunks:
            n = rows.shape[0]
            if axis == 1:
                yield row0, take(rows, slice(start, stop), 1)
                continue
            lo, hi = max(start, row0), min(stop, row0 + n)
            if lo < hi:
                yield lo - start, take(rows, slice(lo - row0, hi - row0), 0)

    def float_rows(self, name: str, rows: int):
        yield from self._rows(self.full.float_rows(name, rows), self._slice(name),
                              lambda a, s, axis: a[s] if axis == 0 else a[:, s])

    def quantized_rows(self, name: str, shape: tuple[int, int], rows: int):
        full = tuple(self.full.shape(name))

        def take(qm: QuantizedMatrix, s: slice, axis: int) -> QuantizedMatrix:
            if axis == 0:
                return qm.take_rows(s)
            g = qm.group or qm.q.shape[1]   # per channel: one scale a row, kept whole
            gs = slice(s.start // g, -(-s.stop // g)) if qm.group else slice(None)
            return dataclasses.replace(qm, q=np.ascontiguousarray(qm.q[:, s]),
                                       d=np.ascontiguousarray(qm.d[:, gs]),
                                       o=None if qm.o is None else
                                       np.ascontiguousarray(qm.o[:, gs]))
        yield from self._rows(self.full.quantized_rows(name, full, rows), self._slice(name),
                              take)

    def raw_rows(self, name: str, shape: tuple[int, int], rows: int):
        full = tuple(self.full.shape(name))
        fmt = self.full.native_format(name, full)
        values, nbytes = GGML_TYPES[TYPE_IDS[fmt.gguf[0][0]]][1:]

        def take(raw: np.ndarray, s: slice, axis: int) -> np.ndarray:
            if axis == 0:
                return raw[s]
            return raw[:, s.start // values * nbytes:s.stop // values * nbytes]
        yield from self._rows(self.full.raw_rows(name, full, rows), self._slice(name), take)
