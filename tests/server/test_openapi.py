"""/openapi.json: it describes every route the server has, with the bodies the
routes check (the same field tables); and schemathesis, fuzzing a real server
from it (positive and negative cases, about 120 s), finds no 5xx, no hang, and
only OpenAI-shaped errors; the server serves normally afterwards."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

import httpx
import pytest

from armllm.server import protocol as P
from armllm.server.audio import TRANSCRIPTION_FIELDS, TRANSLATION_FIELDS
from armllm.server.embeddings import EMBEDDING_FIELDS
from armllm.server.messages import MESSAGES_FIELDS
from armllm.server.rerank import RERANK_FIELDS, SCORE_FIELDS
from armllm.server.responses import RESPONSES_FIELDS
from armllm.server.tokenize import DETOKENIZE_FIELDS, TOKENIZE_FIELDS
from tests.server.conftest import running_server

pytest.importorskip("schemathesis")


def test_document_lists_every_route_and_field(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    assert set(doc["paths"]) == {"/health", "/version", "/metrics", "/openapi.json",
                                 "/v1/models", "/v1/completions", "/v1/chat/completions",
                                 "/v1/embeddings", "/tokenize", "/detokenize",
                                 "/v1/audio/transcriptions", "/v1/audio/translations",
                                 "/v1/responses", "/v1/responses/{response_id}",
                                 "/v1/messages", "/v1/messages/count_tokens",
                                 "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score",
                                 "/score"}
    for path, fields in (("/v1/completions", P.COMPLETION_FIELDS),
                         ("/v1/chat/completions", P.CHAT_FIELDS),
                         ("/v1/responses", RESPONSES_FIELDS),
                         ("/v1/messages", MESSAGES_FIELDS),
                         ("/tokenize", TOKENIZE_FIELDS), ("/detokenize", DETOKENIZE_FIELDS),
                         ("/v1/embeddings", EMBEDDING_FIELDS),
                         ("/v1/rerank", RERANK_FIELDS), ("/v2/rerank", RERANK_FIELDS),
                         ("/v1/score", SCORE_FIELDS)):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert set(body["schema"]["properties"]) == set(fields), path
    for path, fields in (("/v1/audio/transcriptions", TRANSCRIPTION_FIELDS),
                         ("/v1/audio/translations", TRANSLATION_FIELDS)):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]
        assert set(body["schema"]["properties"]) == set(fields), path
    # undocumented paths answer 404 in the error shape
    r = httpx.get(server.url + "/v2/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_fuzzed_server_stays_healthy(tiny_model, tmp_path_factory, tmp_path):
    with running_server(tiny_model, tmp_path_factory, "fuzz", "--dtype", "float32",
                        "--kv-cache-gib", "0.02", "--served-model-name", "tiny") as srv:
        report = tmp_path / "run.ndjson"
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", srv.url + "/openapi.json",
             "--checks", "not_a_server_error,response_schema_conformance",
             "--max-examples", "100", "--max-time", "120", "--request-timeout", "30",
             "--seed", "1", "--report", "ndjson", "--report-ndjson-path", str(report)],
            capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-4000:]
        requests, statuses = collections.Counter(), collections.defaultdict(collections.Counter)
        for line in report.read_text().splitlines():
            event = json.loads(line).get("ScenarioFinished")
            if event is None:
                continue
            for it in (event["recorder"].get("interactions") or {}).values():
                label = event["recorder"]["label"]
                requests[label] += 1
                statuses[label][(it.get("response") or {}).get("status_code")] += 1
        print({k: (requests[k], dict(statuses[k])) for k in requests})
        for op in ("POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize",
                   "POST /detokenize", "POST /v1/embeddings"):
            assert requests[op] >= 200, (op, requests)
            assert not any(s is None or s >= 500 for s in statuses[op]), statuses[op]
        assert httpx.get(srv.url + "/health").status_code == 200
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "w1 w2", "max_tokens": 4,
                                                           "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
