"""The tokenizer rebuilt from the SmolLM2 GGUF, against the one HF
transformers builds from the same file, and on SmolLM2's own rules."""
from __future__ import annotations

import pytest

from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "Émile a mangé une crème brûlée à Noël — ça coûte cher.",
    "日本語のテキストと中文。",
    "emoji 🤖🦙 and symbols <>{}[]()",
    "line one\nline two\r\n\ttabbed",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # square",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    tok, config = tokenizer_from_gguf(GGUFFile(smollm2_gguf).metadata)
    return smollm2_gguf, tok, config


def test_matches_transformers_gguf_tokenizer(smollm2):
    transformers = pytest.importorskip("transformers")
    path, tok, _ = smollm2
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ours = tok.encode(text, add_special_tokens=False).ids
        assert ours == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(ours, skip_special_tokens=False) == text


def test_digits_are_split_one_by_one(smollm2):
    """SmolLM2's pre-tokenizer (GGUF pre 'smollm') splits every digit."""
    _, tok, _ = smollm2
    ids = tok.encode("in 2024 we had 12345 users", add_special_tokens=False).ids
    pieces = [tok.id_to_token(i) for i in ids]
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digit_pieces == list("202412345")
    assert tok.decode(ids) == "in 2024 we had 12345 users"


def test_special_tokens_and_config(smollm2):
    _, tok, config = smollm2
    ids = tok.encode("<|im_start|>user<|im_end|>", add_special_tokens=False).ids
    assert ids[0] == tok.token_to_id("<|im_start|>") == 1
    assert ids[-1] == tok.token_to_id("<|im_end|>") == 2
    assert config["bos_token"] == "<|im_start|>" and config["eos_token"] == "<|im_end|>"
    assert config["add_bos_token"] is False
    assert "<|im_start|>" in config["chat_template"]
    assert tok.get_vocab_size() == 49152


@pytest.mark.parametrize("bos,eos,sep", [(True, True, True), (True, False, False),
                                          (False, True, False), (False, False, True)])
def test_a_pair_is_joined_as_llama_cpp_joins_a_rerank_prompt(smollm2, bos, eos, sep):
    """llama.cpp's server (format_prompt_rerank without a template): BOS if add_bos,
    the query, EOS if add_eos, SEP if add_sep, the document, EOS if add_eos."""
    path, _, _ = smollm2
    meta = {**GGUFFile(path).metadata, "tokenizer.ggml.add_bos_token": bos,
            "tokenizer.ggml.add_eos_token": eos, "tokenizer.ggml.add_sep_token": sep,
            "tokenizer.ggml.seperator_token_id": 3}
    tok, config = tokenizer_from_gguf(meta)
    query, doc = (tok.encode(t, add_special_tokens=False).ids for t in TEXTS[:2])
    bos_id, eos_id = tok.token_to_id(config["bos_token"]), tok.token_to_id(config["eos_token"])
    want = [bos_id] * bos + query + [eos_id] * eos + [3] * sep + doc + [eos_id] * eos
    assert tok.encode(TEXTS[0], pair=TEXTS[1]).ids == want
    assert tok.encode(TEXTS[0]).ids == [bos_id] * bos + query + [eos_id] * eos


def test_unsupported_model_and_bad_ids_are_clear_errors():
    with pytest.raises(ValueError, match="tokenizer.ggml.model = 'llama' is not supported"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "llama"}, "x.gguf")
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 7}
    with pytest.raises(ValueError, match="tokenizer.ggml.eos_token_id = 7 is outside"):
        tokenizer_from_gguf(meta, "x.gguf")
    with pytest.raises(ValueError, match="malformed merge 'ab'"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.merges": ["ab"]}, "x.gguf")
    with pytest.raises(ValueError, match="unsupported GGUF pre-tokenizer"):
        tokenizer_from_gguf({**meta, "tokenizer.ggml.eos_token_id": 1,
                             "tokenizer.ggml.pre": "klingon"}, "x.gguf")
