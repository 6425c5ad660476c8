"""protocol: the OpenAI request bodies armllm accepts, checked field by field
where they enter, and the errors it answers with.

A body is read within a size limit and a deadline, and must be JSON nested at
most MAX_DEPTH levels whose strings are valid Unicode (no lone surrogates, which
the tokenizer cannot take). Each endpoint has a table of the fields it knows.
A known field of the wrong type or range is a 400 naming it; a known field
armllm cannot honour (echo, suffix, predicted outputs, ...) is a 400 saying
so rather than a silently wrong answer; an unknown field is ignored and logged."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from armllm.sampling import SamplingParams
from armllm.structured_output import StructuredOutput

log = logging.getLogger("armllm.server")

MAX_LOGPROBS = 20


class APIError(Exception):
    """An error answered with OpenAI's body: {"error": {message, type, param, code}}, or
    on Anthropic's routes with Anthropic's (anthropic_body)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.type = type or {400: "invalid_request_error", 401: "authentication_error",
                             404: "not_found_error", 408: "invalid_request_error",
                             413: "invalid_request_error",
                             503: "service_unavailable_error"}.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict:
        """The error in Anthropic's body (the /v1/messages routes):
        {"type": "error", "error": {"type", "message"}}."""
        kind = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def bad(param: str, message: str, code: str | None = "invalid_value") -> APIError:
    return APIError(f"{param}: {message}", 400, param, code)


def renamed(exc: APIError, names: dict[str, str]) -> APIError:
    """A chat error in another API's terms: each of `names`' keys in its parameter and
    message replaced by its value, in order (the Responses and Messages routes check
    their requests as chat requests)."""
    def rename(text: str) -> str:
        for chat_name, name in names.items():
            text = text.replace(chat_name, name)
        return text
    if exc.param is None:
        return exc
    return APIError(rename(exc.message), exc.status, rename(exc.param), exc.code, exc.type)


# -- the body -------------------------------------------------------------------------------

# OpenAI bodies nest a handful of levels; the bound keeps everything that later walks a
# body (error messages' repr, chat templates, json.dumps) far from Python's recursion limit
MAX_DEPTH = 64


async def read_body(request: Request, limit: int, timeout_s: float) -> Any:
    """The request's JSON body: at most `limit` bytes, received within `timeout_s`."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(f"Content-Type must be application/json, got {ctype or 'none'!r}",
                       code="invalid_content_type")
    declared = request.headers.get("content-length")
    too_big = APIError(f"the request body exceeds the limit of {limit} bytes", 400,
                       code="request_too_large")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(f"the request body did not arrive within {timeout_s:g} s", 408,
                       code="request_timeout") from None
    return parse_json(b"".join(chunks))


def parse_json(raw: bytes) -> Any:
    """A JSON document nested at most MAX_DEPTH levels, all of whose strings (keys
    included) are valid Unicode; a 400 naming where it is not."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise APIError(f"the request body is nested deeper than {MAX_DEPTH} levels",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(f"the request body is not valid JSON: {exc}",
                       code="invalid_json") from None
    _check_tree(body)
    return body


def _check_tree(body: Any) -> None:
    """Walks the document without recursion (it may be deep) and without building a
    path for every scalar (it may hold a million token ids)."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)] if isinstance(body, (dict, list)) \
        else []
    while stack:
        node, path, depth = stack.pop()
        if depth >= MAX_DEPTH:
            raise bad(_top(path), f"is nested deeper than {MAX_DEPTH} levels")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str) and not _valid_text(key):
                raise bad(_top(path) or "request", f"the field name {key!r} is not valid "
                                                   "Unicode (it holds a lone surrogate)")
            if isinstance(value, str):
                if not _valid_text(value):
                    raise bad(_join(path, key), "is not valid Unicode text (it holds a lone "
                                                "surrogate such as \\ud800)")
            elif isinstance(value, (dict, list)):
                stack.append((value, _join(path, key), depth + 1))


def _valid_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _top(path: str) -> str:
    """The top-level field a path starts in."""
    return path.split(".")[0].split("[")[0]


# -- field types ----------------------------------------------------------------------------

def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_CHECKS = {
    "int": (is_int, "an integer"),
    "num": (_num, "a number"),
    "bool": (lambda v: isinstance(v, bool), "a boolean"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "obj": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "an array"),
    "any": (lambda v: True, ""),
}

# fields both endpoints share: name -> type (None is always allowed: the default)
_SAMPLING_FIELDS = {
    "model": "str", "max_tokens": "int", "temperature": "num", "top_p": "num",
    "top_k": "int", "min_p": "num", "presence_penalty": "num", "frequency_penalty": "num",
    "repetition_penalty": "num", "seed": "int", "stop": "any", "stop_token_ids": "list",
    "ignore_eos": "bool", "n": "int", "stream": "bool", "stream_options": "obj",
    "user": "str", "skip_special_tokens": "bool", "priority": "int", "best_of": "int",
    "logit_bias": "obj", "metadata": "obj", "store": "bool", "service_tier": "str",
    "safety_identifier": "str", "prompt_cache_key": "str", "response_format": "obj",
    "structured_outputs": "obj",
    # llama.cpp's DRY and XTC, vLLM's bad_words (SamplingParams checks their values)
    "dry_multiplier": "num", "dry_base": "num", "dry_allowed_length": "int",
    "dry_penalty_last_n": "int", "dry_sequence_breakers": "list", "xtc_probability": "num",
    "xtc_threshold": "num", "bad_words": "list",
}
# the sampling fields beyond OpenAI's that every generating route takes (Responses and
# Messages as extensions)
EXTRA_SAMPLING = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                  "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "bad_words")
COMPLETION_FIELDS = {**_SAMPLING_FIELDS, "prompt": "any", "logprobs": "int", "echo": "bool",
                     "suffix": "str"}
CHAT_FIELDS = {**_SAMPLING_FIELDS, "messages": "list", "max_completion_tokens": "int",
               "logprobs": "bool", "top_logprobs": "int", "tools": "list",
               "tool_choice": "any", "functions": "list", "function_call": "any",
               "parallel_tool_calls": "bool",
               "add_generation_prompt": "bool", "continue_final_message": "bool",
               "chat_template_kwargs": "obj", "modalities": "list", "audio": "obj",
               "prediction": "obj", "reasoning_effort": "str", "web_search_options": "obj",
               "max_reasoning_tokens": "int"}
# reasoning_effort as a budget of reasoning tokens (None: the model's own, up to max_tokens);
# "none" also turns thinking off where the chat template can (enable_thinking=false)
REASONING_EFFORTS = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": None}


def check_fields(body: Any, fields: dict[str, str], endpoint: str) -> dict:
    """The body as a dict of known fields with the right types (None dropped)."""
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object", code="invalid_body")
    unknown = sorted(k for k in body if k not in fields)
    if unknown:
        log.warning("%s: ignoring unknown fields %s", endpoint, ", ".join(unknown))
    out = {}
    for name, kind in fields.items():
        value = body.get(name)
        if value is None:
            continue
        ok, what = _CHECKS[kind]
        if not ok(value):
            raise bad(name, f"must be {what}, got {type(value).__name__} {value!r}"[:300],
                      "invalid_type")
        out[name] = value
    return out


def refuse_unsupported(req: dict) -> None:
    """A 400 for known fields whose effect armllm does not implement."""
    def no(param: str, what: str) -> APIError:
        return APIError(f"{param}: {what} is not supported by this server", 400, param,
                        "unsupported_parameter")
    if req.get("echo"):
        raise no("echo", "echoing the prompt")
    if req.get("suffix"):
        raise no("suffix", "a suffix (fill in the middle)")
    if req.get("best_of") not in (None, req.get("n", 1)):
        raise no("best_of", "best_of other than n")
    mods = req.get("modalities")
    if mods and mods != ["text"]:
        raise no("modalities", "output other than text")
    if req.get("audio"):
        raise no("audio", "audio output")
    if req.get("prediction"):
        raise no("prediction", "predicted outputs")


# -- prompts --------------------------------------------------------------------------------

def completion_prompts(prompt: Any) -> list[str | list[int]]:
    """prompt: a string, a list of strings, token ids, or a list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(is_int(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in prompt):
            return list(prompt)
    raise bad("prompt", "must be a string, a non-empty list of strings, a list of token ids, "
                        "or a list of non-empty token-id lists")


_ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_messages(messages: Any) -> list[dict]:
    """Messages with string content (text parts joined), for the chat template; an
    assistant's tool_calls and a tool result's tool_call_id kept."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty array of messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with role and content")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{where}.role", f"must be one of {', '.join(_ROLES)}, got {role!r}")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" \
                        or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise APIError(f"{where}.content[{j}]: only text parts are supported, got "
                                   f"{kind!r}", 400, f"{where}.content", "unsupported_parameter")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise bad(f"{where}.content", "must be a string or an array of text parts")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise bad(f"{where}.tool_call_id", "must be the id of the call this answers")
            msg["tool_call_id"] = m["tool_call_id"]
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad(f"{where}.tool_calls", "only an assistant message has tool calls")
            msg["tool_calls"] = _tool_calls(where, m["tool_calls"])
        out.append(msg)
    return out


def _tool_calls(where: str, calls: Any) -> list[dict]:
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls", "must be an array of calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments", ""), str):
            raise bad(f"{where}.tool_calls[{j}]", 'must be {"id": ..., "type": "function", '
                                                  '"function": {"name": ..., "arguments": '
                                                  '"<JSON>"}}')
        out.append({"id": call.get("id") or "", "type": "function",
                    "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}})
    return out


# -- structured output ----------------------------------------------------------------------

def structured_output(req: dict) -> StructuredOutput | None:
    """What the output must match: OpenAI's response_format (text, json_object, or
    json_schema with its schema), or vLLM's structured_outputs (one of json, regex,
    choice, grammar, json_object); a 400 naming the field and the problem."""
    fmt, vllm = req.get("response_format"), req.get("structured_outputs")
    if fmt is not None and fmt.get("type", "text") != "text" and vllm:
        raise bad("structured_outputs", "cannot be combined with a response_format")
    if vllm:
        try:
            return StructuredOutput.coerce(vllm)
        except (ValueError, TypeError) as exc:
            raise bad("structured_outputs", str(exc).removeprefix("structured_output")
                      .lstrip(".: ") or str(exc)) from None
    if fmt is None:
        return None
    kind = fmt.get("type")
    try:
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutput(json_object=True)
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict):
                raise bad("response_format.json_schema", "must be an object with name and "
                                                         "schema")
            if not isinstance(spec.get("name"), str) or not spec["name"]:
                raise bad("response_format.json_schema.name", "must be a non-empty string")
            schema = spec.get("schema", True)
            if not isinstance(schema, dict):
                raise bad("response_format.json_schema.schema", "must be a JSON schema object")
            return StructuredOutput(json=schema or True)
    except ValueError as exc:
        raise bad("response_format", str(exc).removeprefix("structured_output.json")
                  .lstrip(": ")) from None
    raise bad("response_format.type", f"must be text, json_object or json_schema, got {kind!r}")


# -- sampling -------------------------------------------------------------------------------

def template_kwargs(req: dict) -> dict:
    """The chat template's variables: chat_template_kwargs, and reasoning_effort (which
    GPT-OSS's template reads; "none" also sets enable_thinking false, which Qwen's
    templates read) unless chat_template_kwargs sets them."""
    kwargs = dict(req.get("chat_template_kwargs") or {})
    effort = req.get("reasoning_effort")
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
        if effort == "none":
            kwargs.setdefault("enable_thinking", False)
    return kwargs


@dataclass
class Options:
    """What a request asks for beyond the prompt."""
    params: SamplingParams
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    logprobs: int | None       # top-k alternatives wanted (0: only the sampled token's)
    priority: int


def sampling_options(req: dict, chat: bool, default_params) -> Options:
    """SamplingParams from a checked request; default_params(**overrides) applies the
    model's generation_config defaults. Raises APIError naming the field."""
    max_tokens = req.get("max_completion_tokens", req.get("max_tokens")) if chat \
        else req.get("max_tokens")
    if max_tokens is not None and max_tokens < 1:
        param = "max_completion_tokens" if chat and "max_completion_tokens" in req \
            else "max_tokens"
        raise bad(param, f"must be >= 1, got {max_tokens}")
    stop = req.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and len(stop) <= 16
                                 and all(isinstance(s, str) and s for s in stop)):
        raise bad("stop", "must be a non-empty string or a list of at most 16 of them")
    if chat:
        top = req.get("top_logprobs")
        if top is not None and not req.get("logprobs"):
            raise bad("top_logprobs", "needs logprobs: true")
        logprobs = (top or 0) if req.get("logprobs") else None
        lp_param = "top_logprobs"
    else:
        logprobs, lp_param = req.get("logprobs"), "logprobs"
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise bad(lp_param, f"must be in [0, {MAX_LOGPROBS}], got {logprobs}")
    n = req.get("n", 1)
    if not 1 <= n <= 128:
        raise bad("n", f"must be in [1, 128], got {n}")
    stream_options = req.get("stream_options") or {}
    if stream_options and not req.get("stream"):
        raise bad("stream_options", "is only allowed with stream: true")
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad("stream_options.include_usage", "must be a boolean")
    overrides = {k: req.get(k) for k in ("temperature", "top_p", "top_k", "min_p",
                                         "presence_penalty", "frequency_penalty",
                                         "repetition_penalty", "seed", "stop_token_ids",
                                         "ignore_eos", "skip_special_tokens",
                                         "logit_bias", "max_reasoning_tokens",
                                         *EXTRA_SAMPLING)}
    effort = req.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad("reasoning_effort", f"must be one of {', '.join(REASONING_EFFORTS)}, "
                                          f"got {effort!r}")
        budget, given = REASONING_EFFORTS[effort], overrides["max_reasoning_tokens"]
        if budget is not None:
            overrides["max_reasoning_tokens"] = budget if given is None else min(given, budget)
    overrides.update(max_tokens=max_tokens or 1, stop=stop, n=n, logprobs=logprobs,
                     structured_output=structured_output(req))
    try:
        params = default_params(**overrides)
    except ValueError as exc:  # SamplingParams names the field first
        field = str(exc).split()[0]
        raise bad(field if field in overrides else "request", str(exc).split(" ", 1)[-1]
                  if field in overrides else str(exc)) from None
    return Options(params, max_tokens is not None, bool(req.get("stream")), include_usage,
                   logprobs, req.get("priority", 0))
