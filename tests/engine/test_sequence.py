"""Sequence holds a completion's scheduling state and nothing opaque: what its
tokens mean as output, its grammar, its pooling and its random generator are
the engine's, in a RequestState beside it (engine/request_state.py)."""
from __future__ import annotations

import dataclasses
import re

from armllm.engine.request_state import RequestState
from armllm.engine.sequence import Sequence

ENGINE_OWNED = {"completion", "grammar", "pool", "seed", "history", "history_len", "bias",
                "encoder_input", "draft_probs", "breakers", "bad_words"}


def test_a_sequence_holds_only_scheduling_state():
    annotations = {f.name: str(f.type) for f in dataclasses.fields(Sequence)}
    assert not ENGINE_OWNED & set(annotations)
    assert not [name for name, hint in annotations.items() if re.search(r"\bAny\b", hint)]


def test_the_engine_keeps_them_in_a_request_state():
    assert {f.name for f in dataclasses.fields(RequestState)} == ENGINE_OWNED
