"""make_synthetic_moe: writes GGUF files with the exact shapes of real mixture-of-
experts models and random weights, for benchmarks whose speed depends only on
shapes: gpt-oss-20b (MXFP4 experts, BF16 attention, embeddings and head, as the
Hub's checkpoint stores them) and Qwen3-30B-A3B (Q4_0: its BF16 form does not
fit in this machine's memory). armllm and llama.cpp then run the same file.

    python tools/make_synthetic_moe.py --shape gpt-oss-20b --out DIR [--layers N] [--seed N]

writes DIR/<shape>-<TYPE>.gguf, laid out as llama.cpp's converter writes that
architecture ("gpt-oss": gate and up experts de-interleaved, biases, attn_sinks,
post_attention_norm, YaRN keys; "qwen3moe": q/k norms), SmolLM2's tokenizer
padded to the vocabulary size (as tools/make_synthetic.py).

Values. Quantized tensors are random blocks: random codes under one scale per
block chosen so that weights have about the magnitude 1/sqrt(fan_in) (MXFP4: the
e8m0 exponent, Q4_0: the f16 d); BF16 matrices are normal with std 1/sqrt(fan_in);
norm weights 1, biases and attention sinks small normals; routers F32 normal (as
llama.cpp keeps them unquantized). Tensors are generated and written one at a time
(the largest, a layer's stacked experts, a few hundred MB).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_synthetic import add_model_keys, add_tokenizer, smollm2_metadata  # noqa: E402

T = gguf.GGMLQuantizationType
E2M1_MEAN_ABS = 2.625    # mean |value| of the 16 e2m1 codes (0, 0.5 .. 6, doubled sign)
Q4_0_MEAN_ABS = 4.0      # mean |q - 8| of uniform 4-bit codes
E8M0_BIAS = 127


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


def tensor_bytes(t: Tensor, seed: int) -> bytes:
    """The tensor's data as stored (see the module docstring for the values)."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    fan_in = t.shape[-1]
    if t.kind == "norm":
        return np.ones(t.shape, np.float32).tobytes()
    if t.qtype == T.F32:
        std = 0.02 if t.kind == "bias" else fan_in ** -0.5
        return (rng.standard_normal(t.shape, np.float32) * np.float32(std)).tobytes()
    if t.qtype == T.BF16:
        x = rng.standard_normal(t.shape, np.float32) * np.float32(fan_in ** -0.5)
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    block, block_bytes = gguf.GGML_QUANT_SIZES[t.qtype]
    blocks = np.frombuffer(rng.bytes(nbytes(t)), np.uint8).reshape(-1, block_bytes).copy()
    if t.qtype == T.MXFP4:   # e8m0 byte, then 16 bytes of codes
        blocks[:, 0] = E8M0_BIAS + round(math.log2(fan_in ** -0.5 / E2M1_MEAN_ABS))
    elif t.qtype == T.Q4_0:  # f16 d, then 16 bytes of codes
        d = np.float16(fan_in ** -0.5 / Q4_0_MEAN_ABS)
        blocks[:, :2] = np.frombuffer(d.tobytes(), np.uint8)
    else:
        raise ValueError(f"no random blocks for {t.qtype.name}")
    return blocks.tobytes()


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
        data = tensor_bytes(t, seed)
        fout.write(data)
        pad()
        written += len(data)
        if t.name.endswith("ffn_down_exps.weight"):
            log(f"{t.name}: {written / 1e9:.2f} GB in {time.monotonic() - started:.0f} s")
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, type=Path)
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
    path = args.out / f"{args.shape}-{shape.expert_type.name}.gguf"
    write_moe_gguf(shape, path, args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
