"""SmolLM2 requantized by llama.cpp's own quantizer (llama-quantize, built by
tools/build_llama_cpp.sh) to Q4_K_M, Q5_K_M and Q6_K, the files people
download: they load as stored (their 576-wide rows in llama.cpp's Q5_0/Q5_1/
Q8_0 fallbacks beside Q4_K/Q5_K/Q6_K), and armllm's perplexity on the GPL-3
text, by llama-perplexity's recipe, is within 1% of llama-perplexity's on the
same file. (Measured on the AVX-512 kernels, armllm vs llama.cpp: Q4_K_M 22.167
vs 22.318, Q5_K_M 23.740 vs 23.767, Q6_K 21.007 vs 21.074; both quantize the K-quant
layers' activations per 256 columns, llama.cpp's Q8_K.)"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from armllm.demo_model import cache_dir
from armllm.model.loader import load_model

TEXT = Path("/usr/share/common-licenses/GPL-3")
LLAMA_BIN = cache_dir() / "llama.cpp-0.3.36" / "build" / "bin"  # tools/build_llama_cpp.sh
CONTEXT = 256   # llama-perplexity -c 256 over the whole text: 29 chunks, 3,683 scored tokens


@pytest.fixture(scope="module")
def llama_bin() -> Path:
    tools = [LLAMA_BIN / t for t in ("llama-quantize", "llama-perplexity")]
    if not all(t.exists() for t in tools):
        message = f"needs {', '.join(map(str, tools))}: run tools/build_llama_cpp.sh"
        if os.environ.get("CI"):
            pytest.fail(message)   # tools/run-tests builds them
        pytest.skip(message)
    if not TEXT.exists():
        pytest.skip(f"needs {TEXT} (Debian's base-files)")
    return LLAMA_BIN


@pytest.fixture(scope="module", params=["Q4_K_M", "Q5_K_M", "Q6_K"])
def requantized(request, llama_bin, smollm2_gguf, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("kq") / f"smollm2-{request.param}.gguf"
    subprocess.run([llama_bin / "llama-quantize", "--allow-requantize", str(smollm2_gguf),
                    str(out), request.param, "2"], check=True, capture_output=True)
    return request.param, out


def llama_cpp_perplexity(llama_bin: Path, model: Path) -> float:
    r = subprocess.run([llama_bin / "llama-perplexity", "-m", str(model), "-f", str(TEXT),
                        "-c", str(CONTEXT), "-t", "2", "-b", str(CONTEXT)],
                       capture_output=True, text=True, check=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    assert found, r.stdout[-2000:] + r.stderr[-2000:]
    return float(found.group(1))


def test_perplexity_within_one_percent_of_llama_cpp(requantized, llama_bin):
    from armllm.bench.perplexity import chunk_perplexity
    from armllm.model.tokenizer import TextTokenizer
    kind, path = requantized
    loaded = load_model(path, "bf16")
    stored = {"Q4_K_M": ("Q4_K", "Q6_K", "Q5_0"), "Q5_K_M": ("Q5_K", "Q6_K", "Q5_1"),
              "Q6_K": ("Q6_K", "Q8_0")}[kind]
    for t in stored:   # the K-quant rows and llama.cpp's fallbacks, all as stored
        assert t in loaded.tensor_types
        assert t == "Q8_0" or f"{t} (GGUF, as stored)" in loaded.model.weights.quantization
    tokenizer = TextTokenizer(loaded.tokenizer, loaded.tokenizer_config)
    ids = tokenizer.encode(TEXT.read_text())
    bos = tokenizer.token_id(tokenizer.bos_token) if tokenizer.add_bos else None
    ours = chunk_perplexity(loaded, ids, CONTEXT, bos_id=bos)
    theirs = llama_cpp_perplexity(llama_bin, path)
    assert ours["scored"] == len(ids) // CONTEXT * (CONTEXT - CONTEXT // 2 - 1)
    assert abs(ours["perplexity"] / theirs - 1) < 0.01, (ours["perplexity"], theirs)
