"""whisper: OpenAI's Whisper (WhisperForConditionalGeneration), tiny to large-v3-turbo,
the one encoder-decoder family: its config and where its tensors are stored, in
Hugging Face safetensors or a CTranslate2 directory (faster-whisper's layout:
model.bin, config.json, tokenizer.json). The model it runs as is model/whisper.py.

How the registry took an encoder-decoder: the ModelConfig holds the decoder (the
paged KV cache, the scheduler's lengths and the sampler read only it) and an
EncoderShape; the per-sequence cross-attention K/V are a fixed-size state like a
hybrid's recurrent state, so they live in the state pool, one slot per running
sequence."""
from __future__ import annotations

import re
from typing import Any

from armllm.model.arch.base import Architecture
from armllm.model.config import EncoderShape, ModelConfig, eos_ids
from armllm.model.layer import Step

ARCH = "WhisperForConditionalGeneration"
LN_EPS = 1e-5          # every LayerNorm's (PyTorch's default, which Whisper keeps)
CONV_TAPS = 3          # both encoder convs: kernel 3, padding 1
MAX_TIMESCALE = 10000  # the encoder's sinusoidal positions, as Whisper computes them
ENC = "model.encoder."
DEC = "model.decoder."


class Whisper(Architecture):
    name = "whisper"
    hf_architectures = {ARCH: ARCH}

    def config_from_hf(self, cfg: dict[str, Any], arch: str) -> ModelConfig:
        d, heads = int(cfg["d_model"]), int(cfg["decoder_attention_heads"])
        if cfg.get("activation_function", "gelu") != "gelu" or cfg.get("scale_embedding"):
            raise ValueError(f"config: Whisper with activation "
                             f"{cfg.get('activation_function')!r} and scale_embedding "
                             f"{cfg.get('scale_embedding')!r} (armllm runs gelu, unscaled)")
        encoder = EncoderShape(int(cfg["num_mel_bins"]), int(cfg["encoder_layers"]),
                               int(cfg["encoder_attention_heads"]), d,
                               int(cfg["encoder_ffn_dim"]), int(cfg["max_source_positions"]))
        return ModelConfig(
            architecture=ARCH, vocab_size=int(cfg["vocab_size"]), hidden_size=d,
            intermediate_size=int(cfg["decoder_ffn_dim"]),
            num_layers=int(cfg["decoder_layers"]), num_heads=heads, num_kv_heads=heads,
            head_dim=d // heads, rms_norm_eps=LN_EPS, rope_theta=1.0, rope_scaling=None,
            max_position_embeddings=int(cfg["max_target_positions"]),
            tie_word_embeddings=True, attention_bias=True,
            bos_token_id=cfg.get("decoder_start_token_id"),
            eos_token_ids=eos_ids(cfg.get("eos_token_id")), encoder=encoder)

    def text_only_note(self, c: ModelConfig) -> str | None:
        return None

    def config_from_ct2(self, shapes: dict[str, tuple[int, ...]], scalars: dict[str, int],
                        eos_token_id: int | None, start_token_id: int | None) -> ModelConfig:
        return _config_from_ct2(shapes, scalars, eos_token_id, start_token_id)

    def layer(self, c: ModelConfig, i: int) -> tuple[Step, ...]:
        raise ValueError(f"{ARCH} runs as an encoder-decoder (model/arch/whisper.py), not as "
                         f"decoder steps")


ARCHITECTURE = Whisper()

# CTranslate2's WhisperSpec names (ctranslate2's converters write them), by the Hugging
# Face name's part under "model.{encoder,decoder}.layers.{i}." (fused q|k|v and
# cross-attention k|v: a (first row, count) of d-row parts; k's bias stored as zeros)
CT2_LAYER_NAMES = {
    "self_attn_layer_norm": ("self_attention/layer_norm", None),
    "self_attn.q_proj": ("self_attention/linear_0", 0),
    "self_attn.k_proj": ("self_attention/linear_0", 1),
    "self_attn.v_proj": ("self_attention/linear_0", 2),
    "self_attn.out_proj": ("self_attention/linear_1", None),
    "encoder_attn_layer_norm": ("attention/layer_norm", None),
    "encoder_attn.q_proj": ("attention/linear_0", None),
    "encoder_attn.k_proj": ("attention/linear_1", 0),
    "encoder_attn.v_proj": ("attention/linear_1", 1),
    "encoder_attn.out_proj": ("attention/linear_2", None),
    "final_layer_norm": ("ffn/layer_norm", None),
    "fc1": ("ffn/linear_0", None),
    "fc2": ("ffn/linear_1", None),
}
CT2_GLOBAL_NAMES = {
    "model.encoder.conv1": "encoder/conv1", "model.encoder.conv2": "encoder/conv2",
    "model.encoder.embed_positions": "encoder/position_encodings",
    "model.encoder.layer_norm": "encoder/layer_norm",
    "model.decoder.embed_tokens": "decoder/embeddings",
    "model.decoder.embed_positions": "decoder/position_encodings",
    "model.decoder.layer_norm": "decoder/layer_norm",
}
_LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)")


def ct2_tensor(name: str, hidden: int) -> tuple[str, tuple[int, int] | None]:
    """Where a CTranslate2 WhisperSpec stores the Hugging Face tensor `name`: its
    variable and, for a part of a fused matrix, (first row, rows)."""
    m = _LAYER.fullmatch(name)
    if m:
        side, layer, module, leaf = m.groups()
        if module not in CT2_LAYER_NAMES:
            raise ValueError(f"no CTranslate2 name for {name}")
        scope, part = CT2_LAYER_NAMES[module]
        leaf = {"weight": "gamma", "bias": "beta"}[leaf] if module.endswith("norm") else leaf
        rows = None if part is None else (part * hidden, hidden)
        return f"{side}/layer_{layer}/{scope}/{leaf}", rows
    module, _, leaf = name.rpartition(".")
    if module not in CT2_GLOBAL_NAMES:
        raise ValueError(f"no CTranslate2 name for {name}")
    scope = CT2_GLOBAL_NAMES[module]
    if scope.endswith("position_encodings"):
        return f"{scope}/encodings", None
    if scope.endswith("layer_norm"):
        leaf = {"weight": "gamma", "bias": "beta"}[leaf]
    return f"{scope}/{leaf}", None


def _config_from_ct2(shapes: dict[str, tuple[int, ...]], scalars: dict[str, int],
                     eos_token_id: int | None, start_token_id: int | None) -> ModelConfig:
    """A CTranslate2 WhisperSpec's config, from its variables' shapes and its num_heads
    scalars (model.bin stores no config of the model itself)."""
    def layers(side: str) -> int:
        return sum(1 for n in shapes if re.fullmatch(rf"{side}/layer_\d+/ffn/linear_0/weight", n))
    d, n_mels, _ = shapes["encoder/conv1/weight"]
    heads = scalars["decoder/num_heads"]
    encoder = EncoderShape(n_mels, layers("encoder"), scalars["encoder/num_heads"], d,
                           shapes["encoder/layer_0/ffn/linear_0/weight"][0],
                           shapes["encoder/position_encodings/encodings"][0])
    return ModelConfig(
        architecture=ARCH, vocab_size=shapes["decoder/embeddings/weight"][0], hidden_size=d,
        intermediate_size=shapes["decoder/layer_0/ffn/linear_0/weight"][0],
        num_layers=layers("decoder"), num_heads=heads, num_kv_heads=heads,
        head_dim=d // heads, rms_norm_eps=LN_EPS, rope_theta=1.0, rope_scaling=None,
        max_position_embeddings=shapes["decoder/position_encodings/encodings"][0],
        tie_word_embeddings=True, attention_bias=True, bos_token_id=start_token_id,
        eos_token_ids=() if eos_token_id is None else (eos_token_id,), encoder=encoder)




def config_from_ggml(hparams: dict[str, int], encoder_ffn: int, decoder_ffn: int,
                     eos_token_id: int | None, start_token_id: int | None) -> ModelConfig:
    """A whisper.cpp ggml file's config (model/whisper_ggml.py): its hyperparameters
    and the MLP widths of its fc1 weights (whisper.cpp assumes 4 * state)."""
    d, heads = hparams["n_text_state"], hparams["n_text_head"]
    encoder = EncoderShape(hparams["n_mels"], hparams["n_audio_layer"], hparams["n_audio_head"],
                           hparams["n_audio_state"], encoder_ffn, hparams["n_audio_ctx"])
    return ModelConfig(
        architecture=ARCH, vocab_size=hparams["n_vocab"], hidden_size=d,
        intermediate_size=decoder_ffn, num_layers=hparams["n_text_layer"], num_heads=heads,
        num_kv_heads=heads, head_dim=d // heads, rms_norm_eps=LN_EPS, rope_theta=1.0,
        rope_scaling=None, max_position_embeddings=hparams["n_text_ctx"],
        tie_word_embeddings=True, attention_bias=True, bos_token_id=start_token_id,
        eos_token_ids=() if eos_token_id is None else (eos_token_id,), encoder=encoder)
