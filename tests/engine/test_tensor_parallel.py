"""Tensor parallel: an engine of 2 or 3 rank processes against the same model on
one rank (this box has 2 cores: the ranks oversubscribe them, which changes the
speed only). In f32, every logits row each step produced within 1e-4 of the
largest logit (the all-reduce sums the ranks' partial products in another order
than one GEMM does, so bits may differ) and greedy tokens identical over 64
steps: tiny Llama/Qwen/Mistral variants written by transformers, a MoE, SmolLM2
split 3 ways (9 heads: 3 each) and 2 ways (3 KV heads: 2 + 1), K-quant GGUF
blocks split as stored. Quantized and bf16 weights meet their existing
tolerances instead: shards keep whole quantization groups, but a residual
stream 1e-6 apart rounds an activation to another int8 (or bf16) step now and
then, which SmolLM2's massive activations amplify (measured: TP=3 Q4_1 logits
0.5-1.1 from TP=1's, as far as Q4_1's own from its f32 dequantization). Chunked
prefill, the prefix cache and n > 1 (copy-on-write block copies on every rank).
The splits a model does not allow are refused with the reason. Process
hygiene: no worker outlives its engine (normal shutdown, rank 0 killed),
nothing is left in /dev/shm."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from armllm import LLM, SamplingParams
from armllm.model.arch import load_hf_config
from armllm.model.sharding import plan_shards
from tests.processes import segments, tp_workers
from tests.test_sampling_defaults import tokenizer_metadata
from tests.tiny_model import write_tiny_gguf, write_tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.model.test_llama_vs_transformers import VARIANTS, make_tiny  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 71, 9], [40, 41, 42], [88, 3, 60, 61, 62, 63, 64, 12, 1]]


def run_logged(llm: LLM, prompts, params: SamplingParams) -> tuple[list, list[np.ndarray]]:
    """The outputs' token ids and every step's logits rows (copies), observed at the
    runner."""
    runner, rows = llm.engine.runner, []
    run = runner.run

    def observed(out, states):
        sampling, logits = run(out, states)
        rows.append(np.array(logits, copy=True))
        return sampling, logits
    runner.run = observed
    try:
        outs = llm.generate(prompts, params)
    finally:
        runner.run = run
    return [list(o.token_ids) for o in outs], rows


def assert_tp_matches(path, ranks: int, steps: int = 64, rtol: float = 1e-4, **engine):
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    one = LLM(path, **engine)
    want_ids, want_rows = run_logged(one, PROMPTS, params)
    before = segments()
    with LLM(path, tensor_parallel_size=ranks, **engine) as tp:
        workers = tp_workers(os.getpid())
        assert len(workers) == ranks - 1
        assert not segments() - before   # unlinked once every rank mapped it
        got_ids, got_rows = run_logged(tp, PROMPTS, params)
    assert got_ids == want_ids
    assert len(got_rows) == len(want_rows)
    worst = max(np.max(np.abs(a - b)) / max(1.0, np.abs(a).max())
                for a, b in zip(want_rows, got_rows, strict=True) if a.size)
    assert worst <= rtol, worst
    assert not tp_workers(os.getpid())
    return worst


@pytest.mark.parametrize("name", ["llama-gqa", "llama-tied-mha", "mistral-window",
                                  "qwen2-bias", "qwen3-qk-norm"])
def test_tp2_equals_tp1_f32(tmp_path, name):
    config_cls, model_cls, extra = VARIANTS[name]
    make_tiny(tmp_path, config_cls, model_cls, extra)
    assert_tp_matches(tmp_path, 2, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01)


SMOLLM2_F32 = dict(dtype="float32", quantization="none", kv_cache_dtype="f32",
                   kv_cache_gib=0.05, max_model_len=256)


def test_tp3_and_tp2_on_smollm2_f32(smollm2_gguf):
    """SmolLM2-135M's 9 query / 3 KV heads: 3 ranks of 3/1; 2 ranks of 6/2 and 3/1."""
    for ranks in (3, 2):
        assert_tp_matches(smollm2_gguf, ranks, steps=64, **SMOLLM2_F32)


def test_tp3_on_smollm2_q4_1_within_its_tolerance(smollm2_gguf):
    """The Q4_1 layers and Q8_0 head split as stored: next-token distributions of 3
    ranks against 1 within the bound Q4_1 itself meets against its dequantization
    (mean KL < 0.02 nats; the argmax in the other's top 3)."""
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was",
             "The history of the Roman Empire began", "Water boils at a temperature of",
             "import numpy as np\nx = np.", "My favourite colour is", "1, 2, 3, 4,"]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    one = LLM(smollm2_gguf, kv_cache_gib=0.05, max_model_len=256)
    prompts = [one.tokenizer.encode(t) for t in texts]
    _, (want,) = run_logged(one, prompts, params)
    with LLM(smollm2_gguf, tensor_parallel_size=3, kv_cache_gib=0.05, max_model_len=256) as tp:
        _, (got,) = run_logged(tp, prompts, params)
    a, b = (x.astype(np.float64) - x.max(axis=1, keepdims=True) for x in (want, got))
    a, b = (x - np.log(np.exp(x).sum(axis=1, keepdims=True)) for x in (a, b))
    kl = np.mean(np.sum(np.exp(a) * (a - b), axis=1))
    top3 = np.argsort(-a, axis=1)[:, :3]
    assert kl < 0.02, kl
    assert all(b[i].argmax() in top3[i] for i in range(len(texts)))


@pytest.mark.parametrize("engine", [{"dtype": "bfloat16"}, {"quantization": "w4a8"}],
                         ids=["bf16", "w4a8"])
def test_tp2_bf16_and_w4a8(tmp_path, engine):
    """Measured: 7.5e-4 (bf16) and 2.7e-3 (W4A8) of the largest logit; tokens equal."""
    write_tiny_llama(tmp_path, hidden=128, heads=4, kv_heads=2, inter=192)
    assert_tp_matches(tmp_path, 2, steps=32, rtol=1e-2, kv_cache_gib=0.01, **engine)


def test_kquant_blocks_split_as_stored(tmp_path):
    """Q4_K/Q6_K/Q5_K tensors cut at 256-column block boundaries (o's and down's input
    columns) and whole rows, run as stored on each rank."""
    types = {}
    for i in range(2):
        types |= {f"blk.{i}.attn_q.weight": "Q4_K", f"blk.{i}.attn_k.weight": "Q4_K",
                  f"blk.{i}.attn_v.weight": "Q6_K", f"blk.{i}.attn_output.weight": "Q4_K",
                  f"blk.{i}.ffn_gate.weight": "Q4_K", f"blk.{i}.ffn_up.weight": "Q5_K",
                  f"blk.{i}.ffn_down.weight": "Q6_K"}
    path = write_tiny_gguf(tmp_path / "k.gguf", types | {"token_embd.weight": "Q6_K"},
                           hidden=512, heads=8, kv_heads=2, inter=512,
                           metadata=tokenizer_metadata())
    assert_tp_matches(path, 2, steps=24, rtol=1e-2, dtype="float32", kv_cache_dtype="f32",
                      kv_cache_gib=0.01)


def test_moe_experts_split_within(tmp_path):
    make_tiny(tmp_path, "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
              {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
               "norm_topk_prob": True, "mlp_only_layers": [1], "num_hidden_layers": 3,
               "head_dim": 24})
    assert_tp_matches(tmp_path, 2, steps=32, dtype="float32", kv_cache_dtype="f32",
                      kv_cache_gib=0.01)


@pytest.mark.parametrize("budget", [1, 7])
def test_chunks_prefix_cache_and_forks(tmp_path, budget):
    """Chunked prefill, prefix cache hits on a shared prefix and n = 2 completions
    (their copy-on-write block copies run on every rank): the same tokens as one rank
    with the same settings, and as each prompt alone."""
    write_tiny_llama(tmp_path, hidden=64, heads=4, kv_heads=2, inter=96)
    shared = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
    prompts = [shared + [30, 31], shared + [40], shared + [50, 51, 52]]
    params = SamplingParams(max_tokens=12, n=2, temperature=0.8, seed=3, ignore_eos=True)
    engine = dict(dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01, block_size=4,
                  max_num_batched_tokens=max(budget, 6), max_num_seqs=6)
    want = [[c.token_ids for c in o.outputs]
            for o in LLM(tmp_path, **engine).generate(prompts, params)]
    with LLM(tmp_path, tensor_parallel_size=2, **engine) as tp:
        got = [[c.token_ids for c in o.outputs] for o in tp.generate(prompts, params)]
        assert tp.stats().prefix_cache_hits > 0
    assert got == want


def test_splits_that_cannot_be_are_refused(tmp_path):
    write_tiny_llama(tmp_path, hidden=64, heads=4, kv_heads=1, inter=128)
    c = load_hf_config(tmp_path)
    with pytest.raises(ValueError, match="4 query / 1 KV heads do not split over 3 ranks"):
        LLM(tmp_path, tensor_parallel_size=3)
    assert not tp_workers(os.getpid())   # refused before any rank started
    # KV heads shared by ranks: 4 ranks over 1 KV head, 1 query head each
    plans = plan_shards(c, 4)
    assert [p.kv_heads for p in plans] == [(0, 1)] * 4
    assert [p.q_heads for p in plans] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # a 256-column quantization block: o's input columns (16 a head) cannot be cut
    with pytest.raises(ValueError, match="inside a quantization block of 256 columns"):
        plan_shards(c, 2, k_unit=256)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer"):
        LLM(tmp_path, tensor_parallel_size=0)
    with pytest.raises(ValueError, match="names 1 CPU sets for 2 ranks"):
        LLM(tmp_path, tensor_parallel_size=2, cpus="0-1")


def test_plan_gives_every_column_once(tmp_path):
    """Shards tile each dimension: heads, MLP columns, vocabulary rows."""
    write_tiny_llama(tmp_path, hidden=96, heads=6, kv_heads=3, inter=160)
    c = load_hf_config(tmp_path)
    for ranks in (2, 3):
        plans = plan_shards(c, ranks)
        for field, total in (("q_heads", 6), ("kv_heads", 3), ("inter", 160),
                             ("vocab", c.vocab_size)):
            spans = [getattr(p, field) for p in plans]
            assert spans[0][0] == 0 and spans[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        kv = [p.kv_heads[1] - p.kv_heads[0] for p in plans]
        assert kv[0] == max(kv)   # rank 0 sizes the cache: it caches the most heads


def test_workers_exit_when_rank0_is_killed(tmp_path):
    """A worker whose engine process dies (SIGKILL: no cleanup runs) exits by itself."""
    write_tiny_llama(tmp_path, hidden=64, heads=4, kv_heads=2, inter=96)
    code = (f"from armllm import LLM; llm = LLM({str(tmp_path)!r}, tensor_parallel_size=2, "
            "kv_cache_gib=0.01); print('up', flush=True); import time; time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        workers = tp_workers(proc.pid)
        assert len(workers) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{workers[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stat = Path(f"/proc/{workers[0]}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"
    assert not any(s.startswith(f"armllm-tp-{proc.pid}-") for s in segments())


@pytest.mark.parametrize("layout", ["float", "mxfp4"])
def test_gpt_oss_sinks_biases_and_mxfp4_experts(tmp_path, layout):
    """GPT-OSS: each rank's attention sinks, o's and the experts' down biases counted
    once (rank 0's), gate/up biases split with their columns, MXFP4 experts cut at
    their 32-column blocks, sliding and full layers."""
    from tests.model.test_gpt_oss import GPT_OSS, randomize_sinks, write_mxfp4_checkpoint
    hf = make_tiny(tmp_path, "GptOssConfig", "GptOssForCausalLM", GPT_OSS)
    randomize_sinks(hf)
    if layout == "float":
        hf.save_pretrained(tmp_path, safe_serialization=True)
    else:
        (tmp_path / "model.safetensors").unlink()
        write_mxfp4_checkpoint(tmp_path, hf, np.random.default_rng(7))
    assert_tp_matches(tmp_path, 2, steps=32, rtol=1e-4 if layout == "float" else 1e-2,
                      dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01)


def test_pretended_topology_places_the_ranks(tmp_path, monkeypatch):
    """A faked two-node topology ($ARMLLM_SYSFS): rank 0 (this thread) runs on node 0's
    CPU and rank 1 on node 1's while the engine lives; the thread's CPUs come back
    after shutdown."""
    for node, cpu in ((0, 0), (1, 1)):
        d = tmp_path / "sys" / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(f"{cpu}\n")
    monkeypatch.setenv("ARMLLM_SYSFS", str(tmp_path / "sys"))
    model = write_tiny_llama(tmp_path / "m", hidden=64, heads=4, kv_heads=2, inter=96)
    before = os.sched_getaffinity(0)
    with LLM(model, tensor_parallel_size=2, kv_cache_gib=0.01) as tp:
        (worker,) = tp_workers(os.getpid())
        status = Path(f"/proc/{worker}/status").read_text()
        assert "Cpus_allowed_list:\t1\n" in status
        assert os.sched_getaffinity(0) == {0}
        assert tp.generate("w1 w2", SamplingParams(max_tokens=4))[0].token_ids
    assert os.sched_getaffinity(0) == before
