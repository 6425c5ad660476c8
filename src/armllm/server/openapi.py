"""openapi: the server's OpenAPI 3.1 document (GET /openapi.json), built from
the same field tables the routes check their bodies against
(protocol.COMPLETION_FIELDS, CHAT_FIELDS, responses', tokenize's, embeddings',
rerank's, audio's forms, messages'), so that it cannot drift from what the server
accepts. Every error response is OpenAI's error object, Anthropic's on
/v1/messages."""
from __future__ import annotations

import armllm
from armllm.audio.formats import RESPONSE_FORMATS
from armllm.server import protocol as P
from armllm.server.audio import GRANULARITIES, TRANSCRIPTION_FIELDS, TRANSLATION_FIELDS
from armllm.server.embeddings import EMBEDDING_FIELDS, ENCODING_FORMATS
from armllm.server.messages import COUNT_FIELDS, MESSAGES_FIELDS
from armllm.server.rerank import RERANK_FIELDS, SCORE_FIELDS
from armllm.server.responses import RESPONSES_FIELDS
from armllm.server.tokenize import DETOKENIZE_FIELDS, TOKENIZE_FIELDS

# a field table's kinds (protocol._CHECKS) as JSON Schema; null is always allowed (the
# field's default)
_KINDS = {"int": {"type": ["integer", "null"]}, "num": {"type": ["number", "null"]},
          "bool": {"type": ["boolean", "null"]}, "str": {"type": ["string", "null"]},
          "obj": {"type": ["object", "null"]}, "list": {"type": ["array", "null"]},
          "any": {}}
# a completion's prompt, an embedding's input: text, texts, token ids, token-id lists
_PROMPTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                      {"type": "array", "items": {"type": "integer"}},
                      {"type": "array", "items": {"type": "array",
                                                  "items": {"type": "integer"}}}]}
# the fields whose values have more shape than their kind says
_SHAPES = {
    "prompt": _PROMPTS,
    "input": _PROMPTS,
    "messages": {"type": "array", "items": {
        "type": "object", "required": ["role"],
        "properties": {"role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                       "content": {"type": ["string", "array", "null"]},
                       "name": {"type": "string"}, "tool_calls": {"type": "array"},
                       "tool_call_id": {"type": "string"}}}},
    "tokens": {"type": "array", "items": {"type": "integer"}},
    "encoding_format": {"enum": [*ENCODING_FORMATS, None]},
    "stop_token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
    "dry_sequence_breakers": {"type": ["array", "null"], "items": {"type": "string"}},
    "bad_words": {"type": ["array", "null"], "items": {"type": "string"}},
}
# a Responses API request's input: text, or items (messages, calls, call outputs, reasoning)
_RESPONSES_SHAPES = {"input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
    "type": "object", "properties": {
        "type": {"enum": ["message", "function_call", "function_call_output", "reasoning"]},
        "role": {"enum": ["user", "system", "developer", "assistant"]},
        "content": {"type": ["string", "array"]}, "call_id": {"type": "string"},
        "name": {"type": "string"}, "arguments": {"type": "string"},
        "output": {"type": ["string", "array"]}}}}]}}
# an Anthropic message's role and content (a string or content blocks)
_MESSAGES_SHAPES = {"messages": {"type": "array", "items": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": ["user", "assistant"]},
                   "content": {"type": ["string", "array"]}}}}}
# a rerank's documents (v1: strings or {"text": ...}; v2: strings), a score's texts
_RERANK_SHAPES = {"documents": {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "string"}, {"type": "object", "required": ["text"],
                         "properties": {"text": {"type": "string"}}}]}}}
_RERANK_V2_SHAPES = {"documents": {"type": "array", "minItems": 1,
                                   "items": {"type": "string"}}}
_TEXTS = {"anyOf": [{"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}}]}
_SCORE_SHAPES = {"text_1": _TEXTS, "text_2": _TEXTS}
_RERANKED = {"type": "object", "required": ["results"], "properties": {
    "id": {"type": "string"}, "results": {"type": "array", "items": {
        "type": "object", "required": ["index", "relevance_score"],
        "properties": {"index": {"type": "integer"}, "relevance_score": {"type": "number"},
                       "document": {"type": "object"}}}},
    "usage": {"type": "object"}}}
_SCORED = {"type": "object", "required": ["data", "usage"], "properties": {
    "object": {"const": "list"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["index", "score"],
        "properties": {"index": {"type": "integer"}, "score": {"type": "number"}}}},
    "usage": {"type": "object"}}}
_RESPONSE = {"type": "object", "required": ["id", "object", "status", "output"],
             "properties": {"id": {"type": "string"}, "object": {"const": "response"},
                            "status": {"type": "string"}, "output": {"type": "array"}}}
_ERROR = {"$ref": "#/components/schemas/Error"}
# Anthropic's error body, on /v1/messages
_ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}
_MESSAGE = {"type": "object", "required": ["id", "type", "role", "content"],
            "properties": {"id": {"type": "string"}, "type": {"const": "message"},
                           "role": {"const": "assistant"}, "content": {"type": "array"}}}
_JSON_OBJECT = {"type": "object"}


def _body(fields: dict[str, str], required: tuple[str, ...], model: str,
          shapes: dict | None = None) -> dict:
    shapes = {**_SHAPES, **(shapes or {}), "model": {"enum": [model, None]}}  # one model
    schema = {"type": "object",
              "properties": {k: shapes.get(k, _KINDS[v]) for k, v in fields.items()}}
    if required:
        schema["required"] = list(required)
    return schema


def _responses(ok: dict, *, media: str = "application/json", error: dict = _ERROR) -> dict:
    """The success response (`ok`, a schema, under `media`) and the error object
    (OpenAI's unless `error`) for every other status."""
    return {"200": {"description": "success", "content": {media: {"schema": ok}}},
            "default": {"description": "an error (4xx: the request; 503: not ready, "
                        "overloaded or stopped)",
                        "content": {"application/json": {"schema": error}}}}


def _post(summary: str, fields: dict[str, str], required: tuple[str, ...], ok: dict,
          model: str, stream: bool = False, shapes: dict | None = None,
          error: dict = _ERROR) -> dict:
    responses = _responses(ok, error=error)
    if stream:   # "stream": true answers with server-sent events
        responses["200"]["content"]["text/event-stream"] = {"schema": {
            "type": "object", "properties": {"data": {"type": "string"}}}}
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {
        "application/json": {"schema": _body(fields, required, model, shapes)}}},
        "responses": responses}}


# a form field's kind (server/audio.py's tables) as JSON Schema
_FORM_KINDS = {"file": {"type": "string", "contentMediaType": "application/octet-stream"},
               "str": {"type": "string"}, "num": {"type": "number"},
               "bool": {"type": "boolean"},
               "list": {"type": "array", "items": {"enum": list(GRANULARITIES)}}}
_TRANSCRIPT = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}


def _form_post(summary: str, fields: dict[str, str], model: str, stream: bool) -> dict:
    """A multipart/form-data route (an audio upload and its fields); its success is a
    JSON object or text (text, srt, vtt), or with stream=true server-sent events."""
    shapes = {"model": {"enum": [model]}, "response_format": {"enum": list(RESPONSE_FORMATS)}}
    schema = {"type": "object", "required": ["file"],
              "properties": {k: shapes.get(k, _FORM_KINDS[v]) for k, v in fields.items()}}
    responses = _responses(_TRANSCRIPT)
    content = responses["200"]["content"]
    content["text/plain"] = content["text/vtt"] = {"schema": {"type": "string"}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "object",
                                                   "properties": {"data": {"type": "string"}}}}
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": schema}}}, "responses": responses}}


def _get(summary: str, ok: dict, media: str = "application/json") -> dict:
    return {"get": {"summary": summary, "responses": _responses(ok, media=media)}}


def document(model: str) -> dict:
    """The OpenAPI document of every route the server answers, serving `model` (the
    name requests may give)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "armllm", "version": armllm.__version__,
                 "description": "OpenAI-compatible completions, chat, responses, "
                                "embeddings, rerank and score, and audio "
                                "transcriptions, with vLLM's "
                                "extensions (sampling fields, structured outputs, "
                                "/tokenize), and Anthropic's Messages API."},
        "paths": {
            "/health": _get("200 once the model serves, else 503", _JSON_OBJECT),
            "/version": _get("the armllm version", {
                "type": "object", "properties": {"version": {"type": "string"}},
                "required": ["version"]}),
            "/metrics": _get("Prometheus metrics", {"type": "string"},
                             "text/plain"),
            "/openapi.json": _get("this document", _JSON_OBJECT),
            "/v1/models": _get("the served model", {
                "type": "object", "properties": {"object": {"const": "list"},
                                                 "data": {"type": "array"}},
                "required": ["object", "data"]}),
            "/v1/completions": _post("a completion of a prompt (or of each of a list)",
                                     P.COMPLETION_FIELDS, ("prompt",), _JSON_OBJECT, model,
                                     stream=True),
            "/v1/chat/completions": _post("the assistant's reply to a conversation",
                                          P.CHAT_FIELDS, ("messages",), _JSON_OBJECT,
                                          model, stream=True),
            "/v1/responses": _post("a response to input items (OpenAI's Responses API)",
                                   RESPONSES_FIELDS, ("input",), _RESPONSE, model,
                                   stream=True, shapes=_RESPONSES_SHAPES),
            "/v1/responses/{response_id}": {
                **_get("a stored response", _RESPONSE),
                "delete": {"summary": "deletes a stored response",
                           "responses": _responses(_JSON_OBJECT)},
                "parameters": [{"name": "response_id", "in": "path", "required": True,
                                "schema": {"type": "string"}}]},
            "/v1/messages": _post("the assistant's reply (Anthropic's Messages API)",
                                  MESSAGES_FIELDS, ("model", "max_tokens", "messages"),
                                  _MESSAGE, model, stream=True, shapes=_MESSAGES_SHAPES,
                                  error=_ANTHROPIC_ERROR),
            "/v1/messages/count_tokens": _post(
                "the prompt tokens of a Messages request", COUNT_FIELDS,
                ("model", "messages"), {"type": "object", "required": ["input_tokens"],
                                        "properties": {"input_tokens": {"type": "integer"}}},
                model, shapes=_MESSAGES_SHAPES, error=_ANTHROPIC_ERROR),
            "/v1/embeddings": _post("the embedding of an input (or of each of a list)",
                                    EMBEDDING_FIELDS, ("input",), {
                                        "type": "object", "required": ["data", "usage"],
                                        "properties": {"object": {"const": "list"},
                                                       "data": {"type": "array"},
                                                       "usage": {"type": "object"}}}, model),
            **{path: _post("a reranker's relevance scores of documents for a query, best "
                           "first (Jina's and Cohere's v1 shape)", RERANK_FIELDS,
                           ("query", "documents"), _RERANKED, model, shapes=_RERANK_SHAPES)
               for path in ("/v1/rerank", "/rerank")},
            "/v2/rerank": _post("a reranker's relevance scores of documents for a query, "
                                "best first (Cohere's v2 shape)", RERANK_FIELDS,
                                ("query", "documents"), _RERANKED, model,
                                shapes=_RERANK_V2_SHAPES),
            **{path: _post("a reranker's scores of text_1 against each of text_2 (vLLM's "
                           "score API)", SCORE_FIELDS, ("text_1", "text_2"), _SCORED, model,
                           shapes=_SCORE_SHAPES)
               for path in ("/v1/score", "/score")},
            "/v1/audio/transcriptions": _form_post(
                "speech to text (a Whisper model): the audio file's transcript",
                TRANSCRIPTION_FIELDS, model, stream=True),
            "/v1/audio/translations": _form_post(
                "speech to English text (a Whisper model)", TRANSLATION_FIELDS, model,
                stream=False),
            "/tokenize": _post("a prompt, or messages through the chat template, to token "
                               "ids", TOKENIZE_FIELDS, (), _JSON_OBJECT, model),
            "/detokenize": _post("token ids to text", DETOKENIZE_FIELDS, ("tokens",),
                                 _JSON_OBJECT, model),
        },
        "components": {"schemas": {"Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {
                "type": "object", "required": ["message", "type"],
                "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                               "param": {"type": ["string", "null"]},
                               "code": {"type": ["string", "integer", "null"]}}}}}}},
    }
