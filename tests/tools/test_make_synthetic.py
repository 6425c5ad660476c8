"""tools/make_synthetic.py: the shape table against the published models, and
reduced-width checkpoints read back by armllm and by llama.cpp (llama-cpp-python)."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from armllm import LLM
from armllm.model.arch import load_hf_config
from armllm.model.gguf import GGUFFile
from armllm.model.loader import gguf_model_config, load_tokenizer
from armllm.model.rope import inv_freq
from armllm.model.safetensors_file import SafetensorsFile
from armllm.model.sources import unpermute_rope_rows
from armllm.sampling import SamplingParams

TOOL = Path(__file__).resolve().parents[2] / "tools" / "make_synthetic.py"
_spec = importlib.util.spec_from_file_location("make_synthetic", TOOL)
synth = importlib.util.module_from_spec(_spec)
sys.modules["make_synthetic"] = synth   # dataclasses look their module up by name
_spec.loader.exec_module(synth)

SENTENCE = "The quick brown fox jumps over the lazy dog in 2024, isn't it?"
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=5)
# the real vocab and head_dim, narrower and shallower so a test writes it in seconds
NARROW = {"layers": 2, "hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2}
# llama.cpp runs F16 activations/KV: its logprobs differ from armllm's float32 by ~5e-3
LLAMA_CPP_LOGPROB_TOL = 0.03


def test_shape_table_has_the_published_parameter_counts():
    # from the models' Hugging Face pages (safetensors parameter counts)
    published = {"llama-3.2-1b": 1_235_814_400, "llama-3.1-8b": 8_030_261_248,
                 "qwen3-4b": 4_022_468_096}
    for name, count in published.items():
        assert sum(math.prod(t.shape) for t in synth.tensor_specs(synth.SHAPES[name])) == count


@pytest.fixture(scope="module")
def llama(smollm2_gguf, tmp_path_factory):
    shape = dataclasses.replace(synth.SHAPES["llama-3.2-1b"], **NARROW)
    paths = synth.write_synthetic(shape, tmp_path_factory.mktemp("llama"),
                                  ["hf-bf16", "gguf-f16", "gguf-q8_0"], seed=3, log=lambda s: None)
    return shape, paths


@pytest.fixture(scope="module")
def qwen3(smollm2_gguf, tmp_path_factory):
    shape = dataclasses.replace(synth.SHAPES["qwen3-4b"], **NARROW)
    paths = synth.write_synthetic(shape, tmp_path_factory.mktemp("qwen3"),
                                  ["hf-bf16", "gguf-bf16"], name="qwen3-4b", log=lambda s: None)
    return shape, paths


def test_gguf_config_and_tensor_shapes_follow_the_table(llama):
    shape, paths = llama
    gguf = GGUFFile(paths["gguf-f16"])
    config = gguf_model_config(gguf)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_layers,
            config.num_heads, config.num_kv_heads, config.head_dim, config.rope_theta,
            config.max_position_embeddings, config.tie_word_embeddings) == \
        (128256, 256, 512, 2, 4, 2, 64, 500000.0, 131072, True)
    assert gguf.metadata["general.file_type"] == 1   # MOSTLY_F16
    want = {t.gguf_name: t.shape for t in synth.tensor_specs(shape)}
    assert {n: t.shape for n, t in gguf.tensors.items() if n != "rope_freqs.weight"} == want
    assert "output.weight" not in gguf.tensors       # tied, as Llama-3.2-1B
    assert {t.type_name for n, t in gguf.tensors.items() if len(t.shape) == 2} == {"F16"}
    # llama.cpp's rope_freqs divisors give the HF llama3 scaling armllm computes
    base = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(base / gguf.dequantize("rope_freqs.weight"),
                               inv_freq(64, 500000.0, shape.rope_scaling), rtol=1e-6)
    hf = load_hf_config(paths["hf-bf16"])
    assert np.float32(hf.rms_norm_eps) == np.float32(config.rms_norm_eps)  # GGUF: float32
    same = {"rope_scaling": None, "rms_norm_eps": config.rms_norm_eps}
    assert dataclasses.replace(hf, **same) == dataclasses.replace(config, **same)


def test_gguf_holds_the_hf_values(llama, qwen3):
    shape, paths = llama
    hf = SafetensorsFile(paths["hf-bf16"] / "model.safetensors")
    f16, q8 = GGUFFile(paths["gguf-f16"]), GGUFFile(paths["gguf-q8_0"])
    for spec in synth.tensor_specs(shape):
        want = (hf.array(spec.name).astype(np.uint32) << 16).view(np.float32)
        got = f16.dequantize(spec.gguf_name)
        near = q8.dequantize(spec.gguf_name)
        if spec.rope_heads:
            got, near = (unpermute_rope_rows(x, spec.rope_heads) for x in (got, near))
        np.testing.assert_array_equal(got, want, err_msg=spec.name)   # F16 is exact
        if not spec.is_norm:   # Q8_0: half a step d = max|block| / 127, plus d's fp16
            step = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
            bound = step * (0.5 + 127 * 2.0 ** -11)   # rounding (<= 127 steps x 2^-11 each)
            assert np.all(np.abs(near - want).reshape(-1, 32) <= bound), spec.name
    qshape, qpaths = qwen3
    hf = SafetensorsFile(qpaths["hf-bf16"] / "model.safetensors")
    bf16 = GGUFFile(qpaths["gguf-bf16"])
    for spec in synth.tensor_specs(qshape):   # Qwen3: no row permutation, BF16 bit-exact
        want = (hf.array(spec.name).astype(np.uint32) << 16).view(np.float32)
        assert bf16.tensors[spec.gguf_name].type_name == ("F32" if spec.is_norm else "BF16")
        np.testing.assert_array_equal(bf16.dequantize(spec.gguf_name), want)
    assert "blk.1.attn_k_norm.weight" in bf16.tensors


def test_armllm_runs_hf_and_gguf_alike(llama):
    _, paths = llama
    prompt = [[504, 2365, 6354, 16438], [27003, 690]]
    hf, f16, q8 = (LLM(paths[f], dtype="float32", kv_cache_gib=0.01, max_model_len=64)
                   for f in ("hf-bf16", "gguf-f16", "gguf-q8_0"))
    want, got, near = (llm.generate(prompt, GREEDY) for llm in (hf, f16, q8))
    for w, g, n in zip(want, got, near, strict=True):
        assert g.token_ids == w.token_ids
        # same weights; the RoPE table differs in the last float32 bit (divisors vs llama3)
        np.testing.assert_allclose([lp for _, lp, _ in g.logprobs],
                                   [lp for _, lp, _ in w.logprobs], atol=1e-4)
        assert abs(n.logprobs[0][1] - w.logprobs[0][1]) < 0.05   # Q8_0 stays close


def test_tokenizer_is_smollm2s_padded(llama, smollm2_gguf):
    shape, paths = llama
    smollm2 = load_tokenizer(smollm2_gguf)
    for path in (paths["hf-bf16"], paths["gguf-f16"]):
        tok = load_tokenizer(path)
        assert tok.encode(SENTENCE) == smollm2.encode(SENTENCE)
        assert tok.vocab_size == shape.vocab
        padding = [tok.decode([i]) for i in range(smollm2.vocab_size, shape.vocab, 997)]
        assert all(len(p) >= 2 for p in padding)  # two of SmolLM2's tokens joined
        assert len(set(padding)) == len(padding)


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_llama_cpp_runs_the_gguf_like_armllm_runs_the_hf_dir(model, request, smollm2_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    _, paths = request.getfixturevalue(model)
    gguf_path = next(p for f, p in paths.items() if f.startswith("gguf"))
    cpp = llama_cpp.Llama(str(gguf_path), n_ctx=64, logits_all=True, verbose=False,
                          n_threads=2)
    ids = cpp.tokenize(SENTENCE.encode(), add_bos=False)
    assert ids == load_tokenizer(smollm2_gguf).encode(SENTENCE)
    cpp.eval(ids)
    scores = np.asarray(cpp.scores[len(ids) - 1], dtype=np.float64)
    cpp_logprobs = scores - scores.max() - np.log(np.exp(scores - scores.max()).sum())
    llm = LLM(paths["hf-bf16"], dtype="float32", kv_cache_gib=0.01, max_model_len=64)
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, logprobs=5))[0]
    top = out.logprobs[0][2]
    assert [t for t, _ in top] == list(np.argsort(-scores)[:5])
    np.testing.assert_allclose([lp for _, lp in top], cpp_logprobs[[t for t, _ in top]],
                               atol=LLAMA_CPP_LOGPROB_TOL)


def test_command_line_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        synth.main(["--shape", "llama-3.2-1b", "--out", str(tmp_path), "--layers", "0"])
    assert exc.value.code == 2 and "--layers must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        synth.main(["--shape", "llama-3.1-8b", "--out", str(tmp_path), "--seed", "-1"])
    assert exc.value.code == 2 and "--seed must be >= 0, got -1" in capsys.readouterr().err
    assert synth.main(["--shape", "qwen3-4b", "--out", str(tmp_path), "--formats", "gguf-q5"]) == 2
    assert "gguf-q5" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_command_line_layers_cuts_the_stack(tmp_path, monkeypatch):
    """--layers reaches the writer (it was once applied only after a --seed error)."""
    written = []
    monkeypatch.setattr(synth, "write_synthetic",
                        lambda shape, out, formats, seed, name, llama_bin:
                        written.append(shape) or {})
    assert synth.main(["--shape", "llama-3.2-1b", "--out", str(tmp_path), "--layers", "3"]) == 0
    assert [s.layers for s in written] == [3]
    assert written[0].hidden == synth.SHAPES["llama-3.2-1b"].hidden
