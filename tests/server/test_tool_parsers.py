"""Tool parsers on model outputs written by hand: content and calls of the whole
text, the same however the text streams in (random cuts, hypothesis), OpenAI's
delta order (id and name first, then argument fragments), malformed markup kept
as content, and the parser a chat template names."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armllm.server.parsers import PARSERS, detect_parser
from armllm.server.tool_parsers import ToolParser, mistral_call_id

CASES = {
    "hermes": [
        ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
         '"days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "noop", "arguments": {}}\n'
         "</tool_call>",
         "Checking.\n\n", [("get_weather", '{"city": "Paris", "days": [1, 2]}'),
                           ("noop", "{}")]),
        ("a < b and <tool_ but no call", "a < b and <tool_ but no call", []),
        ('<tool_call>{"arguments": {"x": "}"}, "name": "late"}</tool_call>after', "after",
         [("late", '{"x": "}"}')]),
        ('<tool_call>\n{"name": "n", "arguments": 5}\n</tool_call>', "", [("n", "5")]),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', "", [("f", "{}")]),
        ("<tool_call>\nnot json\n</tool_call> tail", "<tool_call>\nnot json\n</tool_call> tail",
         []),
        ('<tool_call>\n{"x": 1}\n</tool_call>', '<tool_call>\n{"x": 1}\n</tool_call>', []),
        ('<tool_call>\n{"name": "cut", "arguments": {"a": "b', "", [("cut", '{"a": "b')]),
    ],
    "llama3_json": [
        ('{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": "x;"}}', "",
         [("f", '{"a": 1}'), ("g", '{"b": "x;"}')]),
        ('  {"name": "f", "arguments": {"q": "\\"hi\\""}}', "", [("f", '{"q": "\\"hi\\""}')]),
        ('Hello {"name": "f"}', 'Hello {"name": "f"}', []),
        ('{"city": "Paris"} is JSON', '{"city": "Paris"} is JSON', []),
    ],
    "mistral": [
        ('Sure.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", '
         '"arguments": {}}]', "Sure.", [("f", '{"a": 1}'), ("g", "{}")]),
        ("[TOOL_ no marker", "[TOOL_ no marker", []),
    ],
    "harmony": [
        ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
         'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Tokyo"}',
         "", [("get_weather", '{"city": "Tokyo"}')]),
        ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final"
         "<|message|>Sunny, 20 C.", "Sunny, 20 C.", []),
        ("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}", "",
         [("f", "{}")]),
        ("plain <| not a marker |> 1 < 2", "plain <| not a marker |> 1 < 2", []),
    ],
}
REASONING = {CASES["harmony"][0][0]: "Need the weather.", CASES["harmony"][1][0]: "think"}
ALL = [(name, *case) for name, cases in CASES.items() for case in cases]


def stream(parser: str | ToolParser, pieces: list[str]
           ) -> tuple[str, list[tuple[str, str]], list]:
    """The content, calls and deltas of pieces fed in turn to a parser (or a new one of
    that name), each delta checked for OpenAI's order."""
    parser = PARSERS[parser]() if isinstance(parser, str) else parser
    content, calls, deltas = [], {}, []
    for piece in [*pieces, None]:
        text, ds = parser.feed(piece) if piece is not None else parser.finish()
        content.append(text)
        deltas += ds
        for d in ds:
            call = calls.setdefault(d["index"], {"name": None, "arguments": ""})
            if "id" in d:
                assert call["name"] is None and d["type"] == "function"
                assert d["function"]["arguments"] == ""   # the name comes first, alone
                call["name"] = d["function"]["name"]
            else:
                assert call["name"] is not None          # fragments follow their name
            call["arguments"] += d["function"]["arguments"]
    return "".join(content), [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], \
        deltas


@pytest.mark.parametrize("parser, text, content, calls", ALL)
def test_whole_outputs(parser, text, content, calls):
    got_content, got_calls = PARSERS[parser]().parse(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    for c in got_calls:
        if c.arguments.endswith(("}", "5")):
            json.loads(c.arguments)


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(ALL), data=st.data())
def test_streams_equal_the_whole_however_cut(case, data):
    parser, text, content, calls = case
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    got_content, got_calls, _ = stream(parser, pieces)
    assert got_content == content and got_calls == calls


@settings(max_examples=100, deadline=None)
@given(text=st.sampled_from(sorted(REASONING)), data=st.data())
def test_harmony_reasoning_however_cut(text, data):
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    parser, reasoning = PARSERS["harmony"](), ""
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        parser.feed(text[a:b])
        reasoning += parser.take_reasoning()
    parser.finish()
    assert reasoning + parser.take_reasoning() == REASONING[text]


def test_a_call_streams_name_first_then_fragments():
    text = CASES["hermes"][0][0]
    _, _, deltas = stream("hermes", list(text))   # a character at a time
    first = [d for d in deltas if "id" in d]
    assert [d["function"]["name"] for d in first] == ["get_weather", "noop"]
    fragments = [d for d in deltas if d["index"] == 0 and "id" not in d]
    assert len(fragments) > 5    # the arguments arrive as they are written


def test_call_ids():
    hermes = PARSERS["hermes"]().parse(CASES["hermes"][0][0])[1]
    assert all(c.id.startswith("call_") for c in hermes) and hermes[0].id != hermes[1].id
    assert all(len(mistral_call_id()) == 9 and mistral_call_id().isalnum() for _ in range(20))


def test_detect_parser_from_the_template():
    assert detect_parser("... <tool_call>\n{{ tool_call | tojson }}</tool_call>") == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_parser("<|start_header_id|>ipython<|end_header_id|>") == "llama3_json"
    assert detect_parser("{{ messages }}") is None and detect_parser(None) is None
    assert detect_parser("<tool_call> [TOOL_CALLS]") is None   # ambiguous: none
    xml = "<tool_call>\n<function={{ name }}>\n<parameter={{ key }}>\n{{ value }}"
    assert detect_parser(xml) == "qwen3_coder"                 # XML inside <tool_call>
    assert detect_parser(xml + " [TOOL_CALLS]") is None
    assert detect_parser("<function=f> <parameter=x>") is None  # no <tool_call>: not Qwen's
