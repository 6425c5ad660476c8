"""Mixture-of-experts models (Mixtral, Qwen3-MoE) against HF transformers: tiny
random checkpoints written by transformers (several experts, top-k > 1, Qwen3's
dense layers among the sparse ones, Mixtral's sliding window), f32 logits within
1e-4 of the largest logit, greedy tokens identical over 32 steps; the engine's
batching, chunking and prefix caching change no token; quantize-on-load runs the
experts on the int8 GEMMs. Routing against a numpy oracle of transformers' rule.
"""
from __future__ import annotations

import numpy as np
import pytest

from armllm import ops
from armllm.model.loader import load_model
from tests.model.test_llama_vs_transformers import (
    greedy_pair,
    hf_logits,
    make_tiny,
    prefill_logits,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 6, "num_experts_per_tok": 2, "sliding_window": 9}),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 40,
                   "norm_topk_prob": True, "mlp_only_layers": [1], "num_hidden_layers": 3,
                   "head_dim": 24}),
    "qwen3-moe-unnormalized": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                               {"num_experts": 5, "num_experts_per_tok": 5,
                                "moe_intermediate_size": 32, "norm_topk_prob": False,
                                "decoder_sparse_step": 2}),
}


@pytest.fixture(scope="module", params=list(MOE))
def moe_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_tiny(path, *MOE[request.param])
    return request.param, path, hf


def test_config_names_the_sparse_layers(moe_model):
    name, path, hf = moe_model
    c = load_model(path, "f32").config
    want = [i for i, layer in enumerate(hf.model.layers)
            if not hasattr(layer.mlp, "gate_proj")]
    assert list(c.moe_layers) == want and want
    assert c.experts_per_token == hf.config.num_experts_per_tok


def test_logits_match_transformers(moe_model):
    _, path, hf = moe_model
    lm = load_model(path, "f32")
    for seed in (1, 2):
        ids = list(np.random.default_rng(seed).integers(0, 97, 37))
        ours, theirs = prefill_logits(lm, ids, block_size=8), hf_logits(hf, ids)
        assert np.max(np.abs(ours - theirs)) <= 1e-4 * max(1.0, np.abs(theirs).max())


def test_greedy_decode_matches_transformers(moe_model):
    """32 greedy tokens through the engine (paged decode, one row per step, where each
    expert runs on whatever rows route to it) equal transformers' greedy. An f32 KV
    cache: top-k routing turns bf16's rounding into another expert on near ties."""
    from armllm import LLM
    _, path, hf = moe_model
    llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01, max_num_seqs=4)
    prompt = [int(i) for i in np.random.default_rng(5).integers(0, 97, 12)]
    ours, theirs = greedy_pair(llm, hf, prompt, 32)
    assert ours == theirs


def assert_batching_changes_no_token(path, budget: int) -> None:
    """Requests alone equal the same requests batched, under a prefill chunk budget of
    `budget` tokens, with the prefix cache on and off (a shared prompt prefix)."""
    from armllm import LLM, SamplingParams
    rng = np.random.default_rng(budget)
    shared = [int(i) for i in rng.integers(0, 97, 16)]
    prompts = [shared + [int(i) for i in rng.integers(0, 97, n)] for n in (3, 9, 1)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = LLM(path, dtype="float32", kv_cache_gib=0.01, max_num_seqs=1,
                enable_prefix_caching=False)
    want = [alone.generate(p, params)[0].token_ids for p in prompts]
    for caching in (True, False):
        llm = LLM(path, dtype="float32", kv_cache_gib=0.01, max_num_seqs=3,
                  max_num_batched_tokens=max(budget, 3), enable_prefix_caching=caching)
        got = [o.token_ids for o in llm.generate(prompts, params)]
        assert got == want, (budget, caching)


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_batching_chunking_and_prefix_cache_change_no_token(moe_model, budget):
    """Requests alone equal the same requests batched, under prefill chunk budgets of
    1, 7 and 64 tokens, with the prefix cache on and off (a shared prompt prefix)."""
    assert_batching_changes_no_token(moe_model[1], budget)


def test_profile_books_the_sparse_mlps_apart(moe_model):
    """`bench latency --profile`'s StepProfile times each sparse layer's one C call as
    the sparse MLPs' share, not as glue; the parts still add up to the step."""
    from armllm import LLM, SamplingParams
    from armllm.bench.step_profile import PARTS, StepProfile
    llm = LLM(moe_model[1], dtype="float32", kv_cache_gib=0.01, max_num_seqs=1)
    with StepProfile(llm.engine) as profile:
        llm.generate([5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    ms = profile.per_token_ms()
    assert profile.decode_tokens == 5 and ms["sparse_mlp"] > 0 and ms["gemm"] > 0
    assert sum(ms[p] for p in PARTS) == pytest.approx(ms["total"])


def test_quantized_experts_close_to_float(moe_model):
    """--quantization w8a8 quantizes every expert (and the dense layers) at load; the
    router stays float. Logits stay within int8's error of the float model's."""
    from armllm.model.quantize import parse_scheme
    _, path, _ = moe_model
    f32 = load_model(path, "f32")
    q = load_model(path, "f32", quantization=parse_scheme("w8a8"))
    moe_layer = q.model.weights.layers[q.config.moe_layers[0]]
    assert all(w.quantized for w in moe_layer.moe.gate_up + moe_layer.moe.down)
    assert not moe_layer.moe.router.quantized
    ids = list(np.random.default_rng(3).integers(0, 97, 20))
    ours, ref = prefill_logits(q, ids), prefill_logits(f32, ids)
    assert np.max(np.abs(ours - ref)) <= 0.05 * max(1.0, np.abs(ref).max())


def test_route_is_transformers_topk_softmax():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 16)).astype(np.float32)
    logits[3, [2, 9]] = logits[3].max() + 1.0   # a tie: the lower id first
    for k, norm in ((1, True), (4, True), (4, False), (16, True)):
        ids, w = ops.moe_route(logits, k, norm)
        probs = torch.softmax(torch.tensor(logits), dim=-1)
        top_w, top_i = torch.topk(probs, k, dim=-1)
        if norm:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        np.testing.assert_array_equal(ids, top_i.numpy())
        np.testing.assert_allclose(w, top_w.numpy(), rtol=1e-6, atol=1e-7)
    assert list(ops.moe_route(logits, 2, True)[0][3]) == [2, 9]


def test_plan_counts_total_and_active_parameters(moe_model, capsys):
    """`armllm plan`: every parameter transformers' model holds; per token, all but
    the unrouted experts' (E - k of each sparse layer); the weight bytes the loader
    really allocates; a batch-1 decode step reads only the routed experts."""
    import json

    from armllm.cli import main
    _, path, hf = moe_model
    assert main(["plan", str(path), "--json", "--bandwidth-gbs", "10", "--max-model-len",
                 "64", "--max-num-seqs", "1"]) == 0
    p = json.loads(capsys.readouterr().out)
    c = load_model(path, "bf16").config
    expert = 3 * c.hidden_size * c.moe_intermediate_size
    assert p["params"]["total"] == hf.num_parameters()
    unrouted = len(c.moe_layers) * (c.num_experts - c.experts_per_token) * expert
    assert p["params"]["active"] == hf.num_parameters() - unrouted
    # bf16 matrices as the plan sizes them (n * k, panel padding aside), f32 norms
    norms = c.num_layers * (2 * c.hidden_size + 2 * c.head_dim * c.qk_norm) + c.hidden_size
    weights = 2 * hf.num_parameters() + 2 * norms
    assert p["weight_bytes"]["total"] == weights
    embed, row = 2 * c.vocab_size * c.hidden_size, 2 * c.hidden_size
    assert p["decode"]["batch_1"]["weight_bytes"] == weights - embed + row - 2 * unrouted


# ------------------------------------------------------------------ Mixtral GGUF

def write_mixtral_gguf(path, hf_dir, hf, types: dict[str, str] | None = None):
    """A GGUF laid out as llama.cpp's converter writes Mixtral ("llama" with experts:
    Q/K rows permuted for its RoPE, each layer's experts stacked into [E, N, K]
    tensors) from the checkpoint transformers saved in hf_dir; `types` quantizes
    tensors by GGUF name (gguf's quantizer, or random blocks for the K-quants it lacks)."""
    from safetensors.numpy import load_file

    from tests.tiny_model import write_gguf_model
    c, sd = hf.config, load_file(str(hf_dir / "model.safetensors"))

    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]) \
            .swapaxes(1, 2).reshape(w.shape)

    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"],
               "output_norm.weight": sd["model.norm.weight"],
               "output.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        p, moe = f"model.layers.{i}.", f"model.layers.{i}.block_sparse_moe."
        experts = range(c.num_local_experts)
        tensors.update({
            f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
            f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            f"blk.{i}.attn_q.weight": permute(sd[p + "self_attn.q_proj.weight"],
                                              c.num_attention_heads),
            f"blk.{i}.attn_k.weight": permute(sd[p + "self_attn.k_proj.weight"],
                                              c.num_key_value_heads),
            f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_gate_inp.weight": sd[moe + "gate.weight"],
            **{f"blk.{i}.ffn_{name}_exps.weight": np.stack(
                [sd[moe + f"experts.{e}.{w}.weight"] for e in experts])
               for name, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}})
    keys = {"embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
            "block_count": c.num_hidden_layers, "attention.head_count": c.num_attention_heads,
            "attention.head_count_kv": c.num_key_value_heads, "context_length": 256,
            "vocab_size": c.vocab_size, "expert_count": c.num_local_experts,
            "expert_used_count": c.num_experts_per_tok,
            "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
            "rope.freq_base": float(c.rope_parameters["rope_theta"])}
    return write_gguf_model(path, "llama", keys, tensors, types)


def gguf_lm(path, quantization="auto"):
    """The model of a GGUF without tokenizer metadata (config, weights, graph)."""
    from types import SimpleNamespace

    from armllm.model.decoder import DecoderModel
    from armllm.model.gguf import GGUFFile
    from armllm.model.loader import gguf_model_config
    from armllm.model.sources import GGUFSource
    from armllm.model.weights import load_weights
    g = GGUFFile(path)
    c = gguf_model_config(g)
    return SimpleNamespace(config=c, model=DecoderModel(c, load_weights(
        GGUFSource(g, c), c, "f32", quantization=quantization)))


@pytest.fixture(scope="module")
def mixtral_full_attention(tmp_path_factory):
    """A tiny Mixtral without a sliding window (GGUF's llama keys have none)."""
    path = tmp_path_factory.mktemp("mixtral-full")
    extra = {**MOE["mixtral"][2], "sliding_window": None}
    return path, make_tiny(path, "MixtralConfig", "MixtralForCausalLM", extra)


def test_mixtral_gguf_matches_transformers(mixtral_full_attention, tmp_path):
    hf_dir, hf = mixtral_full_attention
    lm = gguf_lm(write_mixtral_gguf(tmp_path / "m.gguf", hf_dir, hf))
    assert lm.config.architecture == "MixtralForCausalLM"
    assert lm.config.moe_layers == (0, 1) and lm.config.experts_per_token == 2
    ids = list(np.random.default_rng(4).integers(0, 97, 37))
    ours, theirs = prefill_logits(lm, ids, block_size=8), hf_logits(hf, ids)
    assert np.max(np.abs(ours - theirs)) <= 1e-4 * max(1.0, np.abs(theirs).max())


def test_mixtral_gguf_quantized_experts_run_as_stored(tmp_path):
    """Q8_0 experts on the int8 GEMM, Q4_K / Q6_K ones (a K-quant mix across a layer's
    gate, up and down) on the GGUF-block GEMM, each as stored: logits within int8
    activations' rounding of the same file dequantized to f32 (K-quants need rows of
    256: a wider tiny model)."""
    extra = {**MOE["mixtral"][2], "sliding_window": None, "hidden_size": 256,
             "intermediate_size": 256, "num_local_experts": 4}
    hf = make_tiny(tmp_path / "hf", "MixtralConfig", "MixtralForCausalLM", extra)
    types = {"blk.0.ffn_gate_exps.weight": "Q8_0", "blk.0.ffn_up_exps.weight": "Q8_0",
             "blk.0.ffn_down_exps.weight": "Q8_0", "blk.1.ffn_gate_exps.weight": "Q4_K",
             "blk.1.ffn_up_exps.weight": "Q4_K", "blk.1.ffn_down_exps.weight": "Q6_K"}
    path = write_mixtral_gguf(tmp_path / "q.gguf", tmp_path / "hf", hf, types)
    stored, dequantized = gguf_lm(path), gguf_lm(path, "none")
    layers = stored.model.weights.layers
    assert layers[0].moe.gate_up[0].dtype == "w8" and layers[1].moe.down[3].dtype == "gguf"
    assert layers[1].moe.gate_up[2].gguf_types == (12, 12)   # Q4_K gate and up, fused
    ids = list(np.random.default_rng(6).integers(0, 97, 25))
    ours, ref = prefill_logits(stored, ids), prefill_logits(dequantized, ids)
    assert np.max(np.abs(ours - ref)) <= 0.05 * max(1.0, np.abs(ref).max())


def test_qwen3_moe_gguf_matches_transformers(tmp_path):
    """A Qwen3-MoE GGUF as llama.cpp's converter writes it ("qwen3moe": rows as in HF,
    since its RoPE is neox-style; q/k norms; each layer's experts stacked), F32 and
    with Q8_0 expert gate/up (run as stored)."""
    from safetensors.numpy import load_file

    from tests.tiny_model import write_gguf_model
    extra = {k: v for k, v in MOE["qwen3-moe"][2].items() if k != "mlp_only_layers"}
    hf = make_tiny(tmp_path / "hf", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", extra)
    c, sd = hf.config, load_file(str(tmp_path / "hf" / "model.safetensors"))
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"],
               "output_norm.weight": sd["model.norm.weight"],
               "output.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors.update({f"blk.{i}.{g}": sd[p + h] for g, h in (
            ("attn_norm.weight", "input_layernorm.weight"),
            ("ffn_norm.weight", "post_attention_layernorm.weight"),
            ("attn_q.weight", "self_attn.q_proj.weight"),
            ("attn_k.weight", "self_attn.k_proj.weight"),
            ("attn_v.weight", "self_attn.v_proj.weight"),
            ("attn_output.weight", "self_attn.o_proj.weight"),
            ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            ("ffn_gate_inp.weight", "mlp.gate.weight"))})
        tensors.update({f"blk.{i}.ffn_{w}_exps.weight": np.stack(
            [sd[p + f"mlp.experts.{e}.{w}_proj.weight"] for e in range(c.num_experts)])
            for w in ("gate", "up", "down")})
    keys = {"embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
            "expert_feed_forward_length": c.moe_intermediate_size,
            "block_count": c.num_hidden_layers, "attention.head_count": c.num_attention_heads,
            "attention.head_count_kv": c.num_key_value_heads,
            "attention.key_length": c.head_dim, "context_length": 256,
            "vocab_size": c.vocab_size, "expert_count": c.num_experts,
            "expert_used_count": c.num_experts_per_tok,
            "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
            "rope.freq_base": float(c.rope_parameters["rope_theta"])}
    ids = list(np.random.default_rng(4).integers(0, 97, 37))
    theirs = hf_logits(hf, ids)
    scale = max(1.0, np.abs(theirs).max())
    lm = gguf_lm(write_gguf_model(tmp_path / "f.gguf", "qwen3moe", keys, tensors))
    assert lm.config.architecture == "Qwen3MoeForCausalLM" and lm.config.qk_norm
    assert np.max(np.abs(prefill_logits(lm, ids, block_size=8) - theirs)) <= 1e-4 * scale
    q8 = {n: "Q8_0" for n in tensors if "gate_exps" in n or "up_exps" in n}   # K = 64
    lm = gguf_lm(write_gguf_model(tmp_path / "q.gguf", "qwen3moe", keys, tensors, q8))
    assert lm.model.weights.layers[0].moe.gate_up[0].dtype == "w8"
    assert np.max(np.abs(prefill_logits(lm, ids, block_size=8) - theirs)) <= 0.05 * scale
