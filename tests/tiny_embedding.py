"""Writes tiny random-weight embedding models the way sentence-transformers saves
them: a bare decoder (transformers' Qwen3Model, LlamaModel, ...: no lm_head,
tensors without the "model." prefix), a tokenizer that appends an end token
(Qwen3-Embedding's post-processor), modules.json with its Pooling (and
Normalize) module. Needs torch, transformers and sentence-transformers."""
from __future__ import annotations

import json
from pathlib import Path

WORDS = [f"w{i}" for i in range(90)]
SPECIALS = ["<|endoftext|>", "<pad>"]
TINY = dict(vocab_size=len(SPECIALS) + len(WORDS), hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-6)
# name -> (transformers config class, bare model class, extra config)
DECODERS = {"qwen3": ("Qwen3Config", "Qwen3Model", {"head_dim": 16}),
            "llama": ("LlamaConfig", "LlamaModel", {}),
            "mistral": ("MistralConfig", "MistralModel", {"sliding_window": None})}


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    eos = vocab["<|endoftext|>"]
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B <|endoftext|>",
        special_tokens=[("<|endoftext|>", eos)])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
         "pad_token": "<pad>", "padding_side": "left", "model_max_length": 256}))


def write_tiny_embedding(path: Path, decoder: str = "qwen3", pooling: str = "lasttoken",
                         normalize: bool = True, seed: int = 0, **config_extra):
    """The model directory at `path` and the sentence-transformers model over it."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    config_cls, model_cls, extra = DECODERS[decoder]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**TINY, **extra, **config_extra})
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # random norms, so that they matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    base = path / "base"
    base.mkdir(parents=True)
    model.save_pretrained(base, safe_serialization=True)
    write_tokenizer(base)
    modules = [Transformer(str(base)), Pooling(TINY["hidden_size"], pooling_mode=pooling)]
    if normalize:
        modules.append(Normalize())
    st = SentenceTransformer(modules=modules, device="cpu")
    out = path / "model"
    st.save(str(out))
    if config_extra.get("matryoshka_dimensions"):   # save_pretrained keeps unknown keys
        assert json.loads((out / "config.json").read_text())["matryoshka_dimensions"]
    return out, st
