"""The grammars of tool calls (server/tools.py) in each format: a required call
to an allowed function with valid arguments, written as the model writes it,
is accepted to its end; invalid arguments, an unknown function or a second call
when only one is allowed are refused. With "auto" and one call a turn, any text
is accepted, and once the model writes a call's opener the call must be valid
and nothing may follow it; the calls of CHATS (a real template's tokenizer) as
the chat templates write them back are accepted by their format's grammar."""
from __future__ import annotations

import llguidance
import pytest

from armllm.model.loader import load_tokenizer
from armllm.server.protocol import APIError
from armllm.server.tools import ToolRequest, calls_grammar
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
    """A tokenizer whose call markers (<tool_call>, [TOOL_CALLS], ...) are tokens."""
    return load_tokenizer(write_tiny_chat_llama(tmp_path_factory.mktemp("grammar-tok")))


@pytest.fixture(scope="module")
def text_tok(smollm2_gguf):
    """SmolLM2's tokenizer, which spells the call markers as text."""
    return load_tokenizer(smollm2_gguf)


def accepts(tok, grammar: str, text: str) -> bool:
    ll = llguidance.LLTokenizer(tok.tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    ok = matcher.consume_tokens(tok.encode(text, add_special_tokens=False))
    return ok and matcher.is_accepting()


@pytest.mark.parametrize("parser", sorted(VALID))
def test_required_call_grammars(tok, parser):
    one = calls_grammar(ToolRequest(TOOLS, "required", None, False, parser), tok.token_id)
    assert accepts(tok, one.spec, VALID[parser])
    assert not accepts(tok, one.spec, INVALID[parser])
    if parser == "qwen3_coder":
        assert not any(accepts(tok, one.spec, text) for text in QWEN3_CODER_INVALID)
        assert accepts(tok, one.spec, VALID[parser].replace("Le Puy\n", "Le\nPuy\n\n"))
    if parser in ("hermes", "qwen3_coder"):  # one call only without parallel_tool_calls
        assert not accepts(tok, one.spec, VALID[parser] + "\n" + VALID[parser])
        many = calls_grammar(ToolRequest(TOOLS, "required", None, True, parser), tok.token_id)
        assert accepts(tok, many.spec, VALID[parser] + "\n" + VALID[parser])
    named = calls_grammar(ToolRequest(TOOLS, "named", "search", True, parser), tok.token_id)
    assert accepts(tok, named.spec, VALID[parser]) == ("search" in VALID[parser])
    assert calls_grammar(ToolRequest(TOOLS, "auto", None, True, parser), tok.token_id) is None


def stops_after(tok, grammar: str, text: str) -> bool:
    """Whether the grammar takes text and then nothing but the end."""
    ll = llguidance.LLTokenizer(tok.tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    return matcher.consume_tokens(tok.encode(text, add_special_tokens=False)) \
        and matcher.is_stopped()


@pytest.mark.parametrize("markers", ["tok", "text_tok"])
@pytest.mark.parametrize("parser", sorted(set(VALID) - {"harmony"}))
def test_auto_with_one_call_a_turn(request, markers, parser):
    tok = request.getfixturevalue(markers)
    one = calls_grammar(ToolRequest(TOOLS, "auto", None, False, parser), tok.token_id)
    words = "I can answer that: it is sunny in Paris, 20 C. <b>No</b> call; [x] {y}?"
    if parser == "llama3_json":     # a call is an answer that begins with {
        assert accepts(tok, one.spec, words) and not accepts(tok, one.spec, "{x")
        assert stops_after(tok, one.spec, VALID[parser])
        assert not accepts(tok, one.spec, INVALID[parser])
        return
    assert accepts(tok, one.spec, words) and not stops_after(tok, one.spec, words)
    assert stops_after(tok, one.spec, "Let me check.\n" + VALID[parser])
    assert not accepts(tok, one.spec, "Let me check.\n" + INVALID[parser])
    opener = VALID[parser][:VALID[parser].index("]") + 1 if parser == "mistral" else
                           VALID[parser].index(">") + 1]
    assert not accepts(tok, one.spec, "Sure. " + opener + " oops")   # the call is forced


def test_qwen3_coder_refuses_string_checks_raw_text_cannot_carry(tok):
    """A string parameter is raw text in Qwen3-Coder's calls: a pattern or format on it
    cannot be enforced there, and the request says so (400) rather than ignore it."""
    tools = [{"type": "function", "function": {"name": "mail", "parameters": {
        "type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}}]
    with pytest.raises(APIError) as err:
        calls_grammar(ToolRequest(tools, "required", None, True, "qwen3_coder"), tok.token_id)
    assert err.value.status == 400 and "mail.to" in str(err.value) and "format" in str(err.value)
