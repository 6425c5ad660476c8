"""tools/make_synthetic.py: the shape table against the published models, and
reduced-width checkpoints read back by armllm and by llama.cpp (llama-cpp-python);
the Qwen3.5/3.6 shapes' tensors are the ones armllm's qwen3_5 architecture reads,
and a narrow one goes through llama.cpp's converter and llama-quantize."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from armllm import LLM
from armllm.bench.sizing import param_counts
from armllm.model import arch
from armllm.model.arch import config_from_hf, load_hf_config
from armllm.model.arch.base import EMBED, FINAL_NORM, LM_HEAD
from armllm.model.gguf import GGUFFile
from armllm.model.layer import step_norms
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
                        lambda shape, out, formats, seed, name, llama_bin, llama_src:
                        written.append(shape) or {})
    assert synth.main(["--shape", "llama-3.2-1b", "--out", str(tmp_path), "--layers", "3"]) == 0
    assert [s.layers for s in written] == [3]
    assert written[0].hidden == synth.SHAPES["llama-3.2-1b"].hidden


# ------------------------------------------------------------ Qwen3.5 / Qwen3.6

HYBRID = ["qwen3.5-0.8b", "qwen3.5-9b", "qwen3.6-35b-a3b"]
TOKEN_IDS = {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
# the real vocabulary over narrow layers: 3 DeltaNet layers then an attention one
NARROW_HYBRID = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32,
                 "linear_k_heads": 2, "linear_v_heads": 4, "linear_k_dim": 16,
                 "linear_v_dim": 16}
# through llama.cpp's tools: SmolLM2's vocabulary, 8 tokens padded, for speed
NARROW_MOE = {**NARROW_HYBRID, "vocab": 49160, "experts": 8, "top_k": 2,
              "moe_intermediate": 32, "shared_intermediate": 32}


def hybrid_config(shape):
    return config_from_hf(synth.hybrid_hf_config(shape, TOKEN_IDS))


def armllm_tensors(c) -> dict[str, tuple[int, ...]]:
    """What armllm's qwen3_5 architecture file and loader read from a checkpoint of
    config c: name -> shape."""
    family, h = arch.of(c), c.hidden_size
    want = {EMBED: (c.vocab_size, h), FINAL_NORM: (h,)}
    if not c.tie_word_embeddings:
        want[LM_HEAD] = (c.vocab_size, h)
    for i in range(c.num_layers):
        p, steps = f"model.layers.{i}.", family.layer(c, i)
        want |= {p + family.norms[n]: (h,) for n in step_norms(steps)}
        for e in range(max(1, c.num_experts)):
            want |= {name: shape for parts in family.linear_parts(c, i, e)
                     for name, shape in parts}
        if c.is_linear_layer(i):
            d, name = c.delta_net, family.delta_tensor
            want |= {name(i, "conv1d.weight"): (d.conv_size, 1, d.conv_kernel),
                     name(i, "in_proj_b.weight"): (d.v_heads, h),
                     name(i, "in_proj_a.weight"): (d.v_heads, h),
                     name(i, "A_log"): (d.v_heads,), name(i, "dt_bias"): (d.v_heads,),
                     name(i, "norm.weight"): (d.v_dim,)}
        else:
            want |= {p + f"self_attn.{n}_norm.weight": (c.head_dim,) for n in "qk"}
        if c.num_experts:
            want[family.router_tensor(i)] = (c.num_experts, h)
            want |= {name: shape for parts in family.shared_expert_parts(c, i)
                     for name, shape in parts}
            want[family.shared_gate_tensor(i)] = (1, h)
    return want


@pytest.mark.parametrize("name", HYBRID)
def test_qwen3_5_shapes_are_the_tensors_armllm_reads(name):
    """At full depth, without writing a file: config.json parses as the model (its
    3:1 DeltaNet / attention pattern, DeltaNet heads, a quarter of each head rotated),
    the tensor list is exactly the architecture file's and loader's names and shapes,
    and its size is armllm's own parameter count (35B-A3B: 3.5B active)."""
    shape = synth.SHAPES[name]
    c = hybrid_config(shape)
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
            c.head_dim, c.rot_dim, c.rope_theta, c.max_position_embeddings) == \
        (248320, shape.hidden, shape.layers, shape.heads, shape.kv_heads, 256, 64, 1e7, 262144)
    assert c.linear_layers == tuple(i for i in range(shape.layers) if i % 4 != 3)
    d = c.delta_net
    assert (d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.conv_kernel) == \
        (16, shape.linear_v_heads, 128, 128, 4)
    assert c.tie_word_embeddings == (name == "qwen3.5-0.8b")
    assert (c.num_experts, c.experts_per_token, c.moe_intermediate_size) == \
        ((256, 8, 512) if shape.experts else (0, 0, c.moe_intermediate_size))
    specs = synth.tensor_specs(shape)
    assert len({s.name for s in specs}) == len(specs)
    assert {s.name: s.shape for s in specs} == armllm_tensors(c)
    counts = param_counts(c)
    assert sum(math.prod(s.shape) for s in specs) == counts["total"]
    if shape.experts:
        assert round(counts["total"] / 1e9, 2) == 34.66 and round(counts["active"] / 1e9, 2) == 3.45


def test_qwen3_5_layers_cut_keeps_the_pattern_and_widths():
    shape = dataclasses.replace(synth.SHAPES["qwen3.6-35b-a3b"], layers=8)
    c = hybrid_config(shape)
    assert c.linear_layers == (0, 1, 2, 4, 5, 6) and c.num_experts == 256
    assert synth.hybrid_hf_config(shape, TOKEN_IDS)["layer_types"] == \
        ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + \
        ["full_attention"]
    full = {s.name: s.shape for s in synth.tensor_specs(synth.SHAPES["qwen3.6-35b-a3b"])}
    assert all(full[s.name] == s.shape for s in synth.tensor_specs(shape))


def test_qwen3_5_values():
    """Zero-centred norms hold 0 (they act as 1), the DeltaNet's gated norm 1, A_log
    log(uniform(1, 16)), dt_bias uniform(0, 1), the conv weights std 1/2 (fan-in 4)."""
    shape = dataclasses.replace(synth.SHAPES["qwen3.5-0.8b"], layers=4)
    specs = {s.name: s for s in synth.tensor_specs(shape)}

    def values(name):
        chunks = list(synth.bf16_chunks(specs[name], seed=0))
        return synth.bf16_to_f32(np.concatenate([c.reshape(-1) for c in chunks]))

    for name in ("model.layers.0.input_layernorm.weight", "model.layers.3.self_attn.q_norm.weight",
                 "model.layers.3.post_attention_layernorm.weight", "model.norm.weight"):
        assert not values(name).any(), name
    assert np.all(values("model.layers.0.linear_attn.norm.weight") == 1.0)
    a_log = values("model.layers.1.linear_attn.A_log")
    assert a_log.shape == (16,) and np.all((a_log >= 0) & (a_log <= np.log(16) + 0.01))
    dt = values("model.layers.1.linear_attn.dt_bias")
    assert np.all((dt >= 0) & (dt <= 1)) and len(set(dt)) > 8
    conv = values("model.layers.2.linear_attn.conv1d.weight")
    assert conv.size == 6144 * 4 and abs(conv.std() - 0.5) < 0.01
    q = values("model.layers.3.self_attn.q_proj.weight")
    assert q.size == 2 * 8 * 256 * 1024 and abs(q.std() - 1024 ** -0.5) < 1e-3


@pytest.fixture(scope="module")
def llama_cpp_tools(smollm2_gguf):
    """Skips without llama.cpp's converter and llama-quantize."""
    from tests import llama_cpp_tools
    llama_cpp_tools.converter()
    quantize = synth.LLAMA_CPP / "build" / "bin" / "llama-quantize"
    if not quantize.exists():
        pytest.skip(f"needs {quantize}: run tools/build_llama_cpp.sh")


@pytest.fixture(scope="module")
def qwen3_5_moe(llama_cpp_tools, tmp_path_factory):
    """A narrow, shallow qwen3.6-35b-a3b through llama.cpp's converter and
    llama-quantize."""
    shape = dataclasses.replace(synth.SHAPES["qwen3.6-35b-a3b"], **NARROW_MOE)
    out = tmp_path_factory.mktemp("qwen3.6")
    paths = synth.write_synthetic(shape, out, ["hf-bf16", "gguf-bf16", "gguf-q8_0"],
                                  name="qwen3.6-35b-a3b", log=lambda s: None)
    return out, paths


def test_qwen3_5_gguf_is_llama_cpps_and_runs_like_the_directory(qwen3_5_moe):
    """The converter's BF16 GGUF ("qwen35moe", SmolLM2's pre-tokenizer) gives the
    directory's tokens and logprobs; llama-quantize's Q8_0 loads; only the asked-for
    files are left."""
    out, paths = qwen3_5_moe
    assert sorted(p.name for p in out.iterdir()) == \
        ["hf-bf16", "qwen3.6-35b-a3b-BF16.gguf", "qwen3.6-35b-a3b-Q8_0.gguf"]
    meta = GGUFFile(paths["gguf-bf16"]).metadata
    assert (meta["general.architecture"], meta["tokenizer.ggml.pre"]) == ("qwen35moe", "smollm")
    assert len(meta["tokenizer.ggml.tokens"]) == NARROW_MOE["vocab"]
    prompt = [[504, 2365, 6354, 16438]]
    hf, bf16, q8 = (LLM(paths[f], dtype="float32", kv_cache_gib=0.01, max_model_len=64)
                    .generate(prompt, GREEDY)[0] for f in ("hf-bf16", "gguf-bf16", "gguf-q8_0"))
    assert bf16.token_ids == hf.token_ids
    np.testing.assert_allclose([lp for _, lp, _ in bf16.logprobs],
                               [lp for _, lp, _ in hf.logprobs], atol=1e-3)
    assert abs(q8.logprobs[0][1] - hf.logprobs[0][1]) < 0.1


def test_qwen3_5_sources_only_written_for_ggufs_are_deleted(smollm2_gguf, tmp_path,
                                                           monkeypatch):
    """gguf-q8_0 alone: the directory and the BF16 GGUF made from it are removed (the
    converter and llama-quantize stubbed: the test above runs them)."""
    tools = tmp_path / "llama.cpp"
    for tool in ("src/convert_hf_to_gguf.py", "build/bin/llama-quantize"):
        (tools / tool).parent.mkdir(parents=True)
        (tools / tool).touch()
    ran = []

    def convert(converter, folder, path, log):
        ran.append(("convert", json.loads((folder / "config.json").read_text())["model_type"]))
        path.touch()
        return path

    def quantize(binary, source, out, name, kind, log):
        assert source.exists()
        ran.append(("quantize", kind))
        (out / f"{name}-{kind}.gguf").touch()
        return out / f"{name}-{kind}.gguf"

    monkeypatch.setattr(synth, "convert_hf", convert)
    monkeypatch.setattr(synth, "llama_quantize", quantize)
    shape = dataclasses.replace(synth.SHAPES["qwen3.5-9b"], **NARROW_HYBRID, intermediate=96)
    out = tmp_path / "out"
    paths = synth.write_synthetic(shape, out, ["gguf-q4_k_m", "gguf-q8_0"], name="qwen3.5-9b",
                                  log=lambda s: None, llama_bin=tools / "build" / "bin",
                                  llama_src=tools / "src")
    assert ran == [("convert", "qwen3_5_text"), ("quantize", "Q4_K_M"), ("quantize", "Q8_0")]
    assert sorted(p.name for p in out.iterdir()) == ["qwen3.5-9b-Q4_K_M.gguf",
                                                    "qwen3.5-9b-Q8_0.gguf"]
    assert list(paths) == ["gguf-q4_k_m", "gguf-q8_0"]


def test_qwen3_5_refuses_unknown_formats(tmp_path):
    with pytest.raises(ValueError, match="must be among"):
        synth.write_synthetic(synth.SHAPES["qwen3.5-0.8b"], tmp_path, ["gguf-iq2"])
