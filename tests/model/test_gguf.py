"""The GGUF reader against the `gguf` package (llama.cpp's own Python reader)
on the real SmolLM2 GGUF, and on corrupt or truncated files."""
from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest

from armllm.model.gguf import GGUFFile

gguf = pytest.importorskip("gguf")


def test_metadata_and_tensors_match_llama_cpp_reader(smollm2_gguf):
    ours = GGUFFile(smollm2_gguf)
    theirs = gguf.GGUFReader(str(smollm2_gguf))
    assert ours.metadata["general.architecture"] == "llama"
    assert ours.metadata["llama.block_count"] == 30
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    types = {ours.tensors[t.name].type_name for t in theirs.tensors}
    assert {"Q4_1", "Q8_0", "F32"} <= types
    seen = set()
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        if info.type_name in seen and not t.name.startswith("blk.29."):
            continue  # one tensor per type, plus the last block (end of the file)
        seen.add(info.type_name)
        want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        got = ours.dequantize(t.name)
        assert got.shape == tuple(int(d) for d in reversed(t.shape))
        assert np.array_equal(got, want.reshape(got.shape)), t.name


def test_tensor_data_is_memory_mapped(smollm2_gguf):
    g = GGUFFile(smollm2_gguf)
    raw = g.raw("blk.0.attn_norm.weight")
    assert not raw.flags.owndata and not raw.flags.writeable


def write_minimal_gguf(path, tensors=(("w", (2, 32), 0),), kv=(("general.architecture", "llama"),)):
    """A valid GGUF with F32 tensors of zeros (shape in numpy order)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, value in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", 8)
        out += struct.pack("<Q", len(value)) + value.encode()
    offset = 0
    for name, shape, ggml_type in tensors:
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        out += struct.pack("<IQ", ggml_type, offset)
        offset += int(np.prod(shape)) * 4
    out += b"\0" * (-len(out) % 32) + b"\0" * offset
    path.write_bytes(bytes(out))


def test_minimal_file_roundtrip(tmp_path):
    p = tmp_path / "m.gguf"
    write_minimal_gguf(p)
    g = GGUFFile(p)
    assert g.tensors["w"].shape == (2, 32)
    assert np.array_equal(g.dequantize("w"), np.zeros((2, 32), np.float32))


@pytest.mark.parametrize("cut", [3, 10, 30, 60, -1])
def test_truncated_file_is_a_clear_error(tmp_path, cut):
    p = tmp_path / "m.gguf"
    write_minimal_gguf(p)
    data = p.read_bytes()
    p.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=r"m\.gguf: (truncated|not a GGUF)"):
        GGUFFile(p)


def test_truncated_real_file_names_the_tensor(tmp_path, smollm2_gguf):
    p = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as src, open(p, "wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)
    with open(p, "r+b") as f:
        f.truncate(40_000_000)
    with pytest.raises(ValueError, match=r"cut\.gguf: truncated GGUF file: tensor blk\.\d+\."):
        GGUFFile(p)


def test_bad_magic_version_and_missing_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + b"\0" * 40)
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    with pytest.raises(ValueError, match="unsupported GGUF version 9"):
        GGUFFile(p)
    p.write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        GGUFFile(p)
    with pytest.raises(ValueError, match="no such GGUF file"):
        GGUFFile(tmp_path / "missing.gguf")


def test_absurd_counts_are_refused(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0))
    with pytest.raises(ValueError, match="corrupt GGUF header"):
        GGUFFile(p)


@pytest.mark.parametrize("ggml_type, named", [(16, r"IQ2_XXS \(id 16\)"),
                                              (6, None), (4, r"4, which ggml does not define")])
def test_unsupported_tensor_type_named_on_read(tmp_path, ggml_type, named):
    """A type armllm does not load fails with one line naming the tensor and the type
    (known to ggml or not); a loaded one (6: Q5_0) reads."""
    p = tmp_path / "x.gguf"
    write_minimal_gguf(p, tensors=(("blk.0.q", (1, 256), ggml_type),))
    g = GGUFFile(p)
    if named is None:
        assert g.dequantize("blk.0.q").shape == (1, 256)
        return
    with pytest.raises(ValueError, match=f"tensor blk.0.q has ggml type {named}; armllm "
                                         f"loads F32, .*IQ4_XS, MXFP4$") as err:
        g.dequantize("blk.0.q")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "BF16", "F16", "F32"])
def test_every_supported_type_written_by_llama_cpp_tools(tmp_path, qtype):
    """Tensors quantized and written by the gguf package read back as it dequantizes them."""
    t = getattr(gguf.GGMLQuantizationType, qtype)
    data = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    stored = gguf.quants.quantize(data, t) if qtype != "F32" else data
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    writer.add_tensor("w", stored, raw_dtype=t if qtype not in ("F32", "F16") else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = GGUFFile(tmp_path / "q.gguf")
    assert ours.tensors["w"].type_name == qtype and ours.tensors["w"].shape == (6, 96)
    want = gguf.quants.dequantize(stored, t).reshape(6, 96).astype(np.float32)
    assert np.array_equal(ours.dequantize("w"), want)


def test_rope_freqs_tensor_becomes_frequency_factors(tmp_path):
    from armllm.model.loader import gguf_model_config
    writer = gguf.GGUFWriter(str(tmp_path / "r.gguf"), "llama")
    for key, value in (("embedding_length", 64), ("feed_forward_length", 96),
                       ("block_count", 1), ("attention.head_count", 4),
                       ("attention.head_count_kv", 2), ("context_length", 128),
                       ("vocab_size", 10)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_tensor("rope_freqs.weight", np.array([1, 2, 4, 8, 1, 1, 1, 1], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = gguf_model_config(GGUFFile(tmp_path / "r.gguf"))
    assert config.rope_scaling == {"rope_type": "freq_factors",
                                   "factors": [1, 2, 4, 8, 1, 1, 1, 1]}
    assert config.head_dim == 16 and config.tie_word_embeddings
