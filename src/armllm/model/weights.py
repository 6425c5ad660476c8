"""weights: loads a checkpoint's tensors (safetensors directory or GGUF),
checks every shape against the config, converts to the chosen precision and
prepacks the linear layers once (fused QKV and gate/up), so that `forward`
never converts or repacks anything. Loading holds little beyond the packed
weights: a source (model/sources.py: HFSource, GGUFSource) hands out a
matrix's rows a chunk at a time and load_weights releases each chunk's file
pages once the next is asked for. `linear_formats` tells from a checkpoint's
metadata alone what format each linear weight will load in (what `armllm plan`
and the Workspace size memory by)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from armllm import ops
from armllm.model import arch
from armllm.model.arch.base import EMBED, FINAL_NORM
from armllm.model.config import ModelConfig
from armllm.model.gguf import GGML_TYPES, TYPE_IDS
from armllm.model.layer import (
    DeltaNet,
    QKNorm,
    SparseMLP,
    Step,
    attention_step,
    has_step,
    step_norms,
)
from armllm.model.quantize import Scheme, num_groups, quantize_rtn
from armllm.model.sources import GGUFSource, QuantFormat, as_bf16, as_f32, chunk_rows

WeightDtype = Literal["f32", "bf16"]


@dataclass(frozen=True)
class LinearFormats:
    """What each linear weight runs as: per layer the LINEARS weights' formats,
    and the lm_head's; None: a float weight in the model's dtype."""
    layers: tuple[tuple[QuantFormat | None, ...], ...]
    lm_head: QuantFormat | None
    embed_gguf: str | None = None   # the embedding table kept as stored in this ggml type


def layer_tensors(c: ModelConfig, i: int, expert: int = 0
                  ) -> list[list[tuple[str, tuple[int, int]]]]:
    """The checkpoint tensors (name, [N, K]) of layer i's packed linear weights, in
    LINEARS order (the architecture file's linear_parts)."""
    return arch.of(c).linear_parts(c, i, expert)


def linear_shapes(c: ModelConfig, i: int = 0) -> list[tuple[int, int]]:
    """[N, K] of layer i's packed linear weights, in LINEARS order (a sparse
    layer's gate_up and down: one expert's)."""
    return [(sum(n for _, (n, _) in parts), parts[0][1][1]) for parts in layer_tensors(c, i)]


@dataclass
class MoEWeights:
    """A sparse layer's MLP: the router [experts, hidden] (float, kept in the model's
    dtype) and each expert's fused [gate; up] and down weights, one format for all;
    GPT-OSS's biases: the router's [experts], the experts' [experts, 2 inter] ([gate;
    up] as the weights) and [experts, hidden], float32."""
    router: ops.PackedWeight
    gate_up: list[ops.PackedWeight]
    down: list[ops.PackedWeight]
    router_bias: np.ndarray | None = None
    gate_up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None


@dataclass
class DeltaWeights:
    """A Gated DeltaNet mixer's own weights (its projections are the layer's qkv and o):
    ba [2 v_heads, hidden] the b and a projections, packed in the model's float dtype;
    conv [conv channels, kernel], a_neg = -exp(A_log) and dt_bias [v_heads], norm
    [v_dim] (the gated RMSNorm's), float32."""
    ba: ops.PackedWeight
    conv: np.ndarray
    a_neg: np.ndarray
    dt_bias: np.ndarray
    norm: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.ba.nbytes + sum(a.nbytes for a in (self.conv, self.a_neg, self.dt_bias,
                                                         self.norm))


@dataclass
class LayerWeights:
    norms: dict[str, np.ndarray]   # [hidden] RMSNorm weights, by the names the steps use
    qkv: ops.PackedWeight          # [q; k; v] rows
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None      # per-head RMSNorm weights (the QKNorm step's)
    k_norm: np.ndarray | None
    o: ops.PackedWeight
    gate_up: ops.PackedWeight | None   # [gate; up] rows (a sparse layer: its shared expert's)
    down: ops.PackedWeight | None
    moe: MoEWeights | None = None
    o_bias: np.ndarray | None = None   # GPT-OSS
    sinks: np.ndarray | None = None    # [heads] attention sink logits (GPT-OSS)
    steps: tuple[Step, ...] = ()       # the layer as its architecture file declares it
    delta: DeltaWeights | None = None  # a recurrent layer's Gated DeltaNet
    shared_gate: np.ndarray | None = None   # [hidden] the shared expert's gate (Qwen3.5-MoE)

    def mlp_weights(self) -> tuple[ops.PackedWeight, ops.PackedWeight]:
        """The (gate_up, down) whose formats stand for the layer's MLP: expert 0's in a
        sparse layer (every expert shares them)."""
        if self.moe is not None:
            return self.moe.gate_up[0], self.moe.down[0]
        return self.gate_up, self.down

    @property
    def nbytes(self) -> int:
        mlp = [self.moe.router, *self.moe.gate_up, *self.moe.down] if self.moe else []
        mlp += [w for w in (self.gate_up, self.down) if w is not None]
        return sum(w.nbytes for w in (self.qkv, self.o, *mlp)) + (
            self.delta.nbytes if self.delta else 0)


@dataclass
class MTPWeights:
    """A multi-token-prediction block (Qwen3.5's mtp.*), loaded for speculative
    decoding to draft with: layers(fc [rms_norm(embed(next token), embed_norm) |
    rms_norm(hidden, hidden_norm)]), then rms_norm(., norm) and the model's lm_head.
    fc [hidden, 2 hidden] in the model's float dtype; norms [hidden] float32; layers:
    full-attention decoder layers."""
    fc: ops.PackedWeight
    embed_norm: np.ndarray
    hidden_norm: np.ndarray
    norm: np.ndarray
    layers: list[LayerWeights]

    @property
    def nbytes(self) -> int:
        return self.fc.nbytes + sum(lw.nbytes for lw in self.layers) + 3 * self.norm.nbytes


@dataclass
class ModelWeights:
    dtype: WeightDtype
    embed: np.ndarray | ops.GGUFTable  # [vocab, hidden] float32, uint16 bf16 bits, or GGUF blocks
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: ops.PackedWeight | None   # None: an embedding model (config.has_lm_head False)
    quantization: str | None = None   # what the linear layers run as, e.g. "w4a8-g32 (GGUF Q4_1)"
    mtp: MTPWeights | None = None     # the multi-token-prediction block, where loaded

    @property
    def nbytes(self) -> int:
        head = 0 if self.lm_head is None else self.lm_head.nbytes
        mtp = 0 if self.mtp is None else self.mtp.nbytes
        return sum(lw.nbytes for lw in self.layers) + self.embed.nbytes + head + mtp

    @cached_property
    def formats(self) -> LinearFormats | None:
        """The formats of the packed linear weights (None: all float)."""
        def fmt(w: ops.PackedWeight | None) -> QuantFormat | None:
            if w is None:
                return None
            if w.dtype == "gguf":
                return QuantFormat(0, w.group, gguf=tuple(
                    (GGML_TYPES[t][0], r) for t, r in zip(w.gguf_types, w.gguf_rows, strict=True)))
            return QuantFormat(w.bits, w.group, w.zp_correction is None) if w.quantized \
                else None
        embed = GGML_TYPES[self.embed.ggml_type][0] if isinstance(self.embed, ops.GGUFTable) \
            else None
        return _formats_or_none(
            tuple((fmt(lw.qkv), fmt(lw.o), *map(fmt, lw.mlp_weights())) for lw in self.layers),
            fmt(self.lm_head), embed)


def _packed_format(w: ops.PackedWeight) -> tuple:
    """What distinguishes the formats of two packed weights."""
    return (w.dtype, w.bits, w.group, w.gguf_types, w.zp_correction is None)


def _formats_or_none(layers: tuple[tuple[QuantFormat | None, ...], ...],
                     lm_head: QuantFormat | None, embed_gguf: str | None = None
                     ) -> LinearFormats | None:
    if lm_head is None and embed_gguf is None and all(f is None for layer in layers
                                                      for f in layer):
        return None
    return LinearFormats(layers, lm_head, embed_gguf)


Quantization = Literal["auto", "none"] | Scheme


def _fused_format(natives: list[QuantFormat | None], quantization: Quantization
                  ) -> QuantFormat | None:
    """What one packed matrix runs as, from the formats its parts are stored in (None:
    float): under "auto" the stored format when every part shares it (mixed parts run
    as floats), a Scheme's own format, or None for "none"."""
    if quantization == "none":
        return None
    if quantization == "auto":
        if any(f is None for f in natives):
            return None
        if len({(f.bits, f.group) for f in natives}) == 1 and natives[0].bits:
            # one quantization of the input serves every part: asymmetric if any asks
            return QuantFormat(natives[0].bits, natives[0].group,
                               all(f.act_symmetric for f in natives))
        if all(f.gguf for f in natives):   # GGUF parts of other types: each as stored
            parts = sum((f.gguf for f in natives), ())
            return QuantFormat(0, ops.gguf_act_group([TYPE_IDS[t] for t, _ in parts]),
                               gguf=parts)
        return None
    return QuantFormat(quantization.bits, quantization.group, quantization.act_symmetric)


def _quantizes_head(quantization: Quantization, quantize_lm_head: bool) -> bool:
    return quantization == "auto" or (quantize_lm_head and quantization != "none")


def head_tensor_name(c: ModelConfig) -> str:
    """The checkpoint tensor the lm_head is read from (the embedding when tied)."""
    return arch.of(c).head_tensor(c)


def _head_tensor(c: ModelConfig) -> tuple[str, tuple[int, int]]:
    return head_tensor_name(c), (c.vocab_size, c.hidden_size)


def linear_formats(source, config: ModelConfig, quantization: Quantization = "auto",
                   quantize_lm_head: bool = False) -> LinearFormats | None:
    """What load_weights runs each linear weight of `source` as (None: all float), from
    the checkpoint's metadata alone: no tensor data is read."""
    getter = getattr(source, "native_format", None)

    def fmt(names_shapes: list[tuple[str, tuple[int, int]]]) -> QuantFormat | None:
        if quantization == "none":
            return None
        natives = [getter(n, s) if getter else None for n, s in names_shapes]
        return _fused_format(natives, quantization)

    layers = tuple(tuple(fmt(parts) for parts in layer_tensors(config, i))
                   for i in range(config.num_layers))
    plan = getattr(source, "plan", None)   # a tensor-parallel rank's: its vocabulary rows
    rows = plan.vocab[1] - plan.vocab[0] if plan else config.vocab_size
    head = fmt([(head_tensor_name(config), (rows, config.hidden_size))]) \
        if config.has_lm_head and _quantizes_head(quantization, quantize_lm_head) else None
    full = getattr(source, "full", source)
    embed = full.native_format(*_embed_tensor(config)) if getter and quantization == "auto" \
        else None
    return _formats_or_none(layers, head, embed.gguf[0][0] if embed and embed.gguf else None)


def _embed_tensor(c: ModelConfig) -> tuple[str, tuple[int, int]]:
    return EMBED, (c.vocab_size, c.hidden_size)


def load_weights(source, config: ModelConfig, dtype: WeightDtype = "bf16",
                 progress=None, quantization: Quantization = "auto",
                 quantize_lm_head: bool = False) -> ModelWeights:
    """Reads, checks, converts and packs every tensor of the model.

    quantization: "auto" runs the checkpoint's own quantized layers as they are (GGUF's
    quantized types, compressed-tensors) and float layers in `dtype`, and keeps a GGUF's
    quantized embedding table as stored (the gather dequantizes the rows it reads);
    "none" dequantizes everything to `dtype`; a Scheme quantizes float layers at load
    (round to nearest) and keeps quantized ones that already match it, embeddings in
    `dtype`. A fused matrix whose GGUF parts differ in type (a Q4_K_M file's Q4_K Q/K and
    Q6_K V) runs each part as stored on the GGUF-block GEMM. The lm_head
    follows the linear layers' rule when the checkpoint stores it quantized ("auto", e.g.
    a GGUF's Q8_0 token_embd under a tied head, runs as is, as llama.cpp runs it) or when
    quantize_lm_head asks for it; a float lm_head otherwise stays in `dtype`.

    Memory: loading holds little beyond the packed weights. Each packed matrix is built
    from its parts a chunk of rows at a time (converted, dequantized or quantized per
    chunk) into one buffer in the pack's input form, and each chunk's file pages are
    released once it is copied, so the file's pages do not stay resident; the buffer (one
    matrix's pack input) is the only transient. The embeddings and lm_head, the largest
    matrices, come first, while the least is resident.

    A tensor-parallel rank loads with `source` its model/sharding.ShardedSource and
    `config` its plan's: its shards, and the whole embedding table (from source.full)."""
    if dtype not in ("f32", "bf16"):
        raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")
    if not (isinstance(quantization, Scheme) or quantization in ("auto", "none")):
        raise ValueError(f"quantization must be auto, none or a Scheme, got {quantization!r}")
    c = config
    used: set[str] = set()   # what the linear layers ended up as
    full = getattr(source, "full", source)   # the replicated embedding's source
    plan = getattr(source, "plan", None)     # a tensor-parallel rank's ShardPlan
    v0, v1 = plan.vocab if plan else (0, c.vocab_size)   # the lm_head's rows

    def check(name: str, shape: tuple[int, ...], source=source) -> None:
        if not source.has(name):
            raise ValueError(f"{source.where}: missing tensor {name}")
        found = source.shape(name)
        if tuple(found) != shape:
            raise ValueError(f"{source.where}: tensor {name} has shape {list(found)}, "
                             f"expected {list(shape)} for this config")

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        check(name, shape)
        return source.get(name)

    def float_matrix(names_shapes, out_dtype: WeightDtype, source=source) -> np.ndarray:
        """The parts' rows stacked into one new [N, K] array in `out_dtype` (bf16 as
        uint16 bits), converted a chunk at a time."""
        conv = as_bf16 if out_dtype == "bf16" else as_f32
        k = names_shapes[0][1][1]
        out = np.empty((sum(n for _, (n, _) in names_shapes), k),
                       np.uint16 if out_dtype == "bf16" else np.float32)
        first = 0
        for name, shape in names_shapes:
            check(name, shape, source)
            for row0, rows in source.float_rows(name, chunk_rows(k)):
                out[first + row0:first + row0 + len(rows)] = conv(rows)
            first += shape[0]
        return out

    def quantized_matrix(names_shapes, natives: list[QuantFormat | None], fmt: QuantFormat
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(q, d, o) of the parts' rows stacked, in `fmt`: each part as stored when it is
        stored in fmt's bits and group, else quantized (round to nearest) a chunk at a
        time."""
        k = names_shapes[0][1][1]
        n, chunk = sum(s[0] for _, s in names_shapes), chunk_rows(k)
        q = np.empty((n, k), np.int8)
        d = np.empty((n, num_groups(k, fmt.group)), np.float32)
        o = np.zeros_like(d) if fmt.bits == 4 else None
        first = 0
        for (name, shape), nat in zip(names_shapes, natives, strict=True):
            if nat is not None and (nat.bits, nat.group) == (fmt.bits, fmt.group):
                chunks = source.quantized_rows(name, shape, chunk)   # no second rounding
            else:
                chunks = ((row0, quantize_rtn(as_f32(rows), quantization))
                          for row0, rows in source.float_rows(name, chunk))
            for row0, qm in chunks:
                rows = slice(first + row0, first + row0 + qm.shape[0])
                q[rows], d[rows] = qm.q, qm.d
                if qm.o is not None:
                    o[rows] = qm.o
            first += shape[0]
        return q, d, o

    def gguf_matrix(names_shapes, fmt: QuantFormat) -> ops.PackedWeight:
        """The parts' rows as stored, one after another, packed for the GGUF-block GEMM."""
        k = names_shapes[0][1][1]
        sizes = [n * GGML_TYPES[TYPE_IDS[t]][2] * k // GGML_TYPES[TYPE_IDS[t]][1]
                 for t, n in fmt.gguf]
        blocks, first = np.empty(sum(sizes), np.uint8), 0
        for (name, shape), size in zip(names_shapes, sizes, strict=True):
            part = blocks[first:first + size].reshape(shape[0], -1)
            for row0, rows in source.raw_rows(name, shape, chunk_rows(k)):
                part[row0:row0 + len(rows)] = rows
            first += size
        return ops.pack_gguf(blocks, k, [TYPE_IDS[t] for t, _ in fmt.gguf],
                             [n for _, n in fmt.gguf])

    def matrix(names_shapes: list[tuple[str, tuple[int, int]]],
               may_quantize: bool = True) -> ops.PackedWeight:
        fmt = None
        if may_quantize and quantization != "none":
            for name, shape in names_shapes:
                check(name, shape)
            natives = [source.native_format(n, s) for n, s in names_shapes]
            fmt = _fused_format(natives, quantization)
        if fmt is None:  # float, or mixed formats within one fused matrix: run in dtype
            if may_quantize:
                used.add(dtype)
            return ops.pack_weight(float_matrix(names_shapes, dtype), dtype)
        if fmt.runs_gguf:
            origin = "GGUF" if isinstance(full, GGUFSource) else "checkpoint"
            used.update(f"{t} ({origin}, as stored)" for t, _ in fmt.gguf)
            return gguf_matrix(names_shapes, fmt)
        if quantization == "auto":
            acts = "" if fmt.act_symmetric else ", asymmetric activations"
            used.add(f"w{fmt.bits}a8-{_group_name(fmt.group)} ({_origin(full)}{acts})")
        else:
            used.add(quantization.name)
        q, d, o = quantized_matrix(names_shapes, natives, fmt)
        return ops.pack_quantized(q, d, o, fmt.bits, fmt.group, act_asym=not fmt.act_symmetric)

    h, q, kv = c.hidden_size, c.q_size, c.kv_size
    embed = None
    if quantization == "auto" and hasattr(full, "embedding_table"):
        check(*_embed_tensor(c), full)
        embed = full.embedding_table(*_embed_tensor(c))
    if embed is None:
        embed = float_matrix([_embed_tensor(c)], dtype, full)
    head = [(_head_tensor(c)[0], (v1 - v0, h))]
    head_fmt = None
    if c.has_lm_head and _quantizes_head(quantization, quantize_lm_head) and \
            quantization != "none":
        check(*head[0])
        head_fmt = _fused_format([source.native_format(*head[0])], quantization)
    if not c.has_lm_head:
        lm_head = None
    elif head_fmt is not None:
        lm_head = matrix(head)
        head_label = ", ".join(sorted(used))
        used.clear()
    elif c.tie_word_embeddings and isinstance(embed, np.ndarray):
        lm_head = ops.pack_weight(np.ascontiguousarray(embed[v0:v1]), dtype)
    elif c.tie_word_embeddings:   # a quantized table under a float head
        table = embed.dequantize()[v0:v1]
        lm_head = ops.pack_weight(as_bf16(table) if dtype == "bf16" else table, dtype)
    else:
        lm_head = matrix(head, may_quantize=False)

    def experts(i: int) -> MoEWeights:
        """Layer i's router and experts, every expert in expert 0's format."""
        packed = [[matrix(parts) for parts in layer_tensors(c, i, e)[2:]]
                  for e in range(c.num_experts)]
        first = [_packed_format(w) for w in packed[0]]
        for e, pair in enumerate(packed[1:], 1):
            if [_packed_format(w) for w in pair] != first:
                raise ValueError(f"{source.where}: expert {e} of layer {i} is stored in "
                                 f"another format than expert 0; armllm runs a layer's "
                                 f"experts in one format")
        router = (family.router_tensor(i), (c.num_experts, c.hidden_size))
        biases = (None, None, None)
        if c.moe_bias:   # GPT-OSS: stacked per layer, gate_up's rows interleaved
            stem = f"model.layers.{i}.mlp.experts."
            e, inter = c.num_experts, c.moe_intermediate_size
            gate_up = as_f32(tensor(stem + "gate_up_proj_bias", (e, 2 * inter)))
            biases = (as_f32(tensor(router[0][:-len("weight")] + "bias", (e,))),
                      np.ascontiguousarray(np.concatenate([gate_up[:, 0::2], gate_up[:, 1::2]],
                                                          axis=1)),
                      as_f32(tensor(stem + "down_proj_bias", (e, h))))
        return MoEWeights(matrix([router], may_quantize=False), [g for g, _ in packed],
                          [d for _, d in packed], *biases)

    def delta_net(i: int) -> DeltaWeights:
        """Recurrent layer i's Gated DeltaNet weights (the projections aside)."""
        d, name = c.delta_net, family.delta_tensor
        conv = name(i, "conv1d.weight")   # [channels, 1, kernel], squeezed in a GGUF
        if not source.has(conv) or [n for n in source.shape(conv) if n != 1] != \
                [d.conv_size, d.conv_kernel]:
            raise ValueError(f"{source.where}: tensor {conv} must have shape "
                             f"[{d.conv_size}, 1, {d.conv_kernel}] for this config, got "
                             f"{list(source.shape(conv)) if source.has(conv) else 'none'}")
        ba = [(name(i, f"in_proj_{n}.weight"), (d.v_heads, h)) for n in "ba"]
        return DeltaWeights(
            ba=matrix(ba, may_quantize=False),
            conv=np.ascontiguousarray(as_f32(source.get(conv)).reshape(d.conv_size,
                                                                         d.conv_kernel)),
            a_neg=-np.exp(as_f32(tensor(name(i, "A_log"), (d.v_heads,)))),
            dt_bias=as_f32(tensor(name(i, "dt_bias"), (d.v_heads,))),
            norm=as_f32(tensor(name(i, "norm.weight"), (d.v_dim,))))

    def load_layer(i: int) -> LayerWeights:
        """Layer i (from num_layers on, the MTP block's layer i - num_layers)."""
        p = f"model.layers.{i}."
        steps = family.layer(c, i)
        qkv, o, gate_up, down = layer_tensors(c, i)
        moe = experts(i) if has_step(steps, SparseMLP) else None
        shared = any(isinstance(s, SparseMLP) and s.shared for s in steps)
        if shared:
            gate_up, down = family.shared_expert_parts(c, i)
        attention = attention_step(steps)
        bias = None
        if c.attention_bias:
            bias = np.concatenate([as_f32(tensor(p + f"self_attn.{n}_proj.bias", (size,)))
                                   for n, size in (("q", q), ("k", kv), ("v", kv))])
        qk = [as_f32(tensor(p + f"self_attn.{n}_norm.weight", (c.head_dim,)))
              for n in "qk"] if has_step(steps, QKNorm) else [None, None]
        return LayerWeights(
            norms={n: as_f32(tensor(p + family.norms[n], (h,))) for n in step_norms(steps)},
            qkv=matrix(qkv),
            qkv_bias=bias,
            q_norm=qk[0],
            k_norm=qk[1],
            o=matrix(o),
            gate_up=None if moe and not shared else matrix(gate_up),
            down=None if moe and not shared else matrix(down),
            moe=moe,
            o_bias=as_f32(tensor(p + "self_attn.o_proj.bias", (h,))) if c.o_bias else None,
            sinks=as_f32(tensor(p + "self_attn.sinks", (c.num_heads,)))
            if attention and attention.sinks else None,
            steps=steps,
            delta=delta_net(i) if has_step(steps, DeltaNet) else None,
            shared_gate=shared_gate(i) if shared else None,
        )

    def shared_gate(i: int) -> np.ndarray:
        """Sparse layer i's shared-expert gate [1, hidden], as a vector; llama-quantize
        writes it [hidden] (ggml counts no trailing dimension of size 1)."""
        name = family.shared_gate_tensor(i)
        stored = tuple(source.shape(name)) if source.has(name) else ()
        return as_f32(tensor(name, (h,) if stored == (h,) else (1, h))).reshape(h)

    family = arch.of(c)
    layers = []
    for i in range(c.num_layers):
        layers.append(load_layer(i))
        if progress:
            progress(i + 1, c.num_layers)
    mtp = None
    if c.mtp_layers and plan is None and source.has(family.mtp_tensors()[0]):
        fc, *norms = family.mtp_tensors()
        mtp = MTPWeights(matrix([(fc, (h, 2 * h))], may_quantize=False),
                         *(as_f32(tensor(n, (h,))) for n in norms),
                         [load_layer(c.num_layers + j) for j in range(c.mtp_layers)])
    label = ", ".join(sorted(used)) or None
    if lm_head is not None and lm_head.quantized:
        label = f"{label}; lm_head {head_label}"
    return ModelWeights(dtype, embed, layers, as_f32(tensor(FINAL_NORM, (h,))), lm_head, label,
                        mtp)


def _group_name(group: int) -> str:
    return f"g{group}" if group else "ch"


def _origin(source) -> str:
    if isinstance(source, GGUFSource):
        return "GGUF"
    return "compressed-tensors"
