"""audio: /v1/audio/transcriptions and /v1/audio/translations in OpenAI's shape, over
a Whisper model (AsyncLLM.transcribe_stream).

The body is multipart/form-data: `file` (required: any audio PyAV decodes), `model`,
`language` (transcriptions), `prompt`, `temperature` (one value, no fallback: 0 is
greedy; without it Whisper's fallback schedule 0, 0.2 ... 1.0), `response_format`
(json, text, srt, verbose_json, vtt), `timestamp_granularities[]` (segment, word:
verbose_json's "segments" and "words"; word asks for word timestamps, with
verbose_json alone, 400 otherwise) and `stream` (transcriptions: server-sent
transcript.text.delta events, one per segment, then transcript.text.done; OpenAI's
translations have no stream: 400). A translation on an English-only model
transcribes, as faster-whisper does (its audio is English already).

Limits: the body is read within --max-audio-mb (413 past it, as OpenAI answers an
upload over its size limit) and a deadline that grows with the upload's size; the
audio is decoded (in a worker thread) up to --max-audio-seconds (400 past it). Every
refusal is a 400 naming its field: no file, an empty or undecodable one (the decoder's
reason), a bad language, format or temperature, a model that is not Whisper.

A transcription counts in flight as one completion from admission (before its audio
is decoded) to the end of its response. It runs as a task that feeds its segments to
the response: the client going away cancels it, which aborts its engine requests, and
a shutdown past its grace period cancels it, which ends the response with an error."""
from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from armllm.api import AsyncLLM, EngineClosed, RequestRejected
from armllm.audio.decode import AudioError, load_audio
from armllm.audio.formats import MEDIA_TYPES, RESPONSE_FORMATS, render, stream_events
from armllm.audio.transcribe import Segment, TranscribeOptions, TranscriptionInfo
from armllm.server import protocol as P
from armllm.server.generation import ClientGone, EventStream, until_disconnected
from armllm.server.state import Admission, ServerState

log = logging.getLogger("armllm.server")

# the form's fields: name -> kind ("file", or protocol's kinds, read from text)
TRANSCRIPTION_FIELDS = {"file": "file", "model": "str", "language": "str", "prompt": "str",
                        "temperature": "num", "response_format": "str",
                        "timestamp_granularities[]": "list", "stream": "bool"}
TRANSLATION_FIELDS = {"file": "file", "model": "str", "prompt": "str", "temperature": "num",
                      "response_format": "str", "stream": "bool"}
GRANULARITIES = ("segment", "word")
MAX_TEMPERATURE = 1.0          # OpenAI's range for these routes
# an upload's deadline: the body deadline plus its bytes at this rate (2 Mbit/s), so a
# large file on a slow link arrives, and a stalled one does not hold the server
MIN_UPLOAD_BYTES_PER_S = 256 << 10
_FORM_FIELDS_MAX = 32          # parts in one form (a handful are known)
_FIELD_BYTES_MAX = 64 << 10    # one text field (a prompt is at most a few hundred tokens)


@dataclass
class AudioRequest:
    """A checked form: the upload's bytes and what to do with them."""
    audio: bytes
    options: TranscribeOptions
    response_format: str
    stream: bool
    granularities: tuple[str, ...] = ("segment",)


def routes(state: ServerState) -> list[Route]:
    async def transcriptions(request: Request) -> Response:
        return await _answer(state, request, "transcribe")

    async def translations(request: Request) -> Response:
        return await _answer(state, request, "translate")

    return [Route("/v1/audio/transcriptions", transcriptions, methods=["POST"]),
            Route("/v1/audio/translations", translations, methods=["POST"])]


async def _answer(state: ServerState, request: Request, task: str) -> Response:
    llm = state.ready_llm()
    fields = TRANSCRIPTION_FIELDS if task == "transcribe" else TRANSLATION_FIELDS
    endpoint = "/v1/audio/transcriptions" if task == "transcribe" else "/v1/audio/translations"
    form = await read_form(request, state.config.max_audio_bytes, state.config.body_timeout_s)
    try:
        req = await _checked(state, llm, form, fields, endpoint, task)
    finally:
        await form.close()
    state.check_capacity(llm, 1, 1)
    admission = state.admit(llm, 1)
    try:
        return await _transcribe(state, request, llm, req, task, admission)
    except BaseException:
        admission.release()
        raise


async def _transcribe(state: ServerState, request: Request, llm: AsyncLLM, req: AudioRequest,
                      task: str, admission: Admission) -> Response:
    """Decodes the audio, starts its transcription and answers (the admission ends with
    the response: here for JSON, with the event stream for stream=true)."""
    try:
        pcm = await until_disconnected(request, asyncio.to_thread(
            load_audio, req.audio, max_seconds=state.config.max_audio_seconds))
    except ClientGone:
        admission.release()
        return Response(status_code=499)
    except AudioError as exc:
        raise P.bad("file", str(exc), "invalid_audio") from None
    req.audio = b""   # the samples are all that is needed now
    run = Transcribing(state, llm, pcm, req.options)
    try:
        info = await until_disconnected(request, run.info())
        if req.stream:
            return EventStream(_events(state, run, info, task), admission,
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
        segments = await until_disconnected(request, run.rest())
    except ClientGone:
        run.stop()
        admission.release()
        return Response(status_code=499)
    except BaseException:
        run.stop()
        raise
    admission.release()
    state.metrics.observe_transcription(task, info.duration)
    body = render(req.response_format, segments, info, task, req.granularities)
    if isinstance(body, dict):
        return JSONResponse(body)
    return Response(body, media_type=MEDIA_TYPES[req.response_format])


async def _events(state: ServerState, run: Transcribing, info: TranscriptionInfo,
                  task: str) -> AsyncIterator[str]:
    """transcript.text.delta per segment with text, then transcript.text.done; an error
    on the way is the stream's last event (OpenAI's error object)."""
    try:
        async with aclosing(stream_events(run.segments())) as events:
            async for event in events:
                yield _sse(event)
        state.metrics.observe_transcription(task, info.duration)
    except P.APIError as exc:
        yield _sse(exc.body())
    except Exception as exc:  # a bug: the headers are sent, so the error goes in the stream
        log.exception("a transcription failed")
        yield _sse(P.APIError(f"internal error: {type(exc).__name__}: {exc}", 500).body())
    finally:
        run.stop()


def _sse(data: dict) -> str:
    return "data: " + json.dumps(data) + "\n\n"


# -- the form -------------------------------------------------------------------------------

async def read_form(request: Request, limit: int, timeout_s: float) -> FormData:
    """The request's multipart form, at most `limit` bytes (413 past it, checked on the
    declared length and again while reading), within timeout_s plus the time the
    upload takes at MIN_UPLOAD_BYTES_PER_S (408 past it)."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "multipart/form-data":
        raise P.APIError(f"Content-Type must be multipart/form-data (the audio file and the "
                         f"fields as a form), got {ctype or 'none'!r}",
                         code="invalid_content_type")
    too_big = P.APIError(f"the request body exceeds the upload limit of {limit} bytes "
                         f"({limit / 2**20:g} MiB: --max-audio-mb)", 413,
                         code="request_too_large")
    declared = request.headers.get("content-length")
    size = int(declared) if declared and declared.isdigit() else limit
    if size > limit:
        raise too_big

    async def limited() -> AsyncIterator[bytes]:
        read = 0
        async for chunk in request.stream():
            read += len(chunk)
            if read > limit:
                raise too_big
            yield chunk

    parser = MultiPartParser(request.headers, limited(), max_files=1,
                             max_fields=_FORM_FIELDS_MAX, max_part_size=_FIELD_BYTES_MAX)
    deadline = timeout_s + size / MIN_UPLOAD_BYTES_PER_S
    try:
        async with asyncio.timeout(deadline):
            return await parser.parse()
    except MultiPartException as exc:
        raise P.APIError(f"the multipart form cannot be read: {exc.message}",
                         code="invalid_multipart") from None
    except TimeoutError:
        raise P.APIError(f"the request body did not arrive within {deadline:.0f} s", 408,
                         code="request_timeout") from None


def _text_fields(form: FormData, fields: dict[str, str], endpoint: str) -> dict:
    """The form's known text fields with their values converted to their kinds; a
    400 naming a field of the wrong kind (a file where text belongs, text that is not a
    number); unknown fields are logged and ignored."""
    unknown = sorted({k for k in form if k not in fields})
    if unknown:
        log.warning("%s: ignoring unknown fields %s", endpoint, ", ".join(unknown))
    out = {}
    for name, kind in fields.items():
        values = form.getlist(name)
        if not values or kind == "file":
            continue
        if any(not isinstance(v, str) for v in values):
            raise P.bad(name, "must be a text field, got a file", "invalid_type")
        if kind == "list":
            out[name] = values
            continue
        if len(values) > 1:
            raise P.bad(name, f"is given {len(values)} times", "invalid_value")
        out[name] = _convert(name, kind, values[0])
    return out


def _convert(name: str, kind: str, value: str):
    if kind == "num":
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise P.bad(name, f"must be a number, got {value[:100]!r}", "invalid_type")
        return number
    if kind == "bool":
        if value.strip().lower() not in ("true", "false"):
            raise P.bad(name, f"must be true or false, got {value[:100]!r}", "invalid_type")
        return value.strip().lower() == "true"
    return value


async def _checked(state: ServerState, llm: AsyncLLM, form: FormData, fields: dict[str, str],
                   endpoint: str, task: str) -> AudioRequest:
    """The form as an AudioRequest, every field checked before any audio is decoded."""
    req = _text_fields(form, fields, endpoint)
    state.check_model(req)
    response_format = req.get("response_format", "json")
    if response_format not in RESPONSE_FORMATS:
        raise P.bad("response_format", f"must be one of {', '.join(RESPONSE_FORMATS)}, got "
                                       f"{response_format!r}")
    granularities = req.get("timestamp_granularities[]", [])
    for g in granularities:
        if g not in GRANULARITIES:
            raise P.bad("timestamp_granularities[]", f"must be segment or word, got {g!r}")
    stream = req.get("stream", False)
    words = "word" in granularities
    if words and (response_format != "verbose_json" or stream):
        raise P.APIError("timestamp_granularities[]: word timestamps come with "
                         "response_format=verbose_json (not streamed)", 400,
                         "timestamp_granularities[]", "unsupported_parameter")
    if stream and task == "translate":
        raise P.APIError("stream: translations are not streamed (as OpenAI's API); stream "
                         "a transcription, or ask without stream", 400, "stream",
                         "unsupported_parameter")
    temperature = req.get("temperature")
    if temperature is not None and not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise P.bad("temperature", f"must be in [0, {MAX_TEMPERATURE:g}], got {temperature:g}")
    kwargs = {} if temperature is None else {"temperature": temperature}
    options = TranscribeOptions(language=req.get("language") or None, task=task,
                                initial_prompt=req.get("prompt") or None,
                                word_timestamps=words, **kwargs)
    try:
        llm.check_transcription(options)
    except RequestRejected as exc:
        raise P.APIError(str(exc), 400, exc.field, "invalid_value") from None
    upload = form.get("file")
    if upload is None:
        raise P.bad("file", "is required: the audio file to transcribe",
                    "missing_required_parameter")
    if not isinstance(upload, UploadFile):
        raise P.bad("file", "must be a file upload (multipart part with a filename), got a "
                            "text field", "invalid_type")
    audio = await upload.read()
    if not audio:
        raise P.bad("file", f"the file {upload.filename!r} is empty (0 bytes)", "invalid_audio")
    return AudioRequest(audio, options, response_format, stream,
                        tuple(granularities) or ("segment",))


# -- the transcription as a task ------------------------------------------------------------

_END = object()


class Transcribing:
    """One request's transcription running as a task, which queues its info and then
    its segments as they are decoded. The task is registered in the server state while
    it runs, so that the shutdown can cancel it; cancelling it (stop(), the shutdown)
    aborts its engine requests. Errors reach the reader as APIErrors."""

    def __init__(self, state: ServerState, llm: AsyncLLM, pcm, options: TranscribeOptions):
        self.state = state
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run(llm, pcm, options))
        state.tasks.add(self._task)
        self._task.add_done_callback(state.tasks.discard)

    async def _run(self, llm: AsyncLLM, pcm, options: TranscribeOptions) -> None:
        try:
            info, segments = await llm.transcribe_stream(pcm, options)
            self._queue.put_nowait(info)
            async with aclosing(segments):
                async for segment in segments:
                    self._queue.put_nowait(segment)
            self._queue.put_nowait(_END)
        except asyncio.CancelledError:
            self._queue.put_nowait(_shutting_down() if self.state.stopping else _END)
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the reader
            self._queue.put_nowait(_api_error(exc))

    async def _next(self):
        item = await self._queue.get()
        if isinstance(item, P.APIError):
            raise item
        return item

    async def info(self) -> TranscriptionInfo:
        item = await self._next()
        if item is _END:   # stopped before it began
            raise _shutting_down()
        return item

    async def segments(self) -> AsyncIterator[Segment]:
        """The segments after info(), as they are decoded."""
        while (item := await self._next()) is not _END:
            yield item

    async def rest(self) -> list[Segment]:
        return [s async for s in self.segments()]

    def stop(self) -> None:
        self._task.cancel()


def _api_error(exc: Exception) -> P.APIError:
    """What a transcription's failure answers."""
    if isinstance(exc, EngineClosed):
        return P.APIError("the engine has stopped", 503, code="engine_stopped")
    if isinstance(exc, RequestRejected):
        return P.APIError(str(exc), 400, exc.field, "invalid_value")
    if isinstance(exc, ValueError):   # the audio or the options, refused by the library
        return P.APIError(str(exc), 400, "file", "invalid_value")
    log.error("a transcription failed", exc_info=exc)
    return P.APIError(f"transcription failed: {type(exc).__name__}: {exc}", 500,
                      code="generation_error")


def _shutting_down() -> P.APIError:
    return P.APIError("the server is shutting down; the transcription was stopped", 503,
                      code="server_shutting_down")
