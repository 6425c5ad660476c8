"""gguf_tokenizer: rebuilds a GGUF file's tokenizer as a `tokenizers.Tokenizer`.

Handles `tokenizer.ggml.model = "gpt2"` (byte-level BPE: tokens, merges,
token types, the pre-tokenizer named by `tokenizer.ggml.pre`, BOS/EOS) and
returns the pieces of a Hugging Face `tokenizer_config.json` (special tokens,
chat template) beside it.
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp token types (llama_token_type)
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (GPT-OSS, llama.cpp's "gpt-4o"): the split of its tokenizer.json
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level_after(split: str | None) -> pre_tokenizers.PreTokenizer:
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre` (llama-vocab.cpp)."""
    if pre in ("default", "gpt2", "gpt-2", ""):
        return _byte_level_after(None)
    if pre == "smollm":  # SmolLM/SmolLM2: digits one by one, then GPT-2's split
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"):
        return _byte_level_after(_LLAMA3_SPLIT)
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return _byte_level_after(_QWEN2_SPLIT)
    if pre in ("gpt-4o", "llama4"):
        return _byte_level_after(_GPT4O_SPLIT)
    raise ValueError(f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre = {pre!r} "
                     f"(supported: default, gpt2, smollm, llama-bpe/llama3, qwen2, gpt-4o)")


def tokenizer_from_gguf(meta: dict[str, Any], source: str = "GGUF file") -> tuple[Tokenizer, dict]:
    """(tokenizer, tokenizer_config) from GGUF metadata; ValueError naming the key otherwise."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{source}: tokenizer.ggml.model = {kind!r} is not supported "
                         f"(armllm rebuilds 'gpt2' byte-level BPE tokenizers)")
    try:
        tokens = list(meta["tokenizer.ggml.tokens"])
        merges = list(meta["tokenizer.ggml.merges"])
    except KeyError as exc:
        raise ValueError(f"{source}: missing tokenizer key {exc.args[0]}") from None
    types = meta.get("tokenizer.ggml.token_type")
    types = [1] * len(tokens) if types is None else [int(t) for t in types]
    if len(types) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for "
                         f"{len(tokens)} tokens")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ValueError(f"{source}: malformed merge {merge!r} in tokenizer.ggml.merges")
        pairs.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types, strict=True) if ty == TOKEN_CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types, strict=True)
                    if ty == TOKEN_USER_DEFINED])

    def token_of(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}")
        if idx is None:
            return None
        if not 0 <= int(idx) < len(tokens):
            raise ValueError(f"{source}: tokenizer.ggml.{key} = {idx} is outside the vocabulary")
        return tokens[int(idx)]

    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    sep = token_of("seperator_token_id")   # gguf-py's spelling of the key
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    add_sep = bool(meta.get("tokenizer.ggml.add_sep_token", False))
    bos_part = [f"{bos}:0"] if add_bos and bos else []
    eos_part = [f"{eos}:0"] if add_eos and eos else []
    sep_part = [f"{sep}:0"] if add_sep and sep else []
    if bos_part or eos_part or sep_part:
        # a pair (a reranker's query and document) as llama.cpp's server joins it:
        # [BOS] A [EOS] [SEP] B [EOS]
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(bos_part + ["$A:0"] + eos_part),
            pair=" ".join(bos_part + ["$A:0"] + eos_part + sep_part + ["$B:0"] + eos_part),
            special_tokens=[(t.split(":")[0], vocab[t.split(":")[0]])
                            for t in {*bos_part, *eos_part, *sep_part}])
    config = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_of("unknown_token_id"),
        "pad_token": token_of("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": int(meta.get(f"{meta.get('general.architecture')}"
                                         ".context_length", 0)) or None,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok, {k: v for k, v in config.items() if v is not None}
