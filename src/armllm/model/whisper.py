"""whisper: the encoder-decoder model Whisper runs as (its family's config and tensor
names are model/arch/whisper.py's), over packed weights and a WhisperWorkspace.

The encoder turns one 30 s window of log-mel features [n_mels, 3000] into 1500
frames: conv1d (k 3) + GELU, conv1d (k 3, stride 2) + GELU (each an im2col and a
GEMM), plus fixed sinusoidal positions, then pre-LayerNorm layers of bidirectional
attention and a GELU MLP. Its output is read only through each decoder layer's
cross-attention K and V, so `encode` writes those straight into the sequence's
slot of the cross-attention pool (model/kv_cache.py) and keeps nothing else.
The decoder is a pre-LayerNorm transformer over learned positions: causal
self-attention over the paged KV cache, cross-attention of every row over its
sequence's encoder frames, a GELU MLP, and logits from the tied token embedding,
each a kernel call over the workspace's buffers. The engine runs a sequence's
encoder with its first prefill chunk (engine/runner.py).

Word timestamps read the cross-attention probabilities of the model's alignment
heads: `cross_attention_kv` encodes one window into private K/V arrays and
`alignment_weights` runs the decoder over one whole sequence in numpy (attention
computed explicitly, the GEMMs on the kernels) to expose them, outside the engine
and its cache."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from armllm import ops
from armllm.model.arch.whisper import CONV_TAPS, DEC, ENC, LN_EPS, MAX_TIMESCALE, ct2_tensor
from armllm.model.config import ModelConfig
from armllm.model.kv_cache import KVCache
from armllm.model.quantize import Scheme, quantize_rtn

# ---------------------------------------------------------------- weights

@dataclass
class Linear:
    """A packed weight [N, K] and its bias [N] (None: none)."""
    weight: ops.PackedWeight
    bias: np.ndarray | None


@dataclass
class LayerNorm:
    weight: np.ndarray
    bias: np.ndarray


@dataclass
class EncoderLayer:
    attn_norm: LayerNorm
    qkv: Linear            # [q | k | v]; k's bias is zero (Whisper's k_proj has none)
    out: Linear
    mlp_norm: LayerNorm
    fc1: Linear
    fc2: Linear


@dataclass
class DecoderLayer:
    attn_norm: LayerNorm
    qkv: Linear
    out: Linear
    cross_norm: LayerNorm
    cross_q: Linear
    cross_kv: Linear       # [k | v] of the encoder's output, run once a window
    cross_out: Linear
    mlp_norm: LayerNorm
    fc1: Linear
    fc2: Linear


@dataclass
class WhisperWeights:
    conv1: Linear                  # [hidden, n_mels * 3], columns (channel, tap)
    conv2: Linear                  # [hidden, hidden * 3]
    encoder_positions: np.ndarray  # [positions, hidden] float32
    encoder_layers: list[EncoderLayer]
    encoder_norm: LayerNorm
    embed: np.ndarray              # [vocab, hidden] float32 or bf16 bits
    decoder_positions: np.ndarray  # [max target positions, hidden] float32
    decoder_layers: list[DecoderLayer]
    decoder_norm: LayerNorm
    lm_head: ops.PackedWeight      # the token embedding, packed
    quantization: str | None = None

    @property
    def encoder_nbytes(self) -> int:
        """The encoder's resident bytes: convs, positions, layers, final norm."""
        return _nbytes(self.conv1, self.conv2, self.encoder_positions, self.encoder_layers,
                       self.encoder_norm)

    @property
    def decoder_nbytes(self) -> int:
        """The decoder's: token embedding, positions, layers, final norm and the packed
        copy of the embedding the logits GEMM reads."""
        return _nbytes(self.embed, self.decoder_positions, self.decoder_layers,
                       self.decoder_norm, self.lm_head)

    @property
    def nbytes(self) -> int:
        return self.encoder_nbytes + self.decoder_nbytes


def _nbytes(*parts) -> int:
    """Bytes of packed weights and arrays, inside dataclasses and lists too."""
    total = 0
    for part in parts:
        if isinstance(part, ops.PackedWeight | np.ndarray):
            total += part.nbytes
        elif isinstance(part, list):
            total += _nbytes(*part)
        elif dataclasses.is_dataclass(part):
            total += _nbytes(*(getattr(part, f.name) for f in dataclasses.fields(part)))
    return total


class WhisperTensors(Protocol):
    """Tensors under Hugging Face's WhisperForConditionalGeneration names: `float(name)`
    as float32, `int8(name)` as (q int8 [N, K], per-row d) for a weight stored so
    (CTranslate2's int8), else None. `source` names where they come from."""
    source: str

    def float(self, name: str) -> np.ndarray: ...

    def int8(self, name: str) -> tuple[np.ndarray, np.ndarray] | None: ...

    def has(self, name: str) -> bool: ...


class SafetensorsWhisper:
    """A safetensors directory's tensors (WhisperTensors): all float."""

    def __init__(self, model_dir: Path):
        from armllm.model.safetensors_file import SafetensorsCheckpoint
        self.ckpt, self.source = SafetensorsCheckpoint(model_dir), str(model_dir)

    def has(self, name: str) -> bool:
        return name in self.ckpt

    def float(self, name: str) -> np.ndarray:
        if name not in self.ckpt:
            raise ValueError(f"{self.source}: missing tensor {name}")
        a = self.ckpt.array(name)
        return ops.bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)

    def int8(self, name: str) -> None:
        return None   # safetensors Whisper checkpoints are float


class CT2Whisper:
    """A CTranslate2 directory's model.bin under Hugging Face's names (model/arch/
    whisper.py's ct2_tensor): float16/bfloat16/float32 as float32, int8 weights as
    stored (CTranslate2's per-row scales)."""

    def __init__(self, model_dir: Path, config: ModelConfig):
        from armllm.model.ctranslate2 import CT2File
        self.file, self.source = CT2File(Path(model_dir) / "model.bin"), str(model_dir)
        self.hidden = config.hidden_size

    def _where(self, name: str) -> tuple[str, tuple[int, int] | None]:
        return ct2_tensor(name, self.hidden)

    def has(self, name: str) -> bool:
        return self.file.has(self._where(name)[0])

    def float(self, name: str) -> np.ndarray:
        where, rows = self._where(name)
        v = self.file.variable(where)
        a = self.file.dequantize(where) if v.dtype in ("int8", "int16") else \
            self.file.array(where)
        a = ops.bf16_to_f32(a) if v.dtype == "bfloat16" else a.astype(np.float32)
        return a if rows is None else a[rows[0]:rows[0] + rows[1]]

    def int8(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        where, rows = self._where(name)
        if self.file.variable(where).dtype != "int8":
            return None
        q, d = self.file.int8_rows(where)
        return (q, d) if rows is None else (q[rows[0]:rows[0] + rows[1]],
                                            d[rows[0]:rows[0] + rows[1]])


def sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's encoder positions: sin then cos of length positions at channels / 2
    geometric timescales from 1 to MAX_TIMESCALE."""
    half = channels // 2
    increment = np.log(MAX_TIMESCALE) / (half - 1)
    inv = np.exp(-increment * np.arange(half, dtype=np.float64))
    t = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def load_whisper(tensors: WhisperTensors, c: ModelConfig, dtype: str = "bf16",
                 quantization: str | Scheme = "auto", progress=None) -> WhisperWeights:
    """Packs every tensor: float weights in `dtype` (or quantized at load by a Scheme),
    int8 ones ("auto") as stored on the W8A8 kernels; norms, biases and positions float32."""
    e = c.encoder
    kinds: set[str] = set()

    def linear(names: list[str], biases: list[str]) -> Linear:
        """The weights `names` stacked by rows, with their biases (zeros where a part
        has none: Whisper's k_proj)."""
        stored = [tensors.int8(n) for n in names] if quantization != "none" else [None]
        if all(s is not None for s in stored):
            parts = [s[0] for s in stored]
            weight = ops.pack_quantized(np.concatenate(parts),
                                        np.concatenate([s[1] for s in stored]), bits=8, group=0)
            kinds.add("int8 as stored (W8A8)")
        else:
            parts = [tensors.float(n) for n in names]
            w = np.concatenate(parts)
            if isinstance(quantization, Scheme):
                m = quantize_rtn(w, quantization)
                weight = ops.pack_quantized(m.q, m.d, m.o, m.bits, m.group)
                kinds.add(quantization.label)
            else:
                weight = ops.pack_weight(w, dtype)
                kinds.add(dtype)
        bias = np.concatenate([tensors.float(b) if tensors.has(b)
                               else np.zeros(len(part), np.float32)
                               for b, part in zip(biases, parts, strict=True)])
        return Linear(weight, np.ascontiguousarray(bias, np.float32))

    def norm(prefix: str) -> LayerNorm:
        return LayerNorm(tensors.float(prefix + ".weight"), tensors.float(prefix + ".bias"))

    def attention(p: str) -> tuple[Linear, Linear]:
        proj = [p + f"{n}_proj." for n in "qkv"]
        return (linear([n + "weight" for n in proj], [n + "bias" for n in proj]),
                linear([p + "out_proj.weight"], [p + "out_proj.bias"]))

    def mlp(p: str) -> tuple[Linear, Linear]:
        return (linear([p + "fc1.weight"], [p + "fc1.bias"]),
                linear([p + "fc2.weight"], [p + "fc2.bias"]))

    enc_layers = []
    for i in range(e.layers):
        p = f"{ENC}layers.{i}."
        qkv, out = attention(p + "self_attn.")
        fc1, fc2 = mlp(p)
        enc_layers.append(EncoderLayer(norm(p + "self_attn_layer_norm"), qkv, out,
                                       norm(p + "final_layer_norm"), fc1, fc2))
        if progress:
            progress(i + 1, e.layers + c.num_layers)
    dec_layers = []
    for i in range(c.num_layers):
        p = f"{DEC}layers.{i}."
        qkv, out = attention(p + "self_attn.")
        x = p + "encoder_attn."
        cross_q = linear([x + "q_proj.weight"], [x + "q_proj.bias"])
        cross_kv = linear([x + "k_proj.weight", x + "v_proj.weight"],
                          [x + "k_proj.bias", x + "v_proj.bias"])
        cross_out = linear([x + "out_proj.weight"], [x + "out_proj.bias"])
        fc1, fc2 = mlp(p)
        dec_layers.append(DecoderLayer(norm(p + "self_attn_layer_norm"), qkv, out,
                                       norm(p + "encoder_attn_layer_norm"), cross_q, cross_kv,
                                       cross_out, norm(p + "final_layer_norm"), fc1, fc2))
        if progress:
            progress(e.layers + i + 1, e.layers + c.num_layers)
    # the tied head: int8 as stored (CTranslate2's int8 conversions), else in dtype
    head = linear([f"{DEC}embed_tokens.weight"], [f"{DEC}embed_tokens.bias"])
    conv = [_conv_matrix(tensors.float(f"{ENC}conv{j}.weight")) for j in (1, 2)]
    embed = tensors.float(f"{DEC}embed_tokens.weight")
    positions = tensors.float(f"{ENC}embed_positions.weight") \
        if tensors.has(f"{ENC}embed_positions.weight") else sinusoids(e.positions, e.hidden)
    return WhisperWeights(
        conv1=Linear(ops.pack_weight(conv[0], dtype), tensors.float(f"{ENC}conv1.bias")),
        conv2=Linear(ops.pack_weight(conv[1], dtype), tensors.float(f"{ENC}conv2.bias")),
        encoder_positions=np.ascontiguousarray(positions[:e.positions]),
        encoder_layers=enc_layers, encoder_norm=norm(f"{ENC}layer_norm"),
        embed=ops.f32_to_bf16(embed) if dtype == "bf16" else embed,
        decoder_positions=tensors.float(f"{DEC}embed_positions.weight"),
        decoder_layers=dec_layers, decoder_norm=norm(f"{DEC}layer_norm"),
        lm_head=head.weight, quantization=", ".join(sorted(kinds)))


def _conv_matrix(w: np.ndarray) -> np.ndarray:
    """A conv1d weight [out, in, taps] as the GEMM weight [out, in * taps] over im2col
    columns ordered (channel, tap)."""
    return np.ascontiguousarray(w.reshape(w.shape[0], -1), np.float32)


def _im2col(x: np.ndarray, stride: int) -> np.ndarray:
    """x [frames, channels] (time-major) padded by one frame each side -> [frames //
    stride, channels * taps], column (channel, tap) = x[stride * t + tap - 1, channel]."""
    frames, channels = x.shape
    padded = np.zeros((frames + 2, channels), np.float32)
    padded[1:-1] = x
    out_frames = (frames + 2 - CONV_TAPS) // stride + 1
    windows = np.lib.stride_tricks.as_strided(
        padded, (out_frames, channels, CONV_TAPS),
        (stride * padded.strides[0], padded.strides[1], padded.strides[0]))
    return np.ascontiguousarray(windows.reshape(out_frames, channels * CONV_TAPS))


# ---------------------------------------------------------------- the model

class WhisperWorkspace:
    """The decoder's buffers for up to max_tokens rows and max_logits logits rows."""

    def __init__(self, c: ModelConfig, max_tokens: int, max_logits: int,
                 max_split_rows: int = 16, max_seq_len: int | None = None):
        t, h = max_tokens, c.hidden_size
        self.max_tokens, self.max_logits = max_tokens, max_logits
        self.x, self.normed, self.attn = (np.empty((t, h), np.float32) for _ in range(3))
        self.qkv = np.empty((t, 3 * h), np.float32)
        self.proj = np.empty((t, h), np.float32)
        self.mlp = np.empty((t, c.intermediate_size), np.float32)
        self.selected = np.empty((max_logits, h), np.float32)
        self.logits = np.empty((max_logits, c.vocab_size), np.float32)
        self.attn_scratch = np.empty(ops.attn_scratch_len(
            max_split_rows, c.num_heads, c.head_dim,
            max(max_seq_len or c.max_position_embeddings, c.encoder.positions)), np.float32)

    @classmethod
    def nbytes(cls, c: ModelConfig, max_tokens: int, max_logits: int, max_split_rows: int = 16,
               max_seq_len: int | None = None) -> int:
        h = c.hidden_size   # x, normed, attn, proj [t, h], qkv [t, 3h], mlp [t, inter]
        return 4 * (max_tokens * (7 * h + c.intermediate_size)
                    + max_logits * (h + c.vocab_size)
                    + ops.attn_scratch_len(max_split_rows, c.num_heads, c.head_dim,
                                           max(max_seq_len or c.max_position_embeddings,
                                               c.encoder.positions)))


def layer_norm(x: np.ndarray, norm: LayerNorm, out: np.ndarray | None = None) -> np.ndarray:
    return ops.layer_norm(x, norm.weight, norm.bias, LN_EPS, out=out)


class WhisperModel:
    """Whisper's encoder and decoder over packed weights. alignment_heads: the
    (decoder layer, head) pairs whose cross-attention follows the speech in time
    (default: every head of the last half of the layers, as CTranslate2's)."""

    def __init__(self, config: ModelConfig, weights: WhisperWeights,
                 alignment_heads: list[tuple[int, int]] | None = None):
        self.config, self.weights = config, weights
        self.formats = None   # what the runner's workspace is built with (unused here)
        self.alignment_heads = alignment_heads or default_alignment_heads(config)

    def new_workspace(self, max_tokens: int, max_logits: int, max_seq_len: int | None = None,
                      logits_cols: int | None = None) -> WhisperWorkspace:
        return WhisperWorkspace(self.config, max_tokens, max_logits, max_seq_len=max_seq_len)

    # -- the encoder ----------------------------------------------------------------------

    def encode(self, features: list[np.ndarray], slots: list[int], kv: KVCache) -> None:
        """Runs the encoder over each window's log-mel features [n_mels, 2 * positions],
        the windows batched (every GEMM over all their frames), and writes every decoder
        layer's cross-attention K and V of window i into state slot slots[i] of kv's
        cross-attention pool."""
        c, e, w = self.config, self.config.encoder, self.weights
        frames = 2 * e.positions
        for f in features:
            if f.shape != (e.n_mels, frames):
                raise ValueError(f"encoder input has shape {list(f.shape)}, expected "
                                 f"[{e.n_mels}, {frames}] (one 30 s window of log-mel features)")
        if not features:
            return
        x = self._encoder_hidden(features)
        # window i's frames go to slot i's block (blocks of `positions` frames each)
        slot_rows = (np.asarray(slots, np.int32)[:, None] * e.positions
                     + np.arange(e.positions, dtype=np.int32)).reshape(-1)
        kv_rows = np.empty((len(x), 2 * c.hidden_size), np.float32)
        for layer, k_cache, v_cache in zip(w.decoder_layers, kv.cross_k, kv.cross_v,
                                           strict=True):
            ops.linear(x, layer.cross_kv.weight, layer.cross_kv.bias, out=kv_rows)
            ops.kv_write(kv_rows[:, :c.hidden_size], kv_rows[:, c.hidden_size:], slot_rows,
                         k_cache, v_cache)

    def _encoder_hidden(self, features: list[np.ndarray]) -> np.ndarray:
        """The windows' encoder outputs [windows * positions, hidden] (after the final
        LayerNorm), window after window."""
        e, w = self.config.encoder, self.weights
        n, t = len(features), e.positions
        cols = np.concatenate([_im2col(np.ascontiguousarray(f.T, np.float32), 1)
                               for f in features])
        x = ops.linear(cols, w.conv1.weight, w.conv1.bias)   # [n * 2t, hidden]
        ops.gelu(x, out=x)
        x = ops.linear(np.concatenate([_im2col(part, 2) for part in np.split(x, n)]),
                       w.conv2.weight, w.conv2.bias)
        ops.gelu(x, out=x)
        x = x.reshape(n, t, -1)
        x += w.encoder_positions
        x = x.reshape(n * t, -1)
        h = x.shape[1]
        # each window's own K/V: one block of all its frames, attended bidirectionally
        k_cache = np.empty((e.heads, n, t, e.head_dim), np.float32)
        v_cache = np.empty_like(k_cache)
        rows = np.arange(n * t, dtype=np.int32)
        table = np.arange(n, dtype=np.int32).reshape(n, 1)
        lens = np.full(n, t, np.int32)
        starts = np.arange(0, (n + 1) * t, t, dtype=np.int32)
        normed = np.empty_like(x)
        qkv = np.empty((n * t, 3 * h), np.float32)
        attn, proj = np.empty_like(x), np.empty_like(x)
        mlp = np.empty((n * t, e.ffn), np.float32)
        for layer in w.encoder_layers:
            layer_norm(x, layer.attn_norm, out=normed)
            ops.linear(normed, layer.qkv.weight, layer.qkv.bias, out=qkv)
            ops.kv_write(qkv[:, h:2 * h], qkv[:, 2 * h:], rows, k_cache, v_cache)
            ops.paged_attention(qkv[:, :h], k_cache, v_cache, table, lens, starts, e.heads,
                                e.head_dim ** -0.5, out=attn, causal=False)
            x += ops.linear(attn, layer.out.weight, layer.out.bias, out=proj)
            layer_norm(x, layer.mlp_norm, out=normed)
            ops.linear(normed, layer.fc1.weight, layer.fc1.bias, out=mlp)
            ops.gelu(mlp, out=mlp)
            x += ops.linear(mlp, layer.fc2.weight, layer.fc2.bias, out=proj)
        return layer_norm(x, w.encoder_norm, out=x)

    # -- word alignment ---------------------------------------------------------------------

    def cross_attention_kv(self, features: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """One window's cross-attention K and V [heads, positions, head_dim] per decoder
        layer, in arrays of its own (the engine's cache untouched)."""
        c = self.config
        x = self._encoder_hidden([features])
        t, h = len(x), c.hidden_size
        per_layer = []
        for layer in self.weights.decoder_layers:
            kv = ops.linear(x, layer.cross_kv.weight, layer.cross_kv.bias)
            per_layer.append(tuple(np.ascontiguousarray(
                kv[:, j * h:(j + 1) * h].reshape(t, c.num_heads, c.head_dim).transpose(1, 0, 2))
                for j in (0, 1)))
        return per_layer

    def alignment_weights(self, tokens: list[int],
                          cross: list[tuple[np.ndarray, np.ndarray]],
                          ) -> tuple[np.ndarray, np.ndarray]:
        """The decoder over one whole sequence `tokens` (causal, no cache) against a
        window's cross K/V (cross_attention_kv): (the alignment heads' cross-attention
        probabilities [len(alignment_heads), len(tokens), positions], softmax over every
        frame; the logits [len(tokens), vocab])."""
        c, w = self.config, self.weights
        n, h, heads, d = len(tokens), c.hidden_size, c.num_heads, c.head_dim
        scale = d ** -0.5
        x = np.empty((n, h), np.float32)
        ops.embedding(np.asarray(tokens, np.int32), w.embed, out=x)
        x += w.decoder_positions[:n]
        future = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        found: dict[tuple[int, int], np.ndarray] = {}

        def split_heads(a: np.ndarray) -> np.ndarray:
            return a.reshape(n, heads, d).transpose(1, 0, 2)

        def merge_heads(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.transpose(1, 0, 2).reshape(n, h))

        for i, (layer, (cross_k, cross_v)) in enumerate(zip(w.decoder_layers, cross,
                                                             strict=True)):
            qkv = ops.linear(layer_norm(x, layer.attn_norm), layer.qkv.weight, layer.qkv.bias)
            q, k, v = (split_heads(qkv[:, j * h:(j + 1) * h]) for j in range(3))
            attn = _softmax(q @ k.transpose(0, 2, 1) * scale + future) @ v
            x += ops.linear(merge_heads(attn), layer.out.weight, layer.out.bias)
            q = split_heads(ops.linear(layer_norm(x, layer.cross_norm), layer.cross_q.weight,
                                       layer.cross_q.bias))
            probs = _softmax(q @ cross_k.transpose(0, 2, 1) * scale)
            for head in range(heads):
                if (i, head) in self.alignment_heads:
                    found[i, head] = probs[head]
            x += ops.linear(merge_heads(probs @ cross_v), layer.cross_out.weight,
                            layer.cross_out.bias)
            mlp = ops.linear(layer_norm(x, layer.mlp_norm), layer.fc1.weight, layer.fc1.bias)
            ops.gelu(mlp, out=mlp)
            x += ops.linear(mlp, layer.fc2.weight, layer.fc2.bias)
        logits = ops.linear(layer_norm(x, w.decoder_norm), w.lm_head)
        return np.stack([found[pair] for pair in self.alignment_heads]), logits

    # -- the decoder ----------------------------------------------------------------------

    def forward(self, meta, kv: KVCache, ws: WhisperWorkspace,
                copies: list[tuple[int, int, int]] | tuple = (),
                state_copies: list[tuple[int, int]] | tuple = ()) -> np.ndarray:
        """Logits [len(meta.logits_rows), vocab] (a view of the workspace) of one batch
        of decoder rows, each sequence's cross-attention over its state slot's encoder
        frames (encoded by an earlier or this step's `encode`)."""
        c, w = self.config, self.weights
        t, r, h = len(meta.input_ids), len(meta.logits_rows), c.hidden_size
        if t > ws.max_tokens or r > ws.max_logits:
            raise ValueError(f"batch of {t} tokens / {r} logits rows exceeds the workspace "
                             f"({ws.max_tokens} / {ws.max_logits})")
        if copies:
            kv.copy_blocks(copies)
        kv.copy_states(state_copies)
        x, normed, attn, proj = ws.x[:t], ws.normed[:t], ws.attn[:t], ws.proj[:t]
        qkv, mlp = ws.qkv[:t], ws.mlp[:t]
        ops.embedding(meta.input_ids, w.embed, out=x)
        x += w.decoder_positions[meta.positions]
        n = len(meta.seq_lens)
        positions = c.encoder.positions
        cross_table = meta.state_slots.reshape(n, 1)
        cross_lens = np.full(n, positions, np.int32)
        scale = c.head_dim ** -0.5
        for i, layer in enumerate(w.decoder_layers):
            layer_norm(x, layer.attn_norm, out=normed)
            ops.linear(normed, layer.qkv.weight, layer.qkv.bias, out=qkv)
            ops.kv_write(qkv[:, h:2 * h], qkv[:, 2 * h:], meta.slot_mapping, kv.k[i], kv.v[i])
            ops.paged_attention(qkv[:, :h], kv.k[i], kv.v[i], meta.block_table, meta.seq_lens,
                                meta.query_start, c.num_heads, scale, out=attn,
                                scratch=ws.attn_scratch)
            x += ops.linear(attn, layer.out.weight, layer.out.bias, out=proj)
            layer_norm(x, layer.cross_norm, out=normed)
            q = ops.linear(normed, layer.cross_q.weight, layer.cross_q.bias, out=qkv[:, :h])
            ops.paged_attention(q, kv.cross_k[i], kv.cross_v[i], cross_table, cross_lens,
                                meta.query_start, c.num_heads, scale, out=attn,
                                scratch=ws.attn_scratch, causal=False)
            x += ops.linear(attn, layer.cross_out.weight, layer.cross_out.bias, out=proj)
            layer_norm(x, layer.mlp_norm, out=normed)
            ops.linear(normed, layer.fc1.weight, layer.fc1.bias, out=mlp)
            ops.gelu(mlp, out=mlp)
            x += ops.linear(mlp, layer.fc2.weight, layer.fc2.bias, out=proj)
        if r == 0:
            return ws.logits[:0]
        selected = ws.selected[:r]
        np.take(x, meta.logits_rows, axis=0, out=selected)
        layer_norm(selected, w.decoder_norm, out=selected)
        return ops.linear(selected, w.lm_head, out=ws.logits[:r])


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in float32."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32, copy=False)


def default_alignment_heads(c: ModelConfig) -> list[tuple[int, int]]:
    """Every head of the last half of the decoder layers (CTranslate2's choice for a
    model that names none)."""
    return [(layer, head) for layer in range(c.num_layers // 2, c.num_layers)
            for head in range(c.num_heads)]


def read_alignment_heads(path: Path, c: ModelConfig) -> list[tuple[int, int]]:
    """The alignment heads a model directory names: a CTranslate2 config.json's or a
    Hugging Face generation_config.json's `alignment_heads` [[layer, head], ...]; the
    default where neither does."""
    for name in ("config.json", "generation_config.json"):
        try:
            heads = json.loads((Path(path) / name).read_text()).get("alignment_heads")
        except (OSError, ValueError, AttributeError):
            continue
        if heads:
            pairs = [(int(layer), int(head)) for layer, head in heads]
            for layer, head in pairs:
                if not (0 <= layer < c.num_layers and 0 <= head < c.num_heads):
                    raise ValueError(f"{path}/{name}: alignment head [{layer}, {head}] is not "
                                     f"in {c.num_layers} layers of {c.num_heads} heads")
            return pairs
    return default_alignment_heads(c)


def load(path: Path, c: ModelConfig, dtype: str, quantization: str | Scheme,
         progress: Callable | None = None, tensors: WhisperTensors | None = None
         ) -> WhisperModel:
    """The Whisper model of a safetensors or CTranslate2 directory, or of `tensors`
    another source gives (a whisper.cpp ggml file: model/whisper_ggml.py, whose
    alignment heads are the default: it names none)."""
    if tensors is None:
        tensors = CT2Whisper(path, c) if is_ct2_dir(path) else SafetensorsWhisper(path)
    return WhisperModel(c, load_whisper(tensors, c, dtype, quantization, progress),
                        read_alignment_heads(path, c))


def is_ct2_dir(path: Path) -> bool:
    """A CTranslate2 model directory (model.bin) rather than a safetensors one."""
    path = Path(path)
    return (path / "model.bin").is_file() and not any(path.glob("*.safetensors"))
