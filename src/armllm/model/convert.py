"""convert: writes a model as a Hugging Face directory (safetensors,
config.json, tokenizer.json, tokenizer_config.json, generation_config.json):
`convert_gguf` turns a GGUF file into one that transformers loads and that
armllm loads with the same logits; `quantize_model` writes a GGUF file or a
Hugging Face directory as a compressed-tensors checkpoint (int-quantized,
symmetric, per-token int8 activations) that armllm reloads with the same
outputs as quantizing at load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from armllm import ops
from armllm.model import arch
from armllm.model.arch import load_hf_config
from armllm.model.arch.base import EMBED, FINAL_NORM, LM_HEAD
from armllm.model.compressed_tensors import matrix_tensors, parse_config, quantization_config
from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf
from armllm.model.layer import QKNorm, has_step, step_norms
from armllm.model.loader import gguf_model_config, model_path
from armllm.model.quantize import Scheme, quantize_rtn
from armllm.model.sources import GGUFSource, HFSource

LINEAR_SUFFIX = "_proj.weight"   # the linear weights' names end so (the others: norms, biases)


def _tensor_names(config) -> list[str]:
    """The checkpoint tensors of the model, from its architecture file's declaration."""
    family = arch.of(config)
    names = [EMBED, FINAL_NORM]
    for i in range(config.num_layers):
        p, steps = f"model.layers.{i}.", family.layer(config, i)
        names += [p + family.norms[n] for n in step_norms(steps)]
        names += [name for parts in family.linear_parts(config, i) for name, _ in parts]
        names += [p + f"self_attn.{n}_proj.bias" for n in "qkv" if config.attention_bias]
        names += [p + f"self_attn.{n}_norm.weight" for n in "qk" if has_step(steps, QKNorm)]
    if not config.tie_word_embeddings:
        names.append(LM_HEAD)
    return names


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """GGUF -> Hugging Face directory; dtype float32 (exact) or bfloat16."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    gguf, config = _exportable_gguf(gguf_path)
    tokenizer, tok_config = tokenizer_from_gguf(gguf.metadata, str(gguf_path))
    out = _empty_dir(out_dir)
    source = GGUFSource(gguf, config)
    tensors = {}
    for name in _tensor_names(config):
        w = np.ascontiguousarray(source.get(name), dtype=np.float32)
        tensors[name] = w if dtype == "float32" else ops.f32_to_bf16(w)
    if dtype == "bfloat16":  # safetensors.numpy has no bf16: write the bits, then fix the header
        save_tensors({n: ("BF16", t) for n, t in tensors.items()}, out / "model.safetensors")
    else:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config = _gguf_hf_config(config, dtype)
    _write_gguf_tokenizer(out, tokenizer, tok_config, config, hf_config)
    return out


def _exportable_gguf(path: str | Path) -> tuple[GGUFFile, object]:
    """A GGUF file whose model a config.json can describe, and its config."""
    gguf = GGUFFile(path)
    config = gguf_model_config(gguf)
    if config.rope_scaling and config.rope_scaling.get("rope_type") == "freq_factors":
        raise ValueError(f"{path}: rope_freqs.weight (per-frequency RoPE factors) has no "
                         f"config.json equivalent; armllm runs this GGUF directly")
    arch.of(config).export_config(config, "float32")   # refuses what it cannot write
    return gguf, config


def _empty_dir(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: output directory exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _gguf_hf_config(config, dtype: str) -> dict:
    return arch.of(config).export_config(config, dtype)


def _write_gguf_tokenizer(out: Path, tokenizer, tok_config: dict, c, hf_config: dict) -> None:
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    gen = {"bos_token_id": c.bos_token_id, "eos_token_id": hf_config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


_ST_DTYPES = {"BF16": "<u2", "F32": "<f4", "I8": "i1", "F16": "<f2"}


def save_tensors(tensors: dict[str, tuple[str, np.ndarray]], path: Path) -> None:
    """A safetensors file of mixed dtypes ({name: (safetensors dtype, array)}; BF16 as
    uint16 bits), which safetensors.numpy cannot write for bf16."""
    header, offset, blobs = {}, 0, []
    for name, (st_dtype, array) in tensors.items():
        blob = np.ascontiguousarray(array, dtype=_ST_DTYPES[st_dtype]).tobytes()
        header[name] = {"dtype": st_dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def quantize_model(model: str | Path, out_dir: str | Path, scheme: Scheme) -> Path:
    """A GGUF file or float Hugging Face directory -> a compressed-tensors checkpoint:
    Linear layers int-quantized by round to nearest (quantize.quantize_rtn, scales in
    float32 so a reload reproduces the same kernel inputs), everything else in bfloat16
    (embeddings and lm_head included; norms and biases keep float32)."""
    path = model_path(model)
    if path.is_file():
        gguf, config = _exportable_gguf(path)
        source = GGUFSource(gguf, config)
        tokenizer, tok_config = tokenizer_from_gguf(gguf.metadata, str(path))
        hf_config = _gguf_hf_config(config, "bfloat16")
    else:
        cfg_path = path / "config.json"
        hf_config = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        if parse_config(hf_config, str(cfg_path)) is not None:
            raise ValueError(f"{cfg_path}: the checkpoint is already quantized")
        config = load_hf_config(path)
        arch.of(config).export_config(config, "bfloat16")   # refuses what it cannot write
        source = HFSource(path, config=config)
    out = _empty_dir(out_dir)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for name in _tensor_names(config):
        a = source.get(name)
        w = ops.bf16_to_f32(a) if a.dtype == np.uint16 else np.ascontiguousarray(a, np.float32)
        if name.endswith(LINEAR_SUFFIX):
            qm = quantize_rtn(w, scheme)
            for tname, array in matrix_tensors(name[:-len(".weight")], qm, w.shape[1]).items():
                tensors[tname] = ("I8" if array.dtype == np.int8 else "F32", array)
        elif a.dtype == np.uint16:
            tensors[name] = ("BF16", a)
        elif w.ndim == 1:   # norms and biases keep float32: armllm computes them in f32
            tensors[name] = ("F32", w)
        else:               # embeddings and lm_head in bf16
            tensors[name] = ("BF16", ops.f32_to_bf16(w))
    save_tensors(tensors, out / "model.safetensors")
    ignore = [] if config.tie_word_embeddings else ["lm_head"]
    hf_config = {**hf_config, "torch_dtype": "bfloat16",
                 "quantization_config": quantization_config(scheme.bits, scheme.group,
                                                            ignore or ["lm_head"],
                                                            scheme.act_symmetric)}
    if path.is_file():
        _write_gguf_tokenizer(out, tokenizer, tok_config, config, hf_config)
    else:
        (out / "config.json").write_text(json.dumps(hf_config, indent=2))
        for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                      "special_tokens_map.json"):
            if (path / extra).exists():
                (out / extra).write_bytes((path / extra).read_bytes())
    return out
