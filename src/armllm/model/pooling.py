"""pooling: how an embedding model turns a prompt's last hidden states into one
vector (PoolingConfig), read where the model says it: a sentence-transformers
pipeline (modules.json: Transformer, Pooling, Normalize), a GGUF's
`{arch}.pooling_type`, else the decoder-embedding default (the last token's
state, L2-normalized, as Qwen3-Embedding, gte-Qwen2 and e5-mistral pool).
Matryoshka truncation (the request's `dimensions`) is allowed where config.json
says the model was trained for it (`matryoshka_dimensions`, `is_matryoshka`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PoolingMode = Literal["last", "mean", "cls"]
POOLING_MODES = ("last", "mean", "cls")
# sentence-transformers' pooling mode names (its Pooling config) -> ours
_ST_MODES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
_ST_LEGACY_KEYS = {"pooling_mode_lasttoken": "lasttoken", "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean"}
# the sentence-transformers modules whose work this pooling does (by class name)
_ST_UNDERSTOOD = ("Transformer", "Pooling", "Normalize")
# llama.cpp's LLAMA_POOLING_TYPE_* values -> ours (0: none, 4: rank are not embeddings)
_GGUF_MODES = {1: "mean", 2: "cls", 3: "last"}


@dataclass(frozen=True)
class PoolingConfig:
    mode: PoolingMode = "last"
    normalize: bool = True
    # the sizes a vector may be truncated to (Matryoshka): None, none; () any size
    matryoshka_dimensions: tuple[int, ...] | None = None
    # why this model's embeddings cannot be computed (a pipeline armllm does not run);
    # its generation is unaffected
    unsupported: str = ""

    def __post_init__(self):
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode must be one of {', '.join(POOLING_MODES)}, got "
                             f"{self.mode!r}")

    @property
    def reads_every_row(self) -> bool:
        """The pooled vector needs every prompt row's state (no row may come from the
        prefix cache); last-token pooling needs only the last, always computed."""
        return self.mode != "last"

    def check_dimensions(self, dimensions: int | None, hidden_size: int) -> None:
        """Raises ValueError unless `dimensions` (None: the model's own) is a size this
        model's vectors may be truncated to."""
        if dimensions is None:
            return
        if type(dimensions) is not int or not 1 <= dimensions <= hidden_size:
            raise ValueError(f"dimensions must be an integer in [1, {hidden_size}], got "
                             f"{dimensions!r}")
        if dimensions == hidden_size:
            return
        allowed = self.matryoshka_dimensions
        if allowed is None:
            raise ValueError(f"this model's embeddings have {hidden_size} dimensions and it "
                             f"was not trained for truncation (Matryoshka): dimensions "
                             f"{dimensions} is not available")
        if allowed and dimensions not in allowed:
            raise ValueError(f"dimensions must be one of {sorted(allowed)} for this model, got "
                             f"{dimensions}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def _matryoshka(config_json: dict) -> tuple[int, ...] | None:
    dims = config_json.get("matryoshka_dimensions")
    if dims:
        return tuple(int(d) for d in dims)
    return () if config_json.get("is_matryoshka") else None


def _st_mode(path: Path, cfg: dict) -> PoolingMode:
    """Our mode of a sentence-transformers Pooling config (new or legacy keys)."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in _ST_LEGACY_KEYS.items() if cfg.get(key)]
        mode = modes if len(modes) != 1 else modes[0]
        mode = mode or "mean"   # sentence-transformers' default
    if isinstance(mode, list | tuple):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    if mode not in _ST_MODES:
        raise ValueError(f"{path}: pooling {mode!r} is not supported (armllm pools "
                         f"{', '.join(_ST_MODES)})")
    if cfg.get("include_prompt") is False:
        raise ValueError(f"{path}: pooling that excludes the instruction prompt "
                         "(include_prompt false) is not supported")
    return _ST_MODES[mode]


def pooling_from_dir(model_dir: str | Path) -> PoolingConfig:
    """The pooling of a Hugging Face model directory."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    matryoshka = _matryoshka(_read_json(config_path)) if config_path.exists() else None
    modules_path = model_dir / "modules.json"
    if not modules_path.exists():
        return PoolingConfig(matryoshka_dimensions=matryoshka)
    modules = _read_json(modules_path)
    if not isinstance(modules, list):
        raise ValueError(f"{modules_path}: expected a list of modules")
    mode, normalize = "last", False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""
        if kind not in _ST_UNDERSTOOD:
            return PoolingConfig(unsupported=(
                f"{modules_path}: sentence-transformers module {module!r} is not supported "
                f"(armllm runs {', '.join(_ST_UNDERSTOOD)})"))
        if kind == "Pooling":
            cfg_path = model_dir / str(module.get("path", "")) / "config.json"
            try:
                mode = _st_mode(cfg_path, _read_json(cfg_path)) if cfg_path.exists() else "mean"
            except ValueError as exc:
                return PoolingConfig(unsupported=str(exc))
        normalize |= kind == "Normalize"
    return PoolingConfig(mode, normalize, matryoshka)


def pooling_from_gguf(meta: dict[str, Any]) -> PoolingConfig:
    """The pooling a GGUF's metadata names (llama.cpp's `{arch}.pooling_type`); its
    embeddings are normalized, as llama.cpp's server returns them."""
    arch = meta.get("general.architecture")
    kind = meta.get(f"{arch}.pooling_type")
    return PoolingConfig(_GGUF_MODES.get(kind, "last"), True)
