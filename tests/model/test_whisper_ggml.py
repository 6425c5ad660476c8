"""whisper.cpp's ggml model files (model/whisper_ggml.py): a tiny random Hugging Face
Whisper converted by whisper.cpp's own models/convert-h5-to-ggml.py (run from a
whisper.cpp checkout: $WHISPER_CPP, or the fetched mirror's git history; skipped
without one), in f32 and f16 (its default). The converter needs the openai/whisper
repository only for whisper/assets/mel_filters.npz: the test writes one holding
armllm's own 80-bin filterbank, and checks the file carries it.

The converter rounds every tensor to f16 first (its f32 output too), so the
reference is transformers' model with its weights rounded to f16: our logits of
two windows' prompts, batched as tests/model/test_whisper.py's batch_logits does,
within 1e-4 of the largest logit for both files. Quantized files (what whisper.cpp's
quantize tool writes) come from a test-only rewriter of the f16 file: every 2-D
tensor but the positional embeddings in q8_0 / q4_0 (the gguf package's quantizer;
whisper.cpp's quantize cannot be built here), the hparams' ftype set as quantize
sets it; the reference is transformers with those blocks dequantized by the gguf
package. Truncated files and a wrong magic give ValueErrors naming the file, and a
file without a tokenizer.json beside it one naming the missing path."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from armllm import LLM, SamplingParams
from armllm.audio.mel import mel_filters
from armllm.model.loader import ggml_config, load_model
from armllm.model.whisper_ggml import GgmlWhisper, GgmlWhisperFile, hf_name
from tests.model.test_whisper import PROMPTS, TOKENIZER, batch_logits, hf_logits, windows

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MIRROR = Path("/work/.mirror/ggerganov+whisper.cpp/repo")
CONVERTER = "models/convert-h5-to-ggml.py"
# whisper.cpp sizes the MLP as 4 * state: a file it would load
SHAPE = dict(vocab_size=51864, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
             decoder_ffn_dim=256, num_mel_bins=80, max_source_positions=1500,
             max_target_positions=448, decoder_start_token_id=50257, eos_token_id=50256,
             pad_token_id=50256, bos_token_id=50256)
QUANT_FTYPES = {"Q8_0": 7, "Q4_0": 2}   # ggml_ftype of a file mostly of that type
QNT_VERSION = 2


def converter_source() -> str | None:
    root = os.environ.get("WHISPER_CPP")
    if root and (Path(root) / CONVERTER).is_file():
        return (Path(root) / CONVERTER).read_text()
    if MIRROR.is_dir():
        done = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{CONVERTER}"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout
    return None


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(**SHAPE, init_std=0.1)).eval()
    path = tmp_path_factory.mktemp("whisper") / "tiny"
    model.save_pretrained(path)
    tok = json.loads(Path(TOKENIZER).read_text())
    # what the converter reads: vocab.json and added_tokens.json
    (path / "vocab.json").write_text(json.dumps(tok["model"]["vocab"]))
    (path / "added_tokens.json").write_text(json.dumps(
        {t["content"]: t["id"] for t in tok["added_tokens"]}))
    return path


@pytest.fixture(scope="module")
def ggml_files(hf_dir, tmp_path_factory) -> dict[str, Path]:
    """"f32" / "f16" -> the converter's file, in a directory with tokenizer.json."""
    source = converter_source()
    if source is None:
        pytest.skip("no whisper.cpp checkout ($WHISPER_CPP) for its converter")
    work = tmp_path_factory.mktemp("ggml")
    script = work / "convert-h5-to-ggml.py"
    script.write_text(source)
    assets = work / "openai-whisper" / "whisper" / "assets"
    assets.mkdir(parents=True)
    np.savez(assets / "mel_filters.npz", mel_80=mel_filters(80).astype(np.float32))
    files = {}
    for kind, extra in (("f16", []), ("f32", ["use-f32"])):
        out = work / kind
        out.mkdir()
        subprocess.run([sys.executable, str(script), str(hf_dir), str(work / "openai-whisper"),
                        str(out), *extra], check=True, capture_output=True)
        produced = out / ("ggml-model-f32.bin" if extra else "ggml-model.bin")
        files[kind] = produced.rename(out / f"ggml-tiny-{kind}.bin")
        shutil.copy(TOKENIZER, out / "tokenizer.json")
    return files


def rounded_reference(hf_dir: Path, replace: dict[str, np.ndarray] | None = None):
    """transformers' model with its weights rounded to f16 (what the converter stores),
    then the tensors of `replace` (Hugging Face names) substituted."""
    model = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()
    state = model.state_dict()
    with torch.no_grad():
        for p in state.values():
            p.copy_(p.half().float())
        for name, a in (replace or {}).items():
            state[name].copy_(torch.from_numpy(a).reshape(state[name].shape))
    return model


def assert_logits(path: Path, reference, tolerance: float = 1e-4) -> None:
    c = ggml_config(path)
    feats, prompts = windows(2, seed=4), PROMPTS[:2]
    logits, starts = batch_logits(path, c, feats, prompts)
    for b, (f, p) in enumerate(zip(feats, prompts, strict=True)):
        want = hf_logits(reference, f, p)
        err = np.abs(logits[starts[b]:starts[b + 1]] - want).max() / np.abs(want).max()
        assert err <= tolerance, err


def test_file_contents(ggml_files, hf_dir):
    f = GgmlWhisperFile(ggml_files["f16"])
    assert f.hparams == dict(n_vocab=51864, n_audio_ctx=1500, n_audio_state=64,
                             n_audio_head=4, n_audio_layer=2, n_text_ctx=448,
                             n_text_state=64, n_text_head=4, n_text_layer=2, n_mels=80,
                             ftype=1)
    np.testing.assert_array_equal(f.mel_filters, mel_filters(80).astype(np.float32))
    vocab = json.loads((hf_dir / "vocab.json").read_text())
    assert len(f.vocab) == len(vocab)
    assert f.vocab[0] == b"!" and f.vocab[vocab["\u0120the"]] == b" the"   # byte-level BPE
    types = {name: t.type_name for name, t in f.tensors.items()}
    assert types["encoder.blocks.0.attn.query.weight"] == "F16"
    assert types["encoder.conv1.weight"] == "F16"
    assert types["encoder.conv1.bias"] == "F32" and f.tensors["encoder.conv1.bias"].shape == \
        (64, 1)
    assert types["decoder.positional_embedding"] == "F32"
    assert all(hf_name(n) for n in f.tensors)
    c = ggml_config(ggml_files["f16"])
    assert (c.encoder.n_mels, c.encoder.layers, c.encoder.heads, c.encoder.hidden,
            c.encoder.ffn, c.encoder.positions) == (80, 2, 4, 64, 256, 1500)
    assert (c.num_layers, c.num_heads, c.intermediate_size, c.max_position_embeddings,
            c.vocab_size, c.bos_token_id, c.eos_token_ids) == (2, 4, 256, 448, 51864, 50257,
                                                               (50256,))


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_logits_match_transformers(ggml_files, hf_dir, kind):
    assert_logits(ggml_files[kind], rounded_reference(hf_dir))


def quantized_copy(src: Path, dst: Path, qtype_name: str) -> dict[str, np.ndarray]:
    """Rewrites src with its 2-D weights but the positional embeddings in qtype (as
    whisper.cpp's quantize does); returns those tensors dequantized by the gguf
    package, under Hugging Face's names."""
    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType[qtype_name]
    f = GgmlWhisperFile(src)
    raw = src.read_bytes()
    first = next(iter(f.tensors.values()))
    header = bytearray(raw[:first.offset - 12 - 4 * len(first.shape) - len(first.name)])
    header[44:48] = struct.pack("<i", QNT_VERSION * 1000 + QUANT_FTYPES[qtype_name])
    out, dequantized = [bytes(header)], {}
    for name, t in f.tensors.items():
        a = f.dequantize(name)
        ttype, data = t.ggml_type, raw[t.offset:t.offset + t.nbytes]
        if a.ndim == 2 and "positional_embedding" not in name and not name.endswith("bias"):
            q = gguf.quants.quantize(a, qtype)
            ttype, data = int(qtype), q.tobytes()
            dequantized[hf_name(name)] = gguf.quants.dequantize(q, qtype)
        encoded = name.encode()
        out.append(struct.pack("<iii", len(t.shape), len(encoded), ttype))
        out.append(struct.pack(f"<{len(t.shape)}i", *reversed(t.shape)))
        out += [encoded, data]
    dst.write_bytes(b"".join(out))
    return dequantized


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_file(ggml_files, hf_dir, tmp_path, qtype):
    path = tmp_path / f"ggml-tiny-{qtype.lower()}.bin"
    want = quantized_copy(ggml_files["f16"], path, qtype)
    shutil.copy(TOKENIZER, tmp_path / "tokenizer.json")
    g = GgmlWhisper(path)
    assert g.file.tensors["decoder.token_embedding.weight"].type_name == qtype
    for name, a in want.items():
        np.testing.assert_array_equal(g.float(name), a)
    assert_logits(path, rounded_reference(hf_dir, want))


def test_llm_runs_a_ggml_file(ggml_files):
    path = ggml_files["f32"]
    loaded = load_model(path, dtype="f32")
    assert loaded.tokenizer.token_to_id("<|endoftext|>") == 50256
    llm = LLM(str(path), dtype="f32", max_num_seqs=2, kv_cache_gib=0.05)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    llm.check_request(PROMPTS[0], params, windows(1)[0])


def test_bad_files(ggml_files, tmp_path):
    raw = ggml_files["f16"].read_bytes()
    bad = tmp_path / "ggml-bad.bin"
    bad.write_bytes(b"GGUF" + raw[4:])
    with pytest.raises(ValueError, match=f"{bad}: not a whisper.cpp ggml model file"):
        GgmlWhisperFile(bad)
    with pytest.raises(ValueError, match=str(bad)):
        load_model(bad)
    for cut in (20, 60, len(raw) - 100, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match=f"{bad}: truncated whisper.cpp ggml file"):
            GgmlWhisperFile(bad)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ggml_files["f16"], alone / "ggml-tiny.bin")
    with pytest.raises(ValueError, match=f"{alone / 'tokenizer.json'}: missing"):
        load_model(alone / "ggml-tiny.bin")
