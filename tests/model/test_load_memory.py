"""Loading stays within its steady-state memory: a fresh process loads a generated
checkpoint of real proportions (tens of MB of weights) and its peak resident memory
while loading stays within 10% of what it holds afterwards, which is the packed
weights, not the file's pages. Per load path: safetensors bf16 as bf16, quantized at
load to w8a8, and a GGUF Q8_0 as stored."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from armllm import ops
from armllm.model.convert import save_tensors
from armllm.model.sources import CHUNK_BYTES
from tests.tiny_model import write_tiny_gguf

HIDDEN, HEADS, KV_HEADS, INTER, LAYERS, VOCAB = 512, 8, 2, 2048, 4, 16384
RATIO = 1.10
# What a load may hold beyond 10% whatever the model's size: the conversion
# temporaries of one chunk of rows (a few f32 copies of CHUNK_BYTES while it is
# quantized) and the interpreter's own allocations while loading (imported modules'
# caches, malloc arenas growing), a few MiB.
ALLOWANCE = 4 * CHUNK_BYTES + (8 << 20)

# Runs in a fresh process (its peak RSS is the load's alone): RSS before, the peak
# while loading and RSS after the load, once the checkpoint's file is closed as
# load_model leaves it.
LOAD_SCRIPT = """
import gc, json, sys
from armllm.bench.rss import peak_rss_bytes, rss_bytes
from armllm.model.arch import load_hf_config
from armllm.model.gguf import GGUFFile
from armllm.model.loader import gguf_model_config
from armllm.model.quantize import parse_scheme
from armllm.model.sources import GGUFSource, HFSource
from armllm.model.weights import load_weights

path, quantization = sys.argv[1], sys.argv[2]
quantization = quantization if quantization in ("auto", "none") else parse_scheme(quantization)
if path.endswith(".gguf"):
    gguf = GGUFFile(path)
    config = gguf_model_config(gguf)
    source = GGUFSource(gguf, config)
else:
    gguf, config, source = None, load_hf_config(path), HFSource(path)
before = rss_bytes()
weights = load_weights(source, config, "bf16", None, quantization)
del source, gguf
gc.collect()
print(json.dumps({"before": before, "peak": peak_rss_bytes(), "steady": rss_bytes(),
                  "weights": weights.nbytes, "label": weights.quantization}))
"""


def _random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape, np.float32) * shape[-1] ** -0.5).astype(np.float32)


def _write_bf16_checkpoint(path: Path) -> Path:
    """A Llama-shaped safetensors bf16 checkpoint (untied head), ~64 MB of weights."""
    rng = np.random.default_rng(0)
    hd = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN),
              "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (HIDDEN,),
                       p + "post_attention_layernorm.weight": (HIDDEN,),
                       p + "self_attn.q_proj.weight": (HEADS * hd, HIDDEN),
                       p + "self_attn.k_proj.weight": (KV_HEADS * hd, HIDDEN),
                       p + "self_attn.v_proj.weight": (KV_HEADS * hd, HIDDEN),
                       p + "self_attn.o_proj.weight": (HIDDEN, HEADS * hd),
                       p + "mlp.gate_proj.weight": (INTER, HIDDEN),
                       p + "mlp.up_proj.weight": (INTER, HIDDEN),
                       p + "mlp.down_proj.weight": (HIDDEN, INTER)})
    path.mkdir()
    save_tensors({name: ("BF16", ops.f32_to_bf16(_random(rng, *shape)))
                  for name, shape in shapes.items()}, path / "model.safetensors")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "bos_token_id": 0, "eos_token_id": 1}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("load-memory")
    matrices = [f"blk.{i}.{t}.weight" for i in range(LAYERS)
                for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                          "ffn_down")]
    q8 = write_tiny_gguf(root / "q8_0.gguf", {n: "Q8_0" for n in [*matrices, "token_embd.weight"]},
                         hidden=HIDDEN, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS,
                         inter=INTER, vocab=VOCAB)
    return {"bf16": _write_bf16_checkpoint(root / "hf-bf16"), "q8_0": q8}


@pytest.mark.parametrize("checkpoint, quantization", [
    ("bf16", "auto"),     # bf16 as bf16
    ("bf16", "w8a8"),     # quantized at load
    ("q8_0", "auto"),     # GGUF Q8_0 as stored (embeddings dequantized to bf16)
])
def test_load_peak_within_steady_state(checkpoints, checkpoint, quantization):
    run = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(checkpoints[checkpoint]),
                          quantization], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    m = json.loads(run.stdout)
    assert m["weights"] > 30e6, m   # real proportions: tens of MB of packed weights
    mib = {k: round(v / 2**20, 1) for k, v in m.items() if isinstance(v, int)}
    # the steady state holds the packed weights, not the file's pages too
    assert m["steady"] - m["before"] <= RATIO * m["weights"] + ALLOWANCE, mib
    # and loading never held much more than that
    assert m["peak"] <= RATIO * m["steady"] + ALLOWANCE, mib
