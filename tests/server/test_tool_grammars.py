"""The grammars of required tool calls (server/tools.py) in each format: a call
to an allowed function with valid arguments, written as the model writes it,
is accepted to its end; invalid arguments, an unknown function or a second call
when only one is allowed are refused."""
from __future__ import annotations

import llguidance
import pytest

from armllm.model.loader import load_tokenizer
from armllm.server.protocol import APIError
from armllm.server.tools import ToolRequest, required_calls
from tests.server.test_tools import TOOLS
from tests.tiny_model import write_tiny_chat_llama

VALID = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
              "\n</tool_call>",
    "llama3_json": '{"name": "search", "parameters": {"query": "cats"}}',
    "mistral": '[TOOL_CALLS][{"name": "search", "arguments": {"query": "cats", "limit": 3}}]',
    "harmony": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
               '{"city": "Oslo", "days": 1}',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nLe Puy\n"
                   "</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\n"
                   "2\n</parameter>\n</function>\n</tool_call>",
}
INVALID = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 9}}',
    "llama3_json": '{"name": "delete_all", "parameters": {}}',
    "mistral": '[TOOL_CALLS][{"name": "search", "arguments": {"query": "cats", "limit": 0}}]',
    "harmony": '<|channel|>commentary to=functions.search <|constrain|>json<|message|>'
               '{"city": "Oslo"}',
    "qwen3_coder": VALID["qwen3_coder"].replace("\n2\n", "\n9\n"),
}
# more a qwen3_coder grammar refuses: a string over its maxLength or holding a tag, a
# value not in its enum, a required parameter left out, one the schema does not have
QWEN3_CODER_INVALID = [VALID["qwen3_coder"].replace("Le Puy", "Saint-Jean-de-Luz"),
                       VALID["qwen3_coder"].replace("Le Puy", "a</function>"),
                       VALID["qwen3_coder"].replace("celsius", "kelvin"),
                       VALID["qwen3_coder"].replace("<parameter=days>\n2\n</parameter>\n", ""),
                       VALID["qwen3_coder"].replace("<parameter=unit>", "<parameter=color>")]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(write_tiny_chat_llama(tmp_path_factory.mktemp("grammar-tok")))


def accepts(tok, grammar: str, text: str) -> bool:
    ll = llguidance.LLTokenizer(tok.tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    ok = matcher.consume_tokens(tok.encode(text, add_special_tokens=False))
    return ok and matcher.is_accepting()


@pytest.mark.parametrize("parser", sorted(VALID))
def test_required_call_grammars(tok, parser):
    one = required_calls(ToolRequest(TOOLS, "required", None, False, parser), tok.token_id)
    assert accepts(tok, one.spec, VALID[parser])
    assert not accepts(tok, one.spec, INVALID[parser])
    if parser == "qwen3_coder":
        assert not any(accepts(tok, one.spec, text) for text in QWEN3_CODER_INVALID)
        assert accepts(tok, one.spec, VALID[parser].replace("Le Puy\n", "Le\nPuy\n\n"))
    if parser in ("hermes", "qwen3_coder"):  # one call only without parallel_tool_calls
        assert not accepts(tok, one.spec, VALID[parser] + "\n" + VALID[parser])
        many = required_calls(ToolRequest(TOOLS, "required", None, True, parser), tok.token_id)
        assert accepts(tok, many.spec, VALID[parser] + "\n" + VALID[parser])
    named = required_calls(ToolRequest(TOOLS, "named", "search", True, parser), tok.token_id)
    assert accepts(tok, named.spec, VALID[parser]) == ("search" in VALID[parser])
    assert required_calls(ToolRequest(TOOLS, "auto", None, True, parser), tok.token_id) is None


def test_qwen3_coder_refuses_string_checks_raw_text_cannot_carry(tok):
    """A string parameter is raw text in Qwen3-Coder's calls: a pattern or format on it
    cannot be enforced there, and the request says so (400) rather than ignore it."""
    tools = [{"type": "function", "function": {"name": "mail", "parameters": {
        "type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}}]
    with pytest.raises(APIError) as err:
        required_calls(ToolRequest(tools, "required", None, True, "qwen3_coder"), tok.token_id)
    assert err.value.status == 400 and "mail.to" in str(err.value) and "format" in str(err.value)
