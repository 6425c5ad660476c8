"""llama: the Llama-family decoder as one flat graph over armllm.ops:
Llama 2/3/3.1/3.2 and SmolLM2, Mistral (sliding window), Qwen2 (q/k/v
bias) and Qwen3 (RMSNorm on each q/k head).

`forward` runs one flattened varlen batch (prefill chunks and decodes
together) against the paged KV cache and returns logits only for the rows
that need them. Every activation lives in a preallocated Workspace.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from armllm import ops
from armllm.model.config import ModelConfig
from armllm.model.weights import ModelWeights


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


class KVCache:
    """Per layer K and V of [num_blocks, n_kv_heads, block_size, head_dim]."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 dtype: Literal["bf16", "f32"] = "bf16"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, "
                             f"{block_size}")
        if dtype not in ("bf16", "f32"):
            raise ValueError(f"KV cache dtype must be 'bf16' or 'f32', got {dtype!r}")
        np_dtype = np.uint16 if dtype == "bf16" else np.float32
        shape = (num_blocks, config.num_kv_heads, block_size, config.head_dim)
        # Written through once here (numpy backs large arrays with huge pages): pages a
        # decode step touched for the first time cost it a fault each, ~0.5 ms a token
        # on SmolLM2, and the memory is committed up front as llama.cpp and vLLM do.
        self._k = np.empty((config.num_layers, *shape), np_dtype)
        self._v = np.empty((config.num_layers, *shape), np_dtype)
        self._k.fill(0)
        self._v.fill(0)
        self.k, self.v = list(self._k), list(self._v)
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copies whole blocks (src, dst) in every layer: copy on write of shared blocks."""
        src = np.fromiter((c[0] for c in copies), np.intp, len(copies))
        dst = np.fromiter((c[1] for c in copies), np.intp, len(copies))
        for cache in (*self.k, *self.v):
            cache[dst] = cache[src]

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: str) -> int:
        item = 2 if dtype == "bf16" else 4
        return 2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim * item


class Workspace:
    """Activations for up to max_tokens rows and max_logits logits rows (attention
    scratch for sequences of up to max_seq_len tokens; default: the model's context)."""

    def __init__(self, config: ModelConfig, max_tokens: int, max_logits: int,
                 max_split_rows: int = 16, max_seq_len: int | None = None):
        c, f32 = config, np.float32
        self.max_tokens, self.max_logits = max_tokens, max_logits
        self.residual = np.empty((max_tokens, c.hidden_size), f32)
        self.hidden = np.empty((max_tokens, c.hidden_size), f32)
        self.normed = np.empty((max_tokens, c.hidden_size), f32)
        self.qkv = np.empty((max_tokens, c.q_size + 2 * c.kv_size), f32)
        self.q_normed = np.empty((max_tokens, c.q_size), f32) if c.qk_norm else None
        self.k_normed = np.empty((max_tokens, c.kv_size), f32) if c.qk_norm else None
        self.attn = np.empty((max_tokens, c.q_size), f32)
        self.gate_up = np.empty((max_tokens, 2 * c.intermediate_size), f32)
        self.act = np.empty((max_tokens, c.intermediate_size), f32)
        self.selected = np.empty((max_logits, c.hidden_size), f32)
        self.logits = np.empty((max_logits, c.vocab_size), f32)
        self.attn_scratch = np.empty(ops.attn_scratch_len(
            max_split_rows, c.num_heads, c.head_dim, max_seq_len or c.max_position_embeddings),
            f32)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights):
        self.config, self.weights = config, weights
        c = config
        self.cos_sin = ops.rope_cos_sin(c.max_position_embeddings, c.head_dim, c.rope_theta,
                                        c.rope_scaling)
        self.scale = c.head_dim ** -0.5

    def forward(self, meta: BatchMeta, kv: KVCache, ws: Workspace) -> np.ndarray:
        """Logits [len(meta.logits_rows), vocab] (a view of the workspace)."""
        c, w = self.config, self.weights
        t, r = len(meta.input_ids), len(meta.logits_rows)
        if t > ws.max_tokens or r > ws.max_logits:
            raise ValueError(f"batch of {t} tokens / {r} logits rows exceeds the workspace "
                             f"({ws.max_tokens} / {ws.max_logits})")
        res, x, normed = ws.residual[:t], ws.hidden[:t], ws.normed[:t]
        qkv, attn = ws.qkv[:t], ws.attn[:t]
        q, k, v = (qkv[:, :c.q_size], qkv[:, c.q_size:c.q_size + c.kv_size],
                   qkv[:, c.q_size + c.kv_size:])
        ops.embedding(meta.input_ids, w.embed, out=res)
        for i, lw in enumerate(w.layers):
            # res += x (the previous MLP's output; none before layer 0), normalize, project
            ops.rms_norm_linear(res if i == 0 else x, lw.input_norm, c.rms_norm_eps, lw.qkv,
                                lw.qkv_bias, None if i == 0 else res, normed, qkv)
            q_in, k_in = q, k
            if c.qk_norm:
                q_in, k_in = self._qk_norm(q, k, lw, ws, t)
            ops.rope(q_in, meta.positions, self.cos_sin, c.num_heads, c.head_dim)
            ops.rope(k_in, meta.positions, self.cos_sin, c.num_kv_heads, c.head_dim)
            ops.kv_write(k_in, v, meta.slot_mapping, kv.k[i], kv.v[i])
            ops.paged_attention(q_in, kv.k[i], kv.v[i], meta.block_table, meta.seq_lens,
                                meta.query_start, c.num_heads, self.scale, out=attn,
                                sliding_window=c.sliding_window, scratch=ws.attn_scratch)
            ops.linear(attn, lw.o, out=x)
            ops.rms_norm_linear(x, lw.post_norm, c.rms_norm_eps, lw.gate_up, residual=res,
                                normed=normed, out=ws.gate_up[:t])
            ops.silu_mul(ws.gate_up[:t], out=ws.act[:t])
            ops.linear(ws.act[:t], lw.down, out=x)
        if r == 0:  # a step of prompt chunks only: nothing samples
            return ws.logits[:0]
        ops.rms_norm(x, w.final_norm, c.rms_norm_eps, residual=res, out=normed)
        selected = ws.selected[:r]
        np.take(normed, meta.logits_rows, axis=0, out=selected)
        return ops.linear(selected, w.lm_head, out=ws.logits[:r])

    def _qk_norm(self, q, k, lw, ws, t):
        """RMSNorm over each head of q and k (Qwen3), into contiguous buffers."""
        c = self.config
        qn, kn = ws.q_normed[:t], ws.k_normed[:t]
        qn[...] = q
        kn[...] = k
        q_heads = qn.reshape(t * c.num_heads, c.head_dim)
        k_heads = kn.reshape(t * c.num_kv_heads, c.head_dim)
        ops.rms_norm(q_heads, lw.q_norm, c.rms_norm_eps, out=q_heads)
        ops.rms_norm(k_heads, lw.k_norm, c.rms_norm_eps, out=k_heads)
        return qn, kn
