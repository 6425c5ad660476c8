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

    def layer(self, c: ModelConfig, i: int) -> tuple[Step, ...]:
        raise ValueError(f"{ARCH} runs as an encoder-decoder (model/arch/whisper.py), not as "
                         f"decoder steps")


ARCHITECTURE = Whisper()


