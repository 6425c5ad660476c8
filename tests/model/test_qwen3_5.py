"""Qwen3.5 / Qwen3.6 (model/arch/qwen3_5.py), dense and mixture-of-experts: tiny
random checkpoints written by transformers (three Gated DeltaNet layers, then a
gated full-attention layer, twice) against transformers' own forward.

- f32 logits of a 150-token prompt (two whole 64-row chunks of the chunked delta
  rule, then the recurrent rows) within 1e-4 of the largest logit;
- 64 greedy tokens through the engine equal transformers' generate;
- chunked prefill at several chunk sizes (the recurrent state carried from one
  step to the next) gives one pass's tokens;
- preemption (its state slot freed, the prompt recomputed from a zero state) and
  n > 1 (each fork continuing from a copy of the prompt's state) give the tokens
  of an undisturbed run;
- a *ForConditionalGeneration checkpoint runs its language model;
- llama.cpp's convert_hf_to_gguf.py writes the same checkpoint as a "qwen35" /
  "qwen35moe" GGUF (value heads tiled, A stored as -exp(A_log), norms + 1),
  which gives transformers' logits too; llama-quantize's requantization loads;
- tensor parallel is refused with the reason; `armllm plan` counts the state pool.

The checkpoints use SmolLM2's tokenizer (the demo model's)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from armllm import LLM, SamplingParams
from armllm.model import arch
from armllm.model.gguf import GGUFFile
from armllm.model.loader import load_model
from tests import llama_cpp_tools as llama_cpp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.model.test_llama_vs_transformers import greedy_pair, hf_logits, prefill_logits  # noqa: E402

BASE = dict(vocab_size=llama_cpp.VOCAB, hidden_size=64, intermediate_size=96,
            num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25})
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=32)
# name: (config class, model class, extra config fields)
TINY = {"dense": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {}),
        "moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", MOE)}
IDS = [int(i) for i in np.random.default_rng(5).integers(0, 1000, 150)]
ENGINE = dict(dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.02, max_model_len=512)


def randomize(model) -> None:
    """Norms, decays and conv weights off their init values, so that each matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                p.add_(torch.randn_like(p) * 0.3)
            elif "conv1d" in name:
                p.mul_(3.0)


def add_mtp_layer(path) -> None:
    """An MTP block as the published checkpoints carry it (mtp.*: the fc over [embedding
    norm | hidden norm], one full-attention layer, its norm), which transformers does
    not load: mtp_num_hidden_layers 1 in config.json, the layer a copy of layer 3's."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(path / "model.safetensors")
    h = BASE["hidden_size"]
    rng = np.random.default_rng(7)
    mtp = {name.replace("model.layers.3.", "mtp.layers.0."): value.copy()
           for name, value in tensors.items() if name.startswith("model.layers.3.")}
    mtp["mtp.fc.weight"] = rng.standard_normal((h, 2 * h)).astype(np.float32) * 0.05
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = rng.standard_normal(h).astype(np.float32) * 0.1
    save_file({**tensors, **mtp}, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))


def write_tiny(path, name: str, tokenizer):
    config_cls, model_cls, extra = TINY[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(
        getattr(transformers, config_cls)(**{**BASE, **extra})).eval()
    randomize(model)
    model.save_pretrained(path, safe_serialization=True)
    add_mtp_layer(path)
    llama_cpp.with_tokenizer(path, tokenizer)
    return model


def convert(path, out):
    """llama.cpp's f32 GGUF of the checkpoint at path. The converter hashes the
    tokenizer through AutoTokenizer, which for model_type qwen3_5_moe_text imposes
    Qwen3.5's own tokenizer class on SmolLM2's files: it converts a copy that says
    qwen3_5_text (the architecture, which picks the converter, stays)."""
    copy = out.parent / f"{out.stem}-hf"
    shutil.copytree(path, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5_text"}))
    return llama_cpp.convert(copy, out)


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf, tmp_path_factory):
    return llama_cpp.smollm2_tokenizer(smollm2_gguf, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory):
    made = {}

    def get(name: str):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            made[name] = path, write_tiny(path, name, tokenizer)
        return made[name]
    return get


def assert_logits_close(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-4) -> None:
    assert np.max(np.abs(ours - theirs)) <= rtol * max(1.0, np.abs(theirs).max())


def greedy(llm: LLM, prompts: list[list[int]], n_tokens: int, n: int = 1) -> list[list[int]]:
    params = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True, n=n)
    return [list(c.token_ids) for out in llm.generate(prompts, params) for c in out.outputs] \
        if n > 1 else [list(o.token_ids) for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("name", list(TINY))
def test_hf_logits_match_transformers(tiny, name):
    path, hf = tiny(name)
    lm = load_model(path, "f32")
    c = lm.config
    assert c.linear_layers == (0, 1, 2, 4, 5, 6) and c.attn_output_gate
    assert c.delta_net.v_heads == 4 and not c.delta_net.v_tiled and c.rot_dim == 8
    assert c.mtp_layers == 1 and c.num_layers == 8
    assert_logits_close(prefill_logits(lm, IDS, block_size=8), hf_logits(hf, IDS))


@pytest.mark.parametrize("name", list(TINY))
def test_greedy_matches_transformers(tiny, name):
    """64 greedy tokens: decode rows continue each layer's recurrent state."""
    path, hf = tiny(name)
    llm = LLM(path, max_num_seqs=2, **ENGINE)
    ours, theirs = greedy_pair(llm, hf, IDS[:40], 64)
    assert ours == theirs


@pytest.mark.parametrize("chunk", [7, 64, 100])
def test_chunked_prefill_carries_the_state(tiny, chunk):
    """A 150-token prompt prefilled `chunk` tokens a step gives one pass's tokens."""
    path, _ = tiny("dense")
    whole = greedy(LLM(path, max_num_seqs=2, **ENGINE), [IDS], 16)
    chunked = greedy(LLM(path, max_num_seqs=2, max_num_batched_tokens=chunk, **ENGINE),
                     [IDS], 16)
    assert chunked == whole


def test_preemption_and_forks_continue_the_right_states(tiny):
    """Eight prompts in a cache too small for them all preempt each other (a
    preempted sequence gives its slot back and recomputes from a zero state); n = 3
    greedy completions fork from the prompt's state and all equal the n = 1 run."""
    path, _ = tiny("dense")
    prompts = [IDS[i:i + 30] for i in range(0, 80, 10)]
    roomy = LLM(path, max_num_seqs=8, **ENGINE)
    want = greedy(roomy, prompts, 24)
    # 20 blocks of 8 tokens (K and V of 2 layers, 2 heads of 32, f32) for 8 sequences of
    # 7 blocks each, beside the state pool (8 + 8 checkpoint slots of 6 layers' 1408 floats)
    states, block = 16 * 6 * 1408 * 4, 2 * 2 * 2 * 8 * 32 * 4
    tight = LLM(path, max_num_seqs=8, block_size=8,
                **{**ENGINE, "kv_cache_gib": (states + 20 * block) / 2**30})
    assert greedy(tight, prompts, 24) == want
    assert tight.engine.scheduler.num_preemptions > 0
    assert greedy(roomy, [prompts[0]], 24, n=3) == [want[0]] * 3


def test_prefix_cache_hit_equals_a_miss_bit_for_bit(tiny):
    """A second prompt sharing 300 tokens with the first starts from the state
    checkpoint after 256 of them (the interval for 16-token blocks) and the KV blocks
    before it, and gives the logprobs of an engine that computes it whole, to the
    bit; a third sharing fewer than 256 tokens finds no checkpoint."""
    path, _ = tiny("dense")
    shared = (IDS * 3)[:300]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=2)

    def run(llm: LLM, prompt: list[int]):
        out = llm.generate(prompt, params)[0].outputs[0]
        return out.token_ids, out.logprobs, out.metrics.num_cached_prompt_tokens

    cached = LLM(path, max_num_seqs=2, block_size=16, **ENGINE)
    run(cached, shared + [7, 8])
    hit = run(cached, shared + [9])
    assert hit[2] == 256
    assert hit[:2] == run(LLM(path, max_num_seqs=2, block_size=16, **ENGINE), shared + [9])[:2]
    assert run(cached, shared[:250] + [5])[2] == 0
    stats = cached.stats()
    assert stats.prefix_cache_hits == 256


@pytest.mark.parametrize("name", list(TINY))
def test_multimodal_checkpoint_runs_its_language_model(tokenizer, tmp_path, name):
    """*ForConditionalGeneration: its text model under model.language_model. (the
    vision tower and its config ignored) gives transformers' text logits."""
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=64, patch_size=14, spatial_merge_size=2)
    kind = "Qwen3_5" if name == "dense" else "Qwen3_5Moe"
    torch.manual_seed(0)
    hf = getattr(transformers, f"{kind}ForConditionalGeneration")(
        getattr(transformers, f"{kind}Config")(text_config={**BASE, **TINY[name][2]},
                                               vision_config=vision)).eval()
    randomize(hf)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    llama_cpp.with_tokenizer(tmp_path, tokenizer)
    lm = load_model(tmp_path, "f32")
    assert lm.config.architecture == f"{kind}ForConditionalGeneration"
    assert_logits_close(prefill_logits(lm, IDS[:40], block_size=8), hf_logits(hf, IDS[:40]))


@pytest.mark.parametrize("name", list(TINY))
def test_llama_cpp_gguf_matches_transformers(tiny, tmp_path, name):
    """llama.cpp's converter's f32 GGUF ("qwen35" / "qwen35moe"): its value heads in
    tiled order, A as -exp(A_log), every norm but the DeltaNet's already + 1."""
    path, hf = tiny(name)
    gguf = convert(path, tmp_path / f"{name}.gguf")
    lm = load_model(gguf, "f32")
    assert arch.of(lm.config) is arch.of(load_model(path, "f32").config)
    c = lm.config
    assert c.delta_net.v_tiled and c.linear_layers == (0, 1, 2, 4, 5, 6) and c.mtp_layers == 1
    assert_logits_close(prefill_logits(lm, IDS, block_size=8), hf_logits(hf, IDS))


@pytest.mark.parametrize("name", list(TINY))
def test_mtp_block_is_loaded_from_safetensors_and_gguf(tiny, tmp_path, name):
    """The MTP block (mtp.* in safetensors, llama.cpp's nextn layer in a GGUF) loads
    beside the model: its fc and (1 + w) norms as stored, its layer as layer 3 of the
    checkpoint (of which add_mtp_layer made it a copy), experts and all."""
    from safetensors.numpy import load_file

    from armllm import ops
    path, _ = tiny(name)
    stored = load_file(path / "model.safetensors")
    x = np.random.default_rng(3).standard_normal((3, 128)).astype(np.float32)
    for lm in (load_model(path, "f32"), load_model(convert(path, tmp_path / "m.gguf"), "f32")):
        mtp, layer3 = lm.model.weights.mtp, lm.model.weights.layers[3]
        assert len(mtp.layers) == 1 and mtp.layers[0].steps == layer3.steps
        np.testing.assert_allclose(ops.linear(x, mtp.fc), x @ stored["mtp.fc.weight"].T,
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mtp.embed_norm, stored["mtp.pre_fc_norm_embedding.weight"]
                                   + 1, rtol=1e-6)
        np.testing.assert_array_equal(ops.linear(x[:, :64], mtp.layers[0].qkv),
                                      ops.linear(x[:, :64], layer3.qkv))
        assert (mtp.layers[0].moe is None) == (name == "dense")


@pytest.mark.parametrize("name,scheme", [("dense", "w8a8"), ("moe", "w8a8"), ("dense", "w4a8")])
def test_quantized_projections_stay_close(tiny, name, scheme):
    """W8A8 / W4A8 at load quantize every projection (the DeltaNet's [q k v z] and out,
    attention's, the MLP's, the experts') and keep the DeltaNet's small b/a projection
    float: logits within 6% (w8) / 35% (w4) of the largest of transformers' f32 ones.
    Measured: dense 2.9% / 24%, MoE 4.7% (a rounding flips some routing) / 20%, where a
    Qwen3 of the same shape (no DeltaNet) gives 1.9% / 28%: these tiny random models
    with perturbed norms are far more sensitive than trained ones."""
    from armllm.model.quantize import parse_scheme
    path, hf = tiny(name)
    lm = load_model(path, "f32", quantization=parse_scheme(scheme))
    w = lm.model.weights
    assert w.quantization == scheme and w.layers[0].qkv.quantized and w.layers[0].o.quantized
    assert not w.layers[0].delta.ba.quantized
    theirs = hf_logits(hf, IDS)
    err = np.max(np.abs(prefill_logits(lm, IDS, block_size=8) - theirs)) / np.abs(theirs).max()
    assert err <= (0.06 if scheme == "w8a8" else 0.35), err


@pytest.mark.parametrize("name", list(TINY))
def test_llama_cpp_q8_0_runs_as_stored(tiny, tmp_path, name):
    """The converter's Q8_0 GGUF runs its blocks as stored (w8a8, group 32), within
    twice the distance from transformers' f32 logits that Q8_0's rounding alone costs
    (the same file dequantized), as the other families' Q8_0 tests."""
    path, hf = tiny(name)
    copy = tmp_path / "hf"
    shutil.copytree(path, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5_text"}))
    gguf = llama_cpp.convert(copy, tmp_path / "q8.gguf", "q8_0")
    lm = load_model(gguf, "f32")
    assert "Q8_0" in (lm.tensor_types or "") and "w8a8" in lm.model.weights.quantization
    theirs = hf_logits(hf, IDS)
    stored = np.max(np.abs(prefill_logits(lm, IDS, block_size=8) - theirs))
    rounded = np.max(np.abs(prefill_logits(load_model(gguf, "f32", quantization="none"), IDS,
                                           block_size=8) - theirs))
    assert rounded <= 0.05 * np.abs(theirs).max()
    assert stored <= 2 * rounded


def test_llama_quantize_output_loads(tiny, tmp_path):
    """llama-quantize, which makes the GGUFs people download, writes the shared-expert
    gate [1, hidden] as [hidden] (ggml counts no trailing dimension of size 1): its
    Q8_0 of the converter's GGUF loads, the gate as the converter's file holds it."""
    path, _ = tiny("moe")
    f32 = convert(path, tmp_path / "f32.gguf")
    q8 = llama_cpp.quantize(f32, tmp_path / "q8.gguf", "Q8_0")
    assert GGUFFile(q8).tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (BASE["hidden_size"],)
    gates = [[layer.shared_gate for layer in load_model(p, "f32").model.weights.layers]
             for p in (f32, q8)]
    np.testing.assert_array_equal(np.stack(gates[0]), np.stack(gates[1]))


def test_tensor_parallel_is_refused_with_the_reason(tiny):
    path, _ = tiny("dense")
    with pytest.raises(ValueError, match="tensor parallel does not split Gated DeltaNet"):
        LLM(path, tensor_parallel_size=2, **ENGINE)


def test_plan_counts_the_state_pool(tiny):
    """Six DeltaNet layers of 3 x 128 conv inputs and 4 x 16 x 16 delta state floats a
    slot, float32, a slot a sequence and as many checkpoints; two attention layers
    hold the KV."""
    from armllm.bench.sizing import make_plan, param_counts
    from armllm.engine.args import EngineArgs
    path, hf = tiny("dense")
    c = load_model(path, "f32").config
    plan = make_plan(c, None, EngineArgs(max_num_seqs=4, dtype="float32"), 512)
    per_slot = 6 * 4 * (3 * 128 + 4 * 256)
    assert plan["kv_cache"]["state_pool"] == {"live_slots": 4, "checkpoint_slots": 4,
                                              "layers": 6, "bytes_per_slot": per_slot,
                                              "bytes": 8 * per_slot}
    assert plan["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 32 * 2   # 2 layers' bf16 K, V
    assert param_counts(c)["total"] == sum(p.numel() for p in hf.parameters())
