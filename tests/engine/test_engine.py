"""The engine end to end on a tiny random model: batching does not change
greedy tokens, preemption recomputes correctly, stop conditions, errors, no
leaked blocks, and no large allocation in a steady-state decode step."""
from __future__ import annotations

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


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("budget", [1, 7, 64])
def test_chunked_prefill_does_not_change_tokens(model_dir, budget, caching):
    ref = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, enable_prefix_caching=False)
    ps = prompts(5, seed=7)
    ps += [ps[0] + [5, 6, 7], ps[1] * 2]       # prefixes of earlier prompts
    want = [o.token_ids for o in ref.generate(ps, GREEDY)]
    chunked = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, max_num_batched_tokens=budget,
                  enable_prefix_caching=caching)
    assert [o.token_ids for o in chunked.generate(ps, GREEDY)] == want
    assert [o.token_ids for o in chunked.generate(ps, GREEDY)] == want  # now from the cache
    stats = chunked.stats()
    assert (stats.prefix_cache_hits > 0) == caching
    assert stats.num_free_blocks == stats.num_blocks


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


def test_prefix_cache_skips_the_shared_prefix(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, block_size=4)
    shared = prompts(1, seed=11)[0] * 3
    first = llm.generate(shared + [5], GREEDY)[0]
    before = llm.stats()
    second = llm.generate(shared + [6, 7], GREEDY)[0]
    after = llm.stats()
    cached = len(shared) // 4 * 4
    assert second.outputs[0].metrics.num_cached_prompt_tokens == cached
    assert after.prefix_cache_hits - before.prefix_cache_hits == cached
    # the model ran only the uncached prompt tokens and the decodes
    ran = after.num_computed_tokens - before.num_computed_tokens
    assert ran == len(shared) + 2 - cached + GREEDY.max_tokens - 1
    assert first.finish_reason == second.finish_reason == "length"


@pytest.mark.parametrize("kv_blocks", [None, 11])
def test_parallel_sampling_shares_the_prompt(model_dir, kv_blocks):
    """n greedy completions equal the single-request output; the prompt runs once
    (unless a tiny cache forces preemption, which must not change tokens)."""
    kw = {"kv_cache_gib": 0.01} if kv_blocks is None else {
        "block_size": 4, "kv_cache_gib": kv_blocks * 2 * 2 * 2 * 4 * 16 * 4 / 2**30,
        "kv_cache_dtype": "f32"}
    llm = LLM(model_dir, dtype="float32", **kw)
    p = prompts(1, seed=12)[0][:18] + [9, 9]
    before = llm.stats()
    out = llm.generate(p, SamplingParams(**{**GREEDY.__dict__, "n": 3}))[0]
    ran = llm.stats().num_computed_tokens - before.num_computed_tokens
    want = llm.generate(p, GREEDY)[0].token_ids
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(c.token_ids == want and c.finish_reason == "length" for c in out.outputs)
    if kv_blocks is None:
        assert ran == len(p) + 3 * (GREEDY.max_tokens - 1)
    else:
        assert llm.stats().num_preemptions > before.num_preemptions
    assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks


def full_recompute_logprobs(llm, ids: list[int]) -> np.ndarray:
    """log-softmax of every row of one fresh full prefill of ids."""
    from armllm.model.decoder import BatchMeta, KVCache, Workspace
    model, t = llm.engine.runner.model, len(ids)
    kv = KVCache(model.config, -(-t // 16), 16, "f32")
    ws = Workspace(model.config, t, t, model.formats)
    meta = BatchMeta(np.asarray(ids, np.int32), np.arange(t, dtype=np.int32),
                     np.arange(t, dtype=np.int32), np.asarray([0, t], np.int32),
                     np.asarray([t], np.int32),
                     np.arange(kv.num_blocks, dtype=np.int32).reshape(1, -1),
                     np.arange(t, dtype=np.int64))
    logits = model.forward(meta, kv, ws).astype(np.float64)
    m = logits.max(axis=1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))


def test_parallel_samples_read_their_own_kv_after_copy_on_write(model_dir):
    """Sampled completions diverge inside the shared last prompt block; each one's
    logprobs must equal a full recompute of its own tokens (a wrong copy on write
    would let one read another's K/V)."""
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, kv_cache_dtype="f32", block_size=8)
    p = prompts(1, seed=13)[0][:13]                      # the last block is shared, 5/8 full
    params = SamplingParams(max_tokens=10, temperature=1.5, seed=3, n=4, logprobs=0,
                            ignore_eos=True)
    out = llm.generate(p, params)[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        ref = full_recompute_logprobs(llm, p + c.token_ids)
        want = [ref[len(p) - 1 + i, tok] for i, tok in enumerate(c.token_ids)]
        got = [lp for _, lp, _ in c.logprobs]
        np.testing.assert_allclose(got, want, atol=1e-4)
    single = llm.generate(p, SamplingParams(**{**params.__dict__, "n": 1}))[0]
    assert single.token_ids == out.outputs[0].token_ids   # completion 0: the request's seed


def test_abort_frees_blocks_now_and_reports_at_the_next_step(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    engine = llm.engine
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True, n=2)
    engine.add_request("a", prompts(1, seed=14)[0], params)
    engine.add_request("b", prompts(1, seed=15)[0], SamplingParams(max_tokens=5,
                                                                   ignore_eos=True))
    for _ in range(3):
        engine.step()
    used = engine.blocks.num_blocks - engine.blocks.num_free
    assert engine.abort("a") is True
    assert engine.blocks.num_blocks - engine.blocks.num_free < used
    outs = engine.step()
    assert sorted((o.request_id, o.index, o.finish_reason) for o in outs
                  if o.request_id == "a") == [("a", 0, "abort"), ("a", 1, "abort")]
    assert engine.abort("a") is False and engine.abort("nobody") is False
    while engine.has_unfinished():
        engine.step()
    assert engine.abort("b") is False
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.stats().finished == {"abort": 2, "length": 1}


def test_abort_before_the_prompt_runs_ends_every_completion(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    llm.engine.add_request("a", [3, 4, 5], SamplingParams(max_tokens=5, n=3))
    llm.engine.abort("a")
    outs = llm.engine.step()
    assert sorted(o.index for o in outs) == [0, 1, 2]
    assert all(o.finish_reason == "abort" for o in outs) and not llm.engine.has_unfinished()


def test_stream_closed_early_aborts(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    stream = llm.stream(prompts(1, seed=16)[0], SamplingParams(max_tokens=40, ignore_eos=True))
    next(stream)
    stream.close()
    assert not llm.engine.has_unfinished()
    assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks


def test_timings_and_stats(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    outs = llm.generate(prompts(3, seed=17), GREEDY)
    for o in outs:
        m = o.outputs[0].metrics
        assert m.arrival <= m.first_scheduled <= m.first_token <= m.finished
        assert len(m.token_times) == m.num_output_tokens == GREEDY.max_tokens
        assert m.token_times == sorted(m.token_times) and m.token_times[-1] <= m.finished
        assert m.queue_s >= 0 and m.ttft_s > 0 and m.tpot_s > 0 and m.e2e_s >= m.ttft_s
        assert len(m.itl_s) == GREEDY.max_tokens - 1
    s = llm.stats()
    assert s.num_running == s.num_waiting == 0 and s.kv_usage == 0.0
    assert s.num_generation_tokens == 3 * GREEDY.max_tokens
    assert s.num_prompt_tokens == sum(len(o.prompt_token_ids) for o in outs)
    assert s.finished == {"length": 3} and s.num_steps > 0


def test_a_failing_request_does_not_stop_the_others(model_dir, monkeypatch):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    engine = llm.engine
    sample = engine.runner.sample

    def flaky(jobs, logits, masks):
        sample(jobs, logits, masks)
        for job in jobs:
            if job.seq.request_id == "bad" and len(job.seq.output_ids) == 2:
                job.error = RuntimeError("sampler exploded")

    monkeypatch.setattr(engine.runner, "sample", flaky)
    engine.add_request("bad", [3, 4, 5], GREEDY)
    engine.add_request("good", [3, 4, 5], GREEDY)
    ends = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finish_reason:
                ends[o.request_id] = (o.finish_reason, o.error)
    assert ends == {"bad": ("error", "RuntimeError: sampler exploded"), "good": ("length", None)}
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_priority_admits_urgent_requests_first(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, max_num_seqs=1)
    engine = llm.engine
    engine.add_request("later", [3, 4], GREEDY, priority=1)
    engine.add_request("urgent", [5, 6], GREEDY, priority=-1)
    first_done = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.finish_reason and first_done is None:
                first_done = o.request_id
    assert first_done == "urgent"


def test_no_memory_growth_over_a_thousand_requests(model_dir):
    import gc
    import resource  # noqa: F401  (Linux: RSS from /proc below)

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, max_num_seqs=16)
    params = SamplingParams(max_tokens=4, temperature=0.8, seed=1, ignore_eos=True)
    rng = np.random.default_rng(18)

    def batch(n):
        ps = [list(map(int, rng.integers(2, 120, rng.integers(1, 30)))) for _ in range(n)]
        llm.generate(ps, params)

    for _ in range(4):  # warm-up: allocator pools, caches
        batch(50)
    gc.collect()
    start = rss_mib()
    for _ in range(20):
        batch(50)
    gc.collect()
    grown = rss_mib() - start
    assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks
    assert not llm.engine._requests and not llm.engine.scheduler._order
    assert not llm.engine._states
    assert grown < 8.0, f"RSS grew {grown:.1f} MiB over 1,000 requests"  # stated margin: 8 MiB


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


def test_a_stop_string_spanning_the_first_tokens_is_found(model_dir):
    """While the text is shorter than a stop string, all of it is held back (none of
    a stop string may stream before the match is decided)."""
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    p = prompts(1, seed=3)[0]
    free = llm.generate(p, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))[0]
    stop = " ".join(free.text.split()[:3])
    for n in (1, 2):
        cut = llm.generate(p, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                                             stop=[stop], n=n))[0]
        for c in cut.outputs:
            assert c.finish_reason == "stop" and stop not in c.text
            assert c.token_ids == free.token_ids[:len(c.token_ids)]
            assert stop in llm.tokenizer.decode(c.token_ids) and free.text.startswith(c.text)


def test_seeded_sampling_is_reproducible(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    params = SamplingParams(max_tokens=15, temperature=1.0, seed=42, ignore_eos=True)
    p = prompts(1, seed=4)[0]
    assert llm.generate(p, params)[0].token_ids == llm.generate(p, params)[0].token_ids


def test_bad_requests_are_refused(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, max_model_len=64)
    with pytest.raises(ValueError, match="prompt token id 500 is outside the vocabulary"):
        llm.generate([3, 500], GREEDY)
    with pytest.raises(ValueError, match=r"maximum context length \(max_model_len\) is 64"):
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
    with pytest.raises(ValueError, match="sampling defaults: temperature must be in"):
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
    with pytest.raises(ValueError, match="a model is a directory, a .gguf file or a whisper.cpp"):
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
