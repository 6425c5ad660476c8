"""Every architecture armllm runs, each through its file under model/arch/: the
registry names them all (with their tests); tiny random checkpoints written by
transformers load and match transformers' logits (f32, within 1e-4 of the
largest logit) and its greedy tokens (32 through the engine, past Gemma 3's and
Phi-3's windows); the same checkpoints converted by llama.cpp's own
convert_hf_to_gguf.py load and match transformers too, in f32 and, stored as
Q8_0, within Q8_0's tolerance; tensor parallel over 2 ranks equals one rank;
Gemma 3's sliding layers keep their own KV pool, as GPT-OSS's do. And the
layering the registry stands for: no architecture's name is compared outside
model/arch/, and nothing in model/ reaches into engine/.

The checkpoints use SmolLM2's tokenizer (the demo model's), whose BPE
pre-tokenizer llama.cpp's converter knows."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from armllm import LLM
from armllm.model import arch
from armllm.model.kv_cache import window_pool_blocks
from armllm.model.loader import load_model
from tests import llama_cpp_tools as llama_cpp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.model.test_llama_vs_transformers import greedy_pair, hf_logits, prefill_logits  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src" / "armllm"
BASE = dict(vocab_size=llama_cpp.VOCAB, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256)
# name: (config class, model class, config fields, tokenizer_class for the converter)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, None),
    # llama.cpp keeps no Mistral window in a GGUF: the window is tested on safetensors
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}, None),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, None),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}, None),
    # 7 layers: 5 local, 1 global, 1 local; global RoPE linear-scaled 4x, local base 20000
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "num_hidden_layers": 7, "head_dim": 16, "sliding_window": 8,
        "query_pre_attn_scalar": 16, "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}}, None),
    # Phi-4-mini's partial rotary, Phi-3-mini's window; the converter reads Phi-4's
    # GPT2Tokenizer as BPE
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {
        "partial_rotary_factor": 0.75, "sliding_window": 7,
        "original_max_position_embeddings": 256, "pad_token_id": 0}, "GPT2Tokenizer"),
    # LongRoPE (Phi-3-*-128k, Phi-4-mini) trained at 32 positions, extended to 256: the
    # long factors above 32 tokens, the short ones within
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM", {
        "partial_rotary_factor": 0.75, "original_max_position_embeddings": 32,
        "pad_token_id": 0, "rope_scaling": {
            "rope_type": "longrope",
            "short_factor": [1.6, 1.3, 1.05, 1.0, 1.8, 1.9],
            "long_factor": [4.4, 4.9, 4.2, 5.7, 5.3, 2.0]}}, "GPT2Tokenizer"),
}
# checkpoints llama.cpp's converter does not write alike: safetensors only
HF_ONLY = {
    # a query scale other than head_dim's (llama.cpp assumes head_dim's but for 27B)
    # and final-logit soft-capping
    "gemma3-softcap": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
        "final_logit_softcapping": 3.0}, None),
}
TINY = FAMILIES | HF_ONLY


def write_tiny(path: Path, name: str, tokenizer: Path, seed: int = 0):
    """The tiny checkpoint `name` at path (random norms and biases, so they matter),
    with SmolLM2's tokenizer; returns transformers' model."""
    config_cls, model_cls, extra, tokenizer_class = TINY[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**BASE, **extra})
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(path, safe_serialization=True)
    llama_cpp.with_tokenizer(path, tokenizer, tokenizer_class)
    return model


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf, tmp_path_factory) -> Path:
    return llama_cpp.smollm2_tokenizer(smollm2_gguf, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory):
    """name -> (checkpoint directory, transformers' model), each written once."""
    made: dict[str, tuple[Path, object]] = {}

    def get(name: str) -> tuple[Path, object]:
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            made[name] = path, write_tiny(path, name, tokenizer)
        return made[name]
    return get


IDS = [int(i) for i in np.random.default_rng(1).integers(0, 1000, 40)]


def assert_logits_close(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-4) -> None:
    assert np.max(np.abs(ours - theirs)) <= rtol * max(1.0, np.abs(theirs).max())


@pytest.mark.parametrize("name", list(TINY))
def test_hf_logits_match_transformers(tiny, name):
    path, hf = tiny(name)
    lm = load_model(path, "f32")
    assert_logits_close(prefill_logits(lm, IDS, block_size=8), hf_logits(hf, IDS))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# int8 K/V rows step by max|row| / 127 where bf16 rounds each value to 8 bits: on the
# tiny models int8's logprobs sit 2.6-3.0x as far from transformers' as bf16's
INT8_OVER_BF16 = 4.0


@pytest.mark.parametrize("name", ["llama", "gemma3", "phi3"])
def test_int8_kv_cache_logprobs_near_transformers(tiny, name):
    path, hf = tiny(name)
    lm = load_model(path, "f32")
    theirs = log_softmax(hf_logits(hf, IDS))
    gap = {kv: np.max(np.abs(log_softmax(prefill_logits(lm, IDS, 8, kv)) - theirs))
           for kv in ("bf16", "int8")}
    assert gap["int8"] <= INT8_OVER_BF16 * gap["bf16"]


@pytest.mark.parametrize("name", ["gemma3", "phi3", "gemma3-softcap"])
def test_greedy_matches_transformers(tiny, name):
    """32 greedy tokens after a 24-token prompt: decode rows well past the windows."""
    path, hf = tiny(name)
    llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.02, max_num_seqs=2,
              max_model_len=256)
    ours, theirs = greedy_pair(llm, hf, IDS[:24], 32)
    assert ours == theirs


@pytest.mark.parametrize("name", list(FAMILIES))
def test_llama_cpp_gguf_matches_transformers(tiny, tmp_path, name):
    """llama.cpp's converter's f32 GGUF: its config keys and tensor names, read through
    the family's GGUF map (llama's Q/K rows permuted back, Gemma's norms already + 1,
    Phi-3's fused tensors), give transformers' logits."""
    path, hf = tiny(name)
    gguf = llama_cpp.convert(path, tmp_path / f"{name}.gguf")
    lm = load_model(gguf, "f32")
    assert arch.of(lm.config) is arch.of(load_model(path, "f32").config)
    assert_logits_close(prefill_logits(lm, IDS, block_size=8), hf_logits(hf, IDS))


@pytest.mark.parametrize("name", ["qwen2", "gemma3", "phi3"])
def test_llama_cpp_q8_0_runs_as_stored(tiny, tmp_path, name):
    """The converter's Q8_0 GGUF runs its blocks as stored (w8a8, group 32): its
    logits' distance from transformers' f32 stays within twice what Q8_0's weight
    rounding alone costs (the same file dequantized to f32), the int8 activations'
    share. Measured, as a fraction of the largest logit, stored vs dequantized:
    qwen2 0.0093 vs 0.0062, gemma3 0.052 vs 0.035 (its sandwich norms amplify the
    rounding of a tiny random model), phi3 0.015 vs 0.0095."""
    path, hf = tiny(name)
    gguf = llama_cpp.convert(path, tmp_path / "q8.gguf", "q8_0")
    lm = load_model(gguf, "f32")
    assert "Q8_0" in (lm.tensor_types or "") and "w8a8" in lm.model.weights.quantization
    theirs = hf_logits(hf, IDS)
    stored = np.max(np.abs(prefill_logits(lm, IDS, block_size=8) - theirs))
    floats = load_model(gguf, "f32", quantization="none")
    rounded = np.max(np.abs(prefill_logits(floats, IDS, block_size=8) - theirs))
    assert rounded <= 0.05 * np.abs(theirs).max()
    assert stored <= 2 * rounded


# Gemma 3's int8 cache: each rank quantizes its own heads' rows, as one rank does.
# Attention over an int8 cache quantizes q too, so a q 1e-6 apart (the all-reduce's
# order) now and then lands on another int8 step: the quantized weights' tolerance
# (measured: 1.6e-3 of the largest logit), greedy tokens still identical
@pytest.mark.parametrize(("name", "kv_dtype", "rtol"), [("gemma3", "f32", 1e-4),
                                                        ("phi3", "f32", 1e-4),
                                                        ("gemma3", "int8", 1e-2)])
def test_tensor_parallel_two_ranks_equal_one(tiny, name, kv_dtype, rtol):
    from tests.engine.test_tensor_parallel import assert_tp_matches
    path, _ = tiny(name)
    assert_tp_matches(path, 2, steps=24, rtol=rtol, dtype="float32", kv_cache_dtype=kv_dtype,
                      kv_cache_gib=0.02, max_num_seqs=4, max_model_len=256)


def test_gemma3_sliding_layers_keep_their_own_pool(tiny):
    """Gemma 3's local layers (all but every sixth) form a window group sized as
    GPT-OSS's (window_pool_blocks), the global ones the full group."""
    path, _ = tiny("gemma3")
    with LLM(path, dtype="float32", kv_cache_gib=0.05, max_model_len=256, block_size=4,
             max_num_seqs=2, max_num_batched_tokens=32) as llm:
        full, window = llm.engine.runner.kv.groups
        c = llm.engine.runner.model.config
    assert full.window == 0 and full.layers == (5,)
    assert window.window == 8 and window.layers == (0, 1, 2, 3, 4, 6)
    assert window.num_blocks == window_pool_blocks(c, 4, 2, 32, 256)


def test_gemma3_multimodal_checkpoint_runs_its_language_model(tokenizer, tmp_path):
    """Gemma3ForConditionalGeneration: the text model inside it (its weights under
    the language model's prefix, the vision tower ignored) gives transformers' logits
    for text."""
    text = {**BASE, "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4)).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    llama_cpp.with_tokenizer(tmp_path, tokenizer)
    lm = load_model(tmp_path, "f32")
    assert lm.config.architecture == "Gemma3ForConditionalGeneration"
    assert_logits_close(prefill_logits(lm, IDS, block_size=8), hf_logits(hf, IDS))


def test_phi3_longrope_takes_the_short_factors_within_the_trained_context(tiny):
    """An engine whose context stays within original_max_position_embeddings runs the
    short factors (llama.cpp's choice, made once for the context); transformers picks
    them per call for a sequence that short. (Longer contexts: the family tests.)"""
    from armllm.model.decoder import BatchMeta, KVCache, Workspace
    path, hf = tiny("phi3-longrope")
    lm, ids = load_model(path, "f32"), IDS[:24]
    t, bs = len(ids), 8
    table = np.arange(1, 1 + -(-t // bs), dtype=np.int32).reshape(1, -1)
    slots = (table[0, np.arange(t) // bs] * bs + np.arange(t) % bs).astype(np.int32)
    ws = Workspace(lm.config, t, t, lm.model.formats, max_seq_len=32)
    meta = BatchMeta(np.asarray(ids, np.int32), np.arange(t, dtype=np.int32), slots,
                     np.array([0, t], np.int32), np.array([t], np.int32), table, np.arange(t))
    ours = lm.model.forward(meta, KVCache(lm.config, table.size + 1, bs, "f32"), ws)
    assert_logits_close(ours, hf_logits(hf, ids))
    assert not np.allclose(lm.model.rope_table("global", 32), lm.model.rope_table("global", 33))


# ------------------------------------------------------------ the registry

# every architecture the registry runs -> the test that runs a checkpoint of it
TESTED_BY = {
    "LlamaForCausalLM": "test_architectures.py::test_hf_logits_match_transformers[llama]",
    "MistralForCausalLM": "test_architectures.py::test_hf_logits_match_transformers[mistral]",
    "Qwen2ForCausalLM": "test_architectures.py::test_hf_logits_match_transformers[qwen2]",
    "Qwen3ForCausalLM": "test_architectures.py::test_hf_logits_match_transformers[qwen3]",
    "LlamaModel": "test_embeddings.py::test_embeddings_match_sentence_transformers",
    "MistralModel": "test_embeddings.py::test_embeddings_match_sentence_transformers",
    "Qwen2Model": "test_embeddings.py::test_embeddings_match_sentence_transformers",
    "Qwen3Model": "test_embeddings.py::test_embeddings_match_sentence_transformers",
    "MixtralForCausalLM": "test_moe.py::test_logits_match_transformers",
    "Qwen3MoeForCausalLM": "test_moe.py::test_logits_match_transformers",
    "GptOssForCausalLM": "test_gpt_oss.py::test_logits_match_transformers",
    "Gemma3ForCausalLM": "test_architectures.py::test_hf_logits_match_transformers[gemma3]",
    "Gemma3ForConditionalGeneration":
        "test_architectures.py::test_gemma3_multimodal_checkpoint_runs_its_language_model",
    "Phi3ForCausalLM": "test_architectures.py::test_hf_logits_match_transformers[phi3]",
    "Qwen3_5ForCausalLM": "test_qwen3_5.py::test_hf_logits_match_transformers[dense]",
    "Qwen3_5ForConditionalGeneration":
        "test_qwen3_5.py::test_multimodal_checkpoint_runs_its_language_model[dense]",
    "Qwen3_5MoeForCausalLM": "test_qwen3_5.py::test_hf_logits_match_transformers[moe]",
    "Qwen3_5MoeForConditionalGeneration":
        "test_qwen3_5.py::test_multimodal_checkpoint_runs_its_language_model[moe]",
    "WhisperForConditionalGeneration": "test_whisper.py::test_logits_match_transformers",
    **{f"{name}ForSequenceClassification":
       f"test_score_head.py::test_classifier_scores_match_transformers[{family}]"
       for name, family in (("Llama", "llama"), ("Mistral", "mistral"), ("Qwen2", "qwen2"),
                            ("Qwen3", "qwen3"), ("Gemma3Text", "gemma3"), ("Phi3", "phi3"))},
}
GGUF_TESTED_BY = {
    "llama": "test_architectures.py::test_llama_cpp_gguf_matches_transformers[llama]",
    "qwen2": "test_architectures.py::test_llama_cpp_gguf_matches_transformers[qwen2]",
    "qwen3": "test_architectures.py::test_llama_cpp_gguf_matches_transformers[qwen3]",
    "qwen3moe": "test_moe.py::test_qwen3_moe_gguf_matches_transformers",
    "gpt-oss": "test_gpt_oss.py::test_gguf_with_mxfp4_experts_matches_transformers",
    "gemma3": "test_architectures.py::test_llama_cpp_gguf_matches_transformers[gemma3]",
    "phi3": "test_architectures.py::test_llama_cpp_gguf_matches_transformers[phi3]",
    "qwen35": "test_qwen3_5.py::test_llama_cpp_gguf_matches_transformers[dense]",
    "qwen35moe": "test_qwen3_5.py::test_llama_cpp_gguf_matches_transformers[moe]",
}


def _test_exists(node: str) -> bool:
    module, _, test = node.partition("::")
    name, _, param = test.partition("[")
    tree = ast.parse((Path(__file__).parent / module).read_text())
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    if name not in funcs:
        return False
    return not param or module != "test_architectures.py" or param[:-1] in TINY


def test_registry_lists_every_architecture_with_its_file_and_test():
    assert set(arch.HF_ARCHITECTURES) == set(TESTED_BY)
    assert set(arch.GGUF_ARCHITECTURES) == set(GGUF_TESTED_BY)
    for node in (*TESTED_BY.values(), *GGUF_TESTED_BY.values()):
        assert _test_exists(node), node
    for family in arch.FAMILIES:   # each family is one file under model/arch/
        module = type(family).__module__
        assert module == f"armllm.model.arch.{family.name}", module
        assert (SRC / "model" / "arch" / f"{family.name}.py").exists()
    # a bare decoder runs as its causal kin, with no lm_head
    assert arch.HF_ARCHITECTURES["Qwen3Model"].hf_architectures["Qwen3Model"] == \
        "Qwen3ForCausalLM"


def test_unknown_architectures_are_refused_with_the_supported_list():
    with pytest.raises(ValueError, match="unsupported architecture.*Gemma3ForCausalLM"):
        arch.for_hf({"architectures": ["NopeForCausalLM"]}, "config.json")
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'nope'.*gemma3"):
        arch.for_gguf({"general.architecture": "nope"}, "x.gguf")


def _string_literals(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


# strings that spell a GGUF architecture's name but name something else
OTHER_MEANINGS = {"model/gguf_tokenizer.py": {"qwen2"},   # a tokenizer.ggml.pre value
                  "model/reasoning.py": {"qwen3"}}        # a reasoning parser's name


def test_no_architecture_name_is_compared_outside_the_registry():
    """Sizing, sharding, conversion, loading, the engine and the server read the
    declaration: only model/arch/ spells an architecture's name."""
    names = set(arch.HF_ARCHITECTURES) | set(arch.GGUF_ARCHITECTURES)
    found = {}
    for path in SRC.rglob("*.py"):
        if (SRC / "model" / "arch") in path.parents:
            continue
        where = str(path.relative_to(SRC))
        hits = names & _string_literals(path) - OTHER_MEANINGS.get(where, set())
        if hits:
            found[where] = sorted(hits)
    assert not found


def test_model_does_not_import_the_engine():
    for path in (SRC / "model").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("armllm.engine"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("armllm.engine") for a in node.names), path


def test_layer_steps_are_what_the_workspace_and_sizing_read(tiny):
    """Gemma 3's declaration: sandwich norms around each sub-layer, q/k norms, GeGLU;
    the Workspace holds q/k norm buffers for it, and plan counts its four norms."""
    from armllm.bench.sizing import param_counts
    from armllm.model.decoder import Workspace
    from armllm.model.layer import Act, Norm, QKNorm, step_norms
    path, hf = tiny("gemma3")
    c = load_model(path, "f32").config
    steps = arch.of(c).layer(c, 0)
    assert step_norms(steps) == ("input_norm", "post_attn_norm", "pre_mlp_norm",
                                 "post_mlp_norm")
    assert any(isinstance(s, QKNorm) for s in steps) and Act("gelu_tanh") in steps
    assert sum(isinstance(s, Norm) for s in steps) == 2
    assert Workspace(c, 4, 1).q_normed is not None
    assert param_counts(c)["total"] == sum(p.numel() for p in hf.parameters())  # tied once
