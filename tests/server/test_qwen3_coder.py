"""The qwen3_coder tool parser (server/qwen3_coder.py) on outputs written by hand:
content and calls of the whole text, the same whether the text arrives whole, a
character at a time or cut anywhere (hypothesis), parameters typed by their
schemas, a call sent whole once it has ended, malformed markup read as far as
it goes (a call the token limit cut off dropped); and Qwen3.5's real chat
template rendered by armllm: a tool round trip comes out as the XML the parser
reads back, and detect_parser names qwen3_coder for it."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models

from armllm.model.tokenizer import TextTokenizer
from armllm.server.parsers import detect_parser
from armllm.server.qwen3_coder import Qwen3CoderParser, convert, value_types
from armllm.server.tools import template_messages
from tests.llama_cpp_tools import LLAMA_CPP
from tests.server.test_tool_parsers import stream
from tests.server.test_tools import TOOLS
from tests.tiny_model import QWEN3_5_TEMPLATE

CONFIGURE = {"type": "object", "properties": {
    "verbose": {"type": "boolean"}, "ratio": {"type": "number"},
    "options": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
    "note": {"type": ["string", "null"]}, "mode": {"enum": ["fast", "slow"]},
    "level": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "anything": {}}}
ALL_TOOLS = [*TOOLS, {"type": "function", "function": {"name": "configure",
                                                       "parameters": CONFIGURE}}]


def block(name: str, **params: str) -> str:
    """A call as the chat template writes it."""
    return (f"<tool_call>\n<function={name}>\n"
            + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
            + "</function>\n</tool_call>")


CASES = [   # text, content, [(name, arguments as an object)]
    ("I'll check both.\n\n" + block("get_weather", city="Paris", days="3") + "\n"
     + block("search", query="cats", limit="2"),
     "I'll check both.\n\n\n", [("get_weather", {"city": "Paris", "days": 3}),
                                ("search", {"query": "cats", "limit": 2})]),
    (block("configure", verbose="true", ratio="0.5", options='{"a": [1, {"b": null}]}',
           tags='["x", "y"]', note="null", mode="fast", level="3", anything="[1, 2]"), "",
     [("configure", {"verbose": True, "ratio": 0.5, "options": {"a": [1, {"b": None}]},
                     "tags": ["x", "y"], "note": None, "mode": "fast", "level": 3,
                     "anything": [1, 2]})]),
    # not JSON, or JSON of another type than a union with string allows: the text
    (block("configure", verbose="True", ratio="half", note="42", level="[3]",
           anything="plain words", tags="x, y"), "",
     [("configure", {"verbose": True, "ratio": "half", "note": "42", "level": "[3]",
                     "anything": "plain words", "tags": "x, y"})]),
    # a string stays text: JSON-looking, quoted, several lines, escapes, empty
    (block("search", query='{"a": 1}'), "", [("search", {"query": '{"a": 1}'})]),
    (block("get_weather", city='"Rome"\n  \\n\ttab\n\nend\n', days="1"), "",
     [("get_weather", {"city": '"Rome"\n  \\n\ttab\n\nend\n', "days": 1})]),
    (block("get_weather", city="", days="2"), "", [("get_weather", {"city": "", "days": 2})]),
    ("<tool_call>\n<function=search>\n<parameter=query>\ncafé ☕ 東京</parameter>"
     "</function></tool_call>", "", [("search", {"query": "café ☕ 東京"})]),
    (block("get_weather"), "", [("get_weather", {})]),
    # a function the request did not offer: still a call, its values JSON or text
    (block("lookup", key="42", **{"full name": "Ada"}), "",
     [("lookup", {"key": 42, "full name": "Ada"})]),
    # Qwen3-Coder drops <tool_call> at times: a known function still opens a call
    ("<function=search>\n<parameter=query>\ndogs\n</parameter>\n</function>\nDone.", "\nDone.",
     [("search", {"query": "dogs"})]),
    ("see <function=nope>x</function>", "see <function=nope>x</function>", []),
    # no call: markers that are not whole, a <tool_call> with no <function=
    ("a < b, <tool_ and <func but no call", "a < b, <tool_ and <func but no call", []),
    ("<tool_call>\nnot a call\n</tool_call> tail", "<tool_call>\nnot a call\n</tool_call> tail",
     []),
    ("<tool_call>\n<function=>\n</tool_call>", "<tool_call>\n<function=>\n</tool_call>", []),
    # malformed calls, read as far as they go
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n4\n"
     "</function>\n</tool_call>", "", [("get_weather", {"city": "Oslo", "days": 4})]),
    ("<tool_call>\n<function=search>\nLet me think.\n<parameter=query>\nq\n</parameter>\n"
     "stray\n</tool_call>after", "after", [("search", {"query": "q"})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nBer", "",
     [("get_weather", {"city": "Ber"})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\n5", "",
     [("get_weather", {"days": 5})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=ci", "", [("get_weather", {})]),
    ("x<tool_call>\n<function=get_wea", "x<tool_call>\n<function=get_wea", []),
]


def test_whole_outputs():
    for text, content, calls in CASES:
        got_content, got_calls = Qwen3CoderParser(ALL_TOOLS).parse(text)
        assert got_content == content, text
        assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls, text
        for call, (_, args) in zip(got_calls, calls, strict=True):
            assert call.arguments == json.dumps(args, ensure_ascii=False)
            assert call.id.startswith("call_")


def streamed(pieces: list[str]):
    """The content, calls (arguments parsed) and deltas of the pieces, streamed."""
    content, calls, deltas = stream(Qwen3CoderParser(ALL_TOOLS), pieces)
    return content, [(name, json.loads(args)) for name, args in calls], deltas


def test_a_character_at_a_time():
    for text, content, calls in CASES:
        got_content, got_calls, _ = streamed(list(text))
        assert (got_content, got_calls) == (content, calls), text


@settings(max_examples=400, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data())
def test_streams_equal_the_whole_however_cut(case, data):
    text, content, calls = case
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert streamed(pieces)[:2] == (content, calls)


def test_a_call_is_sent_whole_once_it_has_ended():
    parser = Qwen3CoderParser(ALL_TOOLS)
    assert parser.feed("Sure.\n<tool_call>\n<function=search>\n<parameter=query>\nred ") \
        == ("Sure.\n", [])
    assert parser.feed("cats\n</parameter>\n<parameter=limit>\n10\n</parameter>\n") == ("", [])
    _, sent = parser.feed("</function>\n</tool_call>")
    assert sent == [{"index": 0, "id": parser.calls[0].id, "type": "function",
                     "function": {"name": "search",
                                  "arguments": '{"query": "red cats", "limit": 10}'}}]
    assert parser.finish() == ("", [])


@pytest.mark.parametrize("text", [text for text, _, _ in CASES[-4:-1]])
def test_a_call_the_token_limit_cut_off_is_dropped(text):
    assert Qwen3CoderParser(ALL_TOOLS).parse(text, cut=True) == ("", [])
    whole = block("search", query="q")
    content, calls = Qwen3CoderParser(ALL_TOOLS).parse(whole + text, cut=True)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] \
        == [("search", {"query": "q"})]


def test_a_partial_marker_is_held_back_until_decided():
    parser = Qwen3CoderParser(ALL_TOOLS)
    assert parser.feed("Let me look <tool") == ("Let me look ", [])
    assert parser.feed("_call>\n<func") == ("", [])
    assert parser.feed("tion=sea") == ("", [])
    assert parser.feed("rch>\n") == ("", [])
    content, deltas = parser.feed("</function>")
    assert content == "" and deltas[0]["function"]["name"] == "search"
    other = Qwen3CoderParser(ALL_TOOLS)
    assert other.feed("<tool_call>\n<b>") == ("<tool_call>\n<b>", [])


@pytest.mark.parametrize("schema, text, value", [
    ({"type": "string"}, "null", "null"),
    ({"type": "string"}, " 1 ", " 1 "),
    ({"type": "integer"}, "7", 7),
    ({"type": "integer"}, "7.5", 7.5),            # JSON of another type than asked: kept
    ({"type": "integer"}, "seven", "seven"),
    ({"type": "number"}, "-1e3", -1000.0),
    ({"type": "number"}, "NaN", "NaN"),           # not JSON, whatever Python reads
    ({"type": "boolean"}, "false", False),
    ({"type": "boolean"}, "False", False),        # as the chat template writes it back
    ({"type": "null"}, "null", None),
    ({"type": "array"}, "[1, 2]", [1, 2]),
    ({"type": "object"}, '{"k": "v"}', {"k": "v"}),
    ({"type": ["integer", "string"]}, "12", 12),
    ({"type": ["integer", "string"]}, "true", "true"),
    ({"type": ["array", "string"]}, '"quoted"', "quoted"),
    ({"enum": ["a", "b"]}, "a", "a"),
    ({"enum": [1, 2]}, "2", 2),
    ({"const": "x"}, "x", "x"),
    ({"oneOf": [{"type": "null"}, {"type": "object"}]}, "{}", {}),
    ({}, "3", 3),
    ({}, "three", "three"),
    (None, '{"a": 1}', {"a": 1}),
])
def test_values_are_typed_by_their_schema(schema, text, value):
    got = convert(text, value_types(schema))
    assert got == value and type(got) is type(value)


# -- Qwen3.5's chat template ---------------------------------------------------------

def call(index: int, name: str, arguments: dict) -> dict:
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris, and search cats?"},
    {"role": "assistant", "content": "Let me check.",
     "tool_calls": [call(1, "get_weather", {"city": "Paris", "days": 2}),
                    call(2, "configure", {"verbose": True, "tags": ["a", "b"],
                                          "options": {"k": 1}, "note": "two\nlines"})]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "done"},
]
RENDERED_TURNS = """<|im_start|>user
Weather in Paris, and search cats?<|im_end|>
<|im_start|>assistant
<think>

</think>

Let me check.

<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
<parameter=days>
2
</parameter>
</function>
</tool_call>
<tool_call>
<function=configure>
<parameter=verbose>
True
</parameter>
<parameter=tags>
["a", "b"]
</parameter>
<parameter=options>
{"k": 1}
</parameter>
<parameter=note>
two
lines
</parameter>
</function>
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
18 C
</tool_response>
<tool_response>
done
</tool_response><|im_end|>
<|im_start|>assistant
<think>
"""


def qwen3_5() -> TextTokenizer:
    return TextTokenizer(Tokenizer(models.BPE()), {"chat_template": QWEN3_5_TEMPLATE.read_text()})


def test_the_template_renders_a_tool_round_trip_as_xml():
    prompt = qwen3_5().apply_chat_template(template_messages(ROUND_TRIP), True, tools=ALL_TOOLS)
    assert prompt.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following "
                             "functions:\n\n<tools>\n" + json.dumps(ALL_TOOLS[0]) + "\n")
    assert prompt.endswith("</IMPORTANT><|im_end|>\n" + RENDERED_TURNS)
    assert detect_parser(QWEN3_5_TEMPLATE.read_text()) == "qwen3_coder"


def test_the_parser_reads_back_what_the_template_wrote():
    prompt = qwen3_5().apply_chat_template(template_messages(ROUND_TRIP), True, tools=ALL_TOOLS)
    turn = prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = Qwen3CoderParser(ALL_TOOLS).parse(turn)
    assert content.strip() == "<think>\n\n</think>\n\nLet me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"]))
         for c in ROUND_TRIP[1]["tool_calls"]]


def test_the_template_is_llama_cpps_copy():
    source = LLAMA_CPP / "src" / "models" / "templates" / "Qwen3.5-4B.jinja"
    if not source.exists():
        pytest.skip(f"needs {source}: run tools/build_llama_cpp.sh")
    assert QWEN3_5_TEMPLATE.read_bytes() == source.read_bytes()
    for name in ("Qwen3-Coder.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
                 "StepFun3.5-Flash.jinja"):
        assert detect_parser((source.parent / name).read_text()) == "qwen3_coder", name
    assert detect_parser((source.parent / "Qwen-Qwen3-0.6B.jinja").read_text()) == "hermes"
