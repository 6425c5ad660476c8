"""Logits of armllm's Llama-family graph against HF transformers (torch, CPU):
the real SmolLM2-135M-Instruct GGUF (transformers loads the GGUF itself, an
oracle independent of armllm's loader) and tiny random checkpoints of every
supported architecture, written by transformers as safetensors.

Tolerances: f32 weights, max |logit difference| <= 5e-4 (logits are O(10);
measured 1.3e-4). bf16 weights and KV cache against transformers in f32:
<= 0.5 (measured 0.23) and the same argmax on at least 90% of rows (measured
all). Tiny models: 1e-4 relative to the largest logit.
"""
from __future__ import annotations

import numpy as np
import pytest

from armllm.model.decoder import BatchMeta, KVCache, Workspace
from armllm.model.loader import load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"]


def prefill_logits(lm, ids, block_size=16, kv_dtype="f32"):
    """All rows' logits for one prompt, through a scrambled paged cache."""
    t = len(ids)
    n_blocks = -(-t // block_size)
    table = (np.arange(n_blocks, dtype=np.int32)[::-1] + 1).reshape(1, -1).copy()
    slots = (table[0, np.arange(t) // block_size] * block_size
             + np.arange(t) % block_size).astype(np.int32)
    kv = KVCache(lm.config, n_blocks + 1, block_size, kv_dtype, state_slots=1)
    ws = Workspace(lm.config, t, t, lm.model.formats)
    meta = BatchMeta(np.asarray(ids, np.int32), np.arange(t, dtype=np.int32), slots,
                     np.array([0, t], np.int32), np.array([t], np.int32), table, np.arange(t),
                     state_slots=np.zeros(1, np.int32))
    return lm.model.forward(meta, kv, ws).copy()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def greedy_pair(llm, hf, prompt: list[int], n: int) -> tuple[list[int], list[int]]:
    """n greedy tokens after prompt from armllm's LLM and from transformers' generate."""
    from armllm import SamplingParams
    ours = llm.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0,
                                               ignore_eos=True))[0].token_ids
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return list(ours), theirs[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32)
    return smollm2_gguf, hf


def test_smollm2_f32_logits_match_transformers(smollm2):
    path, hf = smollm2
    lm = load_model(path, "f32", quantization="none")
    for prompt in PROMPTS:
        ids = lm.tokenizer.encode(prompt, add_special_tokens=False).ids
        ours, theirs = prefill_logits(lm, ids), hf_logits(hf, ids)
        assert np.max(np.abs(ours - theirs)) <= 5e-4, prompt


def test_smollm2_bf16_logits_close_to_transformers(smollm2):
    path, hf = smollm2
    lm = load_model(path, "bf16", quantization="none")
    for prompt in PROMPTS:
        ids = lm.tokenizer.encode(prompt, add_special_tokens=False).ids
        ours, theirs = prefill_logits(lm, ids, kv_dtype="bf16"), hf_logits(hf, ids)
        assert np.max(np.abs(ours - theirs)) <= 0.5, prompt
        assert np.mean(ours.argmax(-1) == theirs.argmax(-1)) >= 0.9, prompt


# ------------------------------------------------------- tiny random models

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5)

VARIANTS = {
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-tied-mha": ("LlamaConfig", "LlamaForCausalLM",
                       {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "llama3-rope-scaling": ("LlamaConfig", "LlamaForCausalLM", {
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    "llama-head-dim": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 32}),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 7}),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3-qk-norm": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
}


def make_tiny(tmp_path, config_cls, model_cls, extra, seed=0):
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**TINY, **extra})
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # random norms and biases, so that they matter
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(97)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return model


@pytest.mark.parametrize("name", list(VARIANTS))
def test_tiny_models_match_transformers(tmp_path, name):
    config_cls, model_cls, extra = VARIANTS[name]
    hf = make_tiny(tmp_path, config_cls, model_cls, extra)
    lm = load_model(tmp_path, "f32")
    ids = list(np.random.default_rng(1).integers(0, 97, 40))
    ours, theirs = prefill_logits(lm, ids, block_size=8), hf_logits(hf, ids)
    assert np.max(np.abs(ours - theirs)) <= 1e-4 * max(1.0, np.abs(theirs).max())


# f32 caches; bf16 caches with head_dim 32, which AMX attention computes on tiles (its
# decode tiles hold one row's queries, its prefill tiles many rows: the same bits); int8
# caches (each row quantized once, when written)
@pytest.mark.parametrize(("extra", "kv_dtype"), [({}, "f32"), ({"head_dim": 32}, "bf16"),
                                                 ({}, "int8")])
def test_incremental_paged_decode_equals_full_recompute(tmp_path, extra, kv_dtype):
    hf = make_tiny(tmp_path, "LlamaConfig", "LlamaForCausalLM", extra)
    del hf
    lm = load_model(tmp_path, "f32")
    ids = list(np.random.default_rng(2).integers(0, 97, 30))
    full = prefill_logits(lm, ids, block_size=4, kv_dtype=kv_dtype)
    bs, n_blocks = 4, 8
    table = np.array([[3, 7, 1, 0, 5, 2, 6, 4]], np.int32)
    kv = KVCache(lm.config, n_blocks, bs, kv_dtype)
    ws = Workspace(lm.config, 30, 30)
    prompt = 11
    for start, stop in [(0, prompt)] + [(i, i + 1) for i in range(prompt, 30)]:
        rows = np.arange(start, stop)
        meta = BatchMeta(np.asarray(ids[start:stop], np.int32), rows.astype(np.int32),
                         (table[0, rows // bs] * bs + rows % bs).astype(np.int32),
                         np.array([0, stop - start], np.int32), np.array([stop], np.int32),
                         table, np.arange(stop - start))
        step = lm.model.forward(meta, kv, ws)
        np.testing.assert_array_equal(step, full[start:stop])


def test_smollm2_greedy_continuation_matches_transformers(smollm2):
    """64 greedy tokens through armllm's engine (paged decode) equal transformers' greedy."""
    from armllm import LLM
    path, hf = smollm2
    llm = LLM(path, dtype="float32", kv_cache_gib=0.1, max_num_seqs=2, quantization="none")
    prompt = llm.chat_prompt([{"role": "user", "content": "Tell me about the Moon."}])
    ours, theirs = greedy_pair(llm, hf, prompt, 64)
    assert ours == theirs


def test_thread_count_does_not_change_tokens(tmp_path):
    """Kernels partition outputs, never reductions: any pool gives the same logits."""
    import os
    import subprocess
    import sys
    make_tiny(tmp_path, "LlamaConfig", "LlamaForCausalLM", {})
    code = ("import sys; from armllm import LLM, SamplingParams; "
            f"llm = LLM({str(tmp_path)!r}, dtype='float32', kv_cache_gib=0.01); "
            "print(llm.generate([5, 6, 7, 8], SamplingParams(max_tokens=20, temperature=0.0, "
            "ignore_eos=True))[0].token_ids)")
    outs = set()
    for threads in ("1", "2", "3"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "ARMLLM_NUM_THREADS": threads}, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout.strip())
    assert len(outs) == 1


def test_sharded_float16_checkpoint(tmp_path):
    """f16 weights in several safetensors shards with an index."""
    import shutil
    hf = make_tiny(tmp_path / "src", "LlamaConfig", "LlamaForCausalLM", {})
    hf.to(torch.float16).save_pretrained(tmp_path / "f16", safe_serialization=True,
                                         max_shard_size="60KB")
    shutil.copy(tmp_path / "src" / "tokenizer.json", tmp_path / "f16" / "tokenizer.json")
    assert (tmp_path / "f16" / "model.safetensors.index.json").exists()
    lm = load_model(tmp_path / "f16", "f32")
    ids = list(np.random.default_rng(3).integers(0, 97, 20))
    theirs = hf_logits(hf.to(torch.float16).float(), ids)  # the f16 values, computed in f32
    bound = 1e-4 * max(1.0, np.abs(theirs).max())
    assert np.max(np.abs(prefill_logits(lm, ids) - theirs)) <= bound
