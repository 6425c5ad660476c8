"""make_synthetic_moe: writes random-weight checkpoints with the exact shapes of real
mixture-of-experts models, for benchmarks whose speed depends only on shapes:
gpt-oss-20b (MXFP4 experts, BF16 attention, embeddings and head, as the Hub's
checkpoint stores them) and Qwen3-30B-A3B (4-bit: its BF16 form does not fit in this
machine's memory), as a GGUF file that armllm and llama.cpp both run, or as a Hugging
Face directory holding the same numbers.

    python tools/make_synthetic_moe.py --shape gpt-oss-20b --out DIR [--format gguf|hf]
        [--layers N] [--seed N]

--format gguf (the default) writes DIR/<shape>-<TYPE>.gguf, laid out as llama.cpp's
converter writes that architecture ("gpt-oss": gate and up experts de-interleaved,
biases, attn_sinks, post_attention_norm, YaRN keys; "qwen3moe": q/k norms; Qwen3 in
Q4_0 throughout, norms and routers F32), SmolLM2's tokenizer padded to the
vocabulary size (as tools/make_synthetic.py).

--format hf writes DIR/<shape>-hf/: config.json (the model's published config.json,
sizes from the shape, token ids SmolLM2's), the weights in safetensors shards of at
most 5 GB (model-0000k-of-0000n.safetensors and model.safetensors.index.json;
model.safetensors when one is enough), and the same tokenizer as tokenizer.json and
tokenizer_config.json.
- gpt-oss: the Hub checkpoint's names and layout. Experts as
  mlp.experts.gate_up_proj_blocks (uint8 [E, 2I, H/32, 16]: e2m1 codes two a byte,
  the even one low; gate and up interleaved by row, 2j gate j, 2j+1 up j) and
  gate_up_proj_scales (e8m0 [E, 2I, H/32]), down_proj_blocks/_scales, their biases
  gate_up_proj_bias [E, 2I] (interleaved alike) and down_proj_bias; mlp.router
  .weight/.bias, self_attn.sinks, attention weights and biases, norms, embeddings
  and lm_head bf16; quantization_config {"quant_method": "mxfp4"}.
- Qwen3-30B-A3B: a compressed-tensors pack-quantized checkpoint (what
  armllm.model.compressed_tensors reads): every attention projection and expert as
  weight_packed (int32, eight 4-bit values q' + 8 a word, low nibble first),
  weight_scale (f16, one per 32 columns) and weight_shape, int4 symmetric group 32:
  Q4_0's own form (its code q is q' + 8, its d the scale: d (q - 8) = scale q').
  Embeddings, lm_head, norms and the router (mlp.gate) bf16, lm_head and mlp.gate
  left out of the quantization (its "ignore").

Values. Every tensor comes from its own generator (seeded by --seed and its GGUF
name, so a --layers cut keeps the other tensors' values). Quantized tensors are
random blocks: random codes under one power-of-two scale per tensor, chosen so that
weights have about the magnitude 1/sqrt(fan_in) (MXFP4: the e8m0 exponent; Q4_0:
d = 2^n as f16); BF16 matrices are normal with std 1/sqrt(fan_in), truncated to
bf16; norm weights 1; biases and attention sinks normal with std 0.02, routers
normal with std 1/sqrt(fan_in), both truncated to bf16 too (the checkpoint's dtype)
and stored as F32 in the GGUF (as llama.cpp's converter widens them).

The two formats hold the same numbers, tensor for tensor: MXFP4 codes and scales
re-laid, BF16 bits copied, F32 values narrowed to the bf16 they are, Q4_0 codes and
d as the packed values and scales, and the Q4_0 embeddings and head dequantized to
bf16, exactly (a power-of-two d times a code in [-8, 7] has at most 3 significant
bits). So armllm runs both alike; the one difference in how it runs them is
Qwen3's head under the default quantization: the GGUF's Q4_0 head runs as stored on
int8 activations, the directory's bf16 head in floats.

Tensors are generated, converted and written one at a time, large ones in row
chunks; the most held at once is a layer's stacked experts (gpt-oss-20b's gate and
up: about 300 MB; a run peaks under 0.5 GB).
"""
from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_synthetic import (  # noqa: E402
    MAX_SHARD_BYTES,
    SAFETENSORS_ALIGN,
    add_model_keys,
    add_tokenizer,
    smollm2_metadata,
    write_hf_tokenizer,
)

T = gguf.GGMLQuantizationType
E2M1_MEAN_ABS = 2.625    # mean |value| of the 16 e2m1 codes (0, 0.5 .. 6, doubled sign)
Q4_0_MEAN_ABS = 4.0      # mean |q - 8| of uniform 4-bit codes
E8M0_BIAS = 127
BLOCK = 32               # values under one scale, MXFP4 and Q4_0
MXFP4_BYTES = gguf.GGML_QUANT_SIZES[T.MXFP4][1]   # a block: e8m0 scale + 16 bytes of codes
Q4_0_BYTES = gguf.GGML_QUANT_SIZES[T.Q4_0][1]     # a block: f16 d + 16 bytes of codes
BIAS_STD = 0.02
CHUNK_BYTES = 64 << 20   # float32 bytes of the rows generated (or decoded) at a time
FORMATS = ("gguf", "hf")


@dataclass(frozen=True)
class MoEShape:
    """A mixture-of-experts model as its config.json states it (the published
    configs' values) and the ggml types of its GGUF."""
    arch: str                # GGUF general.architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    top_k: int
    expert_inter: int
    dense_inter: int         # feed_forward_length (config.json's intermediate_size)
    rope_theta: float
    max_position: int
    rms_norm_eps: float
    expert_type: T
    dense_type: T            # attention, embeddings, lm_head
    sliding_window: int = 0
    yarn: tuple[float, int] | None = None   # (factor, original context)


SHAPES = {
    "gpt-oss-20b": MoEShape("gpt-oss", hidden=2880, layers=24, heads=64, kv_heads=8,
                            head_dim=64, vocab=201088, experts=32, top_k=4, expert_inter=2880,
                            dense_inter=2880, rope_theta=150000.0, max_position=131072,
                            rms_norm_eps=1e-5, expert_type=T.MXFP4, dense_type=T.BF16,
                            sliding_window=128, yarn=(32.0, 4096)),
    "qwen3-30b-a3b": MoEShape("qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4,
                              head_dim=128, vocab=151936, experts=128, top_k=8,
                              expert_inter=768, dense_inter=6144, rope_theta=1000000.0,
                              max_position=40960, rms_norm_eps=1e-6, expert_type=T.Q4_0,
                              dense_type=T.Q4_0),
}


@dataclass(frozen=True)
class Tensor:
    name: str                  # GGUF name
    shape: tuple[int, ...]     # numpy order: the last axis is a row
    qtype: T
    kind: str = "matrix"       # matrix, norm, bias, router


def tensor_list(s: MoEShape) -> list[Tensor]:
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    e, inter, oss = s.experts, s.expert_inter, s.arch == "gpt-oss"
    out = [Tensor("token_embd.weight", (s.vocab, h), s.dense_type)]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [Tensor(b + "attn_norm.weight", (h,), T.F32, "norm"),
                Tensor(b + "attn_q.weight", (q, h), s.dense_type),
                Tensor(b + "attn_k.weight", (kv, h), s.dense_type),
                Tensor(b + "attn_v.weight", (kv, h), s.dense_type),
                Tensor(b + "attn_output.weight", (h, q), s.dense_type)]
        if oss:
            out += [Tensor(b + f"attn_{n}.bias", (size,), T.F32, "bias")
                    for n, size in (("q", q), ("k", kv), ("v", kv), ("output", h))]
            out += [Tensor(b + "attn_sinks.weight", (s.heads,), T.F32, "bias"),
                    Tensor(b + "post_attention_norm.weight", (h,), T.F32, "norm")]
        else:
            out += [Tensor(b + "attn_q_norm.weight", (s.head_dim,), T.F32, "norm"),
                    Tensor(b + "attn_k_norm.weight", (s.head_dim,), T.F32, "norm"),
                    Tensor(b + "ffn_norm.weight", (h,), T.F32, "norm")]
        out.append(Tensor(b + "ffn_gate_inp.weight", (e, h), T.F32, "router"))
        out += [Tensor(b + "ffn_gate_exps.weight", (e, inter, h), s.expert_type),
                Tensor(b + "ffn_up_exps.weight", (e, inter, h), s.expert_type),
                Tensor(b + "ffn_down_exps.weight", (e, h, inter), s.expert_type)]
        if oss:
            out += [Tensor(b + "ffn_gate_inp.bias", (e,), T.F32, "bias"),
                    Tensor(b + "ffn_gate_exps.bias", (e, inter), T.F32, "bias"),
                    Tensor(b + "ffn_up_exps.bias", (e, inter), T.F32, "bias"),
                    Tensor(b + "ffn_down_exps.bias", (e, h), T.F32, "bias")]
    out += [Tensor("output_norm.weight", (h,), T.F32, "norm"),
            Tensor("output.weight", (s.vocab, h), s.dense_type)]
    return out


def nbytes(t: Tensor) -> int:
    block, block_bytes = gguf.GGML_QUANT_SIZES[t.qtype]
    return math.prod(t.shape) // block * block_bytes


# ------------------------------------------------------------------ values


def scale_bytes(qtype: T, fan_in: int) -> bytes:
    """The bytes that open every block of a quantized tensor: a power of two near
    1/sqrt(fan_in) / (mean |code value|), as e8m0 (MXFP4) or f16 (Q4_0)."""
    if qtype == T.MXFP4:
        return bytes([E8M0_BIAS + round(math.log2(fan_in ** -0.5 / E2M1_MEAN_ABS))])
    if qtype == T.Q4_0:
        return np.float16(2.0 ** round(math.log2(fan_in ** -0.5 / Q4_0_MEAN_ABS))).tobytes()
    raise ValueError(f"no random blocks for {qtype.name}")


def gguf_chunks(t: Tensor, seed: int) -> Iterator[np.ndarray]:
    """The tensor's data as the GGUF stores it (see the module docstring for the values),
    in chunks of whole rows: float32 [rows, cols] for F32, bf16 bits (uint16) for
    BF16, uint8 [rows, row bytes] for quantized types. Chunks are multiples of 4 rows,
    so that rng.bytes (whole uint32s) draws the stream it would for the whole tensor."""
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])
    if t.kind == "norm":
        yield np.ones((rows, cols), np.float32)
        return
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    floats = t.qtype in (T.F32, T.BF16)
    row_bytes, head = nbytes(t) // rows, b"" if floats else scale_bytes(t.qtype, cols)
    step = max(4, CHUNK_BYTES // (4 * cols) // 4 * 4)   # float32 of a chunk: CHUNK_BYTES
    for row0 in range(0, rows, step):
        n = min(step, rows - row0)
        if floats:
            std = BIAS_STD if t.kind == "bias" else cols ** -0.5
            x = rng.standard_normal((n, cols), np.float32) * np.float32(std)
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)   # truncated to bf16
            yield bits if t.qtype == T.BF16 else bf16_to_f32(bits)
            continue
        blocks = np.frombuffer(rng.bytes(n * row_bytes), np.uint8).reshape(
            n, -1, gguf.GGML_QUANT_SIZES[t.qtype][1]).copy()
        blocks[..., :len(head)] = np.frombuffer(head, np.uint8)
        yield blocks.reshape(n, row_bytes)


def gguf_array_of(chunks: Iterator[np.ndarray]) -> np.ndarray:
    """A whole tensor from its gguf_chunks."""
    return np.concatenate(list(chunks))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """bf16 bits of float32 values that are bf16 values (raises when one is not)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if np.any(bits & 0xFFFF):
        raise ValueError("values are not exact in bf16")
    return (bits >> 16).astype(np.uint16)


# -------------------------------------------------------------------- GGUF


def write_moe_gguf(shape: MoEShape, path: Path, seed: int = 0, log=print) -> Path:
    tensors = tensor_list(shape)
    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(f"synthetic {path.stem}")
    add_model_keys(w, shape, shape.dense_inter)
    w.add_expert_feed_forward_length(shape.expert_inter)
    w.add_expert_count(shape.experts)
    w.add_expert_used_count(shape.top_k)
    if shape.sliding_window:
        w.add_sliding_window(shape.sliding_window)
    if shape.yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(shape.yarn[0])
        w.add_rope_scaling_orig_ctx_len(shape.yarn[1])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, smollm2_metadata(shape.vocab))
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.float32, nbytes(t), t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    written, started = 0, time.monotonic()

    def pad() -> None:
        fout.write(b"\0" * (-fout.tell() % w.data_alignment))

    pad()
    for t in tensors:
        for chunk in gguf_chunks(t, seed):
            fout.write(chunk.data)
            written += chunk.nbytes
        pad()
        if t.name.endswith("ffn_down_exps.weight"):
            log(f"{t.name}: {written / 1e9:.2f} GB in {time.monotonic() - started:.0f} s")
    w.close()
    return path


# ---------------------------------------------------------------------- HF

# a GGUF tensor of a block -> the checkpoint's name under model.layers.N.
HF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks.weight": "self_attn.sinks",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",   # gpt-oss
    "ffn_norm.weight": "post_attention_layernorm.weight",              # qwen3moe
    "ffn_gate_inp.bias": "mlp.router.bias",
    # gpt-oss's stacked experts (gate and up: one tensor, rows interleaved; Qwen3's are
    # per expert, named in hf_groups)
    "ffn_gate_exps.weight": "mlp.experts.gate_up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_exps.bias": "mlp.experts.gate_up_proj_bias",
    "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
}
HF_ROUTER = {"gpt-oss": "mlp.router.weight", "qwen3moe": "mlp.gate.weight"}
HF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
# the checkpoint's dtypes as numpy's (uint16 arrays are bf16 bits) -> safetensors' names
BF16, U8, I32, F16, I64 = map(np.dtype, (np.uint16, np.uint8, np.int32, np.float16, np.int64))
SAFETENSORS_DTYPES = {BF16: "BF16", U8: "U8", I32: "I32", F16: "F16", I64: "I64"}


@dataclass(frozen=True)
class HFTensor:
    name: str
    dtype: np.dtype            # numpy's; uint16 is bf16
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class HFGroup:
    """Checkpoint tensors made together from GGUF tensors: `convert` takes each
    source's gguf_chunks and yields the outputs' data in order, a tensor or part of
    one at a time."""
    outputs: tuple[HFTensor, ...]
    sources: tuple[Tensor, ...]
    convert: Callable[..., Iterator[np.ndarray]]


def mxfp4_hub_blocks(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks uint8 [n, k/32, 16], scales uint8 [n, k/32]) in the Hub's layout (value
    2b in the low nibble of byte b, 2b + 1 in the high) of GGUF MXFP4 rows [n, k/32 *
    17] (the e8m0 byte, then value j in the low and j + 16 in the high nibble of byte
    j): the same codes and scales."""
    b = rows.reshape(len(rows), k // BLOCK, MXFP4_BYTES)
    codes = np.concatenate([b[..., 1:] & 0x0F, b[..., 1:] >> 4], axis=-1)   # values 0..31
    return codes[..., 0::2] | (codes[..., 1::2] << 4), b[..., 0]


def q4_0_codes(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 [n, k] in 0..15, d float16 [n, k/32]) of GGUF Q4_0 rows [n, k/32 *
    18] (f16 d, then value j in the low and j + 16 in the high nibble of byte j)."""
    b = rows.reshape(len(rows), k // BLOCK, Q4_0_BYTES)
    d = np.ascontiguousarray(b[..., :2]).view(np.float16)[..., 0]
    codes = np.concatenate([b[..., 2:] & 0x0F, b[..., 2:] >> 4], axis=-1)
    return codes.reshape(len(rows), k), d


def q4_0_to_bf16(rows: np.ndarray, k: int) -> np.ndarray:
    codes, d = q4_0_codes(rows, k)
    values = (codes.astype(np.float32) - 8).reshape(len(rows), -1, BLOCK) * \
        d.astype(np.float32)[..., None]
    return f32_to_bf16(values.reshape(len(rows), k))


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """int32 [n, k/8] of 4-bit codes [n, k]: element 8j + i in bits 4i..4i+3 of word j
    (compressed-tensors' pack_to_int32 of q' = code - 8)."""
    words = codes.astype(np.uint32).reshape(len(codes), -1, 8) << \
        np.arange(0, 32, 4, dtype=np.uint32)
    return np.bitwise_or.reduce(words, axis=-1).view(np.int32)


def ct_outputs(module: str, n: int, k: int) -> tuple[HFTensor, ...]:
    return (HFTensor(f"{module}.weight_packed", I32, (n, k // 8)),
            HFTensor(f"{module}.weight_scale", F16, (n, k // BLOCK)),
            HFTensor(f"{module}.weight_shape", I64, (2,)))


def ct_arrays(rows: np.ndarray, k: int) -> Iterator[np.ndarray]:
    """weight_packed, weight_scale and weight_shape of a [n, k] Q4_0 matrix."""
    codes, d = q4_0_codes(rows, k)
    yield pack_int4(codes)
    yield d
    yield np.array([len(rows), k], np.int64)


def _rowwise(fn: Callable[[np.ndarray], np.ndarray]):
    return lambda chunks: (fn(chunk) for chunk in chunks)


def _as_bf16(chunk: np.ndarray) -> np.ndarray:
    return chunk if chunk.dtype == np.uint16 else f32_to_bf16(chunk)


def _stacked_mxfp4(experts: int, k: int):
    """The Hub's blocks then scales of stacked MXFP4 experts: one source (down) as
    stored, two (gate, up) interleaved by row."""
    def convert(*sources):
        stacks = [gguf_array_of(chunks).reshape(experts, -1, k // BLOCK * MXFP4_BYTES)
                  for chunks in sources]
        scales = []
        for e in range(experts):
            parts = [mxfp4_hub_blocks(stack[e], k) for stack in stacks]
            yield np.stack([blocks for blocks, _ in parts], axis=1)
            scales.append(np.stack([s for _, s in parts], axis=1))
        yield np.stack(scales)
    return convert


def _interleaved_bf16(*sources):
    """bf16 of [E, N] tensors interleaved by column: gate_up_proj_bias."""
    yield f32_to_bf16(np.stack([gguf_array_of(chunks) for chunks in sources], axis=2))


def _ct_experts(experts: int, k: int):
    """Each Q4_0 expert's compressed-tensors weight_packed, weight_scale, weight_shape."""
    def convert(chunks):
        stack = gguf_array_of(chunks).reshape(experts, -1, k // BLOCK * Q4_0_BYTES)
        for e in range(experts):
            yield from ct_arrays(stack[e], k)
    return convert


def hf_groups(s: MoEShape) -> list[HFGroup]:
    """The checkpoint's tensors, in file order, and how each is made from the GGUF's."""
    tensors = {t.name: t for t in tensor_list(s)}
    oss = s.arch == "gpt-oss"
    groups = []
    for t in tensors.values():
        layer, part = t.name.split(".", 2)[1:] if t.name.startswith("blk.") else ("", t.name)
        prefix, k = f"model.layers.{layer}.", t.shape[-1]
        if oss and part.startswith("ffn_up_exps."):
            continue                                 # interleaved into gate's
        if not oss and part.endswith("_exps.weight"):   # compressed-tensors, per expert
            which = part.split("_")[1]               # gate, up or down
            outputs = sum((ct_outputs(f"{prefix}mlp.experts.{e}.{which}_proj", t.shape[1], k)
                           for e in range(t.shape[0])), ())
            groups.append(HFGroup(outputs, (t,), _ct_experts(t.shape[0], k)))
            continue
        name = HF_TOP_NAMES[part] if not layer else prefix + (
            HF_ROUTER[s.arch] if part == "ffn_gate_inp.weight" else HF_LAYER_NAMES[part])
        if oss and part.endswith("_exps.weight"):   # MXFP4 blocks and scales
            sources = (t,) if "down" in part else (t, tensors[t.name.replace("gate", "up")])
            e, n = t.shape[0], t.shape[1] * len(sources)
            groups.append(HFGroup((HFTensor(f"{name}_blocks", U8, (e, n, k // BLOCK, 16)),
                                   HFTensor(f"{name}_scales", U8, (e, n, k // BLOCK))),
                                  sources, _stacked_mxfp4(e, k)))
        elif oss and part == "ffn_gate_exps.bias":
            up = tensors[t.name.replace("gate", "up")]
            groups.append(HFGroup((HFTensor(name, BF16, (t.shape[0], 2 * k)),), (t, up),
                                  _interleaved_bf16))
        elif t.qtype == T.Q4_0 and name.endswith("_proj.weight"):
            groups.append(HFGroup(ct_outputs(name[:-len(".weight")], *t.shape), (t,),
                                  lambda chunks, k=k: ct_arrays(gguf_array_of(chunks), k)))
        elif t.qtype == T.Q4_0:                      # embeddings, head: bf16, exact
            groups.append(HFGroup((HFTensor(name, BF16, t.shape),), (t,),
                                  _rowwise(lambda rows, k=k: q4_0_to_bf16(rows, k))))
        else:                                        # BF16 as stored, F32 narrowed
            groups.append(HFGroup((HFTensor(name, BF16, t.shape),), (t,), _rowwise(_as_bf16)))
    return groups


def hf_config(s: MoEShape, tok_meta: dict) -> dict:
    """The model's published config.json, with the shape's sizes and the tokenizer's
    special token ids."""
    eos = int(tok_meta["tokenizer.ggml.eos_token_id"])
    if s.arch == "gpt-oss":
        factor, original = s.yarn
        return {
            "architectures": ["GptOssForCausalLM"], "attention_bias": True,
            "attention_dropout": 0.0, "eos_token_id": eos, "experts_per_token": s.top_k,
            "head_dim": s.head_dim, "hidden_act": "silu", "hidden_size": s.hidden,
            "initial_context_length": original, "initializer_range": 0.02,
            "intermediate_size": s.expert_inter,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                            for i in range(s.layers)],
            "max_position_embeddings": s.max_position, "model_type": "gpt_oss",
            "num_attention_heads": s.heads, "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers, "num_key_value_heads": s.kv_heads,
            "num_local_experts": s.experts, "output_router_logits": False,
            "pad_token_id": int(tok_meta.get("tokenizer.ggml.padding_token_id", eos)),
            "quantization_config": {
                "modules_to_not_convert": ["model.layers.*.self_attn",
                                           "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"],
                "quant_method": "mxfp4"},
            "rms_norm_eps": s.rms_norm_eps,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": factor,
                             "original_max_position_embeddings": original,
                             "rope_type": "yarn", "truncate": False},
            "rope_theta": s.rope_theta, "router_aux_loss_coef": 0.9,
            "sliding_window": s.sliding_window, "swiglu_limit": 7.0,
            "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
            "use_cache": True, "vocab_size": s.vocab}
    weights = {"actorder": None, "block_structure": None, "dynamic": False,
               "group_size": BLOCK, "num_bits": 4, "observer": "minmax",
               "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"}
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": int(tok_meta["tokenizer.ggml.bos_token_id"]),
        "decoder_sparse_step": 1, "eos_token_id": eos, "head_dim": s.head_dim,
        "hidden_act": "silu", "hidden_size": s.hidden, "initializer_range": 0.02,
        "intermediate_size": s.dense_inter, "max_position_embeddings": s.max_position,
        "max_window_layers": s.layers, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": s.expert_inter, "norm_topk_prob": True,
        "num_attention_heads": s.heads, "num_experts": s.experts,
        "num_experts_per_tok": s.top_k, "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads, "output_router_logits": False,
        "quantization_config": {
            "config_groups": {"group_0": {"input_activations": None,
                                          "output_activations": None,
                                          "targets": ["Linear"], "weights": weights}},
            "format": "pack-quantized", "global_compression_ratio": None,
            "ignore": ["lm_head", "re:.*mlp.gate$"], "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed"},
        "rms_norm_eps": s.rms_norm_eps, "rope_scaling": None, "rope_theta": s.rope_theta,
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": s.vocab}


class SafetensorsShards:
    """Safetensors shards whose headers are written first (every tensor's name, dtype
    and shape is known), so that data can be appended a chunk at a time, in order."""

    def __init__(self, folder: Path, tensors: list[HFTensor], max_shard_bytes: int):
        shards: list[list[HFTensor]] = [[]]
        size = 0
        for t in tensors:
            if shards[-1] and size + t.nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(t)
            size += t.nbytes
        n = len(shards)
        names = (["model.safetensors"] if n == 1 else
                 [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        self.files: list[BinaryIO] = []
        self.order: list[tuple[HFTensor, BinaryIO]] = []
        for name, shard in zip(names, shards, strict=True):
            header, offset = {"__metadata__": {"format": "pt"}}, 0
            for t in shard:
                header[t.name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                                  "data_offsets": [offset, offset + t.nbytes]}
                offset += t.nbytes
            raw = json.dumps(header).encode()
            raw += b" " * (-len(raw) % SAFETENSORS_ALIGN)
            f = open(folder / name, "wb")  # closed in close()
            f.write(struct.pack("<Q", len(raw)) + raw)
            self.files.append(f)
            self.order += [(t, f) for t in shard]
        if n > 1:
            index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)},
                     "weight_map": {t.name: names[i] for i, shard in enumerate(shards)
                                    for t in shard}}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        self.next, self.left = 0, 0

    def write(self, data: np.ndarray) -> None:
        """Appends `data` to the tensor being written (the next one once it is full)."""
        while self.left == 0:
            t, _ = self.order[self.next]
            self.next, self.left = self.next + 1, t.nbytes
        t, f = self.order[self.next - 1]
        if data.dtype != t.dtype or data.nbytes > self.left:
            raise ValueError(f"{t.name}: got {data.nbytes} bytes of {data.dtype}, "
                             f"{self.left} bytes of {t.dtype} left")
        f.write(np.ascontiguousarray(data).data)
        self.left -= data.nbytes

    def close(self) -> None:
        for f in self.files:
            f.close()

    def check_complete(self) -> None:
        if self.left or self.next != len(self.order):
            raise ValueError(f"wrote {self.next} of {len(self.order)} tensors")


def write_moe_hf(shape: MoEShape, folder: Path, seed: int = 0, log=print,
                 max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    groups = hf_groups(shape)
    tok_meta = smollm2_metadata(shape.vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config(shape, tok_meta), indent=2))
    write_hf_tokenizer(folder, tok_meta)
    out = SafetensorsShards(folder, [t for g in groups for t in g.outputs], max_shard_bytes)
    written, started = 0, time.monotonic()
    try:
        for g in groups:
            for data in g.convert(*(gguf_chunks(t, seed) for t in g.sources)):
                out.write(data)
                written += data.nbytes
            if g.outputs[-1].name.endswith(("down_proj_scales", "down_proj.weight_shape")):
                log(f"{g.sources[0].name}: {written / 1e9:.2f} GB in "
                    f"{time.monotonic() - started:.0f} s")
        out.check_complete()
    finally:
        out.close()
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--format", default="gguf", choices=FORMATS,
                    help="a GGUF file or a Hugging Face directory (default %(default)s)")
    ap.add_argument("--layers", type=int, help="keep only the first N layers (a quick file)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]
    if args.layers is not None:
        if not 1 <= args.layers <= shape.layers:
            print(f"make_synthetic_moe: --layers must be in [1, {shape.layers}], got "
                  f"{args.layers}", file=sys.stderr)
            return 2
        shape = replace(shape, layers=args.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.format == "hf":
        path = write_moe_hf(shape, args.out / f"{args.shape}-hf", args.seed)
    else:
        path = write_moe_gguf(shape, args.out / f"{args.shape}-{shape.expert_type.name}.gguf",
                              args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
