"""structured_output: what a request's output must match (a JSON schema, any
JSON object, a regular expression, one of a list of strings, or a Lark or GBNF
grammar), checked where it enters and compiled to one llguidance grammar.

The grammar engine is llguidance's: this module only turns the request's
form into llguidance's grammar text and refuses, with a ValueError naming the
field and llguidance's message, anything it cannot compile (invalid JSON,
schema keywords it does not implement, a regex that does not parse, an
unknown grammar rule). Matching a model's tokens against it is
engine/structured.py's job."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object")

# JSON output with fixed separators and no free whitespace: a model cannot spend its
# tokens on indentation or trail off into newlines before closing the value
JSON_OPTIONS = {"whitespace_flexible": False}
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of: json (a JSON schema as a dict or a JSON string; {} or True for
    any JSON object), regex, choice (a list of strings), grammar (Lark, as llguidance
    reads it, or llama.cpp's GBNF), json_object=True (any JSON object)."""
    json: dict | str | bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    # the llguidance grammar the field compiles to (set at construction)
    spec: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_output must set exactly one of {', '.join(KINDS)}, "
                             f"got {', '.join(given) or 'none'}")
        kind = given[0]
        object.__setattr__(self, "spec", _compile(kind, getattr(self, kind)))

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @classmethod
    def coerce(cls, value: Any) -> StructuredOutput | None:
        """A StructuredOutput from itself, None, or a dict of its fields (vLLM's
        structured_outputs form); a ValueError naming what is wrong otherwise."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"structured_output must be a StructuredOutput or an object "
                             f"with one of {', '.join(KINDS)}, got {type(value).__name__}")
        unknown = sorted(set(value) - set(KINDS))
        if unknown:
            raise ValueError(f"structured_output has unknown fields {', '.join(unknown)} "
                             f"(known: {', '.join(KINDS)})")
        return cls(**{k: v for k, v in value.items() if v is not None})


def _compile(kind: str, value: Any) -> str:
    """llguidance's grammar for one field, validated; ValueError naming the field."""
    from llguidance import LLMatcher  # the grammar engine loads with its first use
    from llguidance.gbnf_to_lark import any_to_lark

    name = f"structured_output.{kind}"
    if kind in ("json", "json_object"):
        schema = _schema(name, value)
        spec = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    elif kind == "regex":
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        spec = LLMatcher.grammar_from_regex(value)
    elif kind == "choice":
        if not (isinstance(value, list) and value
                and all(isinstance(c, str) and c for c in value)):
            raise ValueError(f"{name} must be a non-empty list of non-empty strings, "
                             f"got {value!r}")
        spec = LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, value)))
    else:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty Lark or GBNF grammar, got {value!r}")
        try:  # GBNF (::= rules) becomes Lark; Lark passes through
            lark = any_to_lark(value)
        except Exception as exc:  # noqa: BLE001 - the converter's own parse errors
            raise ValueError(f"{name}: the GBNF grammar does not convert: {exc}") from None
        spec = LLMatcher.grammar_from_lark(lark)
    error = LLMatcher.validate_grammar(spec)
    if error:
        raise ValueError(f"{name}: {error.strip()}")
    return spec


def _schema(name: str, value: Any) -> dict:
    """A JSON schema from a dict, a JSON string, True or {} (any object)."""
    if value is True or value == {}:
        return ANY_OBJECT
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON schema object, got {type(value).__name__}")
    return value or ANY_OBJECT
