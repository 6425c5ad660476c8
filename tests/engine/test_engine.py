"""The engine end to end on a tiny random model: batching does not change
greedy tokens, preemption recomputes correctly, stop conditions, errors, no
leaked blocks, and no large allocation in a steady-state decode step."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from armllm.api import LLM
from armllm.sampling import SamplingParams
from tests.tiny_model import write_tiny_llama

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"))


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(2, 120, rng.integers(1, 40)))) for _ in range(n)]


def test_batch_equals_one_at_a_time(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    ps = prompts(6)
    alone = [llm.generate(p, GREEDY)[0].token_ids for p in ps]
    together = [o.token_ids for o in llm.generate(ps, GREEDY)]
    assert together == alone
    assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_chunked_prefill_does_not_change_tokens(model_dir, budget):
    ref = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    ps = prompts(5, seed=7)
    want = [o.token_ids for o in ref.generate(ps, GREEDY)]
    chunked = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, max_num_batched_tokens=budget)
    assert [o.token_ids for o in chunked.generate(ps, GREEDY)] == want


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_block_size_and_preemption_do_not_change_tokens(model_dir, block_size):
    ref = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    ps = prompts(5, seed=1)
    want = [o.token_ids for o in ref.generate(ps, GREEDY)]
    # 60 tokens of cache: 5 prompts cannot all run, so decodes preempt and recompute
    small = LLM(model_dir, dtype="float32", block_size=block_size,
                kv_cache_gib=60 * 2 * 2 * 2 * 16 * 2 / 2**30)
    got = [o.token_ids for o in small.generate(ps, GREEDY)]
    assert got == want
    assert small.engine.scheduler.num_preemptions > 0
    assert small.engine.blocks.num_free == small.engine.blocks.num_blocks


def test_stop_conditions(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    p = prompts(1, seed=3)[0]
    free = llm.generate(p, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    words = free.text.split()
    stop_word = words[3]
    cut = llm.generate(p, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                                         stop=[stop_word]))[0]
    assert cut.finish_reason == "stop" and stop_word not in cut.text
    assert free.text.startswith(cut.text)
    by_id = llm.generate(p, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                                           stop_token_ids=[free.token_ids[2]]))[0]
    assert by_id.finish_reason == "stop" and by_id.token_ids == free.token_ids[:3]


def test_seeded_sampling_is_reproducible(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    params = SamplingParams(max_tokens=15, temperature=1.0, seed=42, ignore_eos=True)
    p = prompts(1, seed=4)[0]
    assert llm.generate(p, params)[0].token_ids == llm.generate(p, params)[0].token_ids


def test_bad_requests_are_refused(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, max_model_len=64)
    with pytest.raises(ValueError, match="prompt token id 500 is outside the vocabulary"):
        llm.generate([3, 500], GREEDY)
    with pytest.raises(ValueError, match="max_model_len is 64"):
        llm.generate([3] * 70, GREEDY)
    with pytest.raises(ValueError, match="a prompt is a string or a list of token ids"):
        llm.generate([3.5], GREEDY)
    with pytest.raises(ValueError, match="dtype must be auto, bfloat16 or float32"):
        LLM(model_dir, dtype="int3")
    # the engine still serves after refusing
    assert len(llm.generate([3, 4], GREEDY)[0].token_ids) == 12


def test_chat_uses_the_template(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    out = llm.chat([{"role": "user", "content": "w5 w6"}], GREEDY)
    ids = llm.tokenizer.encode("user: w5 w6\nassistant:", add_special_tokens=False)
    assert out.prompt_token_ids == ids


def test_steady_state_decode_step_allocates_little(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    engine = llm.engine
    for i, p in enumerate(prompts(4, seed=5)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=200, temperature=0.0,
                                                      ignore_eos=True))
    for _ in range(5):  # prefill and warm-up
        engine.step()
    tracemalloc.start()
    for _ in range(20):
        engine.step()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20, f"decode steps allocated up to {peak} bytes"


def test_generation_config_defaults(tmp_path):
    import json
    model = write_tiny_llama(tmp_path / "m")
    (model / "generation_config.json").write_text(json.dumps({"do_sample": False,
                                                              "eos_token_id": 1}))
    llm = LLM(model, dtype="float32", kv_cache_gib=0.01)
    assert llm.default_sampling_params().temperature == 0.0
    assert llm.default_sampling_params(temperature=0.5).temperature == 0.5
    p = prompts(1, seed=6)[0]
    default = llm.generate(p)[0]
    greedy = llm.generate(p, SamplingParams(temperature=0.0))[0]
    assert default.token_ids == greedy.token_ids
    (model / "generation_config.json").write_text(json.dumps({"temperature": 500.0}))
    with pytest.raises(ValueError, match="generation_config.json: temperature must be in"):
        LLM(model, dtype="float32", kv_cache_gib=0.01).default_sampling_params()


def test_bad_checkpoints_name_the_file_and_tensor(tmp_path):
    import json

    from safetensors.numpy import load_file, save_file

    from armllm.model.loader import load_model
    model = write_tiny_llama(tmp_path / "m")
    tensors = load_file(str(model / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:5]
    save_file(tensors, str(model / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor model.layers.1.mlp.up_proj.weight has shape "
                                         r"\[5, 64\], expected \[96, 64\]"):
        load_model(model, "f32")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(model / "model.safetensors"))
    with pytest.raises(ValueError, match="missing tensor model.layers.1.mlp.up_proj.weight"):
        load_model(model, "f32")
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated file: tensor"):
        load_model(model, "f32")
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 3}))
    with pytest.raises(ValueError, match=r"config.json: config: num_attention_heads \(4\) must "
                                         r"be a multiple of num_key_value_heads \(3\)"):
        load_model(model, "f32")
    with pytest.raises(ValueError, match="a model is a directory or a .gguf file"):
        load_model(model / "config.json")


def test_unsupported_gguf_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    from armllm.model.loader import load_model
    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "falcon")
    writer.add_tensor("w", np.zeros((2, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="x.gguf: unsupported GGUF architecture 'falcon'"):
        load_model(tmp_path / "x.gguf")
