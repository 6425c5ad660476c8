"""`armllm convert`: the Hugging Face directory written from the SmolLM2 GGUF
loads in transformers with the same logits as armllm on the GGUF, and in
armllm with exactly the same logits as the GGUF itself."""
from __future__ import annotations

import json

import numpy as np
import pytest

from armllm.model.convert import convert_gguf
from armllm.model.loader import load_model
from tests.model.test_llama_vs_transformers import hf_logits, prefill_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, smollm2_gguf):
    out = convert_gguf(smollm2_gguf, tmp_path_factory.mktemp("conv") / "smollm2")
    return smollm2_gguf, out


def test_converted_directory_matches_gguf(converted):
    gguf_path, out = converted
    from_gguf = load_model(gguf_path, "f32", quantization="none")
    from_dir = load_model(out, "f32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    prompt = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
    ids = from_gguf.tokenizer.encode(prompt, add_special_tokens=False).ids
    assert hf_tok.encode(prompt, add_special_tokens=False) == ids
    a, b = prefill_logits(from_gguf, ids), prefill_logits(from_dir, ids)
    assert np.array_equal(a, b)
    assert np.max(np.abs(hf_logits(hf, ids) - a)) <= 5e-4
    template = json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    assert template == from_gguf.tokenizer_config["chat_template"]


def test_convert_refuses_non_empty_output(converted, tmp_path):
    gguf_path, out = converted
    with pytest.raises(ValueError, match="exists and is not empty"):
        convert_gguf(gguf_path, out)
    with pytest.raises(ValueError, match="dtype must be float32 or bfloat16"):
        convert_gguf(gguf_path, tmp_path / "x", "int4")


def test_bf16_conversion_loads_in_both(converted, tmp_path):
    gguf_path, _ = converted
    out = convert_gguf(gguf_path, tmp_path / "bf16", "bfloat16")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ours = load_model(out, "bf16")
    ids = ours.tokenizer.encode("The sky is", add_special_tokens=False).ids
    assert np.max(np.abs(prefill_logits(ours, ids, kv_dtype="bf16") - hf_logits(hf, ids))) <= 0.5
