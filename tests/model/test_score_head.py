"""LLM.score (a reranker's relevance score of query-document pairs) against
transformers on tiny random checkpoints: one-label sequence classifiers of each
family (sigmoid of `score`'s logit at the last token, the pair joined by the
tokenizer's own pair rule), causal rerankers served with score_from_tokens
(sigmoid(logit(yes) - logit(no)) of the lm_head, tied or not, soft-capped),
and a Qwen3-Reranker as llama.cpp's converter writes it (cls.output, pooling
type rank, its rerank template) against transformers and llama.cpp's own
llama-server /v1/rerank; then the refusals."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from armllm import LLM
from tests import llama_cpp_tools as llama_cpp
from tests.server.conftest import free_port

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.tiny_reranker import (  # noqa: E402
    DOCUMENTS,
    QUERY,
    RERANK_TEMPLATE,
    assert_scores,
    hf_classifier_scores,
    hf_token_scores,
    write_causal,
    write_classifier,
)

F32 = dict(dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.05)


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf, tmp_path_factory) -> Path:
    return llama_cpp.smollm2_tokenizer(smollm2_gguf, tmp_path_factory.mktemp("tokenizer"))


def scores(llm: LLM, query: str = QUERY, documents: list[str] = DOCUMENTS) -> list[float]:
    return [o.score for o in llm.score(query, documents)]


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama", "mistral", "gemma3", "phi3"])
def test_classifier_scores_match_transformers(tmp_path, tokenizer, family):
    model = write_classifier(tmp_path, family, tokenizer)
    want = hf_classifier_scores(model, tmp_path, QUERY, DOCUMENTS)
    assert_scores(scores(LLM(tmp_path, **F32)), want)


def test_pair_rule_and_prompt_are_the_tokenizers(tmp_path):
    """tiny_embedding's tokenizer joins a pair as `A <eos> B <eos>`: the prompt is what
    transformers' tokenizer(query, document) gives, and so is the score; documents
    sharing the query's prefix come from the prefix cache, in batches and chunks."""
    model = write_classifier(tmp_path, "qwen3", None)
    query, docs = "w3 w4 w5 w6", ["w7 w8", "w9 w10 w11 w12 w13", "w3 w4", "w20"] * 3
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    llm = LLM(tmp_path, max_num_batched_tokens=8, max_num_seqs=4, **F32)
    outs = llm.score(query, docs)
    assert [o.prompt_token_ids for o in outs] == [tok(query, d)["input_ids"] for d in docs]
    assert_scores([o.score for o in outs], hf_classifier_scores(model, tmp_path, query, docs))


# the tiny Gemma's local layers see 8 tokens: its prompt ends with the document
SHORT_TEMPLATE = "Query: {query}\nDocument: {document}"


@pytest.mark.parametrize("family,tied,text", [
    ("qwen3", True, RERANK_TEMPLATE), ("qwen3", False, RERANK_TEMPLATE),
    ("gemma3-softcap", True, SHORT_TEMPLATE)])
def test_causal_reranker_matches_transformers(tmp_path, tokenizer, family, tied, text):
    model = write_causal(tmp_path, family, tokenizer, tied)
    want = hf_token_scores(model, tmp_path, text, QUERY, DOCUMENTS)
    template = tmp_path / "rerank.txt"
    template.write_text(text)
    llm = LLM(tmp_path, score_from_tokens="no,yes", score_template=str(template), **F32)
    assert llm.loaded.model.weights.lm_head is None   # two rows of it are the head
    assert_scores(scores(llm), want)


def test_causal_reranker_over_tensor_parallel_ranks(tmp_path, tokenizer):
    """Two ranks: each loads its shards without the lm_head, rank 0 scores."""
    model = write_causal(tmp_path, "qwen3", tokenizer, tied=False)
    template = tmp_path / "rerank.txt"
    template.write_text(RERANK_TEMPLATE)
    llm = LLM(tmp_path, score_from_tokens="no,yes", score_template=str(template),
              tensor_parallel_size=2, **F32)
    try:
        assert_scores(scores(llm), hf_token_scores(model, tmp_path, RERANK_TEMPLATE, QUERY,
                                                   DOCUMENTS))
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def reranker_gguf(tokenizer, tmp_path_factory):
    """A tiny Qwen3-Reranker (a Qwen3ForCausalLM whose directory says so) and
    llama.cpp's converter's f32 GGUF of it."""
    path = tmp_path_factory.mktemp("models") / "qwen3-reranker-tiny"
    path.mkdir()
    model = write_causal(path, "qwen3", tokenizer, tied=True)
    return path, model, llama_cpp.convert(path, path.parent / "qwen3-reranker-tiny.gguf")


def test_gguf_reranker_matches_transformers(reranker_gguf):
    path, model, gguf = reranker_gguf
    llm = LLM(gguf, **F32)
    assert llm.is_reranker and llm.loaded.score_template == RERANK_TEMPLATE
    assert_scores(scores(llm), hf_token_scores(model, path, RERANK_TEMPLATE, QUERY, DOCUMENTS))


def test_gguf_reranker_matches_llama_server(reranker_gguf):
    """llama.cpp's own server (--reranking) on the same GGUF: its relevance scores,
    ranked, are ours."""
    _, _, gguf = reranker_gguf
    port = free_port()
    proc = subprocess.Popen([str(llama_cpp.binary("llama-server")), "-m", str(gguf),
                             "--reranking", "--port", str(port), "-c", "512", "-t", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS},
                       timeout=60)
        assert r.status_code == 200, r.text
        theirs = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    finally:
        proc.terminate()
        proc.wait(30)
    ours = scores(LLM(gguf, **F32))
    assert_scores(ours, [theirs[i] for i in range(len(DOCUMENTS))], atol=1e-3)


def test_refusals(tmp_path, tokenizer):
    causal = tmp_path / "causal"
    write_causal(causal, "qwen3", tokenizer, tied=True)
    llm = LLM(causal, **F32)
    with pytest.raises(ValueError, match="no reranker"):
        llm.score(QUERY, DOCUMENTS)
    for bad in ("yes", "no,no", "no,", 5):
        with pytest.raises(ValueError, match="score_from_tokens"):
            LLM(causal, score_from_tokens=bad, **F32)
    with pytest.raises(ValueError, match="'no-such-token' is not a token"):
        LLM(causal, score_from_tokens="no-such-token,yes", **F32)
    with pytest.raises(ValueError, match=r"must hold \{query\} and \{document\}"):
        LLM(causal, score_from_tokens="no,yes", score_template="Query: {query}", **F32)
    with pytest.raises(ValueError, match="no reranker"):
        LLM(causal, score_template="{query} {document}", **F32)

    reranker = LLM(causal, score_from_tokens="no,yes", **F32)
    with pytest.raises(ValueError, match="scores and embeddings only"):
        reranker.generate("hello")
    with pytest.raises(ValueError, match="a document is a string"):
        reranker.score(QUERY, [3])

    two = tmp_path / "two-labels"
    write_classifier(two, "qwen3", tokenizer, labels=2)
    with pytest.raises(ValueError, match="2 labels gives no single relevance score"):
        LLM(two, **F32)
    config = json.loads((two / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForSequenceClassification"]
