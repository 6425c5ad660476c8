"""convert: writes a GGUF model as a Hugging Face directory (safetensors,
config.json, tokenizer.json, tokenizer_config.json, generation_config.json)
that transformers loads and that armllm loads with the same logits."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from armllm import ops
from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf
from armllm.model.loader import gguf_model_config
from armllm.model.weights import GGUFSource

LAYER_TENSORS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                 "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                 "mlp.up_proj.weight", "mlp.down_proj.weight")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """GGUF -> Hugging Face directory; dtype float32 (exact) or bfloat16."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    gguf = GGUFFile(gguf_path)
    config = gguf_model_config(gguf)
    tied = config.tie_word_embeddings
    if config.rope_scaling:
        raise ValueError(f"{gguf_path}: rope_freqs.weight (per-frequency RoPE factors) has no "
                         f"config.json equivalent; armllm runs this GGUF directly")
    tokenizer, tok_config = tokenizer_from_gguf(gguf.metadata, str(gguf_path))
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: output directory exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    source = GGUFSource(gguf, config)
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [f"model.layers.{i}.{t}" for i in range(config.num_layers) for t in LAYER_TENSORS]
    if not tied:
        names.append("lm_head.weight")
    tensors = {}
    for name in names:
        w = np.ascontiguousarray(source.get(name), dtype=np.float32)
        tensors[name] = w if dtype == "float32" else ops.f32_to_bf16(w)
    if dtype == "bfloat16":  # safetensors.numpy has no bf16: write the bits, then fix the header
        _save_bf16(tensors, out / "model.safetensors")
    else:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    c = config
    hf_config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu", "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids[0] if len(c.eos_token_ids) == 1 else list(c.eos_token_ids),
        "torch_dtype": dtype,
    }
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    gen = {"bos_token_id": c.bos_token_id, "eos_token_id": hf_config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out


def _save_bf16(tensors: dict[str, np.ndarray], path: Path) -> None:
    header, offset, blobs = {}, 0, []
    for name, bits in tensors.items():
        blob = np.ascontiguousarray(bits, dtype="<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(bits.shape),
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
