"""tools/make_synthetic_moe.py: tiny variants of gpt-oss-20b and Qwen3-30B-A3B written
as a GGUF and as a Hugging Face directory with the same seed hold the same numbers:
armllm runs the two alike, and the reference decoders (the gguf package for the GGUF;
transformers' MXFP4 and compressed-tensors' int4 unpacking for the directory) read
the same values out of both."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from armllm.model.loader import load_model, load_tokenizer

TOOL = Path(__file__).resolve().parents[2] / "tools" / "make_synthetic_moe.py"
_spec = importlib.util.spec_from_file_location("make_synthetic_moe", TOOL)
moe = importlib.util.module_from_spec(_spec)
sys.modules["make_synthetic_moe"] = moe   # dataclasses look their module up by name
_spec.loader.exec_module(moe)

# the real vocabulary (SmolLM2's 49152 tokens, 8 padded) over narrow, shallow layers: a
# sliding window of 4 under an 11-token prompt, so that layer 0 (sliding) and layer 1
# (full) differ; K of every quantized matrix a multiple of 32
NARROW = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16,
          "vocab": 49160, "experts": 4, "top_k": 2, "max_position": 1024}
TINY = {"gpt-oss-20b": {**NARROW, "expert_inter": 64, "dense_inter": 64, "sliding_window": 4,
                        "yarn": (4.0, 256)},
        "qwen3-30b-a3b": {**NARROW, "expert_inter": 32, "dense_inter": 96}}
SHARD_BYTES = 4 << 20    # the 6 MB embedding and head each in a shard of their own
PROMPT = [1, 504, 2365, 6354, 16438, 27003, 690, 28, 99, 1000, 7]
# Qwen3 under the default quantization: the GGUF's Q4_0 head runs on int8 activations
# (steps of max|x|/127 per token), the directory's bf16 head in floats: measured 0.006
# of the largest logit
Q4_0_HEAD_TOL = 0.02


@pytest.fixture(scope="module", params=sorted(TINY))
def written(request, smollm2_gguf, tmp_path_factory):
    """(shape, GGUF file, HF directory) of one architecture, seed 3."""
    shape = dataclasses.replace(moe.SHAPES[request.param], **TINY[request.param])
    out = tmp_path_factory.mktemp(request.param)
    gguf_path = moe.write_moe_gguf(shape, out / "model.gguf", seed=3, log=lambda line: None)
    hf_dir = moe.write_moe_hf(shape, out / "hf", seed=3, log=lambda line: None,
                              max_shard_bytes=SHARD_BYTES)
    return shape, gguf_path, hf_dir


def test_hf_directory_is_the_checkpoints_layout(written):
    from safetensors import safe_open
    shape, _, hf_dir = written
    cfg = json.loads((hf_dir / "config.json").read_text())
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    found = {}
    for shard in shards:   # the safetensors package's own reader
        with safe_open(hf_dir / shard, "numpy") as f:
            found.update({k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape())
                          for k in f.keys()})
    assert set(found) == set(index["weight_map"])
    want = {t.name: (moe.SAFETENSORS_DTYPES[t.dtype], list(t.shape))
            for g in moe.hf_groups(shape) for t in g.outputs}
    assert found == want
    assert index["metadata"]["total_size"] == sum((hf_dir / s).stat().st_size for s in shards) \
        - sum(8 + int.from_bytes((hf_dir / s).read_bytes()[:8], "little") for s in shards)
    e, h, inter = shape.experts, shape.hidden, shape.expert_inter
    p = "model.layers.1."
    if shape.arch == "gpt-oss":
        assert cfg["architectures"] == ["GptOssForCausalLM"]
        assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
        assert cfg["quantization_config"]["quant_method"] == "mxfp4"
        assert (cfg["sliding_window"], cfg["rope_scaling"]["rope_type"]) == (4, "yarn")
        assert found[p + "mlp.experts.gate_up_proj_blocks"] == ("U8", [e, 2 * inter, h // 32, 16])
        assert found[p + "mlp.experts.down_proj_scales"] == ("U8", [e, h, inter // 32])
        assert found[p + "mlp.router.bias"] == ("BF16", [e])
        assert found[p + "self_attn.sinks"] == ("BF16", [shape.heads])
        assert len(found) == 3 + 19 * shape.layers   # as the Hub's 459 = 3 + 19 * 24
    else:
        assert cfg["architectures"] == ["Qwen3MoeForCausalLM"]
        qc = cfg["quantization_config"]
        assert (qc["format"], qc["config_groups"]["group_0"]["weights"]["group_size"]) == \
            ("pack-quantized", 32)
        assert found[p + "mlp.experts.3.down_proj.weight_packed"] == ("I32", [h, inter // 8])
        assert found[p + "mlp.experts.3.down_proj.weight_scale"] == ("F16", [h, inter // 32])
        assert found[p + "mlp.experts.3.down_proj.weight_shape"] == ("I64", [2])
        assert found[p + "mlp.gate.weight"] == ("BF16", [e, h])
        assert found["model.embed_tokens.weight"] == ("BF16", [shape.vocab, h])


@pytest.mark.parametrize("quantization", ["auto", "none"])
def test_armllm_runs_gguf_and_hf_alike(written, quantization):
    """f32 logits of one prompt: identical (same values, same kernels), but for Qwen3's
    Q4_0 head under the default quantization (see Q4_0_HEAD_TOL)."""
    from tests.model.test_llama_vs_transformers import prefill_logits
    shape, gguf_path, hf_dir = written
    from_gguf, from_hf = (load_model(p, "f32", quantization=quantization)
                          for p in (gguf_path, hf_dir))
    # what may differ: the GGUF's eps is a float32, its YaRN keys leave the betas to their
    # defaults, and gpt-oss's config.json names no BOS
    same = {"rms_norm_eps": shape.rms_norm_eps, "rope_scaling": None, "bos_token_id": None}
    assert dataclasses.replace(from_gguf.config, **same) == \
        dataclasses.replace(from_hf.config, **same)
    assert np.float32(from_gguf.config.rms_norm_eps) == np.float32(from_hf.config.rms_norm_eps)
    labels = [lm.model.weights.quantization or "" for lm in (from_gguf, from_hf)]
    ours, theirs = (prefill_logits(lm, PROMPT) for lm in (from_gguf, from_hf))
    if quantization == "none":
        np.testing.assert_array_equal(ours, theirs)
    elif shape.arch == "gpt-oss":   # MXFP4 experts as stored, on the same GGUF-block GEMM
        assert all("MXFP4" in label for label in labels)
        np.testing.assert_array_equal(ours, theirs)
    else:                           # every linear layer int4 g32, the same (q, d) in both
        assert all(label.startswith("w4a8-g32") for label in labels)
        assert np.max(np.abs(ours - theirs)) <= Q4_0_HEAD_TOL * np.abs(theirs).max()


def test_tokenizers_agree(written):
    shape, gguf_path, hf_dir = written
    text = "The quick brown fox jumps over the lazy dog in 2024, isn't it?"
    from_gguf, from_hf = load_tokenizer(gguf_path), load_tokenizer(hf_dir)
    assert from_gguf.encode(text) == from_hf.encode(text)
    assert from_gguf.vocab_size == from_hf.vocab_size == shape.vocab


def test_reference_decoders_read_the_same_values(written):
    """Every GGUF tensor, decoded by the gguf package, equals its checkpoint tensors
    decoded as transformers (MXFP4 experts) and compressed-tensors (packed int4) do."""
    torch = pytest.importorskip("torch")
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors import safe_open
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    shape, gguf_path, hf_dir = written
    reader = gguf.GGUFReader(gguf_path)
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
        tuple(reversed([int(d) for d in t.shape]))) for t in reader.tensors}
    hf = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            hf.update({k: f.get_tensor(k) for k in f.keys()})
    for group in moe.hf_groups(shape):
        want = [stored[t.name] for t in group.sources]
        first = group.outputs[0].name
        if first.endswith("_blocks"):   # transformers' decoder: [E, K, N] for x @ W
            decoded = convert_moe_packed_tensors(hf[first], hf[group.outputs[1].name],
                                                 dtype=torch.float32).transpose(1, 2).numpy()
            got = [decoded[:, i::len(want)] for i in range(len(want))]   # gate_up interleaved
        elif first.endswith("_bias") and len(want) == 2:
            decoded = hf[first].float().numpy()
            got = [decoded[:, 0::2], decoded[:, 1::2]]
        elif first.endswith("weight_packed"):
            names = [t.name for t in group.outputs]
            rows = [_ct_dequantize(unpack_from_int32, *(hf[n] for n in names[i:i + 3]))
                    for i in range(0, len(names), 3)]
            got = [np.stack(rows) if len(rows) > 1 else rows[0]]
        else:
            got = [hf[first].float().numpy()]
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=first)


def _ct_dequantize(unpack, packed, scale, weight_shape) -> np.ndarray:
    values = unpack(packed, 4, tuple(int(v) for v in weight_shape)).float()
    return (values * scale.float().repeat_interleave(32, dim=1)).numpy()


def test_command_line_rejects_an_unknown_format(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        moe.main(["--shape", "gpt-oss-20b", "--out", str(tmp_path), "--format", "safetensors"])
    assert exc.value.code == 2
    assert "--format: invalid choice: 'safetensors'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("fmt, writer, name", [
    ([], "write_moe_gguf", "qwen3-30b-a3b-Q4_0.gguf"),
    (["--format", "hf"], "write_moe_hf", "qwen3-30b-a3b-hf")])
def test_command_line_picks_the_writer(tmp_path, monkeypatch, fmt, writer, name):
    calls = []
    monkeypatch.setattr(moe, writer, lambda shape, path, seed: calls.append((shape, path, seed))
                        or path)
    assert moe.main(["--shape", "qwen3-30b-a3b", "--out", str(tmp_path), "--layers", "2",
                     "--seed", "7", *fmt]) == 0
    [(shape, path, seed)] = calls
    assert (shape.layers, path, seed) == (2, tmp_path / name, 7)
