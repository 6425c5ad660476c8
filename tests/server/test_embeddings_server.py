"""/v1/embeddings of a real `armllm serve` over a tiny sentence-transformers model,
through the official openai client (base64, its default, and float) and raw HTTP:
the vectors equal sentence-transformers', usage counts the input tokens, token-id
inputs, Matryoshka dimensions, and OpenAI-shaped 400s for bad input; the model
serves no completions (it has no lm_head)."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
openai = pytest.importorskip("openai")

from tests.server.conftest import running_server  # noqa: E402
from tests.tiny_embedding import write_tiny_embedding  # noqa: E402

TEXTS = ["w1 w2 w3", "w5 w6 w7 w8 w9", "w40 w41"]
URL = "/v1/embeddings"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path, st = write_tiny_embedding(tmp_path_factory.mktemp("embed"), "qwen3", "lasttoken",
                                    True, matryoshka_dimensions=[16, 32])
    with running_server(path, tmp_path_factory, "embed", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
                        "--served-model-name", "emb", "--max-model-len", "128") as srv:
        yield srv, st


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_openai_client_gets_sentence_transformers_vectors(embedder):
    srv, st = embedder
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    want = st.encode(TEXTS, convert_to_numpy=True)
    for fmt in ("base64", "float"):   # the client asks for base64 unless told
        kw = {} if fmt == "base64" else {"encoding_format": "float"}
        resp = client.embeddings.create(model="emb", input=TEXTS, **kw)
        got = np.array([d.embedding for d in resp.data], np.float32)
        assert [d.index for d in resp.data] == [0, 1, 2]
        np.testing.assert_allclose(got, want, atol=2e-5)
        tokens = sum(len(st.tokenizer(t)["input_ids"]) for t in TEXTS)
        assert resp.usage.prompt_tokens == resp.usage.total_tokens == tokens
        assert resp.model == "emb"
    one = client.embeddings.create(model="emb", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, want[0], atol=2e-5)


def test_token_ids_base64_and_dimensions_over_http(embedder):
    srv, st = embedder
    ids = [list(st.tokenizer(t)["input_ids"]) for t in TEXTS[:2]]
    r = httpx.post(srv.url + URL, json={"input": ids, "encoding_format": "base64",
                                        "dimensions": 16})
    assert r.status_code == 200, r.text
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
                    for d in r.json()["data"]])
    full = st.encode(TEXTS[:2], convert_to_numpy=True, normalize_embeddings=False)
    raw = st[0].auto_model   # the unnormalized state, truncated then normalized
    import torch
    with torch.no_grad():
        states = [raw(torch.tensor([i])).last_hidden_state[0, -1, :16].numpy() for i in ids]
    want = np.stack([s / np.linalg.norm(s) for s in states])
    assert got.shape == (2, 16) and full.shape == (2, 64)
    np.testing.assert_allclose(got, want, atol=2e-5)
    single = httpx.post(srv.url + URL, json={"input": ids[0]}).json()
    np.testing.assert_allclose(single["data"][0]["embedding"],
                               st.encode(TEXTS[0], convert_to_numpy=True), atol=2e-5)


@pytest.mark.parametrize("body,param,code", [
    ({"input": []}, "input", "invalid_value"),
    ({"input": [[]]}, "input", "invalid_value"),
    ({"input": ""}, "input", "invalid_value"),
    ({"input": [1, "w1"]}, "input", "invalid_value"),
    ({"input": 5}, "input", "invalid_value"),
    ({"input": "w1", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ({"input": "w1", "dimensions": 8}, "dimensions", "invalid_value"),
    ({"input": "w1", "dimensions": "16"}, "dimensions", "invalid_type"),
    ({"input": " ".join(["w3"] * 200)}, "input", "context_length_exceeded"),
    ({"input": [[5, 10_000]]}, "input", "invalid_value"),
    ({"input": "w1", "model": "other"}, "model", "model_not_found"),
    ({}, "input", "missing_required_parameter"),
])
def test_bad_input_is_a_400(embedder, body, param, code):
    srv, _ = embedder
    err = error_of(httpx.post(srv.url + URL, json=body), 400)
    assert (err["param"], err["code"]) == (param, code), err


def test_an_embedding_model_serves_no_completions(embedder):
    srv, _ = embedder
    err = error_of(httpx.post(srv.url + "/v1/completions",
                              json={"prompt": "w1", "max_tokens": 2}), 400)
    assert err["param"] == "model" and "embeddings only" in err["message"]
    assert httpx.get(srv.url + "/health").status_code == 200
