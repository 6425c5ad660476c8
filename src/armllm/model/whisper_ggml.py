"""whisper_ggml: reads whisper.cpp's legacy ggml model files (ggml-tiny.en.bin ...,
what its models/convert-pt-to-ggml.py and convert-h5-to-ggml.py write and its
quantize tool rewrites): memory-mapped, the header, hyperparameters, mel filters
and vocabulary read eagerly, the tensors indexed and read lazily.

The layout, little-endian int32 throughout: the magic 0x67676d6c ("ggml"); eleven
hyperparameters (n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype; a quantized
file's ftype carries its quantization version times 1000); the mel filterbank
(n_mel, n_fft, then n_mel * n_fft float32); the vocabulary (a count, then each
token's byte length and bytes); then tensors to the end of the file, each n_dims,
the name's byte length, its ggml type id, n_dims dimensions innermost first (ggml's
ne), the name and the data, unpadded. Types: f32, f16 and the ggml blocks q4_0,
q4_1, q5_0, q5_1, q8_0 (GGUF's type ids and blocks).

Tensor names are OpenAI's ("encoder.blocks.0.attn.query.weight"); `GgmlWhisper`
serves them under Hugging Face's names (model/whisper.py's WhisperTensors). The
conv biases are stored [n, 1]; they are served as [n].
Every malformed input raises ValueError naming the file (and tensor)."""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from armllm import ops
from armllm.model.arch.whisper import config_from_ggml
from armllm.model.config import ModelConfig
from armllm.model.gguf import GGML_TYPES
from armllm.model.mapped import map_file

GGML_MAGIC = 0x67676D6C
HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
           "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")
QNT_VERSION_FACTOR = 1000   # ftype = quantization version * 1000 + the file type
# the ggml types whisper.cpp's files hold (its convert scripts and quantize tool)
TENSOR_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0"}
MAX_DIMS = 4
MAX_NAME = 1 << 16

# OpenAI's per-layer module names -> Hugging Face's, under "{encoder,decoder}.blocks.{i}."
LAYER_NAMES = {
    "attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj",
    "attn.value": "self_attn.v_proj", "attn.out": "self_attn.out_proj",
    "attn_ln": "self_attn_layer_norm",
    "cross_attn.query": "encoder_attn.q_proj", "cross_attn.key": "encoder_attn.k_proj",
    "cross_attn.value": "encoder_attn.v_proj", "cross_attn.out": "encoder_attn.out_proj",
    "cross_attn_ln": "encoder_attn_layer_norm",
    "mlp.0": "fc1", "mlp.2": "fc2", "mlp_ln": "final_layer_norm",
}
GLOBAL_NAMES = {
    "encoder.conv1.weight": "model.encoder.conv1.weight",
    "encoder.conv1.bias": "model.encoder.conv1.bias",
    "encoder.conv2.weight": "model.encoder.conv2.weight",
    "encoder.conv2.bias": "model.encoder.conv2.bias",
    "encoder.positional_embedding": "model.encoder.embed_positions.weight",
    "encoder.ln_post.weight": "model.encoder.layer_norm.weight",
    "encoder.ln_post.bias": "model.encoder.layer_norm.bias",
    "decoder.positional_embedding": "model.decoder.embed_positions.weight",
    "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
    "decoder.ln.weight": "model.decoder.layer_norm.weight",
    "decoder.ln.bias": "model.decoder.layer_norm.bias",
}
_LAYER = re.compile(r"(encoder|decoder)\.blocks\.(\d+)\.(.+)\.(weight|bias)")


def hf_name(name: str) -> str | None:
    """The Hugging Face name of whisper.cpp's tensor `name` (None: not Whisper's)."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    m = _LAYER.fullmatch(name)
    if m is None or m.group(3) not in LAYER_NAMES:
        return None
    side, layer, module, leaf = m.groups()
    return f"model.{side}.layers.{layer}.{LAYER_NAMES[module]}.{leaf}"


def is_ggml_file(path: Path) -> bool:
    """A file that starts with the ggml magic (whisper.cpp's model files)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == struct.pack("<I", GGML_MAGIC)
    except OSError:
        return False


@dataclass(frozen=True)
class GgmlTensor:
    name: str
    shape: tuple[int, ...]   # numpy order (outermost first): ne reversed
    ggml_type: int
    offset: int              # absolute byte offset of the data
    nbytes: int

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES[self.ggml_type]


class _Reader:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated whisper.cpp ggml file while reading "
                             f"{what} (need {n} bytes at offset {self.pos}, file has "
                             f"{len(self.buf)})")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def i32(self, what: str) -> int:
        return struct.unpack("<i", self.take(4, what))[0]


class GgmlWhisperFile:
    """A whisper.cpp ggml model file, memory-mapped: `hparams` (HPARAMS' names),
    `mel_filters` [n_mel, n_fft] float32, `vocab` (each token's bytes) and `tensors`
    (by whisper.cpp's name)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mmap = map_file(self.path, "whisper.cpp ggml model")
        self._buf = memoryview(self._mmap)
        self.tensors: dict[str, GgmlTensor] = {}
        self._parse()

    def _parse(self) -> None:
        r = _Reader(self._buf, self.path)
        magic = struct.unpack("<I", r.take(4, "magic"))[0]
        if magic != GGML_MAGIC:
            raise ValueError(f"{self.path}: not a whisper.cpp ggml model file (magic "
                             f"{magic:#010x}, expected {GGML_MAGIC:#010x})")
        self.hparams = {name: r.i32(f"hyperparameter {name}") for name in HPARAMS}
        for name in HPARAMS[:-1]:
            if self.hparams[name] <= 0:
                raise ValueError(f"{self.path}: hyperparameter {name} is "
                                 f"{self.hparams[name]}, expected a positive count")
        if self.hparams["n_audio_state"] != self.hparams["n_text_state"]:
            raise ValueError(f"{self.path}: n_audio_state {self.hparams['n_audio_state']} "
                             f"differs from n_text_state {self.hparams['n_text_state']}")
        n_mel, n_fft = r.i32("mel filter rows"), r.i32("mel filter columns")
        if n_mel < 0 or n_fft < 0:
            raise ValueError(f"{self.path}: mel filters of shape [{n_mel}, {n_fft}]")
        start = r.pos
        r.take(4 * n_mel * n_fft, "mel filters")
        self.mel_filters = np.frombuffer(self._buf, np.dtype("<f4"), n_mel * n_fft,
                                         start).reshape(n_mel, n_fft)
        count = r.i32("vocabulary size")
        if count < 0:
            raise ValueError(f"{self.path}: vocabulary of {count} tokens")
        self.vocab = [bytes(r.take(r.i32(f"length of token {i}"), f"token {i}"))
                      for i in range(count)]
        while r.pos < len(self._buf):
            t = self._tensor(r)
            if t.name in self.tensors:
                raise ValueError(f"{self.path}: tensor {t.name} stored twice")
            self.tensors[t.name] = t

    def _tensor(self, r: _Reader) -> GgmlTensor:
        n_dims, length, ttype = (r.i32(f"tensor header at offset {r.pos}") for _ in range(3))
        if not 1 <= n_dims <= MAX_DIMS or not 0 < length <= MAX_NAME:
            raise ValueError(f"{self.path}: corrupt tensor header at offset {r.pos - 12} "
                             f"({n_dims} dims, name of {length} bytes)")
        ne = [r.i32("tensor dimensions") for _ in range(n_dims)]
        raw_name = bytes(r.take(length, "tensor name"))
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: tensor name {raw_name!r} is not UTF-8") from None
        if ttype not in TENSOR_TYPES:
            kind = GGML_TYPES[ttype][0] if ttype in GGML_TYPES else f"id {ttype}"
            raise ValueError(f"{self.path}: tensor {name} has ggml type {kind}; whisper.cpp "
                             f"files hold {', '.join(TENSOR_TYPES.values())}")
        if any(n <= 0 for n in ne):
            raise ValueError(f"{self.path}: tensor {name} has dimensions {ne}")
        _, block, block_bytes = GGML_TYPES[ttype]
        if ne[0] % block:
            raise ValueError(f"{self.path}: tensor {name}'s rows of {ne[0]} are not a "
                             f"multiple of the {TENSOR_TYPES[ttype]} block ({block})")
        nbytes = int(np.prod(ne)) // block * block_bytes
        offset = r.pos
        r.take(nbytes, f"the data of tensor {name}")
        return GgmlTensor(name, tuple(reversed(ne)), ttype, offset, nbytes)

    def tensor(self, name: str) -> GgmlTensor:
        if name not in self.tensors:
            raise ValueError(f"{self.path}: missing tensor {name}")
        return self.tensors[name]

    def array(self, name: str) -> np.ndarray:
        """An f32 or f16 tensor as stored: a zero-copy view of the mapping (unaligned
        where the file puts it so)."""
        t = self.tensor(name)
        if t.type_name not in ("F32", "F16"):
            raise ValueError(f"{self.path}: tensor {name} is {t.type_name}, not a float type")
        dtype = np.dtype("<f4" if t.type_name == "F32" else "<f2")
        return np.frombuffer(self._buf, dtype, t.nbytes // dtype.itemsize,
                             t.offset).reshape(t.shape)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array of its shape."""
        t = self.tensor(name)
        if t.type_name in ("F32", "F16"):
            return self.array(name).astype(np.float32)
        k = t.shape[-1]
        raw = np.frombuffer(self._buf, np.uint8, t.nbytes, t.offset)
        return ops.gguf_dequantize(t.ggml_type, raw, int(np.prod(t.shape)) // k,
                                   k).reshape(t.shape)

    def close(self) -> None:
        self._buf.release()
        self._mmap.close()


class GgmlWhisper:
    """A whisper.cpp ggml file's tensors under Hugging Face's names, as float32
    (f16 widened, quantized blocks dequantized)."""

    def __init__(self, path: str | Path):
        self.file, self.source = GgmlWhisperFile(path), str(path)
        self.names = {}
        for name in self.file.tensors:
            hf = hf_name(name)
            if hf is None:
                raise ValueError(f"{self.source}: unknown tensor {name} (not whisper.cpp's "
                                 f"Whisper)")
            self.names[hf] = name

    def has(self, name: str) -> bool:
        return name in self.names

    def float(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise ValueError(f"{self.source}: missing tensor {name} (Hugging Face's name)")
        a = self.file.dequantize(self.names[name])
        return a.reshape(-1) if name.endswith(".bias") else a   # conv biases: [n, 1]

    def int8(self, name: str) -> None:
        return None   # quantized blocks are dequantized (q8_0 could run as stored)

    def config(self, eos_token_id: int | None, start_token_id: int | None) -> ModelConfig:
        """The model's config: the hyperparameters, the MLP widths of the fc1 shapes."""
        def ffn(side: str) -> int:
            return self.file.tensor(f"{side}.blocks.0.mlp.0.weight").shape[0]
        return config_from_ggml(self.file.hparams, ffn("encoder"), ffn("decoder"),
                                eos_token_id, start_token_id)
