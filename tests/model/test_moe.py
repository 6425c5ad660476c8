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

from armllm.model.loader import load_model
from armllm.model.moe import route
from tests.model.test_llama_vs_transformers import hf_logits, make_tiny, prefill_logits

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
    from armllm import LLM, SamplingParams
    _, path, hf = moe_model
    llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01, max_num_seqs=4)
    prompt = [int(i) for i in np.random.default_rng(5).integers(0, 97, 12)]
    ours = llm.generate(prompt, SamplingParams(max_tokens=32, temperature=0.0,
                                               ignore_eos=True))[0].token_ids
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ours == theirs[0, len(prompt):].tolist()


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_batching_chunking_and_prefix_cache_change_no_token(moe_model, budget):
    """Requests alone equal the same requests batched, under prefill chunk budgets of
    1, 7 and 64 tokens, with the prefix cache on and off (a shared prompt prefix)."""
    from armllm import LLM, SamplingParams
    _, path, _ = moe_model
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
        ids, w = route(logits, k, norm)
        probs = torch.softmax(torch.tensor(logits), dim=-1)
        top_w, top_i = torch.topk(probs, k, dim=-1)
        if norm:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        np.testing.assert_array_equal(ids, top_i.numpy())
        np.testing.assert_allclose(w, top_w.numpy(), rtol=1e-6, atol=1e-7)
    assert list(route(logits, 2, True)[0][3]) == [2, 9]


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
