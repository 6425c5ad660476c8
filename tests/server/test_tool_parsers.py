"""Tool parsers on model outputs written by hand: content and calls of the whole
text, the same however the text streams in (random cuts, hypothesis), each call
sent whole in one delta once it has ended (never one whose arguments are not a
JSON object), malformed markup kept as content, a call the completion's end cut
off dropped, and the parser a chat template names."""
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
        ('<tool_call>\n{"name": "n", "arguments": 5}\n</tool_call>',
         '<tool_call>\n{"name": "n", "arguments": 5}\n</tool_call>', []),
        ('<tool_call>{"name": "s", "arguments": "{\\"a\\": [1]}"}</tool_call>', "",
         [("s", '{"a": [1]}')]),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', "", [("f", "{}")]),
        ("<tool_call>\nnot json\n</tool_call> tail", "<tool_call>\nnot json\n</tool_call> tail",
         []),
        ('<tool_call>\n{"x": 1}\n</tool_call>', '<tool_call>\n{"x": 1}\n</tool_call>', []),
        # a call left open by a completion that was not cut off: its text is content
        ('<tool_call>\n{"name": "cut", "arguments": {"a": "b',
         '<tool_call>\n{"name": "cut", "arguments": {"a": "b', []),
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


# whole texts a token limit cut off: content, and the calls that had ended
CUT = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
               '<tool_call>\n{"name": "f", "arguments": {"a":', "\n",
     [("f", '{"a": 1}')]),
    ("hermes", 'Let me see.\n<tool_call>\n{"name": "f"', "Let me see.\n", []),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "param', "",
     [("f", '{"a": 1}')]),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"',
     "", [("f", "{}")]),
    ("harmony", "<|channel|>commentary to=functions.f json<|message|>{\"city\": \"Par", "", []),
]


def stream(parser: str | ToolParser, pieces: list[str], cut: bool = False
           ) -> tuple[str, list[tuple[str, str]], list]:
    """The content, calls and deltas of pieces fed in turn to a parser (or a new one of
    that name), each delta checked to be a whole call with an object's arguments."""
    parser = PARSERS[parser]() if isinstance(parser, str) else parser
    content, calls, deltas = [], {}, []
    for piece in [*pieces, None]:
        text, ds = parser.feed(piece) if piece is not None else parser.finish(cut)
        content.append(text)
        deltas += ds
        for d in ds:
            assert d["index"] not in calls and d["index"] == len(calls)
            assert d["type"] == "function" and d["id"]
            assert isinstance(json.loads(d["function"]["arguments"]), dict)
            calls[d["index"]] = (d["function"]["name"], d["function"]["arguments"])
    return "".join(content), [calls[i] for i in sorted(calls)], deltas


@pytest.mark.parametrize("parser, text, content, calls", ALL)
def test_whole_outputs(parser, text, content, calls):
    got_content, got_calls = PARSERS[parser]().parse(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    for c in got_calls:
        assert isinstance(json.loads(c.arguments), dict)


@pytest.mark.parametrize("parser, text, content, calls", CUT)
def test_a_call_cut_off_is_dropped(parser, text, content, calls):
    got_content, got_calls = PARSERS[parser]().parse(text, cut=True)
    assert (got_content, [(c.name, c.arguments) for c in got_calls]) == (content, calls)
    assert stream(parser, list(text), cut=True)[:2] == (content, calls)


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


def test_a_call_is_sent_whole_once_it_has_ended():
    text = CASES["hermes"][0][0]
    parser, sent_at = PARSERS["hermes"](), []
    for i, ch in enumerate(text):     # a character at a time
        sent_at += [(i, d["function"]["name"]) for d in parser.feed(ch)[1]]
    first_end = text.index("}}") + 1     # the first call's object closes here
    assert sent_at == [(first_end, "get_weather"), (text.rindex("}"), "noop")]
    assert parser.finish() == ("", [])


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
