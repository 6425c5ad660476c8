"""`armllm bench throughput`, `armllm bench latency` and `armllm plan`: exact
request and token counts, figures that agree with each other, the sampling
the requests use (the model's defaults unless the command line overrides them,
stated in the results), and plan numbers equal to an independent calculation
from the model config and to what loading the model really allocates."""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest

from armllm.cli import main
from armllm.engine.llm_engine import LLMEngine
from armllm.model.arch import load_hf_config
from armllm.model.decoder import Workspace
from tests.tiny_model import write_tiny_llama

MiB = 2**20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-offline"))


# what the generation_config.json of tiny_with_defaults sets
MODEL_DEFAULTS = {"temperature": 0.6, "top_p": 0.95}


@pytest.fixture(scope="module")
def tiny_with_defaults(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny-defaults"))
    (path / "generation_config.json").write_text(json.dumps(MODEL_DEFAULTS))
    return path


def run_json(capsys, argv: list[str], path) -> tuple[dict, str]:
    assert main([*argv, "--json", str(path)]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("armllm: error: ")
    return err[0]


# a KV block of the tiny model: K and V, 2 layers, 2 KV heads, 16 tokens, dim 16, bf16
TINY_KV_BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 2


# -- bench throughput --------------------------------------------------------------------

@pytest.mark.parametrize("engine", [
    [],                                                        # every prompt in one step
    ["--max-num-seqs", "4", "--max-num-batched-tokens", "32"],  # waves, chunks, mixed steps
])
def test_throughput_counts_and_consistent_figures(tiny, tmp_path, capsys, engine):
    n, n_in, n_out = 6, 20, 7
    r, text = run_json(capsys, ["bench", "throughput", str(tiny), "--num-prompts", str(n),
                                "--input-len", str(n_in), "--output-len", str(n_out),
                                *engine], tmp_path / "t.json")
    assert r["num_prompts"] == n and len(r["requests"]) == n
    assert all(q["num_prompt_tokens"] == n_in and q["num_output_tokens"] == n_out
               for q in r["requests"])
    assert (r["num_prompt_tokens"], r["num_output_tokens"]) == (n * n_in, n * n_out)
    wall = r["elapsed_s"]
    assert r["requests_per_s"] == pytest.approx(n / wall)
    assert r["output_tokens_per_s"] == pytest.approx(n * n_out / wall)
    assert r["total_tokens_per_s"] == pytest.approx(n * (n_in + n_out) / wall)
    p, d = r["prefill"], r["decode"]
    # no preemption, no prefix hits: prompt rows are exactly the prompts; every token
    # after a request's first comes from one decode row
    assert r["num_preemptions"] == 0 and r["prefix_cache_hit_tokens"] == 0
    assert p["prompt_tokens"] == n * n_in
    assert p["decode_tokens"] + d["tokens"] == n * (n_out - 1)
    assert p["tokens_per_s"] == pytest.approx(p["prompt_tokens"] / p["time_s"])
    assert d["tokens_per_s"] == pytest.approx(d["tokens"] / d["time_s"])
    assert d["mean_batch"] == pytest.approx(d["tokens"] / d["steps"])
    assert p["time_s"] + d["time_s"] <= wall
    if engine:  # 20-token prompts over a 32-row budget: chunked, with decodes alongside
        assert p["steps"] > n * n_in / 32 and p["decode_tokens"] > 0 and d["mean_batch"] <= 4
    else:
        assert p["steps"] == 1 and p["decode_tokens"] == 0 and d["mean_batch"] == n
    assert all(q["ttft_s"] <= q["e2e_s"] <= wall for q in r["requests"])
    assert "Throughput:" in text and "decode-only steps" in text
    assert_memory(r, text)


def test_throughput_counts_recomputed_rows_as_prefill(tiny, tmp_path, capsys):
    """4 sequences start in one block each of a 5-block KV cache, and each needs a
    second block at its 17th token: preemptions. The recomputed rows are prefill
    work, so prompt rows exceed the prompts' tokens."""
    r, _ = run_json(capsys, ["bench", "throughput", str(tiny), "--num-prompts", "8",
                             "--input-len", "14", "--output-len", "10", "--max-num-seqs", "4",
                             "--kv-cache-gib", str(5 * TINY_KV_BLOCK_BYTES / 2**30)],
                    tmp_path / "t.json")
    assert r["kv_cache_blocks"] == 5 and r["num_preemptions"] > 0
    assert all(q["num_output_tokens"] == 10 for q in r["requests"])
    assert r["prefill"]["prompt_tokens"] > 8 * 14


# -- the sampling of both --------------------------------------------------------------

@pytest.fixture
def engine_requests(monkeypatch) -> list:
    """The (request id, SamplingParams) of every request the engine is given."""
    seen = []
    add_request = LLMEngine.add_request

    def recording(self, request_id, prompt_ids, params, *args, **kwargs):
        seen.append((request_id, params))
        return add_request(self, request_id, prompt_ids, params, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "add_request", recording)
    return seen


def sampling_of(params) -> dict:
    return {k: getattr(params, k) for k in ("temperature", "top_p", "top_k", "min_p",
                                            "repetition_penalty")}


def test_throughput_samples_with_the_model_s_defaults(tiny_with_defaults, tmp_path, capsys,
                                                      engine_requests):
    """generation_config.json sets temperature and top_p; the other fields keep
    SamplingParams' (Hugging Face's) defaults; request i is seeded with --seed + i."""
    r, text = run_json(capsys, ["bench", "throughput", str(tiny_with_defaults),
                                "--num-prompts", "3", "--input-len", "8", "--output-len", "5",
                                "--seed", "11"], tmp_path / "t.json")
    want = {**MODEL_DEFAULTS, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    s = r["sampling"]
    assert {k: s[k] for k in want} == want
    assert (s["greedy"], s["defaults"], s["from_command_line"]) == (False, "model", [])
    assert ("sampling: sampled (temperature 0.6, top_p 0.95, top_k 0, min_p 0, "
            "repetition_penalty 1; the model's defaults; request i seeded with --seed + i)"
            ) in text and s["description"] in text
    assert all(q["num_output_tokens"] == 5 for q in r["requests"])
    measured = {rid: params for rid, params in engine_requests if rid.startswith("bench-")}
    assert sorted(measured) == ["bench-0", "bench-1", "bench-2"]
    for i in range(3):
        params = measured[f"bench-{i}"]
        assert sampling_of(params) == want and params.seed == 11 + i and params.ignore_eos


def test_greedy_and_overridden_runs_report_their_sampling(tiny_with_defaults, tiny, tmp_path,
                                                          capsys, engine_requests):
    r, text = run_json(capsys, ["bench", "latency", str(tiny_with_defaults), "--input-len",
                                "8", "--output-len", "4", "--warmup", "1", "--repetitions",
                                "2", "--greedy", "--repetition-penalty", "1.2"],
                       tmp_path / "g.json")
    s = r["sampling"]
    assert s["greedy"] and s["temperature"] == 0.0 and s["repetition_penalty"] == 1.2
    assert s["top_p"] == 0.95 and s["from_command_line"] == ["temperature",
                                                             "repetition_penalty"]
    assert "sampling: greedy (temperature 0, repetition_penalty 1.2; temperature, " \
           "repetition_penalty from the command line, the rest the model's defaults)" in text
    assert all(run["num_output_tokens"] == 4 for run in r["runs"])
    assert [p.seed for _, p in engine_requests] == [0, 1, 2]   # warm-up, then measured
    assert all(p.temperature == 0.0 and p.repetition_penalty == 1.2 for _, p in engine_requests)
    # a model that sets no defaults: armllm's fallback, overridden field by field
    r, text = run_json(capsys, ["bench", "throughput", str(tiny), "--num-prompts", "2",
                                "--input-len", "8", "--output-len", "4", "--top-k", "5",
                                "--min-p", "0.2"], tmp_path / "f.json")
    s = r["sampling"]
    assert {k: s[k] for k in ("temperature", "top_p", "top_k", "min_p")} == \
        {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.2}
    assert s["defaults"] == "fallback" and not s["greedy"]
    assert "armllm's fallback defaults (the model sets none)" in text
    assert all(q["num_output_tokens"] == 4 for q in r["requests"])


# -- bench latency -----------------------------------------------------------------------

def test_latency_counts_statistics_and_no_prefix_reuse(tiny, tmp_path, capsys):
    n_in, n_out, reps = 40, 6, 3
    r, text = run_json(capsys, ["bench", "latency", str(tiny), "--input-len", str(n_in),
                                "--output-len", str(n_out), "--warmup", "1",
                                "--repetitions", str(reps)], tmp_path / "l.json")
    runs = r["runs"]
    assert r["max_num_seqs"] == 1 and r["prefix_caching"] and len(runs) == reps
    for run in runs:
        assert run["num_prompt_tokens"] == n_in and run["num_output_tokens"] == n_out
        assert run["num_cached_prompt_tokens"] == 0  # two full blocks, never found again
        assert run["pp_tokens_per_s"] == pytest.approx(n_in / run["ttft_s"])
        assert run["tg_tokens_per_s"] == pytest.approx(1 / run["tpot_s"])
        assert run["e2e_s"] >= run["ttft_s"] + (n_out - 1) * run["tpot_s"] * (1 - 1e-9)
    for key in ("ttft_s", "tpot_s", "e2e_s", "pp_tokens_per_s", "tg_tokens_per_s"):
        values = [run[key] for run in runs]
        assert r[key]["mean"] == pytest.approx(statistics.fmean(values))
        assert r[key]["median"] == pytest.approx(statistics.median(values))
        assert r[key]["stdev"] == pytest.approx(statistics.stdev(values))
    assert f"pp{n_in} tok/s" in text and f"tg{n_out} tok/s" in text
    assert_memory(r, text)


def assert_memory(r: dict, text: str) -> None:
    """The memory figures: the KV cache's bytes are its blocks', and the process held
    (at its load peak) and holds (steady) at least the weights and KV cache."""
    m = r["memory"]
    assert m["kv_cache_bytes"] == r["kv_cache_blocks"] * TINY_KV_BLOCK_BYTES
    assert m["weights_bytes"] > 0
    held = m["weights_bytes"] + m["kv_cache_bytes"]
    assert m["load_peak_rss_bytes"] >= held and m["steady_rss_bytes"] >= held
    assert "memory: peak RSS while loading" in text


def test_latency_profile_splits_each_decode_token(tiny, tmp_path, capsys):
    """--profile: every decode-only step of the measured requests is counted, its parts
    are non-negative and add up to its total, and the GEMMs and the sampler did run."""
    n_out, reps = 6, 2
    r, text = run_json(capsys, ["bench", "latency", str(tiny), "--input-len", "20",
                                "--output-len", str(n_out), "--warmup", "1", "--repetitions",
                                str(reps), "--profile"], tmp_path / "p.json")
    prof = r["profile"]
    assert prof["decode_tokens"] == reps * (n_out - 1)   # the first token comes with the prefill
    ms = prof["per_token_ms"]
    parts = ("gemm", "sparse_mlp", "attention", "other_kernels", "glue", "sampling",
             "postprocess")
    assert all(ms[p] >= 0 for p in parts) and ms["gemm"] > 0 and ms["sampling"] > 0
    assert ms["sparse_mlp"] == 0    # a dense model
    assert ms["attention"] > 0
    assert sum(ms[p] for p in parts) == pytest.approx(ms["total"])
    # one decode token is about one TPOT (the profile's timers add a little)
    assert 0.5 * r["tpot_s"]["mean"] * 1e3 < ms["total"] < 2 * r["tpot_s"]["mean"] * 1e3
    assert "outside the GEMMs" in text and "Python/engine glue" in text
    # off by default: nothing measured, nothing printed
    r, text = run_json(capsys, ["bench", "latency", str(tiny), "--input-len", "20",
                                "--output-len", "3", "--warmup", "0", "--repetitions", "1"],
                       tmp_path / "q.json")
    assert "profile" not in r and "outside the GEMMs" not in text


@pytest.mark.parametrize("argv, message", [
    (["bench", "throughput", "--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["bench", "latency", "--output-len", "1"], "--output-len must be >= 2"),
    (["bench", "latency", "--repetitions", "0"], "--repetitions must be >= 1, got 0"),
    (["bench", "latency", "--input-len", "100", "--max-model-len", "50"],
     "--max-model-len 50 is shorter than --input-len + --output-len = 228"),
    (["bench", "throughput", "--temperature", "-1"], "--temperature must be in [0, 100]"),
    (["bench", "throughput", "--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["bench", "latency", "--top-k", "-2"], "--top-k must be -1, 0 (off) or a positive"),
    (["bench", "latency", "--min-p", "1.5"], "--min-p must be in [0, 1], got 1.5"),
    (["bench", "throughput", "--repetition-penalty", "0"],
     "--repetition-penalty must be in (0, 10], got 0.0"),
    (["bench", "throughput", "--greedy", "--temperature", "0.5"],
     "--greedy is --temperature 0; got --temperature 0.5 too"),
    (["bench", "latency", "--seed", "-1"], "--seed must be >= 0, got -1"),
])
def test_bench_bad_arguments_exit_2(tiny, capsys, argv, message):
    assert message in one_line_error(capsys, [*argv[:2], str(tiny), *argv[2:]])


def test_bench_request_longer_than_the_context_exits_2(tiny, capsys):
    err = one_line_error(capsys, ["bench", "latency", str(tiny), "--input-len", "500",
                                  "--output-len", "100"])
    assert "exceeds max_model_len 512" in err


# -- plan --------------------------------------------------------------------------------

def allocated(ws: Workspace) -> int:
    """What a built Workspace really holds."""
    return (sum(a.nbytes for a in vars(ws).values() if isinstance(a, np.ndarray))
            + sum(sc.nbytes for sc in ws.scratches))


def expected_plan(c, max_len: int, seqs: int, bandwidth_gbs: float, item: int = 2,
                  kv_item: int = 2, linear=None, formats=None, weights=None,
                  embed_bytes: int | None = None) -> dict:
    """The plan, computed here from the config the long way: `linear(n, k)` sizes a
    layer's linear weight (default dense), `weights` overrides the weights' total (as
    measured on a loaded model), `formats` is what the Workspace is built for,
    `embed_bytes` the embedding table's bytes (default dense)."""
    h, inter, v, layers = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_layers
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]  # as packed: fused qkv, gate/up
    embed = v * h
    norms = 2 * h
    params = embed + layers * (sum(n * k for n, k in shapes) + norms) + h \
        + (0 if c.tie_word_embeddings else embed)
    linear = linear or (lambda n, k: n * k * item)
    if weights is None:
        weights = (2 * embed * item              # embedding, and lm_head (tied: a packed copy)
                   + layers * sum(linear(n, k) for n, k in shapes) + 4 * (layers * norms + h))
    kv_token = 2 * layers * kv * kv_item
    kv_total = seqs * math.ceil(max_len / 16) * 16 * kv_token
    workspace = allocated(Workspace(c, 2048, seqs, formats, max_seq_len=max_len))
    overhead = workspace + c.max_position_embeddings * c.head_dim * 4 + 300 * MiB

    embed_bytes = embed * item if embed_bytes is None else embed_bytes

    def step(b: int) -> float:
        return weights - embed_bytes + b * (embed_bytes // v + kv_token * max_len / 2)

    return {"params": params, "weights": weights, "kv_token": kv_token, "kv": kv_total,
            "workspace": workspace, "overhead": overhead,
            "total": weights + kv_total + overhead, "step_1": step(1), "step_c": step(seqs),
            "tok_s_1": bandwidth_gbs * 1e9 / step(1),
            "tok_s_c": seqs * bandwidth_gbs * 1e9 / step(seqs)}


def plan_json(capsys, argv: list[str]) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def check(p: dict, e: dict) -> None:
    assert p["params"]["total"] == e["params"]
    assert p["weight_bytes"]["total"] == e["weights"]
    assert p["kv_cache"]["bytes_per_token"] == e["kv_token"]
    assert p["kv_cache"]["bytes"] == e["kv"]
    assert p["overhead"]["workspace_bytes"] == e["workspace"]
    assert p["overhead"]["bytes"] == e["overhead"]
    assert p["total_bytes"] == e["total"]
    assert p["fits"] == (p["total_bytes"] <= p["mem_available_bytes"])
    d = p["decode"]
    assert d["batch_1"]["bytes"] == e["step_1"] and d["batch_c"]["bytes"] == e["step_c"]
    assert d["batch_1"]["max_tokens_per_s"] == pytest.approx(e["tok_s_1"])
    assert d["batch_1"]["min_step_s"] == pytest.approx(1 / e["tok_s_1"])
    assert d["batch_c"]["max_tokens_per_s"] == pytest.approx(e["tok_s_c"])


def test_plan_tiny_model_bf16_and_f32(tiny, capsys):
    c = load_hf_config(tiny)
    p = plan_json(capsys, [str(tiny), "--max-model-len", "100", "--max-num-seqs", "3",
                           "--bandwidth-gbs", "10"])
    check(p, expected_plan(c, 100, 3, 10.0))
    assert p["quantization"] == "auto"   # serve's default: a float checkpoint stays float
    assert p["linear_formats"] == {"layers": {"bf16": 4 * c.num_layers}, "lm_head": "bf16",
                                   "embedding": "bf16"}
    assert not p["params"]["tied"] and p["params"]["lm_head"] == c.vocab_size * c.hidden_size
    assert p["kv_cache"]["blocks_per_sequence"] == 7  # 100 tokens in 16-token blocks
    p = plan_json(capsys, [str(tiny), "--max-model-len", "512", "--max-num-seqs", "2",
                           "--dtype", "float32", "--kv-cache-dtype", "f32",
                           "--bandwidth-gbs", "25"])
    check(p, expected_plan(c, 512, 2, 25.0, item=4, kv_item=4))


def packed_bytes(scheme: str):
    """What the loader really allocates for an [n, k] linear weight under `scheme`: a
    weight packed by the selected kernels (and its zero-point correction)."""
    from armllm import ops
    from armllm.model.quantize import parse_scheme, quantize_rtn

    def size(n, k):
        s = parse_scheme(scheme)
        qm = quantize_rtn(np.ones((n, k), np.float32), s)
        pw = ops.pack_quantized(qm.q, qm.d, qm.o, qm.bits, qm.group, not s.act_symmetric)
        return pw.nbytes + (0 if pw.zp_correction is None else 4 * n * pw.n_groups)
    return size


@pytest.mark.parametrize("quantization, runs_as", [
    ("w8a8", "w8a8-ch"), ("w4a8", "w4a8-g32"), ("w4a8-g128", "w4a8-g128"),
    ("w8a8-g32", "w8a8-g32"), ("w4a8-asym", "w4a8-g32-asym")])
def test_plan_quantized_weights(tiny, capsys, quantization, runs_as):
    from armllm.model.quantize import parse_scheme
    from armllm.model.weights import LinearFormats, QuantFormat
    c = load_hf_config(tiny)
    s = parse_scheme(quantization)
    fmt = QuantFormat(s.bits, s.group, s.act_symmetric)
    p = plan_json(capsys, [str(tiny), "--max-model-len", "64", "--max-num-seqs", "1",
                           "--quantization", quantization, "--bandwidth-gbs", "10"])
    check(p, expected_plan(c, 64, 1, 10.0, linear=packed_bytes(quantization),
                           formats=LinearFormats(((fmt,) * 4,) * c.num_layers, None)))
    assert p["linear_formats"] == {"layers": {runs_as: 4 * c.num_layers}, "lm_head": "bf16",
                                   "embedding": "bf16"}
    assert any(f"--quantization {quantization}" in line for line in p["assumptions"])


def loaded_bytes(weights, c) -> int:
    """The bytes a loaded model's weights hold: packed matrices (with any zero-point
    correction), the embedding, norms and biases."""
    packed = [*(getattr(lw, n) for lw in weights.layers for n in ("qkv", "o", "gate_up", "down")),
              weights.lm_head]
    corrections = sum(w.zp_correction.nbytes for w in packed if w.zp_correction is not None)
    small = sum(a.nbytes for lw in weights.layers
                for a in (*lw.norms.values(), lw.qkv_bias, lw.q_norm, lw.k_norm)
                if a is not None)
    return (sum(w.nbytes for w in packed) + corrections + weights.embed.nbytes + small
            + weights.final_norm.nbytes)


@pytest.mark.parametrize("quantization", ["auto", "none", "w4a8-g64"])
def test_plan_sizes_what_serve_loads_from_a_gguf(tmp_path, capsys, quantization):
    """A GGUF of mixed types: under auto, the Q8_0/Q4_0/Q4_1 layers whose fused parts
    agree run as stored (a part stored as floats makes its matrix bf16), and so do the
    tied Q8_0 head and the embedding; the plan's weights and workspace are what loading
    the file allocates."""
    pytest.importorskip("gguf")
    from armllm.model.gguf import GGUFFile
    from armllm.model.loader import gguf_model_config
    from armllm.model.quantize import parse_scheme
    from armllm.model.sources import GGUFSource
    from armllm.model.weights import load_weights
    from tests.tiny_model import write_tiny_gguf
    types = {"blk.0.attn_q.weight": "Q8_0", "blk.0.attn_k.weight": "Q8_0",
             "blk.0.attn_v.weight": "Q8_0", "blk.0.attn_output.weight": "Q4_0",
             "blk.0.ffn_gate.weight": "Q4_1", "blk.0.ffn_up.weight": "Q4_0",
             "blk.1.attn_q.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_0",
             "blk.1.ffn_gate.weight": "Q8_0", "blk.1.ffn_up.weight": "Q8_0",
             "blk.1.ffn_down.weight": "Q4_1", "token_embd.weight": "Q8_0"}
    # dimensions the kernels pack without padding, so that packed bytes are exact
    path = write_tiny_gguf(tmp_path / "m.gguf", types, vocab=128, inter=128)
    g = GGUFFile(path)
    c = gguf_model_config(g)
    q = quantization if quantization in ("auto", "none") else parse_scheme(quantization)
    weights = load_weights(GGUFSource(g, c), c, "bf16", quantization=q)
    p = plan_json(capsys, [str(path), "--max-model-len", "96", "--max-num-seqs", "2",
                           "--quantization", quantization, "--bandwidth-gbs", "10"])
    check(p, expected_plan(c, 96, 2, 10.0, formats=weights.formats,
                           weights=loaded_bytes(weights, c),
                           embed_bytes=weights.embed.nbytes))
    want = {"auto": {"layers": {"bf16": 3, "w4a8-g32": 3, "w8a8-g32": 2},
                     "lm_head": "w8a8-g32", "embedding": "Q8_0 (GGUF)"},
            "none": {"layers": {"bf16": 8}, "lm_head": "bf16", "embedding": "bf16"},
            "w4a8-g64": {"layers": {"w4a8-g64": 8}, "lm_head": "bf16", "embedding": "bf16"}
            }[quantization]
    assert p["linear_formats"] == want


def test_plan_sizes_a_k_quant_mix(tmp_path, capsys):
    """A Q4_K_M-like file (Q4_K, Q6_K V and down, Q6_K embedding and tied head): the
    plan's weights are what loading it allocates, the tensor types are reported."""
    pytest.importorskip("gguf")
    from armllm.model.gguf import GGUFFile
    from armllm.model.loader import gguf_model_config
    from armllm.model.sources import GGUFSource
    from armllm.model.weights import load_weights
    from tests.model.test_gguf_kquants import MIXES
    from tests.tiny_model import write_tiny_gguf
    types, hidden, inter = MIXES["Q4_K_M"]
    path = write_tiny_gguf(tmp_path / "m.gguf", types, vocab=128, hidden=hidden, inter=inter)
    g = GGUFFile(path)
    c = gguf_model_config(g)
    weights = load_weights(GGUFSource(g, c), c, "bf16")
    p = plan_json(capsys, [str(path), "--max-model-len", "96", "--max-num-seqs", "2",
                           "--bandwidth-gbs", "10"])
    check(p, expected_plan(c, 96, 2, 10.0, formats=weights.formats,
                           weights=loaded_bytes(weights, c),
                           embed_bytes=weights.embed.nbytes))
    assert p["linear_formats"] == {"layers": {"Q4_K (GGUF)": 4, "Q4_K+Q6_K (GGUF)": 2,
                                              "Q6_K (GGUF)": 2},
                                   "lm_head": "Q6_K (GGUF)", "embedding": "Q6_K (GGUF)"}
    assert p["gguf_tensor_types"] == "Q4_K: 10, F32: 5, Q6_K: 5"


def test_plan_smollm2_default_model(capsys, smollm2_gguf):
    """With no flags but the lengths, the plan sizes what `serve` loads by default: the
    GGUF's Q4_1 layers and Q8_0 head as they are."""
    from armllm.engine.args import EngineArgs
    from armllm.engine.setup import load
    loaded = load(smollm2_gguf, EngineArgs())
    c = loaded.config
    p = plan_json(capsys, ["--max-model-len", "2048", "--max-num-seqs", "8",
                           "--bandwidth-gbs", "20"])
    assert p["model"] == str(smollm2_gguf)
    assert c.tie_word_embeddings and p["params"]["tied"] and p["params"]["lm_head"] == 0
    assert p["linear_formats"] == {"layers": {"w4a8-g32": 120}, "lm_head": "w8a8-g32",
                                   "embedding": "Q8_0 (GGUF)"}
    e = expected_plan(c, 2048, 8, 20.0, formats=loaded.model.formats,
                      weights=loaded_bytes(loaded.model.weights, c),
                      embed_bytes=loaded.model.weights.embed.nbytes)
    check(p, e)
    assert e["params"] == 134_515_008  # SmolLM2-135M: 134.5 M with the tied embedding
    assert p["kv_cache"]["bytes_per_token"] == 2 * 30 * 3 * 64 * 2


def test_plan_int8_kv_cache_holds_twice_the_tokens(capsys, smollm2_gguf):
    """SmolLM2's int8 rows (64 bytes and a 2-byte scale a head) against bf16's 128: 1.94x
    the tokens at the same --kv-cache-gib, as the engine allocates them."""
    from armllm import LLM
    seqs = {}
    for dtype in ("bf16", "int8"):
        p = plan_json(capsys, [str(smollm2_gguf), "--max-model-len", "2048", "--kv-cache-gib",
                               "0.05", "--kv-cache-dtype", dtype, "--bandwidth-gbs", "20"])
        seqs[dtype] = p["kv_cache"]["sequences_at_full_length"]
    assert p["kv_cache"]["bytes_per_token"] == 2 * 30 * 3 * (64 + 2)
    assert seqs["int8"] / seqs["bf16"] == pytest.approx(128 / 66, rel=1e-2)  # whole blocks
    with LLM(smollm2_gguf, kv_cache_dtype="int8", kv_cache_gib=0.05) as llm:
        kv = llm.engine.runner.kv
        assert kv.num_blocks == p["kv_cache"]["blocks"]
        assert kv.k[0].dtype == np.int8 and kv.k_scale[0].shape == kv.k[0].shape[:3]


def test_plan_honours_kv_cache_gib_and_block_size(tiny, capsys):
    c = load_hf_config(tiny)
    per_block = 2 * c.num_layers * c.num_kv_heads * 8 * c.head_dim * 4   # f32, 8 tokens
    gib = 100 * per_block / 2**30 + 1e-12
    p = plan_json(capsys, [str(tiny), "--max-model-len", "64", "--kv-cache-gib", str(gib),
                           "--kv-cache-dtype", "f32", "--block-size", "8",
                           "--bandwidth-gbs", "10"])
    kv = p["kv_cache"]
    assert kv["blocks"] == 100 and kv["bytes"] == 100 * per_block and kv["block_size"] == 8
    assert kv["sequences_at_full_length"] == 100 / 8 and kv["sized_by"] == "--kv-cache-gib"
    assert "serve_default_cap_blocks" not in kv


def test_plan_text_with_measured_bandwidth(tiny, capsys):
    assert main(["plan", str(tiny), "--max-model-len", "128", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "batch 4" in out and "MemAvailable" in out
    assert "--kv-cache-gib" in out and "assumptions:" in out


def test_plan_measures_with_threads(tiny):
    """--threads sets the pool the bandwidth is measured on (a fresh process: the pool
    is one per process)."""
    out = subprocess.run([sys.executable, "-m", "armllm", "plan", str(tiny), "--threads", "1",
                          "--max-model-len", "64", "--json"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out)["decode"]["bandwidth_threads"] == 1


@pytest.mark.parametrize("argv, message", [
    (["--max-num-seqs", "0"], "max_num_seqs must be a positive integer, got 0"),
    (["--max-model-len", "513"], "--max-model-len 513 exceeds the model's context (512"),
    (["--bandwidth-gbs", "0"], "--bandwidth-gbs must be > 0"),
    (["--kv-cache-gib", "-1"], "kv_cache_gib must be > 0, got -1.0"),
])
def test_plan_bad_arguments_exit_2(tiny, capsys, argv, message):
    assert message in one_line_error(capsys, ["plan", str(tiny), *argv])


@pytest.mark.parametrize("argv, message", [
    (["--quantization", "q3_k"], "argument --quantization: invalid choice: 'q3_k'"),
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["--no-prefix-caching"], "unrecognized arguments: --no-prefix-caching"),
])
def test_plan_bad_flags_are_refused_by_the_parser(tiny, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(tiny), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_plan_missing_model_exits_2(tmp_path, capsys):
    assert "no such model file or directory" in one_line_error(
        capsys, ["plan", str(tmp_path / "nope")])


def test_the_cli_imports_no_engine_or_kernels():
    code = ("import sys, armllm.cli; armllm.cli._build_parser(); "
            "print([m for m in ('armllm.ops', 'armllm.api', 'armllm.engine.llm_engine') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_plan_tensor_parallel_gives_rank0s_share(tiny, capsys):
    """-tp 2: rank 0 holds half the heads, MLP columns and vocabulary rows of the
    tiny model (its layers' and lm_head's bytes halve, the replicated embedding does
    not), caches half the KV heads, and reads at half the bandwidth."""
    one = plan_json(capsys, [str(tiny), "--max-model-len", "64", "--max-num-seqs", "2",
                             "--bandwidth-gbs", "10"])
    two = plan_json(capsys, [str(tiny), "--max-model-len", "64", "--max-num-seqs", "2",
                             "--bandwidth-gbs", "10", "-tp", "2", "--allreduce-us", "7"])
    w1, w2 = one["weight_bytes"], two["weight_bytes"]
    assert w2["embedding"] == w1["embedding"]
    assert w2["layers"] < w1["layers"] and w2["lm_head"] * 2 == w1["lm_head"]
    assert two["kv_cache"]["bytes_per_token"] * 2 == one["kv_cache"]["bytes_per_token"]
    tp = two["tensor_parallel"]
    assert tp["ranks"] == 2 and tp["allreduces_per_step"] == 2 * two["config"]["num_layers"]
    assert two["total_bytes"] == 2 * tp["rank_bytes"]
    step1, step2 = one["decode"]["batch_1"], two["decode"]["batch_1"]
    layers, hidden = two["config"]["num_layers"], two["config"]["hidden_size"]
    # 2 all-reduces a layer of 7 us at batch 1; batch 2 moves one more vector each,
    # 2(N-1)/N = 1 of its 4 * hidden bytes per rank, at the node's 5 GB/s
    assert step2["min_step_s"] == pytest.approx(step2["bytes"] / 5e9 + 2 * layers * 7e-6)
    assert step1["min_step_s"] == pytest.approx(step1["bytes"] / 10e9)
    batch2 = two["decode"]["batch_c"]
    assert batch2["min_step_s"] == pytest.approx(
        batch2["bytes"] / 5e9 + 2 * layers * (7e-6 + 4 * hidden / 5e9))
    assert tp["allreduce_us"] == 7 and tp["allreduce_source"] == "given"


def test_plan_tensor_parallel_measures_the_allreduce(tiny, capsys):
    """Without --allreduce-us, -tp times one all-reduce of the hidden vector between
    processes here and counts it in the step; a negative one is refused."""
    p = plan_json(capsys, [str(tiny), "--max-model-len", "64", "--bandwidth-gbs", "10",
                           "-tp", "2"])
    tp, step = p["tensor_parallel"], p["decode"]["batch_1"]
    assert tp["allreduce_source"] == "measured" and 0 < tp["allreduce_us"] < 10_000
    assert step["allreduce_s"] == pytest.approx(tp["allreduces_per_step"]
                                                * tp["allreduce_us"] * 1e-6)
    assert main(["plan", str(tiny), "-tp", "2", "--allreduce-us", "-1"]) == 2
    assert "--allreduce-us must be >= 0, got -1.0" in capsys.readouterr().err
