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
- tensor parallel over 2 ranks (query heads with their gate rows, key heads with
  their value heads and state, the MLP's, experts' and shared expert's columns)
  gives one rank's tokens and logits, from the checkpoint and from its GGUF
  (value heads tiled: a rank's rows are one run per key-head period), and a
  Q8_0 GGUF splits its blocks as stored; each rank reads the rows of its heads;
- `armllm plan` counts the state pool, a tensor-parallel rank's too;
- compressed-tensors checkpoints written by the compressed_tensors library as
  llm-compressor writes them (W8A8 int-quantized, W4A16 pack-quantized, the
  MTP block copied float beside them) run their projections as stored, read to
  the library's own dequantized values, within the int8 activations' distance
  of the same weights dequantized.

The checkpoints use SmolLM2's tokenizer (the demo model's)."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from armllm import LLM, SamplingParams
from armllm.model import arch
from armllm.model.arch import load_hf_config
from armllm.model.arch.qwen3_5 import MULTIMODAL_PREFIX
from armllm.model.gguf import GGUFFile
from armllm.model.loader import gguf_model_config, load_model
from armllm.model.sharding import ShardedSource, plan_shards
from armllm.model.sources import GGUFSource, HFSource
from armllm.model.weights import head_tensor_name
from tests import llama_cpp_tools as llama_cpp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.engine.test_tensor_parallel import assert_tp_matches  # noqa: E402
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


def write_tiny(path, name: str, tokenizer, **fields):
    config_cls, model_cls, extra = TINY[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(
        getattr(transformers, config_cls)(**{**BASE, **extra, **fields})).eval()
    randomize(model)
    model.save_pretrained(path, safe_serialization=True)
    add_mtp_layer(path)
    llama_cpp.with_tokenizer(path, tokenizer)
    return model


def convert(path, out, outtype: str = "f32"):
    """llama.cpp's GGUF (f32 or outtype) of the checkpoint at path. The converter hashes the
    tokenizer through AutoTokenizer, which for model_type qwen3_5_moe_text imposes
    Qwen3.5's own tokenizer class on SmolLM2's files: it converts a copy that says
    qwen3_5_text (the architecture, which picks the converter, stays)."""
    copy = out.parent / f"{out.stem}-hf"
    shutil.copytree(path, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5_text"}))
    return llama_cpp.convert(copy, out, outtype)


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
    # 7 blocks each, beside the state pool (8 + 2 checkpoint slots of 6 layers' 1408 floats)
    states, block = 10 * 6 * 1408 * 4, 2 * 2 * 2 * 8 * 32 * 4
    tight = LLM(path, max_num_seqs=8, block_size=8,
                **{**ENGINE, "kv_cache_gib": (states + 20 * block) / 2**30})
    assert greedy(tight, prompts, 24) == want
    assert tight.engine.scheduler.num_preemptions > 0
    assert greedy(roomy, [prompts[0]], 24, n=3) == [want[0]] * 3


SHARED = (IDS * 3)[:300]   # a prompt prefix past the first state checkpoint (256 tokens)
LOGPROBS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=2)


def run_cached(llm: LLM, prompt: list[int]) -> tuple:
    """(token ids, logprobs, prompt tokens from the prefix cache) of one request."""
    out = llm.generate(prompt, LOGPROBS)[0].outputs[0]
    return out.token_ids, out.logprobs, out.metrics.num_cached_prompt_tokens


def test_prefix_cache_hit_equals_a_miss_bit_for_bit(tiny):
    """A second prompt sharing 300 tokens with the first starts from the state
    checkpoint after 256 of them (the interval for 16-token blocks) and the KV blocks
    before it, and gives the logprobs of an engine that computes it whole, to the
    bit; a third sharing fewer than 256 tokens finds no checkpoint."""
    path, _ = tiny("dense")
    cached = LLM(path, max_num_seqs=2, block_size=16, **ENGINE)
    run_cached(cached, SHARED + [7, 8])
    hit = run_cached(cached, SHARED + [9])
    assert hit[2] == 256
    fresh = LLM(path, max_num_seqs=2, block_size=16, **ENGINE)
    assert hit[:2] == run_cached(fresh, SHARED + [9])[:2]
    assert run_cached(cached, SHARED[:250] + [5])[2] == 0
    stats = cached.stats()
    assert stats.prefix_cache_hits == 256


def test_prefix_cache_on_disk_outlives_the_engine(tiny, tmp_path):
    """--prefix-cache-dir: a restarted engine takes the 256-token prefix's KV blocks
    and its state checkpoint from disk and gives the logprobs of an engine that
    computes the prompt whole, to the bit."""
    path, _ = tiny("dense")
    kw = dict(max_num_seqs=2, block_size=16, prefix_cache_dir=tmp_path, **ENGINE)
    first = LLM(path, **kw)
    run_cached(first, SHARED + [7, 8])
    first.shutdown()
    second = LLM(path, **kw)
    hit = run_cached(second, SHARED + [9])
    # the blocks up to the checkpoint (none past it) and the checkpoint
    assert hit[2] == 256 and second.engine.blocks.disk_hits == 256 // 16 + 1
    fresh = LLM(path, max_num_seqs=2, block_size=16, **ENGINE)
    assert hit[:2] == run_cached(fresh, SHARED + [9])[:2]
    second.shutdown()


def write_tiny_multimodal(path, name: str, tokenizer):
    """A tiny *ForConditionalGeneration checkpoint: the tiny text model beside a
    one-block vision tower."""
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=64, patch_size=14, spatial_merge_size=2)
    kind = "Qwen3_5" if name == "dense" else "Qwen3_5Moe"
    torch.manual_seed(0)
    hf = getattr(transformers, f"{kind}ForConditionalGeneration")(
        getattr(transformers, f"{kind}Config")(text_config={**BASE, **TINY[name][2]},
                                               vision_config=vision)).eval()
    randomize(hf)
    hf.save_pretrained(path, safe_serialization=True)
    llama_cpp.with_tokenizer(path, tokenizer)
    return hf


@pytest.mark.parametrize("name", list(TINY))
def test_multimodal_checkpoint_runs_its_language_model(tokenizer, tmp_path, name):
    """*ForConditionalGeneration: its text model under model.language_model. (the
    vision tower and its config ignored) gives transformers' text logits."""
    hf = write_tiny_multimodal(tmp_path, name, tokenizer)
    lm = load_model(tmp_path, "f32")
    assert lm.config.architecture == type(hf).__name__
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


@pytest.fixture(scope="module")
def dense_gguf(tiny, tmp_path_factory):
    path, _ = tiny("dense")
    return convert(path, tmp_path_factory.mktemp("gguf") / "dense.gguf")


def rows_of(a: np.ndarray, size: int, heads) -> np.ndarray:
    """The rows of `heads` (a slice or a list) of a [heads * size, ...] tensor."""
    return a.reshape(-1, size, *a.shape[1:])[heads].reshape(-1, *a.shape[1:])


def shard_tensors(source, c, plan, names) -> dict[str, np.ndarray]:
    """The tensors `names` as rank `plan.rank` reads them: get(), and float_rows() in
    chunks of 5 rows must agree."""
    sharded = ShardedSource(source, plan, c, head_tensor_name(c))
    got = {}
    for name in names:
        got[name] = a = sharded.get(name)
        assert tuple(a.shape) == sharded.shape(name)
        if a.ndim == 2:
            rows = np.full_like(a, np.nan)
            for row0, chunk in sharded.float_rows(name, 5):
                rows[row0:row0 + len(chunk)] = chunk
            np.testing.assert_array_equal(rows, a)
    return got


@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_reads_the_rows_of_its_heads(tiny, ranks):
    """Against the checkpoint's tensors sliced by heads in numpy: 2 ranks hold 1 of 2
    key heads with its 2 value heads each, 4 ranks share each key head and take 1
    value head (as 4 ranks share attention's 2 KV heads); q_proj's rows a head are
    [q | gate]; the experts and the shared expert split within, their gates whole."""
    from safetensors.numpy import load_file
    path, _ = tiny("moe")
    c = load_hf_config(path)
    d, h, hd = c.delta_net, c.hidden_size, c.head_dim
    g = d.v_heads // d.k_heads
    w = load_file(path / "model.safetensors")
    plans = plan_shards(c, ranks)
    taken = []
    source = HFSource(path, None, c)
    for p in plans:
        got = shard_tensors(source, c, p,
                            [n for n in w if n.startswith(("model.layers.0.",
                                                           "model.layers.3."))])
        (k0, k1), (q0, q1), (kv0, kv1) = p.delta_k_heads, p.q_heads, p.kv_heads
        heads = [v for a, b in p.delta_v_heads for v in range(a, b)]
        assert all(k0 <= v // g < k1 for v in heads)   # each reads one of its key heads
        taken += heads
        shard = p.config(c)
        assert (shard.delta_net.k_heads, shard.delta_net.v_heads) == (k1 - k0, len(heads))
        lin = "model.layers.0.linear_attn."
        q, k, v = np.split(w[lin + "in_proj_qkv.weight"], [d.key_size, 2 * d.key_size])
        qkv_rows = [rows_of(q, d.k_dim, slice(k0, k1)), rows_of(k, d.k_dim, slice(k0, k1))]
        want = {lin + "in_proj_qkv.weight": np.concatenate(
                    [*qkv_rows, rows_of(v, d.v_dim, heads)]),
                lin + "in_proj_z.weight": rows_of(w[lin + "in_proj_z.weight"], d.v_dim, heads),
                lin + "out_proj.weight": w[lin + "out_proj.weight"].reshape(
                    h, d.v_heads, d.v_dim)[:, heads].reshape(h, -1),
                lin + "norm.weight": w[lin + "norm.weight"]}
        conv_q, conv_k, conv_v = np.split(w[lin + "conv1d.weight"],
                                          [d.key_size, 2 * d.key_size])
        want[lin + "conv1d.weight"] = np.concatenate([
            rows_of(conv_q, d.k_dim, slice(k0, k1)), rows_of(conv_k, d.k_dim, slice(k0, k1)),
            rows_of(conv_v, d.v_dim, heads)])
        for per_head in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
            want[lin + per_head] = w[lin + per_head][heads]
        att = "model.layers.3.self_attn."
        want |= {att + "q_proj.weight": rows_of(w[att + "q_proj.weight"], 2 * hd,
                                                slice(q0, q1)),
                 att + "k_proj.weight": rows_of(w[att + "k_proj.weight"], hd, slice(kv0, kv1)),
                 att + "v_proj.weight": rows_of(w[att + "v_proj.weight"], hd, slice(kv0, kv1)),
                 att + "o_proj.weight": w[att + "o_proj.weight"][:, q0 * hd:q1 * hd]}
        m0, m1 = p.moe_inter
        for i in (0, 3):
            mlp = f"model.layers.{i}.mlp."
            for expert in ("experts.5.", "shared_expert."):
                for part in ("gate_proj.weight", "up_proj.weight"):
                    want[mlp + expert + part] = w[mlp + expert + part][m0:m1]
                want[mlp + expert + "down_proj.weight"] = \
                    w[mlp + expert + "down_proj.weight"][:, m0:m1]
            for whole in ("gate.weight", "shared_expert_gate.weight"):
                want[mlp + whole] = w[mlp + whole]
        for name, a in want.items():
            np.testing.assert_array_equal(got.pop(name), a, err_msg=name)
        for name in (n for n in got if "experts." not in n):   # the norms: whole
            np.testing.assert_array_equal(got[name], source.get(name), err_msg=name)
    assert sorted(taken) == list(range(d.v_heads))   # every value head once


def test_a_tiled_ggufs_ranks_read_the_same_heads(tiny, dense_gguf):
    """llama.cpp's GGUF stores value head t of key head j at t * key heads + j: rank
    0's value heads {0, 2} are two runs of rows (and out_proj's columns), in the
    tiled order of its own single key head, and hold the Hugging Face heads 0, 1."""
    from safetensors.numpy import load_file
    path, _ = tiny("dense")
    w = load_file(path / "model.safetensors")
    gguf = GGUFFile(dense_gguf)
    try:
        c = gguf_model_config(gguf)
        d = c.delta_net
        assert d.v_tiled
        plans = plan_shards(c, 2)
        assert [p.delta_v_heads for p in plans] == [((0, 1), (2, 3)), ((1, 2), (3, 4))]
        lin = "model.layers.0.linear_attn."
        for p in plans:
            got = shard_tensors(GGUFSource(gguf, c), c, p, [lin + n for n in (
                "in_proj_qkv.weight", "out_proj.weight", "dt_bias", "A_log")])
            (k0, k1), g = p.delta_k_heads, d.v_heads // d.k_heads
            # the tiled heads' Hugging Face numbers, in the shard's order
            hf = [(v % d.k_heads) * g + v // d.k_heads
                  for a, b in p.delta_v_heads for v in range(a, b)]
            assert hf == [k0 * g, k0 * g + 1]
            v = w[lin + "in_proj_qkv.weight"][2 * d.key_size:]
            np.testing.assert_allclose(got[lin + "in_proj_qkv.weight"][2 * (k1 - k0) * d.k_dim:],
                                       rows_of(v, d.v_dim, hf), rtol=1e-6)
            np.testing.assert_allclose(got[lin + "out_proj.weight"], w[lin + "out_proj.weight"]
                                       .reshape(c.hidden_size, d.v_heads, d.v_dim)[:, hf]
                                       .reshape(c.hidden_size, -1), rtol=1e-6)
            for per_head in ("dt_bias", "A_log"):
                np.testing.assert_allclose(got[lin + per_head], w[lin + per_head][hf],
                                           rtol=1e-5)
    finally:
        gguf.close()


@pytest.mark.parametrize("name", list(TINY))
def test_tensor_parallel_2_equals_1(tiny, name):
    """Each of 2 ranks: 1 of 2 KV heads, 2 of 4 query heads (their gate rows too), 1
    of 2 key heads and its 2 value heads (and their recurrent states), half of the
    MLP's, each expert's and the shared expert's columns: 24 greedy steps give one
    rank's tokens, every logits row within 1e-4 of the largest logit."""
    path, _ = tiny(name)
    assert_tp_matches(path, 2, steps=24, **ENGINE)


def test_tensor_parallel_copies_states_on_every_rank(tiny):
    """n = 2 completions (each fork continues from a copy of its prompt's state) and
    prompts that hit the first one's state checkpoint after 256 tokens (saved and
    restored by slot copies), prefilled in 64-token chunks: every rank makes the
    copies of its own heads' states, and the sampled tokens are one rank's."""
    path, _ = tiny("dense")
    shared = (IDS * 3)[:300]
    params = SamplingParams(max_tokens=12, n=2, temperature=0.8, seed=3, ignore_eos=True)
    engine = dict(ENGINE, block_size=16, max_num_batched_tokens=64, max_num_seqs=4)

    def run(llm: LLM) -> list:
        outs = llm.generate([shared + [7]], params)
        outs += llm.generate([shared + [8], shared + [9, 10]], params)
        return [[list(c.token_ids) for c in o.outputs] for o in outs]
    want = run(LLM(path, **engine))
    with LLM(path, tensor_parallel_size=2, **engine) as tp:
        got = run(tp)
        assert tp.stats().prefix_cache_hits == 2 * 256
    assert got == want


def test_tensor_parallel_splits_a_tiled_gguf(dense_gguf):
    """llama.cpp's GGUF: each rank's value heads two runs of rows (and of out_proj's
    columns), in the tiled order of its one key head."""
    assert_tp_matches(dense_gguf, 2, steps=24, **ENGINE)


def test_tensor_parallel_splits_q8_0_blocks_as_stored(tokenizer, tmp_path):
    """Value heads of 32 dims: out_proj's Q8_0 blocks of 32 columns stay whole, in the
    tiled order's two runs of columns a rank; tokens equal, logits within 3%: the ranks'
    partial sums differ from one rank's in the last bits (1e-7 relative, measured over
    the first 8 steps), and once such a difference moves an int8 activation across a
    rounding boundary (one step of 127 in a 32-group) the logits move by about 1%
    (measured 1.04% at worst over 24 steps on the avx2 kernels)."""
    (tmp_path / "hf").mkdir()
    write_tiny(tmp_path / "hf", "dense", tokenizer, linear_value_head_dim=32)
    gguf = convert(tmp_path / "hf", tmp_path / "q8.gguf", "q8_0")
    assert_tp_matches(gguf, 2, steps=24, rtol=3e-2, **ENGINE)


def test_splits_that_cannot_be_are_refused(dense_gguf):
    """Tiled value heads of 16 dims under 32-column quantization blocks (rank 0's run
    of head 0 ends inside one); one value head a key head over more ranks than key
    heads."""
    gguf = GGUFFile(dense_gguf)
    try:
        c = gguf_model_config(gguf)
    finally:
        gguf.close()
    assert plan_shards(c, 2, k_unit=16)
    with pytest.raises(ValueError, match="Gated DeltaNet's output projection at column 16"):
        plan_shards(c, 2, k_unit=32)
    one_each = dataclasses.replace(c, delta_net=dataclasses.replace(c.delta_net, v_heads=2))
    assert plan_shards(one_each, 2)
    with pytest.raises(ValueError, match="2 key / 2 value heads of the Gated DeltaNet layers "
                                         "do not split over 4 ranks"):
        plan_shards(one_each, 4)


def test_plan_counts_the_state_pool(tiny):
    """Six DeltaNet layers of 3 x 128 conv inputs and 4 x 16 x 16 delta state floats a
    slot, float32, a slot a sequence and one checkpoint slot for four; two attention
    layers hold the KV. A tensor-parallel rank's: its heads' share."""
    from armllm.bench.sizing import make_plan, param_counts
    from armllm.engine.args import EngineArgs
    path, hf = tiny("dense")
    c = load_model(path, "f32").config
    plan = make_plan(c, None, EngineArgs(max_num_seqs=4, dtype="float32"), 512)
    per_slot = 6 * 4 * (3 * 128 + 4 * 256)
    assert plan["kv_cache"]["state_pool"] == {"live_slots": 4, "checkpoint_slots": 1,
                                              "layers": 6, "bytes_per_slot": per_slot,
                                              "bytes": 5 * per_slot}
    assert plan["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 32 * 2   # 2 layers' bf16 K, V
    assert param_counts(c)["total"] == sum(p.numel() for p in hf.parameters())
    # rank 0 of 2: 1 key head of 2 and its 2 value heads, half of each slot; 1 KV head
    rank0 = make_plan(c, None, EngineArgs(max_num_seqs=4, dtype="float32"), 512,
                      shard=plan_shards(c, 2)[0])
    assert rank0["kv_cache"]["state_pool"]["bytes_per_slot"] == per_slot // 2
    assert rank0["kv_cache"]["bytes_per_token"] == 2 * 2 * 1 * 32 * 2
    assert rank0["tensor_parallel"]["rank0"]["delta_heads"] == [1, 2]


# llm-compressor's recipe for Qwen3.5 / 3.6 (examples/quantization_w8a8_int8/qwen3_6_example.py):
# every Gated DeltaNet projection, the router, the shared expert's gate and the head float
LLM_COMPRESSOR_IGNORE = ["re:.*lm_head", "re:visual.*", "re:model.visual.*", "re:.*mlp.gate$",
                         "re:.*embed_tokens$", "re:.*shared_expert_gate$", "re:.*linear_attn.*"]
# the DeltaNet's [q k v], z and out projections quantized too, its small b and a float
DELTA_QUANTIZED_IGNORE = ["lm_head", "re:visual.*", "re:model.visual.*", "re:.*in_proj_[ab]$",
                          "re:.*mlp.gate$", "re:.*shared_expert_gate$"]
# llm-compressor preset: (ignore list, the format the library picks, what armllm runs)
CT_PRESETS = {"W8A8": (LLM_COMPRESSOR_IGNORE, "int-quantized", "w8a8-ch"),
              "W4A16": (DELTA_QUANTIZED_IGNORE, "pack-quantized", "w4a8-g32")}


def unfuse_experts(model) -> None:
    """Each sparse block's stacked experts as one Qwen3_5MoeMLP an expert (nn.Linear gate,
    up and down), as llm-compressor's calibration module for Qwen3_5MoeSparseMoeBlock
    leaves them, so that targets=["Linear"] reach the experts and the checkpoint names
    them one by one."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeMLP
    c = model.config.get_text_config()
    for layer in getattr(model.model, "language_model", model.model).layers:
        stacked = getattr(layer.mlp, "experts", None)
        if stacked is None:
            continue
        inter, dtype = c.moe_intermediate_size, stacked.gate_up_proj.dtype
        experts = torch.nn.ModuleList(Qwen3_5MoeMLP(c, inter) for _ in range(c.num_experts))
        for e, mlp in enumerate(experts.to(dtype)):
            mlp.gate_proj.weight.data = stacked.gate_up_proj.data[e, :inter].clone()
            mlp.up_proj.weight.data = stacked.gate_up_proj.data[e, inter:].clone()
            mlp.down_proj.weight.data = stacked.down_proj.data[e].clone()
        layer.mlp.experts = experts


def quantize_with_compressed_tensors(path, out, preset: str) -> None:
    """The checkpoint at `path`, in bf16, as llm-compressor's data-free QuantizationModifier
    (targets Linear, a preset scheme, round to nearest) and save_pretrained write it,
    each step the compressed_tensors library's but the weight observer's min and max:
    apply_quantization_config attaches the scheme (CT_PRESETS' ignore list),
    calculate_qparams sets each weight's scales, ModelCompressor picks the format,
    compresses (int-quantized: int8 `weight`; pack-quantized: `weight_packed` and
    `weight_shape`) and writes quantization_config (its ignore list names each float
    Linear), and save_mtp_tensors_to_checkpoint copies the float MTP block from `path`
    (a shard of its own, an index, `re:^mtp.*` ignored). W4A16's groups are 32 columns,
    not 128: the tiny model's K is 32 to 128."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from compressed_tensors.utils import save_mtp_tensors_to_checkpoint
    from safetensors.torch import save_file

    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(path, dtype=torch.bfloat16)
    unfuse_experts(model)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if scheme.weights.group_size:
        scheme.weights.group_size = 32
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=CT_PRESETS[preset][0]))
    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "quantization_scheme"):
                continue
            args, w = module.quantization_scheme.weights, module.weight
            if args.group_size:
                w = w.unflatten(-1, (-1, args.group_size))
            scale, zero_point = calculate_qparams(w.amin(-1), w.amax(-1), args)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            module.weight_zero_point.copy_(zero_point.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    out.mkdir()
    for f in path.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              out / "model.safetensors", metadata={"format": "pt"})
    compressor.update_config(out)
    save_mtp_tensors_to_checkpoint(str(path), str(out))


def dequantized_copy(out, ref) -> dict[str, np.ndarray]:
    """A float checkpoint at `ref` of the compressed one at `out`, each quantized weight
    as the library's compressor decompresses it (the bf16 scales widened to f32 first,
    so each weight is exactly value x scale); returns those weights by module name."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file, save_file

    config = json.loads((out / "config.json").read_text())
    qc = QuantizationConfig.model_validate(config.pop("quantization_config"))
    compressor = BaseCompressor.get_value_from_registry(qc.format)
    tensors = {}
    for shard in out.glob("*.safetensors"):
        tensors.update(load_file(shard))
    weights = {}
    for module in [k[:-len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")]:
        local = {k.rsplit(".", 1)[1]: tensors.pop(k) for k in list(tensors)
                 if k.rsplit(".", 1)[0] == module}
        local["weight_scale"] = local["weight_scale"].float()
        w = compressor.decompress(local, qc.config_groups["group_0"])["weight"]
        tensors[f"{module}.weight"] = w
        weights[module] = w.numpy()
    ref.mkdir()
    for f in out.iterdir():
        if f.suffix == ".json" and f.name != "model.safetensors.index.json":
            shutil.copy(f, ref / f.name)
    (ref / "config.json").write_text(json.dumps(config))
    save_file(tensors, ref / "model.safetensors", metadata={"format": "pt"})
    return weights


def assert_reads_as_the_library(out, lm, library: dict[str, np.ndarray], preset: str):
    """Each quantized weight of the checkpoint at `out` reads (HFSource.get: armllm's
    dequantization of what it packs) as the library dequantizes it, bit for bit but
    int8 -128, which the kernels' symmetric [-127, 127] takes one step up."""
    from armllm.model.compressed_tensors import parse_config
    source = HFSource(out, parse_config(json.loads((out / "config.json").read_text()),
                                        str(out)), lm.config)
    for module, theirs in library.items():
        ours = source.get(f"{module.replace(MULTIMODAL_PREFIX, 'model.')}.weight")
        if preset == "W8A8":
            stepped = source.ckpt.array(f"{module}.weight") == -128
            theirs = np.where(stepped, theirs * 127 / 128, theirs)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0, err_msg=module)


def distance_from_dequantized(lm, ref) -> float:
    """The largest distance of lm's f32 logits from those of the float checkpoint at
    `ref`, over the largest of those (IDS' rows)."""
    want = prefill_logits(load_model(ref, "f32"), IDS, block_size=8)
    return float(np.max(np.abs(prefill_logits(lm, IDS, block_size=8) - want))
                 / np.abs(want).max())


@pytest.mark.parametrize("name,preset", [("dense", "W8A8"), ("dense", "W4A16"),
                                         ("moe", "W8A8"), ("moe", "W4A16")])
def test_compressed_tensors_checkpoint_runs_as_stored(tiny, tmp_path, name, preset):
    """A checkpoint as llm-compressor writes it (quantize_with_compressed_tensors) runs
    its quantized projections as stored, in the library's format (W4A16's activations
    in int8: W4A8), and the ignored ones (all of the DeltaNet's or its b and a, the
    router, the shared expert's gate, the head) and the MTP block float; every stored
    weight reads as the library dequantizes it. Logits within 2.5% (dense) / 8% (MoE)
    of the largest of the same weights dequantized, run in f32: measured W8A8 1.2% /
    3.4% (of which the -128 step alone 0.3% / 3.3%: a routing flip), W4A16 1.5% / 5.2%:
    the int8 activations' rounding, which these tiny random models amplify (see
    test_quantized_projections_stay_close)."""
    path, _ = tiny(name)
    _, fmt, runs = CT_PRESETS[preset]
    out, ref = tmp_path / "compressed", tmp_path / "dequantized"
    quantize_with_compressed_tensors(path, out, preset)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == fmt and {"lm_head", "re:^mtp.*"} <= set(qc["ignore"])
    library = dequantized_copy(out, ref)

    lm = load_model(out, "f32")
    c, w = lm.config, lm.model.weights
    assert w.quantization == f"f32, {runs} (compressed-tensors)"   # f32: the MTP block's
    for i, layer in enumerate(w.layers):
        mixer = preset == "W4A16" or not c.is_linear_layer(i)
        assert layer.qkv.quantized == layer.o.quantized == mixer, i
        mlp = [layer.gate_up, layer.down]   # a sparse layer's: its shared expert's
        if layer.moe is not None:
            mlp += layer.moe.gate_up + layer.moe.down
            assert not layer.moe.router.quantized
        assert all(m.quantized for m in mlp), i
        assert layer.delta is None or not layer.delta.ba.quantized
    mtp = w.mtp.layers[0]
    mtp_mats = [w.mtp.fc, mtp.qkv, mtp.o, mtp.gate_up, mtp.down]
    mtp_mats += mtp.moe.gate_up + mtp.moe.down if mtp.moe else []
    assert not w.lm_head.quantized and not any(m.quantized for m in mtp_mats)
    assert_reads_as_the_library(out, lm, library, preset)
    err = distance_from_dequantized(lm, ref)
    assert err <= (0.025 if name == "dense" else 0.08), err


@pytest.mark.parametrize("name,preset", [("dense", "W4A16"), ("moe", "W8A8"), ("moe", "W4A16")])
def test_compressed_tensors_multimodal_checkpoint(tokenizer, tmp_path, name, preset):
    """The form llm-compressor's Qwen3.5 / 3.6 recipes quantize and publish,
    *ForConditionalGeneration: the language model's tensors under
    model.language_model., the vision tower's Linears ignored by name. A pack-quantized
    layer stores no `weight` (weight_packed instead), and is found under that prefix
    all the same. Logits as test_compressed_tensors_checkpoint_runs_as_stored's;
    measured: dense W4A16 1.6%, MoE W8A8 5.9%, W4A16 6.0%."""
    path, out, ref = (tmp_path / n for n in ("hf", "compressed", "dequantized"))
    path.mkdir()
    write_tiny_multimodal(path, name, tokenizer)
    quantize_with_compressed_tensors(path, out, preset)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "model.visual.blocks.0.attn.qkv" in qc["ignore"]
    library = dequantized_copy(out, ref)
    lm = load_model(out, "f32")
    w = lm.model.weights
    assert w.quantization.endswith(f"{CT_PRESETS[preset][2]} (compressed-tensors)")
    assert w.layers[0].qkv.quantized == (preset == "W4A16") and w.layers[3].qkv.quantized
    assert_reads_as_the_library(out, lm, library, preset)
    err = distance_from_dequantized(lm, ref)
    assert err <= (0.025 if name == "dense" else 0.08), err
