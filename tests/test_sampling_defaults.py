"""The sampling defaults of a model: its generation_config.json, or a GGUF's
general.sampling.* keys, or, when it names none, FALLBACK_DEFAULTS; in the
library, in `armllm generate`, and over HTTP, where what a client sends wins
and what it omits comes from the model."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from armllm.api import LLM
from armllm.sampling import FALLBACK_DEFAULTS, SamplingParams
from tests.server.conftest import ServerProcess
from tests.tiny_model import write_tiny_gguf, write_tiny_llama

pytest.importorskip("gguf")

GGUF_SAMPLING = {"general.sampling.temp": 0.6, "general.sampling.top_p": 0.95,
                 "general.sampling.top_k": 20, "general.sampling.min_p": 0.1,
                 "general.sampling.penalty_repeat": 1.05}
# what the keys above mean, as written in float32 and read back
FROM_GGUF = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.1,
             "repetition_penalty": 1.05}
VOCAB = 122


def tokenizer_metadata() -> dict:
    """A byte-level BPE vocabulary of VOCAB tokens: <s>, </s>, space, printable ASCII,
    and space + a letter."""
    letters = "abcdefghijklmnopqrstuvwxy"
    tokens = ["<s>", "</s>", "Ġ", *(chr(b) for b in range(33, 127)),
              *("Ġ" + c for c in letters)]
    assert len(tokens) == VOCAB
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 3] + [1] * (VOCAB - 2),
            "tokenizer.ggml.merges": ["Ġ " + c for c in letters],
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}


@pytest.fixture(scope="module")
def gguf_with_sampling(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "s.gguf", {}, vocab=VOCAB,
                           metadata={**tokenizer_metadata(), **GGUF_SAMPLING})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-defaults"))


def sampling_fields(params: SamplingParams) -> dict:
    return {k: getattr(params, k) for k in FROM_GGUF}


def test_a_gguf_s_sampling_keys_are_its_defaults(gguf_with_sampling):
    llm = LLM(gguf_with_sampling, kv_cache_gib=0.01)
    assert sampling_fields(llm.default_sampling_params()) == FROM_GGUF
    # what the caller gives wins, field by field
    params = llm.default_sampling_params(temperature=0.0, max_tokens=3)
    assert params.temperature == 0.0 and params.top_p == 0.95 and params.max_tokens == 3


def test_the_defaults_read_without_loading_the_model(gguf_with_sampling, tiny):
    """load_generation_config (what `bench serve` reads of its --tokenizer model) is the
    loaded model's generation_config, weights unread."""
    from armllm.model.loader import load_generation_config
    from armllm.sampling import model_sampling_defaults
    gen = load_generation_config(gguf_with_sampling)
    assert gen == LLM(gguf_with_sampling, kv_cache_gib=0.01).loaded.generation_config
    assert model_sampling_defaults(gen) == FROM_GGUF
    assert load_generation_config(tiny) == {} and model_sampling_defaults({}) == {}
    assert model_sampling_defaults({"do_sample": False, "top_p": 0.8}) == \
        {"temperature": 0.0, "top_p": 0.8}


def test_a_gguf_sampling_key_of_the_wrong_type_is_named(tmp_path):
    bad = write_tiny_gguf(tmp_path / "bad.gguf", {}, vocab=VOCAB, metadata={
        **tokenizer_metadata(), "general.sampling.temp": "hot"})
    with pytest.raises(ValueError, match="general.sampling.temp must be a number, got 'hot'"):
        LLM(bad, kv_cache_gib=0.01)


def test_a_model_without_sampling_defaults_gets_the_fallback(tiny, tmp_path):
    llm = LLM(tiny, kv_cache_gib=0.01)    # no generation_config.json
    want = {**sampling_fields(SamplingParams()), **FALLBACK_DEFAULTS}
    assert sampling_fields(llm.default_sampling_params()) == want
    plain = write_tiny_gguf(tmp_path / "plain.gguf", {}, vocab=VOCAB,
                            metadata=tokenizer_metadata())
    assert sampling_fields(LLM(plain, kv_cache_gib=0.01).default_sampling_params()) == want


def test_a_generation_config_is_taken_as_it_is(tiny, tmp_path):
    """Fields it does not set keep SamplingParams' defaults (Hugging Face's), not the
    fallback's: the model's authors chose them."""
    (tiny / "generation_config.json").write_text(json.dumps({"temperature": 0.3,
                                                             "top_k": 5}))
    try:
        params = LLM(tiny, kv_cache_gib=0.01).default_sampling_params()
        (tiny / "generation_config.json").write_text(json.dumps({"do_sample": False}))
        greedy = LLM(tiny, kv_cache_gib=0.01).default_sampling_params()
    finally:
        (tiny / "generation_config.json").unlink()
    assert sampling_fields(params) == {**sampling_fields(SamplingParams()), "temperature": 0.3,
                                       "top_k": 5}
    assert greedy.temperature == 0.0


def test_generate_samples_with_the_fallback_defaults(tiny):
    r = subprocess.run([sys.executable, "-m", "armllm", "generate", str(tiny), "--prompt",
                        "w3 w4 w5", "--max-tokens", "12", "--seed", "7", "--ignore-eos",
                        "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ARMLLM_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    llm = LLM(tiny, kv_cache_gib=0.01)
    want = llm.generate("w3 w4 w5", SamplingParams(max_tokens=12, seed=7, ignore_eos=True,
                                                   **FALLBACK_DEFAULTS))[0]
    unfit = llm.generate("w3 w4 w5", SamplingParams(max_tokens=12, seed=7, ignore_eos=True))[0]
    assert want.token_ids != unfit.token_ids   # so that the seed tells the settings apart
    assert json.loads(r.stdout)["token_ids"] == want.token_ids


def test_the_server_fills_what_a_request_omits_from_the_model(gguf_with_sampling, tmp_path):
    llm = LLM(gguf_with_sampling, kv_cache_gib=0.01)
    prompt = [5, 6, 7, 8, 9]

    def library(**fields) -> str:
        params = SamplingParams(max_tokens=10, seed=3, ignore_eos=True, **fields)
        return llm.generate(prompt, params)[0].text

    srv = ServerProcess(gguf_with_sampling, "--kv-cache-gib", "0.01",
                        "--served-model-name", "tiny", log=tmp_path / "server.log")
    srv.wait_ready()
    try:
        def served(**fields) -> str:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 10, "seed": 3,
                    "ignore_eos": True, **fields}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60, trust_env=False)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        omitted = library(**FROM_GGUF)
        assert len({omitted, library(temperature=1.5), library()}) == 3  # seeds tell apart
        assert served() == omitted
        assert served(temperature=1.5) == library(**{**FROM_GGUF, "temperature": 1.5})
        assert served(top_p=1.0, min_p=0.0) == library(**{**FROM_GGUF, "top_p": 1.0,
                                                          "min_p": 0.0})
    finally:
        srv.stop()
