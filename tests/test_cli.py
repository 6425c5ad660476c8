"""`armllm info` and errors on the command line, run as a real subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from armllm import ops


def armllm(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "armllm", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


def test_info_json_reports_cpu_threads_and_kernels():
    r = armllm("info", "--json", ARMLLM_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["arch"] in ("x86_64", "aarch64")
    assert info["num_threads"] == 2
    # the best variant, unless the environment forces one (ARMLLM_ISA=avx2 runs of the suite)
    assert info["isa"] == (os.environ.get("ARMLLM_ISA") or ops.available_isas()[0])
    assert list(info["kernels"]) == [
        "gemm_f32_packed_len", "gemm_f32_pack", "gemm_f32", "gemm_bf16_packed_len",
        "gemm_bf16_pack", "gemm_bf16", "gemm_f32_cols", "gemm_bf16_cols", "rmsnorm", "rope",
        "silu_mul", "gelu_tanh_mul", "embed_f32", "embed_bf16", "exp", "kv_write", "attention",
        "quant_act", "gemm_wq_packed_len", "gemm_wq_pack", "gemm_wq", "gemm_wq_cols",
        "gemm_gguf_packed_len", "gemm_gguf_pack", "gemm_gguf", "gemm_gguf_cols", "gdn_conv",
        "gdn_rule", "gated_rmsnorm", "sigmoid_mul", "layernorm", "gelu",
        "sample_argmax", "sample_find_above", "sample_exp", "sample_block_sums",
        "sample_collect"]
    # a built variant, then any run-time choice inside its code ("neon+dotprod")
    assert {impl.split("+")[0] for impl in info["kernels"].values()} <= set(info["isa_built"])
    if info["arch"] == "x86_64":
        assert ("avx2" in info["features"]) == ("avx2" in info["isa_available"])
        assert info["fetch_add"] == "lock xadd"


def test_info_text():
    r = armllm("info")
    assert r.returncode == 0, r.stderr
    assert "variant:" in r.stdout and "gemm_f32" in r.stdout


def test_forced_variant():
    r = armllm("info", "--json", ARMLLM_ISA="ref")
    info = json.loads(r.stdout)
    assert info["isa"] == "ref" and info["isa_source"] == "ARMLLM_ISA"
    assert set(info["kernels"].values()) == {"ref"}


def test_unknown_variant_is_a_one_line_error_with_exit_2():
    r = armllm("info", ARMLLM_ISA="avx9")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ARMLLM_ISA=avx9: unknown kernel variant 'avx9'" in lines[0]


def test_variant_the_cpu_lacks_is_refused():
    foreign = "sve" if ops.cpu_info()["arch"] == "x86_64" else "avx2"
    r = armllm("info", ARMLLM_ISA=foreign)
    assert r.returncode == 2 and f"kernel variant '{foreign}'" in r.stderr


def test_decode_streams_follow_the_cpu_or_the_environment():
    """The x86 quantized decode GEMVs read one panel stream a thread on Zen 4 (AMD
    family 19h, cpuid's as /proc/cpuinfo gives them) and two elsewhere, `armllm info`
    showing "+1stream" where one runs (and "+nopf" on the bf16 GEMV's there);
    ARMLLM_DECODE_STREAMS sets the count, and a bad one is a one-line error."""
    info = json.loads(armllm("info", "--json").stdout)
    if info["arch"] == "x86_64":
        cpuinfo = dict(line.split(":", 1) for line in
                       Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                       if ":" in line)
        cpuinfo = {k.strip(): v.strip() for k, v in cpuinfo.items()}
        assert info["cpuid"] == {"vendor": cpuinfo["vendor_id"],
                                 "family": int(cpuinfo["cpu family"]),
                                 "model": int(cpuinfo["model"])}
        zen4 = cpuinfo["vendor_id"] == "AuthenticAMD" and cpuinfo["cpu family"] == "25"
        assert info["x86_decode_streams"] == (1 if zen4 else 2)
        if info["isa"] == "avx512":   # and its bf16 decode GEMV prefetches nothing there
            assert info["kernels"]["gemm_bf16"] == "avx512" + ("+nopf" if zen4 else "")
    for streams in (1, 2):
        info = json.loads(armllm("info", "--json", ARMLLM_DECODE_STREAMS=str(streams)).stdout)
        assert info["x86_decode_streams"] == streams
        if info["isa"] in ("avx512", "amx"):
            one = "+1stream" if streams == 1 else ""
            assert info["kernels"]["gemm_gguf"] == "avx512" + one
            assert info["kernels"]["gemm_wq"] == info["isa"] + one
    r = armllm("info", ARMLLM_DECODE_STREAMS="3")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1
    assert "ARMLLM_DECODE_STREAMS must be 1 or 2, got '3'" in lines[0]


def test_amx_variant_runs_or_says_why():
    """amx is runnable exactly when the CPU has AMX and Linux granted tile data; when
    the CPU has AMX but not the grant, `armllm info` and ARMLLM_ISA=amx say why."""
    info = ops.cpu_info()
    if info["arch"] != "x86_64":
        pytest.skip("AMX is x86-64")
    amx = {"amx_tile", "amx_bf16", "amx_int8", "amx_perm"} <= set(info["features"])
    avx512 = "avx512" in info["isa_available"]
    assert ("amx" in info["isa_available"]) == (amx and avx512)
    if amx and avx512 and not os.environ.get("ARMLLM_ISA"):
        assert info["isa"] == "amx" and info["amx_denied"] == ""
    r = armllm("info", ARMLLM_ISA="amx")
    if "amx" in info["isa_available"]:
        assert r.returncode == 0 and "variant:     amx (forced by ARMLLM_ISA" in r.stdout
    else:
        assert r.returncode == 2 and "kernel variant 'amx' needs" in r.stderr
        if info["amx_denied"]:
            assert info["amx_denied"] in r.stderr and info["amx_denied"] in armllm("info").stdout


SMALL_SIGALTSTACK = """
import ctypes, sys
class StackT(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int),
                ("ss_size", ctypes.c_size_t)]
stack = ctypes.create_string_buffer(6144)  # room for AVX-512's signal frame, not AMX's
if ctypes.CDLL(None).sigaltstack(ctypes.byref(StackT(ctypes.addressof(stack), 0, 6144)), None):
    sys.exit(77)
from armllm import cli
sys.exit(cli.main(["info"]))
"""


def test_refused_tile_data_is_explained():
    """Linux refuses AMX tile data to a process with a sigaltstack too small for the tile
    state: the amx variant is then not runnable, and `armllm info` and the ARMLLM_ISA=amx
    error say why; avx512 still runs."""
    info = ops.cpu_info()
    if "amx_tile" not in info["features"] or not sys.platform.startswith("linux"):
        pytest.skip("needs an AMX CPU under Linux")
    env = {**os.environ}
    env.pop("ARMLLM_ISA", None)

    def run(**extra):
        return subprocess.run([sys.executable, "-c", SMALL_SIGALTSTACK], capture_output=True,
                              text=True, env={**env, **extra}, timeout=300)

    r = run()
    if r.returncode == 77:
        pytest.skip("this kernel does not accept a 6 KiB sigaltstack")
    assert r.returncode == 0, r.stderr
    assert "amx:         not runnable: Linux refused AMX tile data" in r.stdout
    assert "variant:     avx512 (auto" in r.stdout
    r = run(ARMLLM_ISA="amx")
    assert r.returncode == 2 and "amx_perm (Linux refused AMX tile data" in r.stderr


def test_bad_bench_arguments():
    r = armllm("bench", "kernels", "--models", "gpt5")
    assert r.returncode == 2 and "unknown model 'gpt5'" in r.stderr
    r = armllm("bench", "kernels", "--m", "0")
    assert r.returncode == 2 and "--m values must be >= 1" in r.stderr
    r = armllm("bench", "kernels", "--isa", "ref,vax")
    assert r.returncode == 2 and "--isa 'vax' is not a kernel variant this CPU runs" in r.stderr


def test_bench_kernels_runs_a_small_shape(tmp_path):
    out = tmp_path / "bench.json"
    r = armllm("bench", "kernels", "--models", "smollm2-135m", "--m", "1", "--threads", "1",
               "--min-time", "0.01", "--parts", "gemm", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["machine"]["1"]["read_gbs"] > 0 and data["machine"]["1"]["fma_gflops"] > 0
    assert len(data["gemm"]) == 8  # 4 layers x 2 dtypes at M=1
    assert all(row["armllm_s"] > 0 and row["numpy_f32_s"] > 0 for row in data["gemm"])


def test_bench_kernels_times_the_sampler(tmp_path):
    """--parts sampling: each case's time a row, new and old, at each --vocab."""
    out = tmp_path / "bench.json"
    r = armllm("bench", "kernels", "--parts", "sampling", "--vocab", "1000,3000",
               "--min-time", "0.01", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["sampling"]
    assert [(row["vocab"], row["case"]) for row in rows] == [
        (n, case) for n in (1000, 3000) for case in ("greedy", "t0.8 top-p 0.95", "t1")]
    for row in rows:
        assert all(row[k] > 0 for k in ("one_row_us", "batch_us_per_row"))
    assert "gemm" not in json.loads(out.read_text())
    bad = armllm("bench", "kernels", "--parts", "gemm,sorting")
    assert bad.returncode == 2 and "--parts must name some of gemm, sampling" in bad.stderr


def test_bench_kernels_compares_variants(tmp_path):
    """--isa measures several variants side by side: a row per variant, each with its
    time relative to the first variant's."""
    out = tmp_path / "bench.json"
    isas = ["ref", ops.available_isas()[0]]
    r = armllm("bench", "kernels", "--isa", ",".join(isas), "--models", "smollm2-135m",
               "--m", "1", "--threads", "1", "--dtypes", "bf16", "--min-time", "0.01",
               "--no-numpy", "--parts", "gemm", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["gemm"]
    assert [row["isa"] for row in rows] == isas * 4  # 4 layers at M=1
    for first, other in zip(rows[::2], rows[1::2], strict=True):
        assert first["ratio_to_first_isa"] == 1.0
        assert other["ratio_to_first_isa"] == first["armllm_s"] / other["armllm_s"]


def test_generate_json_matches_the_library(tmp_path):
    from armllm.api import LLM
    from armllm.sampling import SamplingParams
    from tests.tiny_model import write_tiny_llama
    model = write_tiny_llama(tmp_path / "tiny")
    r = armllm("generate", str(model), "--prompt", "w3 w4 w5", "--max-tokens", "7",
               "--greedy", "--ignore-eos", "--dtype", "float32", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = LLM(model, dtype="float32", kv_cache_gib=0.01).generate(
        "w3 w4 w5", SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True))[0]
    assert got["token_ids"] == want.token_ids and got["text"] == want.text
    assert got["finish_reason"] == "length" and got["timings"]["ttft_s"] > 0


def test_generate_streams_text_to_stdout(tmp_path):
    from tests.tiny_model import write_tiny_llama
    model = write_tiny_llama(tmp_path / "tiny")
    r = armllm("generate", str(model), "--prompt", "w1 w2", "--max-tokens", "5",
               "--temperature", "0", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) == 5 and "[length; 5 tokens" in r.stderr


def test_generate_errors_are_one_line_exit_2(tmp_path):
    r = armllm("generate", str(tmp_path / "missing"), "--prompt", "x")
    assert r.returncode == 2 and "no such model file or directory" in r.stderr
    r = armllm("generate", "--prompt", "x", "--temperature", "-1")
    assert r.returncode == 2 and "--temperature must be in [0, 100]" in r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    r = armllm("generate", str(bad), "--prompt", "x")
    assert r.returncode == 2 and "unsupported architecture ['GPT2LMHeadModel']" in r.stderr
    r = armllm("generate", "--prompt", "x", "--speculative-config", '{"method": "lookup"}')
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "speculative_config: method must be one of ngram, suffix" in r.stderr


def test_chat_session_with_reset(tmp_path):
    from tests.tiny_model import write_tiny_llama
    model = write_tiny_llama(tmp_path / "tiny")
    r = subprocess.run([sys.executable, "-m", "armllm", "chat", str(model), "--max-tokens", "3",
                        "--temperature", "0", "--ignore-eos"], input="w1 w2\n/reset\nw3\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "(history cleared)" in r.stderr and len(r.stdout.strip().splitlines()) == 2


ENGINE_FLAGS = {"--dtype", "--quantization", "--quantize-lm-head", "--max-model-len",
                "--kv-cache-gib", "--kv-cache-dtype", "--block-size", "--max-num-seqs",
                "--max-num-batched-tokens", "--no-prefix-caching", "--threads",
                "--speculative-config"}
# one window at a time, and windows at shifted positions share no cached prefix; scoring
# generates nothing to speculate on
NOT_FOR_PERPLEXITY = {"--max-num-seqs", "--no-prefix-caching", "--speculative-config"}


def test_every_command_that_loads_a_model_shows_the_engine_flags(capsys):
    from armllm.cli import main
    commands = {("generate",): ENGINE_FLAGS, ("chat",): ENGINE_FLAGS, ("serve",): ENGINE_FLAGS,
                ("bench", "throughput"): ENGINE_FLAGS, ("bench", "latency"): ENGINE_FLAGS,
                ("eval", "perplexity"): ENGINE_FLAGS - NOT_FOR_PERPLEXITY}
    for command, flags in commands.items():
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        shown = {word.strip("[],") for word in capsys.readouterr().out.split()
                 if word.strip("[],").startswith("--")}
        assert shown & ENGINE_FLAGS == flags, command


def test_threads_flag_beats_the_environment(tmp_path):
    from tests.tiny_model import write_tiny_llama
    model = write_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "latency.json"
    r = armllm("bench", "latency", str(model), "--threads", "1", "--input-len", "4",
               "--output-len", "2", "--warmup", "0", "--repetitions", "1", "--json", str(out),
               ARMLLM_NUM_THREADS="2")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["threads"] == 1
    r = armllm("generate", str(model), "--prompt", "w1", "--threads", "0")
    assert r.returncode == 2 and "threads must be an integer from 1 to 4096, got 0" in r.stderr


def test_serve_ray_without_ray_says_what_to_install(smollm2_gguf):
    """Where Ray is not installed (simulated: the import fails), `armllm serve --ray`
    is a one-line usage error naming the extra, exit code 2."""
    code = ("import sys; sys.modules['ray'] = None; from armllm.cli import main; "
            f"sys.exit(main(['serve', {str(smollm2_gguf)!r}, '--ray']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("armllm: error: --ray: armllm.ray needs Ray: "
                                                   'pip install "armllm[ray]"'), lines


def test_generate_takes_dry_xtc_and_bad_words(tmp_path):
    from armllm.api import LLM
    from tests.tiny_model import write_tiny_llama
    model = write_tiny_llama(tmp_path / "tiny")
    r = armllm("generate", str(model), "--prompt", "w3 w4 w3 w4 w3", "--max-tokens", "8",
               "--temperature", "0.8", "--seed", "4", "--ignore-eos", "--dtype", "float32",
               "--dry-multiplier", "3", "--dry-allowed-length", "1",
               "--dry-sequence-breaker", "w9", "--xtc-probability", "0.5",
               "--xtc-threshold", "0.05", "--bad-word", "w4", "--json")
    assert r.returncode == 0, r.stderr
    llm = LLM(model, dtype="float32", kv_cache_gib=0.01)
    want = llm.generate(   # the model's defaults (top-p, min-p) under the flags, as the CLI
        "w3 w4 w3 w4 w3", llm.default_sampling_params(
            max_tokens=8, temperature=0.8, seed=4, ignore_eos=True, dry_multiplier=3.0,
            dry_allowed_length=1, dry_sequence_breakers=["w9"], xtc_probability=0.5,
            xtc_threshold=0.05, bad_words=["w4"]))[0]
    assert json.loads(r.stdout)["token_ids"] == want.token_ids
    r = armllm("generate", str(model), "--prompt", "w1", "--dry-base", "0.5")
    assert r.returncode == 2 and "--dry-base must be >= 1" in r.stderr
