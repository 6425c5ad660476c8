"""loader: turns a model path (Hugging Face or CTranslate2 directory, .gguf file or
whisper.cpp ggml .bin file) into a config, packed weights and a tokenizer."""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from armllm import ops
from armllm.model import arch
from armllm.model.arch import config_from_gguf, load_hf_config
from armllm.model.compressed_tensors import parse_config
from armllm.model.config import ModelConfig
from armllm.model.ctranslate2 import CT2File
from armllm.model.decoder import DecoderModel
from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf
from armllm.model.pooling import PoolingConfig, pooling_from_dir, pooling_from_gguf
from armllm.model.score_head import (
    ScoreHead,
    head_from_gguf,
    head_from_hf,
    head_from_tokens,
    parse_score_tokens,
    read_score_template,
)
from armllm.model.sharding import ShardedSource, ShardPlan, k_unit, plan_shards
from armllm.model.sources import GGUFSource, HFSource
from armllm.model.tokenizer import TextTokenizer
from armllm.model.weights import Quantization, WeightDtype, head_tensor_name, load_weights
from armllm.model.whisper import is_ct2_dir
from armllm.model.whisper_ggml import GgmlWhisper, is_ggml_file

log = logging.getLogger("armllm")

# llama.cpp's recommended-sampler metadata (gguf-py's Keys.General.SAMPLING_*) -> the
# generation_config.json field it sets
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
                      "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_repeat": "repetition_penalty"}
# GGUF stores those as float32, which reads 0.95 as 0.949999988: 6 decimals undo that
GGUF_FLOAT_DECIMALS = 6


@dataclass
class LoadedModel:
    path: Path
    config: ModelConfig
    model: DecoderModel
    tokenizer: Tokenizer
    tokenizer_config: dict
    generation_config: dict   # generation_config.json, or what a GGUF's metadata implies
    tensor_types: str | None = None   # a GGUF's tensors per ggml type: "Q4_K: 112, F32: 33"
    pooling: PoolingConfig = PoolingConfig()   # how its embeddings are pooled
    # a reranker's relevance head (model/score_head.py), and the text a query and a
    # document are put into to score them (None: the tokenizer's pair encoding)
    score_head: ScoreHead | None = None
    score_template: str | None = None


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def gguf_model_config(gguf: GGUFFile) -> ModelConfig:
    """The config a GGUF file implies, its tensors included: tied embeddings when
    there is no output.weight, RoPE frequency factors from rope_freqs.weight."""
    config = config_from_gguf(gguf.metadata, str(gguf.path))
    scaling = config.rope_scaling
    if "rope_factors_long.weight" in gguf.tensors:   # LongRoPE (llama.cpp's phi3)
        long, short = (gguf.dequantize(f"rope_factors_{n}.weight").tolist()
                       for n in ("long", "short"))
        if len(long) != config.rot_dim // 2 or len(short) != config.rot_dim // 2:
            raise ValueError(f"{gguf.path}: the LongRoPE factors have {len(long)} and "
                             f"{len(short)} entries, expected {config.rot_dim // 2}")
        arch_name = gguf.metadata["general.architecture"]
        scaling = {"rope_type": "longrope", "long_factor": long, "short_factor": short,
                   "original_max_position_embeddings": int(gguf.metadata.get(
                       f"{arch_name}.rope.scaling.original_context_length",
                       config.max_position_embeddings)),
                   "max_position_embeddings": config.max_position_embeddings}
        factor = gguf.metadata.get(f"{arch_name}.rope.scaling.attn_factor")
        if factor is not None:
            scaling["attention_factor"] = float(factor)
    elif "rope_freqs.weight" in gguf.tensors:
        factors = gguf.dequantize("rope_freqs.weight")
        if factors.shape != (config.head_dim // 2,):
            raise ValueError(f"{gguf.path}: tensor rope_freqs.weight has shape "
                             f"{list(factors.shape)}, expected [{config.head_dim // 2}]")
        scaling = {"rope_type": "freq_factors", "factors": factors.tolist()}
    return dataclasses.replace(config, rope_scaling=scaling,
                               tie_word_embeddings="output.weight" not in gguf.tensors)


def gguf_generation_config(gguf: GGUFFile, config: ModelConfig) -> dict:
    """The generation_config.json a GGUF implies: its EOS ids and its sampling keys."""
    gen: dict = {"eos_token_id": list(config.eos_token_ids)} if config.eos_token_ids else {}
    for key, name in GGUF_SAMPLING_KEYS.items():
        value = gguf.metadata.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{gguf.path}: metadata {key} must be a number, got {value!r}")
        gen[name] = round(value, GGUF_FLOAT_DECIMALS) if isinstance(value, float) else value
    return gen


def model_path(path: str | Path) -> Path:
    """A model's local path, checked: an existing directory, .gguf file or whisper.cpp
    ggml file (a .bin that starts with the ggml magic). A Hugging
    Face Hub name (ORG/NAME, ORG/NAME:QUANT...; model/hub.py) that is not a local path
    is downloaded first, or found in the Hugging Face cache."""
    if not Path(path).exists():
        from armllm.model import hub  # huggingface_hub loads only for a model by name
        path = hub.resolve(path)
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such model file or directory")
    if path.is_file() and path.suffix != ".gguf" and not is_ggml_file(path):
        raise ValueError(f"{path}: a model is a directory, a .gguf file or a whisper.cpp "
                         f"ggml .bin file")
    return path


def _open(path: Path) -> tuple[ModelConfig, HFSource | GGUFSource, GGUFFile | None]:
    """The config and tensor source of a checked model path (and its GGUFFile)."""
    if is_ggml_file(path):   # whisper.cpp's ggml-*.bin
        return ggml_config(path), None, None
    if path.is_file():
        gguf = GGUFFile(path)
        config = gguf_model_config(gguf)
        return config, GGUFSource(gguf, config), gguf
    if is_ct2_dir(path):   # CTranslate2's layout (faster-whisper's models)
        return ct2_config(path), None, None
    config = load_hf_config(path)
    ct = parse_config(_read_json(path / "config.json"), str(path / "config.json"))
    source = HFSource(path, ct, config)
    if config.has_lm_head and not config.tie_word_embeddings and \
            not source.has("lm_head.weight"):   # a causal LM's config over an embedding model
        config = dataclasses.replace(config, has_lm_head=False)
    return config, source, None


def _shard_plans(config: ModelConfig, source, ranks: int, quantization: Quantization
                 ) -> list[ShardPlan]:
    if config.encoder is not None:
        raise ValueError(f"{config.architecture}: tensor parallel does not split an "
                         f"encoder-decoder; run it on one rank (data parallel replicas do)")
    return plan_shards(config, ranks, k_unit(source, config, quantization))


def tensor_parallel_plans(path: str | Path, ranks: int, quantization: Quantization = "auto"
                          ) -> list[ShardPlan]:
    """Each rank's ShardPlan for the model at `path` (headers only; no weights are
    read), or a ValueError saying why it does not split over `ranks`."""
    config, source, _ = _open(model_path(path))
    return _shard_plans(config, source, ranks, quantization)


def load_model(path: str | Path, dtype: WeightDtype = "bf16", progress=None,
               quantization: Quantization = "auto", quantize_lm_head: bool = False,
               comm: ops.Comm | None = None, score_from_tokens: str | None = None,
               score_template: str | None = None) -> LoadedModel:
    """Loads a Hugging Face model directory or a GGUF file (see load_weights for
    `quantization`). With `comm`, a tensor-parallel rank's: the model holds rank
    comm.rank's shards (model/sharding.py) and communicates through comm; the
    LoadedModel's config stays the whole model's. A reranker (a one-label
    sequence classifier, a GGUF of pooling type rank, or a causal reranker named by
    score_from_tokens "FALSE,TRUE") loads its score head instead of an lm_head;
    score_template (text or a file, with {query} and {document}) overrides a GGUF's
    `tokenizer.chat_template.rerank`."""
    path = model_path(path)
    score_tokens = parse_score_tokens(score_from_tokens)
    template = read_score_template(score_template)
    config, source, gguf = _open(path)
    if (note := arch.of(config).text_only_note(config)) and (comm is None or comm.rank == 0):
        log.info("%s", note)
    if config.encoder is not None:   # an encoder-decoder (Whisper): model/whisper.py
        if score_tokens or template:
            raise ValueError(f"{path}: an encoder-decoder ({config.architecture}) is no "
                             f"reranker: score_from_tokens and score_template do not apply")
        return _load_encoder_decoder(path, config, dtype, quantization, progress, comm)
    if gguf is not None:
        tokenizer, tok_config = tokenizer_from_gguf(gguf.metadata, str(path))
        template = template or gguf.metadata.get("tokenizer.chat_template.rerank")
    else:
        tokenizer, tok_config = _hf_tokenizer(path), _read_json(path / "tokenizer_config.json")
    head = _score_head(path, config, source, gguf, tokenizer, score_tokens)
    if head is not None:   # a reranker: no lm_head (its rows, if any, are the head's)
        config = dataclasses.replace(config, has_lm_head=False, tie_word_embeddings=False)
        if gguf is not None:
            source = GGUFSource(gguf, config)
        if comm is None or comm.rank == 0:
            log.info("a reranker: its relevance score is read from %s", head.source)
    elif score_template is not None:
        raise ValueError(f"{path}: score_template is given but the model is no reranker (a "
                         f"one-label sequence classifier, or a causal reranker named by "
                         f"score_from_tokens)")
    shard_config, vocab_bounds = config, None
    if comm is not None:
        plan = _shard_plans(config, source, comm.ranks, quantization)[comm.rank]
        source = ShardedSource(source, plan, config, head_tensor_name(config))
        shard_config, vocab_bounds = plan.config(config), plan.vocab_bounds
    weights = load_weights(source, shard_config, dtype, progress, quantization,
                           quantize_lm_head)
    model = DecoderModel(shard_config, weights, comm, vocab_bounds)
    template = template if head is not None else None
    if gguf is not None:
        return LoadedModel(path, config, model, tokenizer, tok_config,
                           gguf_generation_config(gguf, config), gguf.type_summary(),
                           pooling_from_gguf(gguf.metadata), head, template)
    return LoadedModel(path, config, model, tokenizer, tok_config,
                       _read_json(path / "generation_config.json"),
                       pooling=pooling_from_dir(path), score_head=head, score_template=template)


def _score_head(path: Path, config: ModelConfig, source, gguf: GGUFFile | None,
                tokenizer: Tokenizer, score_tokens: tuple[str, str] | None
                ) -> ScoreHead | None:
    """The model's relevance head, if it is a reranker (model/score_head.py)."""
    if score_tokens is not None:
        if not config.has_lm_head:
            raise ValueError(f"{path}: score_from_tokens reads two rows of the lm_head, and "
                             f"this checkpoint has none")
        return head_from_tokens(source, config, head_tensor_name(config), tokenizer,
                                score_tokens, str(path))
    if gguf is not None:
        return head_from_gguf(gguf, config)
    config_json = _read_json(path / "config.json")
    if any(str(a).endswith("ForSequenceClassification")
           for a in config_json.get("architectures") or []):
        return head_from_hf(source, config_json, config, str(path))
    return None


def ct2_config(path: Path) -> ModelConfig:
    """The config of a CTranslate2 directory: its spec's family reads the shapes of
    model.bin's variables; the EOS and start tokens come from its tokenizer.json."""
    model_bin = CT2File(path / "model.bin")
    family = arch.for_ct2(model_bin.spec, str(path / "model.bin"))
    shapes = {n: model_bin.variable(n).shape for n in model_bin.names()}
    scalars = {n: int(model_bin.array(n)) for n in model_bin.names() if not shapes[n]}
    tokenizer = _hf_tokenizer(path)
    return family.config_from_ct2(shapes, scalars, tokenizer.token_to_id("<|endoftext|>"),
                                  tokenizer.token_to_id("<|startoftranscript|>"))


def ggml_config(path: Path) -> ModelConfig:
    """The config of a whisper.cpp ggml file: its hyperparameters; the EOS and start
    tokens from the tokenizer.json beside it."""
    tokenizer = _ggml_tokenizer(path)
    return GgmlWhisper(path).config(tokenizer.token_to_id("<|endoftext|>"),
                                    tokenizer.token_to_id("<|startoftranscript|>"))


def _ggml_tokenizer(path: Path) -> Tokenizer:
    tok_path = path.parent / "tokenizer.json"
    if not tok_path.exists():
        raise ValueError(f"{tok_path}: missing: a whisper.cpp ggml file ({path.name}) holds "
                         f"only its vocabulary's bytes; armllm needs the model's Hugging Face "
                         f"tokenizer.json beside it")
    return _hf_tokenizer(path.parent)


def _load_encoder_decoder(path: Path, config: ModelConfig, dtype: WeightDtype, quantization,
                          progress, comm) -> LoadedModel:
    from armllm.model import whisper
    if comm is not None:
        _shard_plans(config, None, comm.ranks, quantization)   # refuses
    ggml = is_ggml_file(path)   # its tokenizer and configs lie beside it
    model = whisper.load(path, config, dtype, quantization, progress,
                         GgmlWhisper(path) if ggml else None)
    files = path.parent if ggml else path
    generation = _read_json(files / "generation_config.json") or \
        {"eos_token_id": list(config.eos_token_ids)}
    return LoadedModel(path, config, model,
                       _ggml_tokenizer(path) if ggml else _hf_tokenizer(path),
                       _read_json(files / "tokenizer_config.json"), generation)


def _hf_tokenizer(path: Path) -> Tokenizer:
    tok_path = path / "tokenizer.json"
    if not tok_path.exists():
        raise ValueError(f"{tok_path}: missing (armllm needs a tokenizers tokenizer.json)")
    try:
        return Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # tokenizers raises its own exception type
        raise ValueError(f"{tok_path}: cannot be read: {exc}") from None


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """Only the tokenizer (and chat template) of a model directory or GGUF file; no
    weights are read."""
    path = model_path(path)
    if is_ggml_file(path):
        return TextTokenizer(_ggml_tokenizer(path),
                             _read_json(path.parent / "tokenizer_config.json"))
    if path.is_file():
        tokenizer, tok_config = tokenizer_from_gguf(GGUFFile(path).metadata, str(path))
        return TextTokenizer(tokenizer, tok_config)
    return TextTokenizer(_hf_tokenizer(path), _read_json(path / "tokenizer_config.json"))


def load_generation_config(path: str | Path) -> dict:
    """Only the generation_config.json of a model directory, or the one a GGUF file
    implies (LoadedModel.generation_config); no weights are read."""
    path = model_path(path)
    if is_ggml_file(path):
        return _read_json(path.parent / "generation_config.json")
    if path.is_file():
        gguf = GGUFFile(path)
        return gguf_generation_config(gguf, gguf_model_config(gguf))
    return _read_json(path / "generation_config.json")
