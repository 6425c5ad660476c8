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
  Gated attention (Qwen3.5): q_proj's rows are per query head [q | gate], so a
  rank's query heads take both halves.
- Gated DeltaNet layers (hybrids): split by key heads as attention by KV
  heads, each rank holding its key heads and the value heads that read them
  (with fewer key heads than ranks, each key head replicated on the ranks that
  split its value heads): its rows of the input projection's q, k and v parts
  and of the conv's channels (the same ones), of z, b, a, A_log and dt_bias;
  the output projection row-parallel by the same value heads. In llama.cpp's
  tiled order (value head h reads key head h % key heads) a rank's value heads
  are not one run of rows but one per key-head period: a cut is a list of row
  (or column) ranges, and each rank's heads keep the checkpoint's order, so its
  shard is the same kind of model (tiled or not) over its own heads. The gated
  norm's weight (per head dim) is replicated; the state pool follows the heads.
- Mixture of experts: every expert split within (its intermediate columns), not
  experts spread over ranks: each rank then reads 1/N of every chosen expert's
  bytes, while expert parallelism leaves the rank that holds the most chosen
  experts reading more than 1/N (top-k of a few dozen experts rarely spreads
  evenly); the router is replicated and routes identically on every rank, as
  the all-reduced residual stream holds the same bits everywhere. A shared
  expert (Qwen3.5-MoE) splits like the experts, its gate vector replicated:
  every rank scales its part of the shared output by the same sigmoid of the
  whole normed row, and the layer's all-reduce sums the parts.
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
from armllm.model.config import DeltaNetShape, ModelConfig
from armllm.model.gguf import GGML_TYPES, TYPE_IDS
from armllm.model.quantize import QuantizedMatrix, Scheme
from armllm.model.sources import QuantFormat
from armllm.model.weights import layer_tensors

# rows of a vocabulary shard come in multiples of this (whole panels of the GEMMs)
VOCAB_UNIT = 64
# intermediate columns of an MLP shard come in multiples of this where the size
# allows (whole GEMM panels and int8 activation groups)
MLP_UNIT = 32

Span = tuple[int, int]   # [start, stop)


def _split(total: int, ranks: int, unit: int) -> list[int]:
    """Boundaries [0, ..., total] of `ranks` parts in multiples of `unit` (the last
    part takes any remainder), the first parts the larger."""
    units, extra = divmod(total // unit, ranks)
    bounds = [0]
    for r in range(ranks):
        bounds.append(bounds[-1] + (units + (r < extra)) * unit)
    bounds[-1] = total
    return bounds


def _runs(items: list[int]) -> tuple[Span, ...]:
    """Sorted distinct integers as their runs of consecutive values."""
    runs: list[list[int]] = []
    for x in items:
        if runs and runs[-1][1] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, x + 1])
    return tuple((a, b) for a, b in runs)


@dataclass(frozen=True)
class ShardPlan:
    """One rank's share: query heads [q0, q1), KV heads [kv0, kv1), the dense MLP's
    intermediate columns [i0, i1), each expert's (and a shared expert's) [m0, m1),
    vocabulary rows [v0, v1) of the lm_head; `vocab_bounds` every rank's vocabulary
    start (and the end); a hybrid's Gated DeltaNet key heads [k0, k1) and value heads,
    runs [a, b) in the checkpoint's order (one run unless tiled)."""
    rank: int
    ranks: int
    q_heads: Span
    kv_heads: Span
    inter: Span
    moe_inter: Span
    vocab: Span
    vocab_bounds: tuple[int, ...]
    delta_k_heads: Span = (0, 0)
    delta_v_heads: tuple[Span, ...] = ()

    def config(self, c: ModelConfig) -> ModelConfig:
        """The model's config as this rank's layers see it (the vocabulary stays whole:
        the embedding is replicated; a size no layer uses stays as it was)."""
        moe = self.moe_inter[1] - self.moe_inter[0]
        delta = c.delta_net and dataclasses.replace(
            c.delta_net, k_heads=self.delta_k_heads[1] - self.delta_k_heads[0],
            v_heads=sum(b - a for a, b in self.delta_v_heads))
        return dataclasses.replace(
            c, num_heads=self.q_heads[1] - self.q_heads[0],
            num_kv_heads=self.kv_heads[1] - self.kv_heads[0],
            intermediate_size=self.inter[1] - self.inter[0] or c.intermediate_size,
            moe_intermediate_size=moe or c.moe_intermediate_size,
            # the layer runs a shared expert on the experts' scratch: the same size
            shared_expert_intermediate_size=c.shared_expert_intermediate_size and moe,
            delta_net=delta)


def _delta_heads(d: DeltaNetShape, ranks: int) -> list[tuple[Span, tuple[Span, ...]]]:
    """Each rank's Gated DeltaNet key heads and value heads (runs in the checkpoint's
    order), as attention's KV and query heads: whole key heads with the value heads
    that read them, or with fewer key heads than ranks, each key head on the ranks
    that split its value heads."""
    k, g = d.k_heads, d.v_heads // d.k_heads
    if k >= ranks:
        bounds = _split(k, ranks, 1)
        shares = [((a, b), (0, g)) for a, b in zip(bounds, bounds[1:], strict=False)]
    elif ranks % k == 0 and g % (ranks // k) == 0:
        per, width = ranks // k, g // (ranks // k)
        shares = [((r // per, r // per + 1), (r % per * width, (r % per + 1) * width))
                  for r in range(ranks)]
    else:
        raise ValueError(f"{k} key / {d.v_heads} value heads of the Gated DeltaNet layers do "
                         f"not split over {ranks} ranks: with fewer key heads than ranks, "
                         f"ranks must be a multiple of the key heads and divide each key "
                         f"head's {g} value heads")
    # value head t of key head j: j * g + t (Hugging Face's order), t * k + j (tiled)
    return [((a, b), _runs(sorted(t * k + j if d.v_tiled else j * g + t
                                  for j in range(a, b) for t in range(t0, t1))))
            for (a, b), (t0, t1) in shares]


def plan_shards(c: ModelConfig, ranks: int, k_unit: int = 1) -> list[ShardPlan]:
    """Every rank's ShardPlan, or a ValueError saying why the model does not split over
    `ranks`. k_unit: the column multiple the row-parallel weights' shards must keep (the
    lcm of their quantization groups or GGUF blocks; 1 for float weights)."""
    if ranks < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {ranks}")
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
    delta = _delta_heads(c.delta_net, ranks) if c.delta_net else [((0, 0), ())] * ranks
    for _, runs in delta:
        for edge in (x * c.delta_net.v_dim for run in runs for x in run):
            if edge % k_unit:
                raise ValueError(f"tensor parallel over {ranks} ranks would cut the Gated "
                                 f"DeltaNet's output projection at column {edge}, inside a "
                                 f"quantization block of {k_unit} columns; choose a "
                                 f"tensor_parallel_size that splits its value heads of "
                                 f"{c.delta_net.v_dim} into multiples of {k_unit} columns")

    def mlp_bounds(size: int, what: str) -> list[int]:
        if not size:
            return [0] * (ranks + 1)
        unit = math.lcm(MLP_UNIT, k_unit)   # whole 32-column blocks where the size allows
        if size % unit or size // unit < ranks:
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
                      (moe[r], moe[r + 1]), (vocab[r], vocab[r + 1]), tuple(vocab),
                      *delta[r])
            for r in range(ranks)]


def k_unit(source, c: ModelConfig, quantization) -> int:
    """The column multiple the row-parallel weights' shards must keep: the lcm of the
    o/down (the DeltaNet's output projection, experts' and a shared expert's down)
    quantization groups or GGUF blocks as the checkpoint stores them or a Scheme makes
    them."""
    unit = 1
    if isinstance(quantization, Scheme) and quantization.group:
        unit = quantization.group
    if quantization == "none" or not hasattr(source, "native_format"):
        return unit
    family = arch.of(c)
    for i in range(c.num_layers):
        tensors = layer_tensors(c, i)
        row_parallel = [tensors[1][0], tensors[3][0]]
        if c.is_moe_layer(i) and c.shared_expert_intermediate_size:
            row_parallel.append(family.shared_expert_parts(c, i)[1][0])
        for name, shape in row_parallel:
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


# (axis, the spans [start, stop) along it, in order), or "once": rank 0's bias
Cut = tuple[int, tuple[Span, ...]] | str


def _delta_cuts(family, c: ModelConfig, p: ShardPlan, i: int) -> dict[str, Cut]:
    """Recurrent layer i's Gated DeltaNet tensors: rows of its key heads' q and k and
    its value heads' v (the input projection and the conv alike), z, b, a, A_log and
    dt_bias; the output projection's columns of its value heads."""
    d, name = c.delta_net, family.delta_tensor
    (k0, k1), heads = p.delta_k_heads, p.delta_v_heads
    values = tuple((a * d.v_dim, b * d.v_dim) for a, b in heads)
    qkv = ((k0 * d.k_dim, k1 * d.k_dim),
           (d.key_size + k0 * d.k_dim, d.key_size + k1 * d.k_dim),
           *((2 * d.key_size + a, 2 * d.key_size + b) for a, b in values))
    cuts: dict[str, Cut] = {name(i, "in_proj_qkv.weight"): (0, qkv),
                            name(i, "conv1d.weight"): (0, qkv),
                            name(i, "in_proj_z.weight"): (0, values),
                            name(i, "out_proj.weight"): (1, values)}
    for per_head in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
        cuts[name(i, per_head)] = (0, heads)
    return cuts


def _cuts(c: ModelConfig, p: ShardPlan, head_name: str) -> dict[str, Cut]:
    """How each tensor splits, by name, from the architecture's declaration: each
    layer's linear parts (model/arch: linear_parts, each expert's and a shared
    expert's too) and what goes with them (q/k/v/o biases, attention sinks, GPT-OSS's
    stacked expert biases, a DeltaNet's per-head vectors and conv); the lm_head by
    vocabulary rows. A tensor not named here is replicated."""
    family, d = arch.of(c), c.head_dim
    kv = (0, ((p.kv_heads[0] * d, p.kv_heads[1] * d),))
    o = (1, ((p.q_heads[0] * d, p.q_heads[1] * d),))
    cuts: dict[str, Cut] = {head_name: (0, (p.vocab,))}
    inter, moe_inter = (0, (p.inter,)), (0, (p.moe_inter,))
    for i in range(c.num_layers):
        parts = family.linear_parts(c, i)
        prefix = f"model.layers.{i}."
        if c.is_linear_layer(i):
            cuts |= _delta_cuts(family, c, p, i)
        else:
            (qn, (q_rows, _)), (kn, _), (vn, _) = parts[0]
            per_head = q_rows // c.num_heads   # head_dim; gated attention's: [q | gate]
            q = (0, ((p.q_heads[0] * per_head, p.q_heads[1] * per_head),))
            for name, cut in ((qn, q), (kn, kv), (vn, kv)):
                cuts[name] = cuts[name.removesuffix("weight") + "bias"] = cut
            on = parts[1][0][0]
            cuts[on], cuts[on.removesuffix("weight") + "bias"] = o, "once"
            cuts[prefix + "self_attn.sinks"] = (0, (p.q_heads,))
        if not c.is_moe_layer(i):
            (gate, _), (up, _) = parts[2]
            cuts[gate], cuts[up], cuts[parts[3][0][0]] = inter, inter, (1, (p.inter,))
            continue
        experts = [family.expert_tensors(i, e) for e in range(c.num_experts)]
        if c.shared_expert_intermediate_size:
            (gate, _), (up, _) = family.shared_expert_parts(c, i)[0]
            experts.append((gate, up, family.shared_expert_parts(c, i)[1][0][0]))
        for gate, up, down in experts:
            cuts[gate], cuts[up], cuts[down] = moe_inter, moe_inter, (1, (p.moe_inter,))
        # GPT-OSS's stacked biases: gate_up's columns 2j (gate j) and 2j + 1 (up j)
        cuts[prefix + "mlp.experts.gate_up_proj_bias"] = (1, ((2 * p.moe_inter[0],
                                                               2 * p.moe_inter[1]),))
        cuts[prefix + "mlp.experts.down_proj_bias"] = "once"
    return cuts


def _take(a: np.ndarray, spans: tuple[Span, ...], axis: int) -> np.ndarray:
    """a's rows (axis 0) or columns (axis 1) in the spans, one after another."""
    parts = [a[s:e] if axis == 0 else a[:, s:e] for s, e in spans]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


class ShardedSource:
    """A checkpoint source (model/sources.py) as rank `plan.rank` reads it: the same
    names, each tensor its shard (see the module's docstring), so that load_weights
    with plan.config() loads this rank's weights, quantized ones as stored. `full`
    is the whole checkpoint (the replicated embedding table is read from it)."""

    def __init__(self, source, plan: ShardPlan, config: ModelConfig, head_name: str):
        self.full, self.plan, self.where = source, plan, source.where
        self._cuts = _cuts(config, plan, head_name)

    def _slice(self, name: str) -> Cut | None:
        """(axis, spans) of the tensor's shard; "once" for a bias that counts once
        (rank 0's; zeros elsewhere); None: replicated."""
        return self._cuts.get(name)

    def has(self, name: str) -> bool:
        return self.full.has(name)

    def shape(self, name: str) -> tuple[int, ...]:
        shape = tuple(self.full.shape(name))
        cut = self._slice(name)
        if not isinstance(cut, tuple):
            return shape
        axis, spans = cut
        return shape[:axis] + (sum(e - s for s, e in spans),) + shape[axis + 1:]

    def get(self, name: str) -> np.ndarray:
        a = self.full.get(name)
        cut = self._slice(name)
        if cut == "once":
            return a if self.plan.rank == 0 else np.zeros_like(a)
        return a if cut is None else _take(a, cut[1], cut[0])

    def native_format(self, name: str, shape: tuple[int, int]) -> QuantFormat | None:
        fmt = self.full.native_format(name, tuple(self.full.shape(name)))
        if fmt is None or not fmt.gguf:
            return fmt
        return dataclasses.replace(fmt, gguf=((fmt.gguf[0][0], shape[0]),))

    def _rows(self, chunks, cut, take):
        """The chunks (first row, rows) of a full tensor cut to its shard: `take(rows,
        spans, axis)` takes a chunk's rows (axis 0: one span) or columns (axis 1)."""
        if cut is None or cut == "once":
            yield from chunks
            return
        axis, spans = cut
        for row0, rows in chunks:
            if axis == 1:
                yield row0, take(rows, spans, 1)
                continue
            first = 0   # the span's first row in the shard
            for start, stop in spans:
                lo, hi = max(start, row0), min(stop, row0 + rows.shape[0])
                if lo < hi:
                    yield first + lo - start, take(rows, ((lo - row0, hi - row0),), 0)
                first += stop - start

    def float_rows(self, name: str, rows: int):
        yield from self._rows(self.full.float_rows(name, rows), self._slice(name), _take)

    def quantized_rows(self, name: str, shape: tuple[int, int], rows: int):
        full = tuple(self.full.shape(name))

        def take(qm: QuantizedMatrix, spans: tuple[Span, ...], axis: int) -> QuantizedMatrix:
            if axis == 0:
                return qm.take_rows(slice(*spans[0]))
            if not qm.group:   # per channel: one scale a row, kept whole
                return dataclasses.replace(qm, q=np.ascontiguousarray(_take(qm.q, spans, 1)))
            g = qm.group   # the spans keep whole groups (plan_shards' k_unit)
            groups = tuple((s // g, -(-e // g)) for s, e in spans)
            return dataclasses.replace(
                qm, q=np.ascontiguousarray(_take(qm.q, spans, 1)),
                d=np.ascontiguousarray(_take(qm.d, groups, 1)),
                o=None if qm.o is None else np.ascontiguousarray(_take(qm.o, groups, 1)))
        yield from self._rows(self.full.quantized_rows(name, full, rows), self._slice(name),
                              take)

    def raw_rows(self, name: str, shape: tuple[int, int], rows: int):
        full = tuple(self.full.shape(name))
        fmt = self.full.native_format(name, full)
        values, nbytes = GGML_TYPES[TYPE_IDS[fmt.gguf[0][0]]][1:]

        def take(raw: np.ndarray, spans: tuple[Span, ...], axis: int) -> np.ndarray:
            if axis == 0:
                return raw[slice(*spans[0])]
            return _take(raw, tuple((s // values * nbytes, e // values * nbytes)
                                    for s, e in spans), 1)
        yield from self._rows(self.full.raw_rows(name, full, rows), self._slice(name), take)
