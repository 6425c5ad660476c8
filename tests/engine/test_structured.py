"""Structured outputs in the embedded API: LLM.generate with
SamplingParams(structured_output=...) on a tiny random model (so the output is
the grammar's doing), forks of n > 1, length
cut-offs, dead ends, and the grammar's masks against llguidance's own."""
from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import numpy as np
import pytest

from armllm import LLM
from armllm.sampling import SamplingParams
from armllm.structured_output import StructuredOutput
from tests.tiny_model import write_tiny_chat_llama, write_tiny_llama

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "n": {"type": "integer", "minimum": -5, "maximum": 500},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["x", "y", "z"]}}},
          "required": ["name", "n", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write_tiny_chat_llama(tmp_path_factory.mktemp("chat")), max_model_len=512,
               dtype="float32", kv_cache_dtype="f32")


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0),
                                      dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05,
                                           repetition_penalty=1.3, presence_penalty=0.5)])
def test_every_kind_matches_with_n_completions(llm, sampling):
    cases = [({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
             ({"regex": r"[a-f]{2,4}@\d\d"},
              lambda t: re.fullmatch(r"[a-f]{2,4}@\d\d", t) or pytest.fail(t)),
             ({"choice": ["alpha", "beta", "gamma"]},
              lambda t: t in ("alpha", "beta", "gamma") or pytest.fail(t)),
             ({"grammar": 'start: item+\nitem: "<" /[xy]/ ">"'},
              lambda t: re.fullmatch(r"(<[xy]>)+", t) or pytest.fail(t))]
    for so, check in cases:
        params = SamplingParams(max_tokens=300, seed=5, n=3, structured_output=so, **sampling)
        for out in llm.generate(["Give me data:", "Another one"], params):
            for c in out.outputs:
                assert c.finish_reason == "stop", (so, c.text)
                check(c.text)


def test_greedy_takes_the_best_allowed_token(llm):
    """The constrained greedy token is the argmax of the logits over the tokens the
    grammar allows: the highest of the allowed tokens' logprobs (as the
    unconstrained first step reports them) wins."""
    prompt = "Pick:"
    first = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0, logprobs=20))
    ranked = [t for t, _ in first[0].outputs[0].logprobs[0][2]]
    tok = llm.tokenizer
    texts = [tok.decode([t]) for t in ranked[1:6]]
    texts = [t for t in texts if t and t.isprintable() and len(set(texts)) == len(texts)]
    got = llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0.0,
                                              structured_output={"choice": texts}))
    best = next(t for t in ranked if tok.decode([t]) in texts)
    assert got[0].outputs[0].token_ids[0] == best


def test_logprobs_see_only_allowed_tokens(llm):
    out = llm.generate("x", SamplingParams(max_tokens=4, temperature=1.0, seed=1, logprobs=5,
                                           structured_output={"choice": ["yes", "no"]}))[0]
    tok = llm.tokenizer
    _, _, top = out.outputs[0].logprobs[0]
    shown = [(tok.decode([t]), lp) for t, lp in top]
    assert all("yes".startswith(s) or "no".startswith(s) for s, lp in shown if lp > -np.inf)


def test_max_tokens_inside_the_structure_is_length(llm):
    out = llm.generate("x", SamplingParams(max_tokens=3, temperature=1.0, seed=2,
                                           structured_output={"json": SCHEMA}))[0]
    c = out.outputs[0]
    assert c.finish_reason == "length" and c.text.startswith("{") and len(c.token_ids) == 3


def test_completion_as_soon_as_the_grammar_is_done_with_held_back_text(llm):
    """A stop string that never comes holds text back; the grammar's end releases it."""
    out = llm.generate("x", SamplingParams(max_tokens=50, temperature=0.0, stop=["zzzz"],
                                           structured_output={"choice": ["abcdef"]}))[0]
    assert out.outputs[0].text == "abcdef" and out.outputs[0].finish_reason == "stop"


def test_constrained_and_plain_requests_share_steps_without_changing_the_plain(llm):
    prompts = ["one two", "three four"]
    plain = SamplingParams(max_tokens=16, temperature=0.0)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, plain)]
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", llm.prompt_ids(p), plain)
    engine.add_request("c", llm.prompt_ids("json"), SamplingParams(
        max_tokens=16, temperature=1.0, seed=3, structured_output={"json_object": True}))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for step in engine.step():
            tokens.setdefault(step.request_id, []).extend(step.new_token_ids)
    assert [tokens["p0"], tokens["p1"]] == alone
    assert llm.tokenizer.decode(tokens["c"]).startswith("{")


def test_lazy_rows_with_and_without_penalties_share_a_step(llm):
    """Lazy constrained completions (greedy or plain temperature) whose tokens the
    grammar refuses are drawn again from their rows as they were: the kernel keeps a
    plain row, one with penalties or a bias is copied first; in one step, in either
    order, each gives its tokens alone."""
    so = {"choice": ["alpha beta", "gamma delta", "epsilon"]}
    kinds = [SamplingParams(max_tokens=40, temperature=0.0, structured_output=so),
             SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.5,
                            structured_output=so),
             SamplingParams(max_tokens=40, temperature=1.0, seed=2, structured_output=so),
             SamplingParams(max_tokens=40, temperature=1.0, seed=2, frequency_penalty=1.0,
                            logit_bias={5: 3.0}, structured_output=so)]
    prompts = ["Pick one:", "Choose:", "Pick one:", "Choose:"]
    alone = [llm.generate([p], k)[0].outputs[0].token_ids for p, k in zip(prompts, kinds,
                                                                         strict=True)]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        engine = llm.engine
        for i in order:
            engine.add_request(f"r{i}", llm.prompt_ids(prompts[i]), kinds[i])
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for step in engine.step():
                tokens.setdefault(step.request_id, []).extend(step.new_token_ids)
        assert [tokens[f"r{i}"] for i in range(4)] == alone
    texts = [llm.tokenizer.decode(t) for t in alone]
    assert all(t in so["choice"] for t in texts), texts


def test_bad_grammars_raise_before_anything_runs(llm):
    with pytest.raises(ValueError, match=r"(?s)structured_output.regex: .*unclosed group"):
        SamplingParams(structured_output={"regex": "(a"})
    with pytest.raises(ValueError, match="Unimplemented keys"):
        SamplingParams(structured_output=StructuredOutput(json={"not": {"type": "string"}}))
    with pytest.raises(ValueError, match="unknown fields"):
        SamplingParams(structured_output={"jsonn": {}})


def test_a_dead_end_fails_only_its_request(tmp_path):
    """A vocabulary of words w0..w119 (read as bytes) has no token for a digit: the
    grammar allows nothing at the first step, which ends that request with an
    error, not an unconstrained token; the request beside it finishes."""
    folder = write_tiny_llama(tmp_path / "words")
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": True}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    llm = LLM(folder, max_model_len=256)
    engine = llm.engine
    engine.add_request("dead", [5, 6], SamplingParams(max_tokens=5,
                                                       structured_output={"regex": "[0-9]+"}))
    engine.add_request("fine", [5, 6], SamplingParams(max_tokens=5, temperature=0.0))
    finals = {}
    while engine.has_unfinished():
        for step in engine.step():
            if step.finish_reason:
                finals[step.request_id] = step
    assert finals["dead"].finish_reason == "error" and not finals["dead"].new_token_ids
    assert "grammar allows no token" in finals["dead"].error
    assert finals["fine"].finish_reason == "length"


def test_a_tokenizer_llguidance_cannot_read_is_a_clear_error(tmp_path):
    llm = LLM(write_tiny_llama(tmp_path / "words"), max_model_len=256)
    with pytest.raises(ValueError, match="structured outputs are not available for this "
                                         "model's tokenizer: .*WordPiece"):
        llm.generate([5, 6], SamplingParams(structured_output={"regex": "w1"}))


def test_masks_equal_llguidance_stepping_alone(llm):
    """The engine's batched masks (LLExecutor on the worker thread) are the masks a
    lone matcher computes for the same tokens."""
    spec = StructuredOutput(json=SCHEMA)
    out = llm.generate("x", SamplingParams(max_tokens=40, temperature=1.0, seed=9,
                                           structured_output=spec))[0].outputs[0]
    structured = llm.engine.structured
    matcher = llguidance.LLMatcher(structured._tokenizer(), spec.spec)
    vocab = llm.vocab_size
    for t in out.token_ids:
        mask = np.full(-(-vocab // 32), -1, np.int32)
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        assert np.unpackbits(mask.view(np.uint8), bitorder="little")[t]
        assert matcher.consume_token(t)
    assert llm.stats().grammar_masks > 0 and llm.stats().grammar_mask_seconds > 0


def test_masks_on_a_worker_during_the_forward_give_the_inline_tokens(llm):
    """With a CPU the kernel pool leaves free, the masks compute on a worker thread
    during the forward; the tokens are the same as computing them inline."""
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=4, n=2,
                            structured_output={"json": SCHEMA})
    structured = llm.engine.structured
    inline = [c.token_ids for o in llm.generate(["a", "b", "c"], params) for c in o.outputs]
    structured.overlap = True
    try:
        overlapped = [c.token_ids for o in llm.generate(["a", "b", "c"], params)
                      for c in o.outputs]
        assert structured._worker is not None  # the worker ran them
    finally:
        structured.overlap = False
    assert overlapped == inline
