"""arch: the registry of model architectures. Each file here is one family
(model/arch/base.py says what a file declares); this module maps a Hugging
Face config.json's `architectures` and a GGUF file's `general.architecture`
to the file that runs it, and a ModelConfig back to its family. It is the
only place, with the architecture files, where an architecture's name is
compared."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from armllm.model.arch import gemma3, gpt_oss, llama, mixtral, phi3, qwen3_5, qwen3_moe, whisper
from armllm.model.arch.base import Architecture, TensorRef
from armllm.model.config import ModelConfig

FAMILIES: tuple[Architecture, ...] = (
    *(m.ARCHITECTURE for m in (llama, mixtral, qwen3_moe, gpt_oss, gemma3, phi3)),
    qwen3_5.ARCHITECTURE, qwen3_5.MOE_ARCHITECTURE, whisper.ARCHITECTURE)
HF_ARCHITECTURES: dict[str, Architecture] = {
    name: f for f in FAMILIES for name in f.hf_architectures}
# a GGUF architecture -> the families that run its files (runs_gguf tells which)
GGUF_ARCHITECTURES: dict[str, tuple[Architecture, ...]] = {
    name: tuple(f for f in FAMILIES if name in f.gguf_architectures)
    for family in FAMILIES for name in family.gguf_architectures}

__all__ = ["Architecture", "TensorRef", "FAMILIES", "HF_ARCHITECTURES", "GGUF_ARCHITECTURES",
           "for_hf", "for_gguf", "for_ct2", "of", "config_from_hf", "config_from_gguf",
           "load_hf_config"]


def for_hf(cfg: dict[str, Any], source: str) -> tuple[Architecture, str]:
    """The family that runs a config.json, and the `architectures` entry it runs."""
    archs = cfg.get("architectures") or []
    name = next((a for a in archs if a in HF_ARCHITECTURES), None)
    if name is None:
        raise ValueError(f"{source}: unsupported architecture {archs or cfg.get('model_type')!r} "
                         f"(supported: {', '.join(HF_ARCHITECTURES)})")
    return HF_ARCHITECTURES[name], name


def for_gguf(meta: dict[str, Any], source: str) -> tuple[Architecture, str]:
    """The family that runs a GGUF file, and its general.architecture."""
    name = meta.get("general.architecture")
    if name not in GGUF_ARCHITECTURES:
        raise ValueError(f"{source}: unsupported GGUF architecture {name!r} (supported: "
                         f"{', '.join(GGUF_ARCHITECTURES)})")
    return next(f for f in GGUF_ARCHITECTURES[name] if f.runs_gguf(meta)), name


# a CTranslate2 model.bin's spec name -> the family that runs it
CT2_SPECS: dict[str, Architecture] = {"WhisperSpec": whisper.ARCHITECTURE}


def for_ct2(spec: str, source: str) -> Architecture:
    """The family that runs a CTranslate2 model.bin of this spec."""
    if spec not in CT2_SPECS:
        raise ValueError(f"{source}: unsupported CTranslate2 model {spec!r} (supported: "
                         f"{', '.join(CT2_SPECS)})")
    return CT2_SPECS[spec]


def of(config: ModelConfig) -> Architecture:
    """The family whose config this is (by the architecture it records)."""
    for f in FAMILIES:
        if config.architecture in f.hf_architectures.values():
            return f
    raise ValueError(f"no architecture file runs {config.architecture!r}")


def config_from_hf(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """The ModelConfig of a config.json, by the architecture file that runs it."""
    family, name = for_hf(cfg, source)
    try:
        return family.config_from_hf(cfg, name)
    except KeyError as exc:
        raise ValueError(f"{source}: missing key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        if str(exc).startswith("config:"):
            raise ValueError(f"{source}: {exc}") from None
        raise ValueError(f"{source}: malformed value: {exc}") from None


def load_hf_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (a Hugging Face model directory needs config.json)") \
            from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return config_from_hf(cfg, str(path))


def config_from_gguf(meta: dict[str, Any], source: str) -> ModelConfig:
    """The ModelConfig of a GGUF file's metadata, by the architecture file that runs it."""
    family, gguf_arch = for_gguf(meta, source)
    try:
        return family.config_from_gguf(meta, gguf_arch, source)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith("config:"):
            raise ValueError(f"{source}: {exc}") from None
        raise
