"""/v1/rerank, /v2/rerank and /v1/score on a live server through Cohere's own SDK
(Client for v1, ClientV2 for v2) and httpx, a tiny one-label Qwen3 classifier
served: the scores and their ranking are transformers' (sigmoid of the
classifier's logit on tokenizer(query, document)); top_n, return_documents,
max_tokens_per_doc; many documents at once; bad input on every field is a 400
in OpenAI's error shape (and schemathesis finds no 5xx); a model that is no
reranker says so."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from tests.server.conftest import running_server

cohere = pytest.importorskip("cohere")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.tiny_reranker import assert_scores, hf_classifier_scores, write_classifier  # noqa: E402

QUERY = "w3 w4 w5 w6"
DOCS = ["w7 w8", "w9 w10 w11 w12 w13", "w3 w4", "w20 w21 w22", "w5 w6 w40"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = tmp_path_factory.mktemp("reranker")
    model = write_classifier(path, "qwen3", None)
    with running_server(path, tmp_path_factory, "reranker", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
                        "--max-num-seqs", "4", "--served-model-name", "tiny-reranker") as srv:
        srv.model_dir = path
        yield srv, (lambda query, docs: hf_classifier_scores(model, path, query, docs))


def error_of(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_cohere_v1_rerank(reranker):
    srv, oracle = reranker
    want = oracle(QUERY, DOCS)
    co = cohere.Client(api_key="none", base_url=srv.url)
    full = co.rerank(model="tiny-reranker", query=QUERY, documents=DOCS)
    assert [r.index for r in full.results] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert_scores([r.relevance_score for r in full.results], [want[r.index] for r in full.results])
    assert [r.document.text for r in full.results] == [DOCS[r.index] for r in full.results]
    top = co.rerank(model="tiny-reranker", query=QUERY, top_n=2, return_documents=False,
                    documents=[{"text": d} for d in DOCS])
    assert [r.index for r in top.results] == [r.index for r in full.results[:2]]
    assert all(r.document is None for r in top.results)


def test_cohere_v2_rerank(reranker):
    srv, oracle = reranker
    co = cohere.ClientV2(api_key="none", base_url=srv.url)
    got = co.rerank(model="tiny-reranker", query=QUERY, documents=DOCS, top_n=3)
    want = oracle(QUERY, DOCS)
    assert [r.index for r in got.results] == sorted(range(len(DOCS)), key=lambda i: -want[i])[:3]
    np.testing.assert_allclose([r.relevance_score for r in got.results],
                               [want[r.index] for r in got.results], atol=2e-5)
    raw = httpx.post(srv.url + "/v2/rerank", json={"query": QUERY, "documents": DOCS}).json()
    assert all(set(r) == {"index", "relevance_score"} for r in raw["results"])   # v2's items
    # each document cut to its first two tokens
    cut = co.rerank(model="tiny-reranker", query=QUERY, documents=DOCS, max_tokens_per_doc=2)
    short = [" ".join(d.split()[:2]) for d in DOCS]
    np.testing.assert_allclose(sorted(r.relevance_score for r in cut.results),
                               sorted(oracle(QUERY, short)), atol=2e-5)


def test_score_pairs_and_broadcast(reranker):
    srv, oracle = reranker
    r = httpx.post(srv.url + "/v1/score", json={"text_1": QUERY, "text_2": DOCS}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
    np.testing.assert_allclose([d["score"] for d in body["data"]], oracle(QUERY, DOCS),
                               atol=2e-5)
    queries = ["w1 w2", "w30 w31", "w3"]
    r = httpx.post(srv.url + "/score", json={"text_1": queries, "text_2": DOCS[:3]},
                   timeout=60)
    want = [oracle(q, [d])[0] for q, d in zip(queries, DOCS[:3], strict=True)]
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, atol=2e-5)
    tokens = r.json()["usage"]["prompt_tokens"]
    tok = transformers.AutoTokenizer.from_pretrained(srv.model_dir)
    assert tokens == sum(len(tok(q, d)["input_ids"]) for q, d in zip(queries, DOCS[:3],
                                                                        strict=True))


def test_many_documents_at_once(reranker):
    """More documents than the server runs at once (max_num_seqs 4): they queue, and
    each score is its own."""
    srv, oracle = reranker
    docs = [f"w{i} w{i + 1} w{(i * 7) % 80 + 2}" for i in range(2, 42)]
    r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": docs},
                   timeout=120)
    assert r.status_code == 200, r.text
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(docs))], oracle(QUERY, docs),
                               atol=2e-5)


@pytest.mark.parametrize("path,body,param,code", [
    ("/v1/rerank", {"documents": DOCS}, "query", "missing_required_parameter"),
    ("/v1/rerank", {"query": QUERY}, "documents", "missing_required_parameter"),
    ("/v1/rerank", {"query": QUERY, "documents": []}, "documents", "invalid_value"),
    ("/v1/rerank", {"query": QUERY, "documents": [1, 2]}, "documents", "invalid_value"),
    ("/v1/rerank", {"query": QUERY, "documents": [{"title": "w1"}]}, "documents",
     "invalid_value"),
    ("/v2/rerank", {"query": QUERY, "documents": [{"text": "w1"}]}, "documents",
     "invalid_value"),
    ("/v1/rerank", {"query": 5, "documents": DOCS}, "query", "invalid_type"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n", "invalid_value"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n", "invalid_type"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "return_documents": "yes"},
     "return_documents", "invalid_type"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "rank_fields": ["title"]},
     "rank_fields", "invalid_value"),
    ("/v2/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 0},
     "max_tokens_per_doc", "invalid_value"),
    ("/v1/rerank", {"query": QUERY, "documents": [" ".join(["w3"] * 300)]}, "documents",
     "context_length_exceeded"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "model": "other"}, "model",
     "model_not_found"),
    ("/v1/score", {"text_2": DOCS}, "text_1", "missing_required_parameter"),
    ("/v1/score", {"text_1": QUERY}, "text_2", "missing_required_parameter"),
    ("/v1/score", {"text_1": ["w1", "w2"], "text_2": DOCS}, "text_1", "invalid_value"),
    ("/v1/score", {"text_1": QUERY, "text_2": []}, "text_2", "invalid_value"),
    ("/v1/score", {"text_1": 3, "text_2": DOCS}, "text_1", "invalid_value"),
])
def test_bad_input_is_a_400(reranker, path, body, param, code):
    srv, _ = reranker
    err = error_of(httpx.post(srv.url + path, json=body, timeout=60))
    assert (err["param"], err["code"]) == (param, code), err
    assert httpx.get(srv.url + "/health").status_code == 200


def test_a_reranker_serves_no_completions(reranker):
    srv, _ = reranker
    err = error_of(httpx.post(srv.url + "/v1/completions", json={"prompt": "w1"}))
    assert err["param"] == "model" and "scores and embeddings only" in err["message"]


def test_a_model_that_is_no_reranker_says_so(server):
    for path, body in (("/v1/rerank", {"query": "a", "documents": ["b"]}),
                       ("/v1/score", {"text_1": "a", "text_2": "b"})):
        err = error_of(httpx.post(server.url + path, json=body))
        assert err["param"] == "model" and "no reranker" in err["message"]


def test_fuzzed_rerank_routes_stay_healthy(reranker, tmp_path):
    """schemathesis over the rerank and score routes of /openapi.json (positive and
    negative cases): no 5xx, answers that match the document, and the scores still
    transformers' afterwards."""
    pytest.importorskip("schemathesis")
    srv, oracle = reranker
    report = tmp_path / "run.ndjson"
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", srv.url + "/openapi.json",
         "--include-path-regex", "rerank|score",
         "--checks", "not_a_server_error,response_schema_conformance",
         "--max-examples", "40", "--max-time", "40", "--request-timeout", "30",
         "--seed", "1", "--report", "ndjson", "--report-ndjson-path", str(report)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:]
    statuses = collections.Counter()
    for line in report.read_text().splitlines():
        event = json.loads(line).get("ScenarioFinished")
        for it in ((event or {}).get("recorder", {}).get("interactions") or {}).values():
            statuses[(it.get("response") or {}).get("status_code")] += 1
    assert statuses[200] >= 20 and statuses[400] >= 20, statuses
    assert not any(s is None or s >= 500 for s in statuses), statuses
    r = httpx.post(srv.url + "/v1/score", json={"text_1": QUERY, "text_2": DOCS}, timeout=60)
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], oracle(QUERY, DOCS),
                               atol=2e-5)
