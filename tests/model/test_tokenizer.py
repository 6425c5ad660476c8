"""Chat templates rendered like HF's apply_chat_template."""
from __future__ import annotations

import pytest

from armllm.model.gguf import GGUFFile
from armllm.model.gguf_tokenizer import tokenizer_from_gguf
from armllm.model.tokenizer import TextTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
]


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    tok, config = tokenizer_from_gguf(GGUFFile(smollm2_gguf).metadata)
    return smollm2_gguf, TextTokenizer(tok, config)


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
    # extra template variables may not replace what the call itself passes
    for name in ("bos_token", "eos_token", "raise_exception", "strftime_now"):
        with pytest.raises(ValueError, match=f"chat template variables {name} cannot be set"):
            tok.apply_chat_template(CONVERSATIONS[0], **{name: "x"})
    extra = tok.apply_chat_template(CONVERSATIONS[0], unused_variable="x")
    assert extra == tok.apply_chat_template(CONVERSATIONS[0])
