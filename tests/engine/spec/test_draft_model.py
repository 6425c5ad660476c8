"""The draft-model proposer (engine/spec/draft_model.py) on tiny random checkpoints,
driven as the engine drives it (one ProposeInput per sequence and step), against
the engine's own greedy decoding without speculation:

- the target as its own draft model drafts the target's greedy continuation,
  token for token (every draft accepted), batched, with long prompts caught up in
  chunks of the token budget and steps that ask for no draft;
- self_draft with every layer does the same; with its first L layers it drafts
  what the engine decodes from a checkpoint cut to those L layers (an independent
  build of the same weights);
- token_ids that diverge from the drafts anywhere (rejections, tokens drafted
  for nothing, steps without drafts, preemption) give the drafts a fresh
  proposer computes from scratch; a sampled request's distributions equal the
  fresh ones, its draft tokens drawn from them (argmax under a seed);
- a hybrid (Qwen3.5's Gated DeltaNet layers, whose state cannot roll back) does
  all of that too;
- a draft whose tokenizer differs from the target's is refused, naming both; a
  vocabulary padded to another size is not;
- no draft past the draft's context or when its cache is full; release gives its
  blocks and state slots back."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from armllm import LLM, SamplingParams
from armllm.engine.args import EngineArgs
from armllm.engine.runner import ModelRunner
from armllm.engine.setup import load
from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.draft_model import DraftModelProposer, self_draft_model
from armllm.engine.spec.proposer import NO_DRAFT, ProposeInput
from armllm.model.config import EncoderShape
from armllm.model.kv_cache import KVCache
from armllm.sampling import sampling_probs
from tests.tiny_model import write_tiny_chat_llama, write_tiny_llama

ENGINE = dict(dtype="float32", kv_cache_dtype="f32")
# a small token budget, so that prompts are caught up in several chunks
ARGS = EngineArgs(**ENGINE, max_num_batched_tokens=16, max_num_seqs=4)
GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=64, temperature=0.8, top_k=40, top_p=0.95)
MAX_LEN = 256


def greedy_continuations(path: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens after each prompt, from the engine without speculation."""
    llm = LLM(path, **ENGINE, kv_cache_gib=0.02, max_num_seqs=4, max_model_len=MAX_LEN)
    params = dataclasses.replace(GREEDY, max_tokens=n)
    return [list(o.token_ids) for o in llm.generate(prompts, params)]


def cut_checkpoint(src: Path, dst: Path, layers: int) -> Path:
    """A copy of the Hugging Face checkpoint at src with only its first `layers` layers
    (no MTP block): what self_draft runs, built by the loader from files."""
    shutil.copytree(src, dst)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:layers]
    config.pop("mtp_num_hidden_layers", None)
    (dst / "config.json").write_text(json.dumps(config))
    tensors = {name: t for name, t in load_file(src / "model.safetensors").items()
               if not name.startswith("mtp.") and not (
                   name.startswith("model.layers.") and int(name.split(".")[2]) >= layers)}
    save_file(tensors, dst / "model.safetensors")
    return dst


def proposer(target, method: str, path: Path | None = None, layers: int | None = None,
             k: int = 4, max_len: int = MAX_LEN, num_blocks: int | None = None,
             args: EngineArgs = ARGS) -> DraftModelProposer:
    config = SpeculativeConfig(method, k, model=None if path is None else str(path),
                               draft_layers=layers)
    draft = None if path is None else load(path, dataclasses.replace(args, threads=None))
    return DraftModelProposer(config, target, args, args.max_num_seqs, max_len, num_blocks,
                              draft)


def one(key, ids: list[int], num_prompt: int, k: int, params=GREEDY) -> ProposeInput:
    return ProposeInput(key, list(ids), num_prompt, 0, 1, k, params)


def follow(prop: DraftModelProposer, prompts: list[list[int]], continuations: list[list[int]],
           k: int = 4) -> int:
    """Drives prop as an engine whose target writes `continuations`: each prompt is first
    prefilled in chunks of 8 (inputs asking no draft), then every step each sequence
    keeps the drafts that match its continuation and the target's next token. Asserts
    that every draft is the continuation; returns the tokens drafted."""
    seqs = [(f"r{i}", 0) for i in range(len(prompts))]
    for end in range(8, max(map(len, prompts)), 8):
        prop.propose([one(key, p[:end], len(p), 0) for key, p in zip(seqs, prompts, strict=True)
                      if end < len(p)])
    made = [1] * len(prompts)   # continuation tokens in token_ids
    drafted = 0
    while True:
        live = [i for i in range(len(prompts)) if made[i] + k < len(continuations[i])]
        if not live:
            return drafted
        drafts = prop.propose([one(seqs[i], prompts[i] + continuations[i][:made[i]],
                                   len(prompts[i]), k) for i in live])
        for i, draft in zip(live, drafts, strict=True):
            assert draft.tokens == continuations[i][made[i]:made[i] + k] and draft.probs is None
            drafted += k
            made[i] += k + 1


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> SimpleNamespace:
    """A 3-layer tiny Llama, the same cut to 1 layer, prompts and both greedy
    continuations."""
    path = write_tiny_llama(tmp_path_factory.mktemp("llama"), layers=3, max_position=MAX_LEN)
    cut = cut_checkpoint(path, tmp_path_factory.mktemp("cut") / "llama1", 1)
    rng = np.random.default_rng(3)
    prompts = [list(map(int, rng.integers(2, 120, n))) for n in (5, 37, 20)]
    return SimpleNamespace(path=path, cut=cut, target=load(path, ARGS), prompts=prompts,
                           greedy=greedy_continuations(path, prompts, 40),
                           cut_greedy=greedy_continuations(cut, prompts, 40), vocab=122)


def test_the_target_as_its_draft_drafts_its_greedy_continuation(llama):
    prop = proposer(llama.target, "draft_model", llama.path)
    assert follow(prop, llama.prompts, llama.greedy) > 80
    assert prop.draft_seconds > 0


def test_more_sequences_than_a_batch_holds_draft_in_turns(llama):
    """6 sequences with max_num_seqs 4: two batches of forwards per call."""
    prop = proposer(llama.target, "draft_model", llama.path)
    follow(prop, llama.prompts * 2, llama.greedy * 2)


@pytest.mark.parametrize("k", [1, 3])
def test_self_draft_of_every_layer_drafts_the_greedy_continuation(llama, k):
    prop = proposer(llama.target, "self_draft", layers=3, k=k)
    assert prop.runner.model.weights.embed is llama.target.model.weights.embed
    follow(prop, llama.prompts, llama.greedy, k)


def test_self_draft_of_the_first_layers_is_the_cut_checkpoint(llama):
    prop = proposer(llama.target, "self_draft", layers=1)
    assert prop.runner.model.weights.layers[0] is llama.target.model.weights.layers[0]
    follow(prop, llama.prompts, llama.cut_greedy)
    follow(proposer(llama.target, "draft_model", llama.cut), llama.prompts, llama.cut_greedy)


def test_self_draft_layers_default_to_a_quarter_and_are_checked(llama):
    assert self_draft_model(llama.target, None).config.num_layers == 1   # 3 // 4, at least 1
    with pytest.raises(ValueError, match="draft_layers must be from 1 to the model's 3"):
        self_draft_model(llama.target, 4)
    whisper = SimpleNamespace(path=llama.path, model=SimpleNamespace(
        config=dataclasses.replace(llama.target.config,
                                   encoder=EncoderShape(80, 2, 4, 64, 128, 1500))))
    with pytest.raises(ValueError, match="encoder-decoder"):
        self_draft_model(whisper, 1)


def diverge(prop: DraftModelProposer, fresh: DraftModelProposer, prompts: list[list[int]],
            vocab: int, params: SamplingParams, rounds: int, seed: int = 0) -> None:
    """Steps in which each sequence keeps a random number of its drafts then a random
    token (the target's, which may equal the next draft), or asks no draft and gets a
    few tokens, or is preempted; every draft must be what `fresh` drafts from scratch
    on the same token_ids. A sampled draft's rows must be fresh's distribution after
    the same tokens, its token drawn from them."""
    rng = np.random.default_rng(seed)
    keys = [(f"s{i}", 0) for i in range(len(prompts))]
    ids = [p + [int(rng.integers(vocab))] for p in prompts]
    checked = 0
    for _ in range(rounds):
        ks = [int(rng.choice([0, 1, 2, 4, 6])) for _ in prompts]
        drafts = prop.propose([one(key, t, len(p), k, params)
                               for key, t, p, k in zip(keys, ids, prompts, ks, strict=True)])
        for i, (key, draft) in enumerate(zip(keys, drafts, strict=True)):
            if not ks[i]:
                assert draft is NO_DRAFT
                ids[i] += [int(t) for t in rng.integers(0, vocab, rng.integers(1, 4))]
                continue
            assert len(draft.tokens) == ks[i]
            if params.greedy:
                fresh.release(key, ids[i], False)
                assert fresh.propose([one(key, ids[i], len(prompts[i]), ks[i])])[0] == draft
            else:
                assert draft.probs.shape == (ks[i], prop.target_vocab)
                for j, token in enumerate(draft.tokens):
                    fresh.release(key, ids[i], False)
                    again = fresh.propose([one(key, ids[i] + draft.tokens[:j],
                                               len(prompts[i]), 1, params)])[0]
                    np.testing.assert_allclose(draft.probs[j], again.probs[0], atol=1e-5)
                    assert draft.probs[j, token] > 0
            checked += ks[i]
            kept = int(rng.integers(0, ks[i] + 1))
            ids[i] += draft.tokens[:kept] + [int(rng.integers(vocab))]
            if rng.random() < 0.1:   # preempted: recomputed from its prompt
                prop.release(key, ids[i], False)
    assert checked > 20


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_drafts_after_any_divergence_are_computed_from_scratch(llama, params):
    prop = proposer(llama.target, "draft_model", llama.path)
    diverge(prop, proposer(llama.target, "self_draft", layers=3), llama.prompts, llama.vocab,
            params, rounds=12)


def test_seeded_sampled_drafts_are_point_masses(llama):
    """A seeded request drafts argmax tokens (probs None), as a greedy one does: its
    output stays the output without speculation whatever k is."""
    prop = proposer(llama.target, "self_draft", layers=2)
    greedy = proposer(llama.target, "self_draft", layers=2)
    seeded = dataclasses.replace(SAMPLED, seed=11)
    for p in llama.prompts:
        draft = prop.propose([one(("a", 0), p, len(p), 5, seeded)])[0]
        want = greedy.propose([one(("a", 0), p, len(p), 5, GREEDY)])[0]
        assert draft.probs is None and draft.tokens == want.tokens


@pytest.mark.parametrize("kernel_only", [dict(dry_multiplier=0.8), dict(xtc_probability=0.5),
                                         dict(bad_words=["w3"])])
def test_dry_xtc_and_bad_words_drafts_are_point_masses(llama, kernel_only):
    """An unseeded request with a sampler only the kernel runs drafts argmax tokens:
    the kernel verifies them, with the drafts before each as output."""
    prop = proposer(llama.target, "self_draft", layers=2)
    params = dataclasses.replace(SAMPLED, seed=None, **kernel_only)
    for p in llama.prompts[:2]:
        assert prop.propose([one(("a", 0), p, len(p), 5, params)])[0].probs is None


def test_sampled_drafts_are_drawn_from_their_rows(llama):
    """2000 first drafts after one context (each call recomputes its last token): each
    token's frequency within 4.5 standard deviations of its probability."""
    prop = proposer(llama.target, "self_draft", layers=1, k=1)
    params = dataclasses.replace(SAMPLED, temperature=3.0, top_k=6, top_p=1.0)
    p = llama.prompts[0]
    counts = np.zeros(prop.target_vocab)
    draws = 2000
    for _ in range(draws):
        draft = prop.propose([one(("a", 0), p, len(p), 1, params)])[0]
        counts[draft.tokens[0]] += 1
    probs = draft.probs[0]
    assert np.count_nonzero(probs) == 6 and probs.max() < 0.5
    assert np.all(np.abs(counts / draws - probs) <= 4.5 * np.sqrt(probs * (1 - probs) / draws))


def test_sampled_draft_rows_are_the_requests_distribution(llama):
    """The first row: the target's logits of the prompt's last row (scored alone, by
    ModelRunner.prompt_logits) through sampling_probs (the draft is the target here), at
    the request's top-k too."""
    prompt = llama.prompts[1]
    kv = KVCache(llama.target.config, 4, 16, "f32")
    runner = ModelRunner(llama.target.model, kv, 64, 1, 64)
    logits = runner.prompt_logits(np.array(prompt), 0, [np.arange(4)], np.array([36]))[0]
    draft = proposer(llama.target, "draft_model", llama.path).propose(
        [one(("a", 0), prompt, len(prompt), 2, SAMPLED)])[0]
    np.testing.assert_allclose(draft.probs[0], sampling_probs(logits, SAMPLED), atol=1e-6)
    assert np.count_nonzero(draft.probs[0]) <= SAMPLED.top_k


def test_no_draft_past_the_context_or_without_blocks_and_release_frees(llama):
    prop = proposer(llama.target, "self_draft", layers=1, max_len=40, num_blocks=5,
                    args=dataclasses.replace(ARGS, block_size=8))
    p = llama.prompts[1]                                       # 37 tokens
    assert prop.propose([one(("a", 0), p, 37, 0)]) == [NO_DRAFT]
    assert len(prop.free_blocks) == 5 and prop.draft_seconds == 0   # k = 0: nothing runs
    assert len(prop.propose([one(("a", 0), p, 37, 6)])[0].tokens) == 4   # positions < 40
    assert not prop.free_blocks                                # 5 blocks: 40 positions
    assert prop.propose([one(("a", 0), p + [5, 6, 7, 8], 37, 3)]) == [NO_DRAFT]
    assert prop.propose([one(("b", 0), p[:5], 5, 3)]) == [NO_DRAFT]   # no block left
    prop.release(("a", 0), p, True)
    assert sorted(prop.free_blocks) == [0, 1, 2, 3, 4]
    assert len(prop.propose([one(("b", 0), p[:5], 5, 3)])[0].tokens) == 3


def test_a_different_tokenizer_is_refused_naming_both(llama, tmp_path):
    other = write_tiny_chat_llama(tmp_path / "chat")
    with pytest.raises(ValueError, match=f"draft model {other} and target {llama.path} have "
                                         f"different tokenizers"):
        proposer(llama.target, "draft_model", other)


def pad_vocabulary(src: Path, dst: Path, rows: int, extra_token: str | None = None) -> Path:
    """A copy of the tiny Llama whose embedding and lm_head have `rows` rows (the
    extra ones random), its tokenizer given `extra_token` when asked."""
    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    rng = np.random.default_rng(0)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = tensors[name]
        tensors[name] = np.concatenate([w, rng.standard_normal(
            (rows - len(w), w.shape[1])).astype(np.float32)])
    save_file(tensors, dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "vocab_size": rows}))
    if extra_token:
        tokenizer = json.loads((dst / "tokenizer.json").read_text())
        tokenizer["model"]["vocab"][extra_token] = len(tokenizer["model"]["vocab"])
        (dst / "tokenizer.json").write_text(json.dumps(tokenizer))
    return dst


def test_a_vocabulary_padded_to_another_size_is_mapped(llama, tmp_path):
    """A target padded to 128 rows with a 122-token draft: drafts come from the 122 ids
    both score, probs rows are the target's 128 wide. A draft padded beyond the
    target's rows is fine too; one whose tokenizer has a token the target cannot
    score is refused."""
    padded = pad_vocabulary(llama.path, tmp_path / "padded", 128)
    target = load(padded, ARGS)
    prop = proposer(target, "draft_model", llama.path)
    p = llama.prompts[0]
    assert prop.propose([one(("a", 0), p + llama.greedy[0][:1], 5, 4)])[0].tokens == \
        llama.greedy[0][1:5]
    draft = prop.propose([one(("b", 0), p, 5, 6, dataclasses.replace(SAMPLED, top_k=0,
                                                                      temperature=5.0))])[0]
    assert draft.probs.shape == (6, 128) and not draft.probs[:, 122:].any()
    proposer(llama.target, "draft_model", padded)   # the draft's rows 122.. are never drafted
    extra = pad_vocabulary(llama.path, tmp_path / "extra", 128, extra_token="w999")
    with pytest.raises(ValueError, match="the draft's tokenizer has id 122 .'w999'., beyond "
                                         "the target model's 122 tokens"):
        proposer(llama.target, "draft_model", extra)


# -- a hybrid: Qwen3.5's Gated DeltaNet layers ------------------------------------------


@pytest.fixture(scope="module")
def qwen(smollm2_gguf, tmp_path_factory) -> SimpleNamespace:
    """The tiny Qwen3.5 of tests/model (three Gated DeltaNet layers then a full-attention
    one, twice), the same cut to 4 layers, prompts and both greedy continuations."""
    pytest.importorskip("transformers")
    from tests import llama_cpp_tools as llama_cpp
    from tests.model.test_qwen3_5 import write_tiny
    tokenizer = llama_cpp.smollm2_tokenizer(smollm2_gguf, tmp_path_factory.mktemp("tok"))
    path = tmp_path_factory.mktemp("qwen3_5") / "dense"
    write_tiny(path, "dense", tokenizer)
    cut = cut_checkpoint(path, tmp_path_factory.mktemp("cut") / "qwen4", 4)
    rng = np.random.default_rng(4)
    prompts = [list(map(int, rng.integers(0, 1000, n))) for n in (9, 70)]
    return SimpleNamespace(path=path, cut=cut, target=load(path, ARGS), prompts=prompts,
                           greedy=greedy_continuations(path, prompts, 30),
                           cut_greedy=greedy_continuations(cut, prompts, 30))


def test_a_hybrid_draft_drafts_its_greedy_continuation(qwen):
    prop = proposer(qwen.target, "draft_model", qwen.path)
    assert prop.hybrid
    follow(prop, qwen.prompts, qwen.greedy)
    for key in [("r0", 0), ("r1", 0)]:
        prop.release(key, [], True)
    assert sorted(prop.free_states) == [0, 1, 2, 3] and sorted(prop.free_scratch) == [4, 5, 6, 7]


def test_a_hybrid_self_draft_is_its_cut_checkpoint(qwen):
    prop = proposer(qwen.target, "self_draft", layers=4)
    assert prop.runner.model.config.linear_layers == (0, 1, 2)
    follow(prop, qwen.prompts, qwen.cut_greedy)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_hybrid_after_any_divergence_drafts_from_scratch(qwen, params):
    diverge(proposer(qwen.target, "draft_model", qwen.path),
            proposer(qwen.target, "self_draft", layers=8), qwen.prompts, 1000, params,
            rounds=8, seed=1)
