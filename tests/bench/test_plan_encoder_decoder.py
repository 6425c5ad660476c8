"""`armllm plan` of an encoder-decoder (Whisper): its figures equal what loading the
model with the same flags allocates (the weights' packed bytes of the encoder and the
decoder, KVCache.nbytes and its cross-attention pool, the decoder's workspace), on
the real whisper-tiny.en (CTranslate2 float16), on a tiny random multilingual
Whisper in Hugging Face's layout and as CTranslate2's int8 conversion of it (run as
stored); its parameter counts equal transformers'."""
from __future__ import annotations

import json

import numpy as np
import pytest

from armllm.api import LLM
from armllm.cli import main
from tests.whisper_reference import tiny_en


def plan_json(capsys, model, flags: list[str]) -> dict:
    assert main(["plan", str(model), "--bandwidth-gbs", "10", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def check_against_the_engine(plan: dict, model, flags: dict) -> None:
    llm = LLM(model, **flags)
    weights, kv = llm.loaded.model.weights, llm.engine.runner.kv
    wb = plan["weight_bytes"]
    assert (wb["encoder"], wb["decoder"], wb["total"]) == (
        weights.encoder_nbytes, weights.decoder_nbytes, weights.nbytes)
    assert wb["lm_head"] == weights.lm_head.nbytes
    assert plan["kv_cache"]["bytes"] == kv.nbytes
    assert plan["kv_cache"]["blocks"] == kv.num_blocks
    assert plan["cross_attention_pool"]["bytes"] == kv.state_nbytes
    assert plan["cross_attention_pool"]["slots"] == llm.max_num_seqs
    ws = llm.engine.runner.workspace
    allocated = sum(a.nbytes for a in vars(ws).values() if isinstance(a, np.ndarray))
    assert plan["overhead"]["workspace_bytes"] == allocated
    for key in ("batch_1", "batch_c"):
        step = plan["decode"][key]
        assert step["bytes"] == step["weight_bytes"] + step["kv_bytes"] + step["cross_bytes"]
        assert step["max_tokens_per_s"] > 0


@pytest.mark.parametrize("flags", [
    {"dtype": "float32", "kv_cache_dtype": "f32", "max_num_seqs": 3},
    {"dtype": "bfloat16", "kv_cache_dtype": "bf16", "max_num_seqs": 2, "kv_cache_gib": 0.05,
     "max_num_batched_tokens": 512},
])
def test_tiny_en_plan_is_what_the_engine_allocates(capsys, flags):
    model = tiny_en()
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    plan = plan_json(capsys, model, argv)
    check_against_the_engine(plan, model, flags)
    assert plan["config"]["encoder"]["layers"] == 4 and plan["config"]["num_layers"] == 4
    assert plan["linear_formats"] == {flags["kv_cache_dtype"]: 4 * 4 + 4 * 7 + 1}
    assert main(["plan", str(model), "--bandwidth-gbs", "10"]) == 0   # the text form
    text = capsys.readouterr().out
    assert "cross-attention pool" in text and "decoder's decode upper bound" in text


@pytest.fixture(scope="module")
def tiny_multilingual(tmp_path_factory):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from tests.audio.tiny_multilingual import build_model
    directory = tmp_path_factory.mktemp("tiny-multilingual")
    ct2_dir, _ = build_model(directory)
    return directory / "hf", ct2_dir


def test_parameters_equal_transformers(tiny_multilingual, capsys):
    import transformers
    hf_dir, ct2_dir = tiny_multilingual
    model = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir)
    want = {"encoder": model.model.encoder.num_parameters(),
            "decoder": model.model.decoder.num_parameters()}
    for path in (hf_dir, ct2_dir):
        params = plan_json(capsys, path, ["--dtype", "float32"])["params"]
        assert {k: params[k] for k in want} == want
        assert params["total"] == model.num_parameters()


def test_int8_conversion_runs_as_stored(tiny_multilingual, tmp_path, capsys):
    import ctranslate2
    hf_dir, _ = tiny_multilingual
    int8_dir = tmp_path / "int8"
    ctranslate2.converters.TransformersConverter(
        str(hf_dir), copy_files=["tokenizer.json"]).convert(str(int8_dir), quantization="int8")
    flags = {"dtype": "float32", "kv_cache_dtype": "f32", "max_num_seqs": 2}
    plan = plan_json(capsys, int8_dir, ["--dtype", "float32", "--kv-cache-dtype", "f32",
                                        "--max-num-seqs", "2"])
    assert plan["linear_formats"] == {"w8a8-ch (as stored)": 2 * 4 + 2 * 7 + 1}
    check_against_the_engine(plan, int8_dir, flags)
    plan = plan_json(capsys, hf_dir, ["--quantization", "w8a8", "--max-num-seqs", "2"])
    assert plan["linear_formats"] == {"w8a8-ch": 2 * 4 + 2 * 7 + 1}
    check_against_the_engine(plan, hf_dir, {"quantization": "w8a8", "max_num_seqs": 2})
