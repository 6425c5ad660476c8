"""llama.cpp's own tools for tests: its Hugging Face -> GGUF converter
(convert_hf_to_gguf.py, from the source tools/build_llama_cpp.sh fetches, with
that source's gguf-py), its llama-quantize and llama-server (which that script
builds) and the tiny checkpoints the converter accepts: random weights written
by transformers over SmolLM2's tokenizer (the demo model's, written out by
`armllm convert`), a BPE tokenizer whose pre-tokenizer the converter knows."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from armllm.demo_model import cache_dir

LLAMA_CPP = cache_dir() / "llama.cpp-0.3.36"   # tools/build_llama_cpp.sh
CONVERTER = LLAMA_CPP / "src" / "convert_hf_to_gguf.py"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VOCAB = 49152   # SmolLM2's vocabulary

# the converter identifies a BPE tokenizer's pre-tokenizer by hashing how transformers'
# AutoTokenizer splits a probe text; for some model types transformers 5 picks its own
# tokenizer class over tokenizer.json's, which hashes differently: the tokenizer is
# SmolLM2's, so say so
_RUN = """import sys
sys.path.insert(0, {src!r})
sys.argv = {argv!r}
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def converter() -> Path:
    """The converter's path; skips (fails under CI, whose tools/run-tests fetches it)
    without it."""
    if not CONVERTER.exists():
        message = f"needs {CONVERTER}: run tools/build_llama_cpp.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CONVERTER


def convert(hf_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """hf_dir converted by llama.cpp's convert_hf_to_gguf.py to out (outtype: f32, f16,
    bf16, q8_0)."""
    src = converter().parent
    code = _RUN.format(src=str(src), argv=[str(CONVERTER), str(hf_dir), "--outfile", str(out),
                                         "--outtype", outtype])
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def binary(name: str) -> Path:
    """The path of a llama.cpp tool tools/build_llama_cpp.sh builds (llama-quantize,
    llama-server, ...); skips (fails under CI) without it."""
    path = LLAMA_CPP / "build" / "bin" / name
    if not path.exists():
        message = f"needs {path}: run tools/build_llama_cpp.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def quantize(source: Path, out: Path, kind: str) -> Path:
    """llama.cpp's llama-quantize (tools/build_llama_cpp.sh's) of source to `kind`
    (Q8_0, Q4_K_M, ...); skips (fails under CI) without it."""
    r = subprocess.run([str(binary("llama-quantize")), str(source), str(out), kind],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def smollm2_tokenizer(smollm2_gguf: Path, cache: Path) -> Path:
    """A directory holding SmolLM2's tokenizer.json and tokenizer_config.json."""
    if not (cache / "tokenizer.json").exists():
        from armllm.model.convert import convert_gguf
        convert_gguf(smollm2_gguf, cache)
    return cache


def with_tokenizer(hf_dir: Path, tokenizer_dir: Path, tokenizer_class: str | None = None) -> Path:
    """Copies the tokenizer into hf_dir (tokenizer_class: what tokenizer_config.json
    names, e.g. Phi-4's GPT2Tokenizer, which the Phi-3 converter reads as BPE)."""
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, hf_dir / name)
    if tokenizer_class:
        path = hf_dir / "tokenizer_config.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "tokenizer_class": tokenizer_class}))
    return hf_dir
