"""LLM.embed against sentence-transformers (and transformers' hidden states) on tiny
random embedding models: last-token, mean and first-token pooling, normalized or
not; prompts split into prefill chunks, repeated (prefix cache), batched with
generations; Matryoshka truncation; the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")

from armllm import LLM, SamplingParams  # noqa: E402
from tests.tiny_embedding import write_tiny_embedding  # noqa: E402

TEXTS = ["w1 w2 w3", "w5 w6 w7 w8 w9 w10 w11", "w40", " ".join(f"w{i % 80 + 3}" for i in range(70))]
F32 = dict(dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.02)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_matches(ours: list, theirs: np.ndarray, normalized: bool) -> None:
    ours = np.stack([o.embedding for o in ours])
    assert ours.shape == theirs.shape and ours.dtype == np.float32
    assert cosines(ours, theirs).min() >= 0.9999
    np.testing.assert_allclose(ours, theirs, atol=2e-5 * max(1.0, np.abs(theirs).max()))
    if normalized:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("decoder,pooling,normalize", [
    ("qwen3", "lasttoken", True), ("llama", "mean", False), ("mistral", "cls", True),
    ("qwen3", "mean", True)])
def test_embeddings_match_sentence_transformers(tmp_path, decoder, pooling, normalize):
    path, st = write_tiny_embedding(tmp_path, decoder, pooling, normalize)
    want = st.encode(TEXTS, convert_to_numpy=True, batch_size=1)
    llm = LLM(path, **F32)
    assert not llm.loaded.config.has_lm_head
    got = llm.embed(TEXTS)
    assert_matches(got, want, normalize)
    assert [o.prompt_token_ids[-1] for o in got] == [0] * len(TEXTS)  # the appended end token
    assert llm.stats().num_free_blocks == llm.stats().num_blocks     # nothing kept


@pytest.mark.parametrize("pooling", ["lasttoken", "mean", "cls"])
def test_chunked_prefill_and_repeats_pool_the_same(tmp_path, pooling):
    """A 71-token prompt in 16-token chunks pools as in one pass; a repeated prompt
    (last-token pooling: served from the prefix cache but its last row) gives the same
    vector; mean and first-token pooling recompute every row."""
    path, st = write_tiny_embedding(tmp_path, "qwen3", pooling)
    want = st.encode(TEXTS[3:], convert_to_numpy=True)
    llm = LLM(path, max_num_batched_tokens=16, max_num_seqs=4, **F32)
    first, again = llm.embed([TEXTS[3], TEXTS[3]])
    assert_matches([first], want, True)
    np.testing.assert_array_equal(first.embedding, again.embedding)
    third = llm.embed(TEXTS[3])[0]
    cached = third.metrics.num_cached_prompt_tokens
    assert cached == (64 if pooling == "lasttoken" else 0)   # whole 16-token blocks
    np.testing.assert_array_equal(first.embedding, third.embedding)


def test_embedding_beside_generation(tmp_path):
    """A causal LM serves both: embeddings (default pooling: the last token's state,
    normalized, as transformers' hidden states give it) batched in the same steps as
    greedy generations, which are unchanged by them."""
    import transformers

    from tests.tiny_embedding import TINY, write_tokenizer
    torch.manual_seed(1)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY, head_dim=16)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    write_tokenizer(tmp_path)
    llm = LLM(tmp_path, **F32)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = [o.token_ids for o in llm.generate(TEXTS[:2], greedy)]
    for i, text in enumerate(TEXTS[:2]):
        llm.engine.add_request(f"g{i}", llm.prompt_ids(text), greedy)
    from armllm.engine.embedding import PoolingParams
    ids = llm.prompt_ids(TEXTS[1])
    llm.engine.add_request("e", ids, PoolingParams())
    tokens, vector = {"g0": [], "g1": []}, None
    while llm.engine.has_unfinished():
        for out in llm.engine.step():
            if out.request_id == "e":
                vector = out.embedding
            else:
                tokens[out.request_id] += out.new_token_ids
    assert [tokens["g0"], tokens["g1"]] == alone
    with torch.no_grad():
        state = hf.model(torch.tensor([ids])).last_hidden_state[0, -1].numpy()
    want = state / np.linalg.norm(state)
    np.testing.assert_allclose(vector, want, atol=2e-5)
    assert np.allclose(llm.embed(TEXTS[1])[0].embedding, vector, atol=1e-6)


def test_matryoshka_dimensions_and_refusals(tmp_path):
    path, st = write_tiny_embedding(tmp_path, "qwen3", "lasttoken", True,
                                    matryoshka_dimensions=[16, 32])
    llm = LLM(path, **F32)
    full = st.encode(TEXTS[:2], convert_to_numpy=True, normalize_embeddings=False)
    base = st[0].auto_model   # the bare decoder: its unnormalized last-token state
    with torch.no_grad():
        raw = [base(torch.tensor([llm.prompt_ids(t)])).last_hidden_state[0, -1].numpy()
               for t in TEXTS[:2]]
    assert cosines(np.stack(raw), full).min() > 0.9999
    got = np.stack([o.embedding for o in llm.embed(TEXTS[:2], dimensions=16)])
    want = np.stack([r[:16] / np.linalg.norm(r[:16]) for r in raw])   # truncate, normalize
    np.testing.assert_allclose(got, want, atol=2e-5)
    with pytest.raises(ValueError, match=r"one of \[16, 32\].*got 8"):
        llm.embed("w1", dimensions=8)
    with pytest.raises(ValueError, match="no lm_head"):
        llm.generate("w1 w2", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="maximum context length"):
        llm.embed(" ".join(["w3"] * 300))
    with pytest.raises(ValueError, match="empty"):
        llm.embed([[]])


def test_no_truncation_unless_trained_for_it(tmp_path):
    path, _ = write_tiny_embedding(tmp_path, "llama", "mean", False)
    llm = LLM(path, **F32)
    with pytest.raises(ValueError, match="not trained for truncation.*dimensions 16"):
        llm.embed("w1", dimensions=16)
    assert llm.embed("w1", dimensions=64)[0].embedding.shape == (64,)


def test_causal_config_without_lm_head_is_an_embedding_model(tmp_path):
    """Qwen3-Embedding-4B's layout: a Qwen3ForCausalLM config, untied, over a bare
    decoder's tensors."""
    path, st = write_tiny_embedding(tmp_path, "qwen3", "lasttoken")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False)
    (path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(path, **F32)
    assert not llm.loaded.config.has_lm_head
    assert_matches(llm.embed(TEXTS[:2]), st.encode(TEXTS[:2], convert_to_numpy=True), True)


def test_unsupported_pipeline_refuses_embeddings_only(tmp_path):
    path, _ = write_tiny_embedding(tmp_path, "llama", "mean", False)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.base.modules.dense.Dense"})
    (path / "modules.json").write_text(json.dumps(modules))
    llm = LLM(path, **F32)
    with pytest.raises(ValueError, match="Dense.*not supported"):
        llm.embed("w1")


def test_tensor_parallel_embeddings_equal_one_rank(tmp_path):
    """Rank 0 pools the all-reduced hidden states: TP=2 equals TP=1 (f32, the sum's order
    aside), a mean-pooled prompt split into chunks included."""
    path, _ = write_tiny_embedding(tmp_path, "qwen3", "mean")
    one = np.stack([o.embedding for o in LLM(path, max_num_batched_tokens=32, **F32)
                    .embed(TEXTS)])
    with LLM(path, tensor_parallel_size=2, max_num_batched_tokens=32, **F32) as tp:
        two = np.stack([o.embedding for o in tp.embed(TEXTS)])
    np.testing.assert_allclose(two, one, atol=1e-5)
