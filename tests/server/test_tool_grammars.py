"""The grammars of required tool calls (server/tools.py) in each format: a call
to an allowed function with valid arguments, written as the model writes it,
is accepted to its end; invalid arguments, an unknown function or a second call
when only one is allowed are refused."""
from __future__ import annotations

import llguidance
import pytest

from armllm.model.loader import load_tokenizer
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
}
INVALID = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 9}}',
    "llama3_json": '{"name": "delete_all", "parameters": {}}',
    "mistral": '[TOOL_CALLS][{"name": "search", "arguments": {"query": "cats", "limit": 0}}]',
    "harmony": '<|channel|>commentary to=functions.search <|constrain|>json<|message|>'
               '{"city": "Oslo"}',
}


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
    if parser == "hermes":  # one call only without parallel_tool_calls
        assert not accepts(tok, one.spec, VALID[parser] + "\n" + VALID[parser])
        many = required_calls(ToolRequest(TOOLS, "required", None, True, parser), tok.token_id)
        assert accepts(tok, many.spec, VALID[parser] + "\n" + VALID[parser])
    named = required_calls(ToolRequest(TOOLS, "named", "search", True, parser), tok.token_id)
    assert accepts(tok, named.spec, VALID[parser]) == ("search" in VALID[parser])
    assert required_calls(ToolRequest(TOOLS, "auto", None, True, parser), tok.token_id) is None
