"""Quantized inference end to end on the tiny model and SmolLM2: quantize at
load, write and reload compressed-tensors checkpoints (same outputs; the
compressed-tensors library decompresses them to the same weights), GGUF
Q4_1/Q8_0 run as they are, and perplexity bounds."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from armllm.api import LLM
from armllm.model.loader import load_model
from armllm.model.quantize import SCHEMES, parse_scheme, quantize_rtn
from armllm.sampling import SamplingParams
from tests.tiny_model import write_tiny_llama

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
PROMPTS = [[5, 6, 7, 8], [40, 41, 9, 12, 99, 3], [70]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-q"))


def outputs(llm: LLM):
    return [(o.token_ids, [lp for _, lp, _ in o.logprobs]) for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("scheme", ["w8a8", "w4a8", "w4a8-g64", "w4a8-ch", "w8a8-g32",
                                    "w8a8-asym", "w4a8-g128-asym"])
def test_quantize_at_load_stays_close_to_float(tiny, scheme):
    ref = LLM(tiny, dtype="float32", kv_cache_gib=0.01, quantization="none")
    q = LLM(tiny, dtype="float32", kv_cache_gib=0.01, quantization=scheme)
    assert q.loaded.model.weights.quantization == scheme
    want, got = outputs(ref), outputs(q)
    # the first token's logprob is computed from the same prompt: compare it directly
    bound = 0.02 if scheme.startswith("w8") else 0.25   # measured: see the closing note
    for (_, wl), (_, gl) in zip(want, got, strict=True):
        assert abs(wl[0] - gl[0]) < bound


@pytest.mark.parametrize("scheme", ["w8a8", "w4a8", "w8a8-asym"])
def test_quantize_command_round_trip(tiny, tmp_path, scheme):
    from armllm.cli import main
    out = tmp_path / scheme
    assert main(["quantize", str(tiny), "--scheme", scheme, "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "int-quantized"
    asym = scheme.endswith("-asym")
    assert cfg["config_groups"]["group_0"]["input_activations"]["symmetric"] is not asym
    reloaded = LLM(out, dtype="bfloat16", kv_cache_gib=0.01)
    label = {"w8a8": "w8a8-ch", "w4a8": "w4a8-g32", "w8a8-asym": "w8a8-ch"}[scheme]
    acts = ", asymmetric activations" if asym else ""
    assert reloaded.loaded.model.weights.quantization == f"{label} (compressed-tensors{acts})"
    # the checkpoint keeps embeddings in bf16: the same model quantized at load in bf16
    direct = LLM(tiny, dtype="bfloat16", kv_cache_gib=0.01, quantization=scheme)
    assert outputs(reloaded) == outputs(direct)       # identical tokens and logprobs


@pytest.mark.parametrize("scheme", ["w8a8", "w4a8", "w4a8-asym"])
def test_compressed_tensors_library_reads_our_checkpoint(tiny, tmp_path, scheme):
    pytest.importorskip("torch")
    ctq = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.compressors import IntQuantizationCompressor
    from safetensors.torch import load_file

    from armllm.cli import main
    from armllm.model.sources import HFSource
    out = tmp_path / scheme
    assert main(["quantize", str(tiny), "--scheme", scheme, "--out", str(out)]) == 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    config = ctq.QuantizationConfig.model_validate(qc)    # the library accepts our config
    scheme_obj = config.config_groups["group_0"]
    tensors = load_file(str(out / "model.safetensors"))
    source = HFSource(tiny)
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        state = {"weight": tensors[f"{name}.weight"],
                 "weight_scale": tensors[f"{name}.weight_scale"]}
        theirs = IntQuantizationCompressor.decompress(state, scheme_obj)["weight"]
        ours = quantize_rtn(source.get(f"{name}.weight").astype(np.float32),
                            parse_scheme(scheme)).dequantize()
        np.testing.assert_allclose(theirs.float().numpy(), ours, rtol=1e-6, atol=1e-7)


def test_gguf_q4_1_runs_as_is_and_stays_close_to_its_dequantization(smollm2_gguf):
    """The Q4_1 layers (and the Q8_0 tied head) run from their blocks; next-token
    distributions stay close to the same weights dequantized to bf16 (measured: mean KL
    0.002-0.0045 nats per position with a bf16 head, the W4A8 argmax always in bf16's
    top 3)."""
    from tests.engine.test_engine import full_recompute_logprobs
    model = smollm2_gguf
    native = load_model(model, "bf16", quantization="auto")
    assert native.model.weights.quantization == "w4a8-g32 (GGUF); lm_head w8a8-g32 (GGUF)"
    q = LLM(model, kv_cache_gib=0.05)
    f = LLM(model, kv_cache_gib=0.05, quantization="none")
    prompts = [q.chat_prompt([{"role": "user", "content": "What is the capital of France?"}]),
               q.tokenizer.encode("The history of the Roman Empire began"),
               q.tokenizer.encode("def fibonacci(n):\n    if n < 2:")]
    for ids in prompts:
        a, b = full_recompute_logprobs(q, ids), full_recompute_logprobs(f, ids)
        kl = np.mean(np.sum(np.exp(b) * (b - a), axis=1))
        top3 = np.argsort(-b, axis=1)[:, :3]
        in_top3 = np.mean([a[i].argmax() in top3[i] for i in range(len(ids))])
        assert kl < 0.02 and in_top3 >= 0.95, (kl, in_top3)


def test_quantizing_an_already_quantized_checkpoint_is_refused(tiny, tmp_path):
    from armllm.model.convert import quantize_model
    out = quantize_model(tiny, tmp_path / "a", SCHEMES["w8a8"])
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(out, tmp_path / "b", SCHEMES["w8a8"])


def test_bad_quantization_config_names_the_setting(tiny, tmp_path):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors",
                                  "config_groups": {"g": {"targets": ["Linear"], "weights": {
                                      "num_bits": 8, "type": "float", "strategy": "tensor"}}}}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"weights.type 'float' is not supported"):
        load_model(bad)


def test_smollm2_perplexity_bounds(smollm2_gguf):
    """Sliding-window perplexity over the GPL-3 text (1,024 tokens): W8A8 within 2% of
    bf16 (the issue's target) and W4A8 within a measured bound. Measured: bf16 19.654,
    W8A8 19.539 (-0.6%), W4A8 from the GGUF's Q4_1 groups 19.607 (-0.2%), W8A8 with
    asymmetric activations 19.784 (+0.7%). With one activation scale per token instead
    of per group W8A8 and W4A8 were +3.8%."""
    from armllm.bench.perplexity import perplexity
    from armllm.model.tokenizer import TextTokenizer
    text = "/usr/share/common-licenses/GPL-3"
    if not os.path.exists(text):
        pytest.skip(f"needs {text} (Debian's base-files)")
    results = {}
    for q in ("none", "w8a8", "auto", "w8a8-asym"):
        lm = load_model(smollm2_gguf, "bf16", None, q if q in ("none", "auto") else parse_scheme(q))
        with open(text) as f:
            ids = TextTokenizer(lm.tokenizer, lm.tokenizer_config).encode(f.read())[:1024]
        results[q] = perplexity(lm, ids, 512, 256)["perplexity"]
    assert 15 < results["none"] < 25
    assert abs(results["w8a8"] / results["none"] - 1) < 0.02
    assert abs(results["auto"] / results["none"] - 1) < 0.02
    assert abs(results["w8a8-asym"] / results["none"] - 1) < 0.02


def test_lm_head_is_quantized_only_when_asked(tiny):
    ref = LLM(tiny, dtype="float32", kv_cache_gib=0.01, quantization="none")
    plain = LLM(tiny, dtype="float32", kv_cache_gib=0.01, quantization="w8a8")
    assert not plain.loaded.model.weights.lm_head.quantized
    head = LLM(tiny, dtype="float32", kv_cache_gib=0.01, quantization="w8a8",
               quantize_lm_head=True)
    assert head.loaded.model.weights.lm_head.quantized
    assert head.loaded.model.weights.quantization == "w8a8; lm_head w8a8"
    for (_, want), (_, got) in zip(outputs(ref), outputs(head), strict=True):
        assert abs(want[0] - got[0]) < 0.02


def test_gguf_tied_q8_0_embedding_runs_as_the_lm_head(smollm2_gguf):
    for ask in (False, True):
        lm = load_model(smollm2_gguf, "bf16", quantization="auto", quantize_lm_head=ask)
        assert lm.model.weights.quantization == "w4a8-g32 (GGUF); lm_head w8a8-g32 (GGUF)"
    lm = load_model(smollm2_gguf, "bf16", quantization=SCHEMES["w8a8"])
    assert not lm.model.weights.lm_head.quantized
