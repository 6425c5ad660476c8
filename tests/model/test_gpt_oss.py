"""GPT-OSS against HF transformers: tiny random checkpoints written by transformers
(biased q/k/v/o, router and experts, attention sinks, sliding and full layers
alternating, YaRN RoPE, the clamped SwiGLU), in the float layout transformers
saves and in the Hub's MXFP4 layout (experts as *_blocks/*_scales, decoded for the
oracle by transformers' own converter): f32 logits within 1e-4 of the largest
logit, greedy tokens identical over 32 steps, the engine's batching, chunking and
prefix caching change no token, the MXFP4 experts run as stored.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from armllm.model.loader import load_model
from tests.model.test_llama_vs_transformers import (
    greedy_pair,
    hf_logits,
    make_tiny,
    prefill_logits,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# 3 layers: sliding, full, sliding; a window of 5 under prompts of 12-37 tokens; YaRN
# with a short original context, so that its ramp and attention factor both matter
GPT_OSS = {"num_local_experts": 6, "num_experts_per_tok": 2, "intermediate_size": 64,
           "num_hidden_layers": 3, "head_dim": 16, "sliding_window": 5,
           "rope_parameters": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "rope_theta": 10000.0,
                               "original_max_position_embeddings": 32}}


def randomize_sinks(hf):
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.copy_(torch.randn_like(layer.self_attn.sinks))


def write_mxfp4_checkpoint(path, hf, rng):
    """Gives hf random MXFP4 experts and writes its checkpoint in the Hub's layout:
    transformers' float experts replaced by *_blocks [E, N, K/32, 16] and *_scales
    [E, N, K/32] (scales 2^-9..2^-5, so that expert outputs stay near the float
    init's), quantization_config mxfp4. The oracle's experts are transformers'
    convert_moe_packed_tensors of the same bytes."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    c = hf.config
    e, h, inter = c.num_local_experts, c.hidden_size, c.intermediate_size
    tensors = {k: v.contiguous() for k, v in hf.state_dict().items()
               if not k.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    for i, layer in enumerate(hf.model.layers):
        for name, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
            blocks = torch.from_numpy(rng.integers(0, 256, (e, n, k // 32, 16), np.uint8))
            scales = torch.from_numpy(rng.integers(118, 123, (e, n, k // 32), np.uint8))
            with torch.no_grad():
                getattr(layer.mlp.experts, name).copy_(
                    convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            stem = f"model.layers.{i}.mlp.experts.{name}"
            tensors[f"{stem}_blocks"], tensors[f"{stem}_scales"] = blocks, scales
    path.mkdir(exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    cfg = hf.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4",
                                  "modules_to_not_convert": ["model.layers.*.self_attn",
                                                             "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module", params=["float", "mxfp4"])
def gpt_oss(request, tmp_path_factory):
    """(layout, checkpoint dir, transformers model of the same weights)."""
    path = tmp_path_factory.mktemp(f"gpt-oss-{request.param}")
    hf = make_tiny(path, "GptOssConfig", "GptOssForCausalLM", GPT_OSS)
    randomize_sinks(hf)
    if request.param == "float":
        hf.save_pretrained(path, safe_serialization=True)
    else:
        (path / "model.safetensors").unlink()
        write_mxfp4_checkpoint(path, hf, np.random.default_rng(7))
    return request.param, path, hf


def test_config(gpt_oss):
    _, path, hf = gpt_oss
    c = load_model(path, "f32").config
    assert c.architecture == "GptOssForCausalLM" and c.moe_layers == (0, 1, 2)
    assert c.sliding_layers == (0, 2) and [c.window(i) for i in range(3)] == [5, 0, 5]
    assert hf.config.layer_types == ["sliding_attention", "full_attention",
                                     "sliding_attention"]
    assert c.attention_sinks and c.o_bias and c.moe_bias and c.clamped_swiglu == (1.702, 7.0)


def test_mxfp4_experts_run_as_stored(gpt_oss):
    layout, path, _ = gpt_oss
    lm = load_model(path, "f32")
    experts = lm.model.weights.layers[1].moe
    if layout == "mxfp4":
        assert {w.dtype for w in experts.gate_up + experts.down} == {"gguf"}
        assert experts.gate_up[0].gguf_types == (39, 39)   # MXFP4 gate and up, fused
        assert "MXFP4 (checkpoint, as stored)" in lm.model.weights.quantization
    else:
        assert {w.dtype for w in experts.gate_up + experts.down} == {"f32"}


def test_logits_match_transformers(gpt_oss):
    """Float experts: 1e-4 of the largest logit. MXFP4 experts run on int8 activations
    (the GGUF-block GEMM's): within their rounding of transformers' f32 experts, and
    the same file with the experts decoded to f32 (--quantization none) within 1e-4."""
    layout, path, hf = gpt_oss
    lm = load_model(path, "f32")
    exact = lm if layout == "float" else load_model(path, "f32", quantization="none")
    for seed in (1, 2):
        ids = list(np.random.default_rng(seed).integers(0, 97, 37))
        theirs = hf_logits(hf, ids)
        scale = max(1.0, np.abs(theirs).max())
        ours = prefill_logits(exact, ids, block_size=8)
        assert np.max(np.abs(ours - theirs)) <= 1e-4 * scale
        if layout == "mxfp4":
            ours = prefill_logits(lm, ids, block_size=8)
            assert np.max(np.abs(ours - theirs)) <= 0.05 * scale


def test_greedy_decode_matches_transformers(gpt_oss):
    """32 greedy tokens through the engine (paged decode past the window) equal
    transformers' greedy, experts decoded to f32 for the MXFP4 layout. The sliding
    layers' KV lives in a pool of its own sized to the window, whose null block (where
    tables point out of the window) holds NaN here: no kernel may read it."""
    from armllm import LLM
    from armllm.model.kv_cache import window_pool_blocks
    layout, path, hf = gpt_oss
    llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01, max_num_seqs=4,
              quantization="none", block_size=2, max_num_batched_tokens=16)
    kv, pools = llm.engine.runner.kv, llm.engine.scheduler.blocks.pools
    full, window = kv.groups
    assert (full.window, full.layers, window.window, window.layers) == (0, (1,), 5, (0, 2))
    assert window.num_blocks == 2 * (4 * 4 + 8) == window_pool_blocks(
        llm.loaded.config, 2, 4, 16, llm.max_model_len)
    assert [(p.window, p.num_blocks) for p in pools] == kv.pool_layout
    for i in window.layers:
        kv.k[i][:, window.num_blocks] = kv.v[i][:, window.num_blocks] = np.nan
    prompt = [int(i) for i in np.random.default_rng(5).integers(0, 97, 12)]
    ours, theirs = greedy_pair(llm, hf, prompt, 32)
    assert ours == theirs
    assert pools[1].num_blocks - len(pools[1].free) == 0   # every block back


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_batching_chunking_and_prefix_cache_change_no_token(gpt_oss, budget):
    """Requests alone equal the same requests batched, under prefill chunk budgets of 1,
    7 and 64 tokens, prefix cache on and off (a shared prefix longer than the window)."""
    from tests.model.test_moe import assert_batching_changes_no_token
    assert_batching_changes_no_token(gpt_oss[1], budget)


def test_prefix_hits_past_the_window_change_no_token(gpt_oss):
    """A request whose 23-token prefix another one computed before starts after it:
    the full layer's blocks of the whole prefix and the sliding layers' blocks of the
    window before its first new token come from the prefix cache, and its tokens are
    those it gets with no cache at all."""
    from armllm import LLM, SamplingParams
    path = gpt_oss[1]
    rng = np.random.default_rng(9)
    shared = [int(i) for i in rng.integers(0, 97, 23)]
    first, second = shared + [1, 2, 3], shared + [4, 5, 6, 7, 8]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    args = {"dtype": "float32", "kv_cache_dtype": "f32", "kv_cache_gib": 0.01,
            "max_num_seqs": 2, "block_size": 4, "quantization": "none"}
    cold = LLM(path, enable_prefix_caching=False, **args)
    want = cold.generate(second, params)[0].token_ids
    llm = LLM(path, **args)
    llm.generate(first, params)
    got = llm.generate(second, params)[0]
    assert got.metrics["num_cached_prompt_tokens"] == 20      # five whole blocks
    assert got.token_ids == want


def test_plan_counts_total_and_active_parameters(gpt_oss, capsys):
    """`armllm plan`: every parameter transformers' model holds (biases and sinks
    included), and per token all but the unrouted experts' (with their biases)."""
    from armllm.cli import main
    layout, path, hf = gpt_oss
    assert main(["plan", str(path), "--json", "--bandwidth-gbs", "10", "--max-model-len",
                 "64", "--max-num-seqs", "1"]) == 0
    p = json.loads(capsys.readouterr().out)
    c = load_model(path, "bf16").config
    expert = 3 * c.hidden_size * c.moe_intermediate_size + 2 * c.moe_intermediate_size \
        + c.hidden_size
    assert p["params"]["total"] == hf.num_parameters()
    unrouted = c.num_layers * (c.num_experts - c.experts_per_token) * expert
    assert p["params"]["active"] == hf.num_parameters() - unrouted


def test_plan_sizes_the_sliding_layers_pool_as_the_engine_does(gpt_oss, capsys):
    """The plan's KV cache is the engine's, byte for byte: the full layer at full
    length for every sequence, the two sliding layers in a pool sized to the window."""
    from armllm import LLM
    from armllm.cli import main
    path = gpt_oss[1]
    flags = {"max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 16,
             "block_size": 2}
    argv = [a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    assert main(["plan", str(path), "--json", "--bandwidth-gbs", "10", *argv]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    pool = kv["window_pool"]
    assert (pool["layers"], pool["window"], pool["blocks"]) == (2, 5, 2 * (4 * 4 + 8))
    llm = LLM(path, **flags)
    assert llm.engine.runner.kv.nbytes == kv["bytes"]
    per_layer_block = 2 * 2 * 2 * 16 * 2   # K and V, 2 KV heads, 2 tokens, head_dim 16, bf16
    assert pool["saved_bytes"] == (4 * 256 // 2 - pool["blocks"]) * 2 * per_layer_block


def test_gguf_with_mxfp4_experts_matches_transformers(tmp_path):
    """A GPT-OSS GGUF as llama.cpp's converter writes it ("gpt-oss": gate and up
    de-interleaved into their own stacked tensors and biases, post_attention_norm,
    attn_sinks, YaRN keys), its experts MXFP4 by the gguf package's quantizer; the
    oracle's experts are the gguf package's decoding of the same blocks. Decoded
    to f32 (--quantization none): 1e-4; as stored (int8 activations): 0.05."""
    import gguf

    from tests.model.test_moe import gguf_lm
    from tests.tiny_model import write_gguf_model
    hf = make_tiny(tmp_path / "hf", "GptOssConfig", "GptOssForCausalLM", GPT_OSS)
    randomize_sinks(hf)
    c = hf.config
    sd = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"],
               "output_norm.weight": sd["model.norm.weight"],
               "output.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors.update({f"blk.{i}.{g}": sd[p + h] for g, h in (
            ("attn_norm.weight", "input_layernorm.weight"),
            ("post_attention_norm.weight", "post_attention_layernorm.weight"),
            ("attn_sinks.weight", "self_attn.sinks"),
            ("ffn_gate_inp.weight", "mlp.router.weight"),
            ("ffn_gate_inp.bias", "mlp.router.bias"),
            ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
            *((f"attn_{g}.{t}", f"self_attn.{h}_proj.{t}") for g, h in (
                ("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
              for t in ("weight", "bias")))})
        gate_up = sd[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1)   # [E, 2I, H]
        bias = sd[p + "mlp.experts.gate_up_proj_bias"]
        tensors.update({f"blk.{i}.ffn_gate_exps.weight": gate_up[:, 0::2],
                        f"blk.{i}.ffn_up_exps.weight": gate_up[:, 1::2],
                        f"blk.{i}.ffn_down_exps.weight":
                            sd[p + "mlp.experts.down_proj"].transpose(0, 2, 1),
                        f"blk.{i}.ffn_gate_exps.bias": bias[:, 0::2],
                        f"blk.{i}.ffn_up_exps.bias": bias[:, 1::2]})
    mxfp4 = {n: "MXFP4" for n in tensors if n.endswith("_exps.weight")}
    keys = {"embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
            "expert_feed_forward_length": c.intermediate_size,
            "block_count": c.num_hidden_layers, "attention.head_count": c.num_attention_heads,
            "attention.head_count_kv": c.num_key_value_heads,
            "attention.key_length": c.head_dim, "context_length": 256,
            "vocab_size": c.vocab_size, "expert_count": c.num_local_experts,
            "expert_used_count": c.num_experts_per_tok,
            "attention.sliding_window": c.sliding_window,
            "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
            "rope.freq_base": float(c.rope_parameters["rope_theta"]),
            "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
            "rope.scaling.original_context_length": 32}
    path = write_gguf_model(tmp_path / "m.gguf", "gpt-oss", keys, tensors, mxfp4)
    stored = gguf.GGUFReader(str(path))
    with torch.no_grad():   # the oracle runs on the values the file holds
        for t in stored.tensors:
            if t.name.endswith("_exps.weight"):
                i, kind = int(t.name.split(".")[1]), t.name.split(".")[2]
                w = gguf.quants.dequantize(t.data, t.tensor_type)   # [E, N, K]
                experts = hf.model.layers[i].mlp.experts
                if kind == "ffn_down_exps":
                    experts.down_proj.copy_(torch.from_numpy(w.transpose(0, 2, 1).copy()))
                else:
                    cols = slice(0, None, 2) if kind == "ffn_gate_exps" else slice(1, None, 2)
                    experts.gate_up_proj[:, :, cols] = torch.from_numpy(
                        w.transpose(0, 2, 1).copy())
    lm, exact = gguf_lm(path), gguf_lm(path, "none")
    assert lm.config.architecture == "GptOssForCausalLM" and lm.config.sliding_layers == (0, 2)
    assert lm.config.rope_scaling["rope_type"] == "yarn"
    assert lm.model.weights.layers[0].moe.gate_up[0].gguf_types == (39, 39)
    ids = list(np.random.default_rng(3).integers(0, 97, 37))
    theirs = hf_logits(hf, ids)
    scale = max(1.0, np.abs(theirs).max())
    assert np.max(np.abs(prefill_logits(exact, ids, block_size=8) - theirs)) <= 1e-4 * scale
    assert np.max(np.abs(prefill_logits(lm, ids, block_size=8) - theirs)) <= 0.05 * scale
