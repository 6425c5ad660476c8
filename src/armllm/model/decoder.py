"""decoder: the decoder model every architecture runs as: embeddings (scaled where
the architecture says), its layers, each the steps its architecture file
declares (model/arch/, model/layer.py) run by one bound C call, and the final
norm and lm_head on only the rows that need logits (soft-capped where the
architecture says).

`forward` runs one flattened varlen batch (prefill chunks and decodes
together) against the paged KV cache and returns logits only for the rows
that need them. Every activation lives in a preallocated Workspace.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from armllm import ops
from armllm.model import arch
from armllm.model.config import ModelConfig
from armllm.model.kv_cache import KVCache
from armllm.model.layer import (
    LINEARS,
    Act,
    Attention,
    DeltaNet,
    Linear,
    Norm,
    NormLinear,
    OutputGate,
    QKNorm,
    RopeKV,
    SparseMLP,
    Step,
    has_step,
)
from armllm.model.moe import bind_experts, pass_rows
from armllm.model.rope import rope_cos_sin
from armllm.model.weights import LinearFormats, ModelWeights, QuantFormat, linear_shapes


@dataclass
class BatchMeta:
    """One engine step, flattened: B sequences, T token rows."""
    input_ids: np.ndarray     # [T] int32
    positions: np.ndarray     # [T] int32
    slot_mapping: np.ndarray  # [T] int32, KV slot of each row (-1: none)
    query_start: np.ndarray   # [B + 1] int32, rows of each sequence
    seq_lens: np.ndarray      # [B] int32, tokens in the cache after this step
    block_table: np.ndarray   # [B, max_blocks] int32
    logits_rows: np.ndarray   # [R] int64, rows that need logits
    # (slot_mapping, block_table) of KV groups 1.. (model/kv_cache.py); the fields above
    # are group 0's
    other_groups: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    # [B] int32, each sequence's slot in the state pool (a hybrid model's recurrent layers)
    state_slots: np.ndarray | None = None


class Workspace:
    """Every buffer a forward writes, allocated once: activations for up to max_tokens
    rows, logits for max_logits rows, attention scratch for sequences of up to
    max_seq_len tokens (default: the model's context), and for quantized linear
    weights (`formats`, as ModelWeights.formats gives them) the int8 activations: one
    ActScratch per distinct input (K and group length) of the layers, one for the
    lm_head. logits_cols: the logits rows' width (default the vocabulary; a
    tensor-parallel rank other than 0 holds only its vocabulary shard's).
    `Workspace.nbytes` is what this allocates, from the same arguments."""

    residual: np.ndarray          # [max_tokens, hidden] the residual stream
    hidden: np.ndarray            # [max_tokens, hidden] attention / MLP output
    normed: np.ndarray            # [max_tokens, hidden] RMSNorm output
    qkv: np.ndarray               # [max_tokens, the widest layer's qkv projection]
    q_normed: np.ndarray | None   # [max_tokens, q] per-head normed q (Qwen3)
    k_normed: np.ndarray | None   # [max_tokens, kv]
    attn: np.ndarray              # [max_tokens, max(q, DeltaNet value size)] mixer output
    conv_out: np.ndarray | None   # [max_tokens, DeltaNet conv channels] (hybrids)
    delta_ba: np.ndarray | None   # [max_tokens, 2 DeltaNet value heads] its b and a
    gate_up: np.ndarray           # [max_tokens, 2 intermediate] (of the dense layers)
    act: np.ndarray               # [max_tokens, intermediate] silu(gate) * up
    router_logits: np.ndarray | None   # [max_tokens, experts] (mixture of experts)
    # a sparse layer's (row, expert) pair rows (moe.pass_rows):
    expert_in: np.ndarray | None       # [pairs, hidden] float experts' inputs
    expert_gate_up: np.ndarray | None  # [pairs, max(2 expert intermediate, hidden)]
    expert_act: np.ndarray | None      # [pairs, expert intermediate] a float down's inputs
    selected: np.ndarray          # [max_logits, hidden] the rows that need logits
    selected_residual: np.ndarray  # [max_logits, hidden] the residual stream at those rows
    logits: np.ndarray            # [max_logits, vocab]
    attn_scratch: np.ndarray      # the attention kernel's split-KV partials

    def __init__(self, config: ModelConfig, max_tokens: int, max_logits: int,
                 formats: LinearFormats | None = None, max_split_rows: int = 16,
                 max_seq_len: int | None = None, logits_cols: int | None = None):
        self.max_tokens, self.max_logits, self.formats = max_tokens, max_logits, formats
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        for name, shape in self._arrays(config, max_tokens, max_logits, max_split_rows,
                                        max_seq_len, logits_cols, formats).items():
            setattr(self, name, None if shape is None else np.empty(shape, np.float32))
        scratch_args, layer_keys, head_key = self._scratch_plan(config, max_tokens, max_logits,
                                                                formats)
        made = {key: ops.ActScratch(**args) for key, args in scratch_args.items()}
        self.scratches: list[ops.ActScratch] = list(made.values())
        # per layer, the scratch of each of its LINEARS weights (None: a float weight)
        self.layer_scratch = [tuple(made.get(key) for key in keys) for keys in layer_keys]
        self.head_scratch: ops.ActScratch | None = made.get(head_key)
        # (model, KV cache, its layers and head bound to these buffers), set by its forward
        self.bound: tuple | None = None

    @classmethod
    def nbytes(cls, config: ModelConfig, max_tokens: int, max_logits: int,
               formats: LinearFormats | None = None, max_split_rows: int = 16,
               max_seq_len: int | None = None, logits_cols: int | None = None) -> int:
        """Bytes a Workspace of these arguments allocates: the engine's working memory."""
        arrays = cls._arrays(config, max_tokens, max_logits, max_split_rows, max_seq_len,
                             logits_cols, formats)
        scratches = cls._scratch_plan(config, max_tokens, max_logits, formats)[0]
        return (sum(4 * math.prod(shape) for shape in arrays.values() if shape is not None)
                + sum(ops.ActScratch.nbytes_for(**args) for args in scratches.values()))

    @staticmethod
    def _arrays(c: ModelConfig, max_tokens: int, max_logits: int, max_split_rows: int,
                max_seq_len: int | None, logits_cols: int | None = None,
                formats: LinearFormats | None = None) -> dict[str, tuple[int, ...] | None]:
        """The float32 buffers' shapes, by attribute name."""
        t, h = max_tokens, c.hidden_size
        steps = layer_steps(c)
        dense = max((c.intermediate_size for i, s in enumerate(steps) if has_step(s, Act)),
                    default=0)
        sparse = [i for i, s in enumerate(steps) if has_step(s, SparseMLP)]
        moe = bool(sparse)
        # the experts' float (gate_up, down): their inputs are float pair rows
        float_in = [formats is None or formats.layers[i][j] is None for i in sparse
                    for j in (2, 3)]
        pairs = pass_rows(c, t) if moe else 0
        qk_norm = any(has_step(s, QKNorm) for s in steps)
        e_inter = c.moe_intermediate_size
        shapes = [linear_shapes(c, i) for i in range(c.num_layers)]
        delta = c.delta_net
        return {
            "residual": (t, h), "hidden": (t, h), "normed": (t, h),
            "qkv": (t, max(qkv[0] for qkv, *_ in shapes)),
            "q_normed": (t, c.q_size) if qk_norm else None,
            "k_normed": (t, c.kv_size) if qk_norm else None,
            "attn": (t, max(o[1] for _, o, *_ in shapes)),
            "conv_out": (t, delta.conv_size) if delta else None,
            "delta_ba": (t, 2 * delta.v_heads) if delta else None,
            "gate_up": (t, 2 * dense), "act": (t, dense),
            "router_logits": (t, c.num_experts) if moe else None,
            "expert_in": (pairs, h) if any(float_in[0::2]) else None,
            "expert_gate_up": (pairs, max(2 * e_inter, h)) if moe else None,
            "expert_act": (pairs, e_inter) if any(float_in[1::2]) else None,
            "selected": (max_logits, h), "selected_residual": (max_logits, h),
            # an embedding model has no lm_head: no logits
            "logits": (max_logits, (logits_cols or c.vocab_size) if c.has_lm_head else 0),
            "attn_scratch": (ops.attn_scratch_len(max_split_rows, c.num_heads, c.head_dim,
                                                  max_seq_len or c.max_position_embeddings),),
        }

    @staticmethod
    def _scratch_plan(c: ModelConfig, max_tokens: int, max_logits: int,
                      formats: LinearFormats | None
                      ) -> tuple[dict[tuple, dict], list[tuple], tuple | None]:
        """The ActScratch arguments by key, each layer's keys (in LINEARS order,
        None for a float weight) and the lm_head's key. Inputs of one row count, K and
        group length share a scratch (each call quantizes into it in turn), which holds
        the zero points' correction of the widest asymmetric weight among them."""
        if formats is None:
            return {}, [(None,) * len(LINEARS)] * c.num_layers, None
        if len(formats.layers) != c.num_layers:
            raise ValueError(f"formats describe {len(formats.layers)} layers, the model has "
                             f"{c.num_layers}")
        scratches: dict[tuple, dict] = {}

        def key(fmt: QuantFormat | None, n: int, k: int, rows: int,
                role: str = "") -> tuple | None:
            if fmt is None:
                return None
            kk = (rows, k, ops.quant_group_len(fmt.group), role)
            args = scratches.setdefault(kk, {"rows": rows, "k": k, "group": fmt.group,
                                             "sums": True, "asym_n": 0})
            if not fmt.act_symmetric:
                args["asym_n"] = max(args["asym_n"], n)
            return kk

        # a sparse layer's experts quantize pair rows (moe.pass_rows), their inputs and
        # activations in scratches of their own (both hold a whole pass at once)
        steps = layer_steps(c)
        pairs = pass_rows(c, max_tokens)

        def layer_key(i: int, j: int, fmt: QuantFormat | None, n: int, k: int) -> tuple | None:
            if j < 2 or not has_step(steps[i], SparseMLP):
                return key(fmt, n, k, max_tokens)
            return key(fmt, n, k, pairs, "experts" if j == 2 else "experts_act")

        layers = [tuple(layer_key(i, j, fmt, n, k) for j, (fmt, (n, k)) in enumerate(
                      zip(layer, linear_shapes(c, i), strict=True)))
                  for i, layer in enumerate(formats.layers)]
        return scratches, layers, key(formats.lm_head, c.vocab_size, c.hidden_size, max_logits)


def layer_steps(c: ModelConfig) -> list[tuple[Step, ...]]:
    """Every layer's steps, as the model's architecture file declares them."""
    family = arch.of(c)
    return [family.layer(c, i) for i in range(c.num_layers)]


class DecoderModel:
    """The decoder over its weights. A tensor-parallel rank's holds its shards
    (model/sharding.py; `config` is its ShardPlan's) and `comm`, its ops.Comm: its
    layers all-reduce after o and down (and the experts), and its lm_head's logits,
    vocabulary columns vocab_bounds[rank]..vocab_bounds[rank + 1], are gathered onto
    rank 0, whose forward returns the whole rows (the tensor-parallel runner hands
    each step's batch to the other ranks first: engine/tensor_parallel.py)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights,
                 comm: ops.Comm | None = None, vocab_bounds: tuple[int, ...] | None = None):
        self.config, self.weights = config, weights
        self.comm = comm
        self.vocab_bounds = None if vocab_bounds is None else np.asarray(vocab_bounds, np.int64)
        self.formats = weights.formats   # what a Workspace for these weights is built with
        self._rope_tables: dict[tuple[str, int], np.ndarray] = {}

    def new_workspace(self, max_tokens: int, max_logits: int, max_seq_len: int | None = None,
                      logits_cols: int | None = None) -> Workspace:
        """A Workspace for this model's weights (see Workspace)."""
        return Workspace(self.config, max_tokens, max_logits, self.formats,
                         max_seq_len=max_seq_len, logits_cols=logits_cols)

    def rope_table(self, which: str, max_seq_len: int) -> np.ndarray:
        """The cos/sin table [max_position_embeddings, rot_dim] of the RopeKV steps'
        `which` ("global", or "local": the sliding layers' own base) for a context of
        up to max_seq_len tokens (LongRoPE's factors depend on it)."""
        c = self.config
        long = max_seq_len > (c.rope_scaling or {}).get("original_max_position_embeddings",
                                                        max_seq_len)
        key = (which, long if which == "global" else False)
        if key not in self._rope_tables:
            theta, scaling = (c.rope_theta, c.rope_scaling) if which == "global" or \
                not c.local_rope_theta else (c.local_rope_theta, c.local_rope_scaling)
            self._rope_tables[key] = rope_cos_sin(c.max_position_embeddings, c.rot_dim, theta,
                                                  scaling, long_factors=key[1])
        return self._rope_tables[key]

    def forward(self, meta: BatchMeta, kv: KVCache, ws: Workspace,
                copies: list[tuple[int, int, int]] | tuple = (),
                state_copies: list[tuple[int, int]] | tuple = (),
                inputs: np.ndarray | None = None) -> np.ndarray:
        """Logits [len(meta.logits_rows), vocab] (a view of the workspace), after the KV
        block copies (group, src, dst: copy on write) `copies` and the state slot copies
        (src, dst: forked completions) `state_copies`. inputs: the rows [T, hidden] the
        first layer takes in place of the embeddings of meta.input_ids (a
        multi-token-prediction block's, engine/spec/mtp.py)."""
        t, r = len(meta.input_ids), len(meta.logits_rows)
        if t > ws.max_tokens or r > ws.max_logits:
            raise ValueError(f"batch of {t} tokens / {r} logits rows exceeds the workspace "
                             f"({ws.max_tokens} / {ws.max_logits})")
        if ws.formats is not self.formats and ws.formats != self.formats:
            raise ValueError("the workspace was built for other linear weight formats than "
                             "this model's: build it with Workspace(..., model.formats)")
        if len(meta.other_groups) + 1 != len(kv.groups):
            raise ValueError(f"the batch has block tables for {len(meta.other_groups) + 1} KV "
                             f"groups, the cache {len(kv.groups)}")
        if copies:
            kv.copy_blocks(copies)
        kv.copy_states(state_copies)
        if inputs is not None:
            if inputs.shape != (t, self.config.hidden_size):
                raise ValueError(f"inputs must have shape ({t}, {self.config.hidden_size}), "
                                 f"got {inputs.shape}")
            ws.residual[:t] = inputs
        else:
            ops.embedding(meta.input_ids, self.weights.embed, out=ws.residual[:t])
            if self.config.embed_scale != 1.0:
                ws.residual[:t] *= np.float32(self.config.embed_scale)
        batches = [ops.StepBatch(meta.positions, slots, table, meta.seq_lens, meta.query_start,
                                 meta.state_slots if g == 0 else None)
                   for g, (slots, table) in enumerate(((meta.slot_mapping, meta.block_table),
                                                       *meta.other_groups))]
        layers, head = self._bound(kv, ws)
        for layer, group in zip(layers, kv.group_of, strict=True):
            ops.decoder_layer(layer, batches[group])
        if r == 0:  # a step of prompt chunks only: nothing samples
            return ws.logits[:0]
        if head is None:
            raise ValueError("this model has no lm_head (an embedding model): it computes "
                             "no logits")
        # the final norm (with the last residual add) and the lm_head, on only the rows
        # that sample
        ops.norm_head(head, meta.logits_rows, t)
        if self.comm is not None:
            self.comm.gather_cols(ws.logits[:r], self.vocab_bounds)
        logits = ws.logits[:r]
        cap = self.config.final_logit_softcap
        if cap:   # cap * tanh(logits / cap)
            np.multiply(np.tanh(np.divide(logits, cap, out=logits), out=logits), cap, out=logits)
        return logits

    def final_hidden(self, ws: Workspace, rows: np.ndarray) -> np.ndarray:
        """The last hidden states (after the final norm) of these rows of the forward
        that just ran: what an embedding pools. Rank 0's are whole: every layer's output
        is all-reduced before it is added."""
        x = ws.residual[rows] + ws.hidden[rows]   # the last layer's residual add
        return ops.rms_norm(x, self.weights.final_norm, self.config.rms_norm_eps, out=x)

    def _bound(self, kv: KVCache, ws: Workspace
               ) -> tuple[list[ops.DecoderLayer], ops.NormHead | None]:
        """The layers and the head bound to this cache and workspace (built on first
        use): each layer its steps (LayerWeights.steps) over its weights, the
        workspace's buffers and its cache layer, with the kernels and buffers
        armllm.ops' per-op wrappers would use; the head gathers the rows that need
        logits of x and res, then res += x, x = rms_norm(res, final_norm),
        logits = x @ lm_head.T."""
        if ws.bound is not None and ws.bound[0] is self and ws.bound[1] is kv:
            return ws.bound[2:]
        c, w = self.config, self.weights
        layers = []
        for i, (lw, scratch) in enumerate(zip(w.layers, ws.layer_scratch, strict=True)):
            qkv_in, o_in, gate_up_in, down_in = scratch   # int8 activations (quantized weights)
            linears = [(lw.qkv, lw.qkv_bias, qkv_in), (lw.o, lw.o_bias, o_in),
                       (lw.gate_up, None, gate_up_in), (lw.down, None, down_in)]
            # this layer's columns of the buffers the widest layer sizes
            buffers = (ws.residual, ws.hidden, ws.normed, ws.qkv[:, :lw.qkv.n], ws.q_normed,
                       ws.k_normed, ws.attn[:, :lw.o.k], ws.gate_up, ws.act, ws.attn_scratch)
            sparse = None
            if lw.moe:
                shared = (lw.gate_up, lw.down, lw.shared_gate) if lw.shared_gate is not None \
                    else None
                sparse = bind_experts(c, lw.moe, ws, gate_up_in, down_in, shared)
                linears[2:] = [(None, None, None)] * 2   # the experts' (and shared expert's)
            delta = None if lw.delta is None else ops.bind_delta_net(
                lw.delta.ba, lw.delta.conv, lw.delta.a_neg, lw.delta.dt_bias, lw.delta.norm,
                kv.conv_state[i], kv.delta_state[i], c.delta_net.k_heads, c.delta_net.v_tiled,
                (ws.conv_out, ws.delta_ba))
            attention = next((s for s in lw.steps if isinstance(s, Attention)), Attention())
            rope_kv = next((s for s in lw.steps if isinstance(s, RopeKV)), RopeKV())
            layers.append(ops.bind_decoder_layer(
                [self._step(s, lw) for s in lw.steps], linears, lw.q_norm, lw.k_norm,
                c.rms_norm_eps, buffers, kv.k[i], kv.v[i],
                self.rope_table(rope_kv.table, ws.max_seq_len), c.num_heads, c.num_kv_heads,
                c.head_dim, c.rot_dim, attention.scale or c.head_dim ** -0.5,
                attention.window, first=i == 0, sinks=lw.sinks, comm=self.comm,
                sparse=sparse, delta=delta, k_scale=kv.k_scale[i], v_scale=kv.v_scale[i]))
        # rank 0 of several: its vocabulary shard's columns come first in the whole rows
        head = None if w.lm_head is None else ops.bind_norm_head(
            w.lm_head, ws.head_scratch, w.final_norm, c.rms_norm_eps, ws.hidden, ws.residual,
            ws.selected, ws.selected_residual, ws.logits[:, :w.lm_head.n])
        ws.bound = (self, kv, layers, head)
        return layers, head

    @staticmethod
    def _step(step: Step, lw) -> tuple:
        """A step as the bound layer's C side reads it (see ops.DecoderLayer)."""
        if isinstance(step, NormLinear):
            return ("norm_linear", step.linear, lw.norms[step.norm])
        if isinstance(step, Linear):
            return ("linear", step.linear)
        if isinstance(step, Norm):
            return ("norm", lw.norms[step.norm])
        if isinstance(step, SparseMLP):
            return ("sparse_mlp", lw.norms[step.norm])
        if isinstance(step, Act):
            return ("act", step.kind)
        return ({QKNorm: "qk_norm", RopeKV: "rope_kv", Attention: "attention",
                 OutputGate: "output_gate", DeltaNet: "delta_net"}[type(step)],)
