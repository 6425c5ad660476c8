"""`armllm transcribe` as a real subprocess on whisper-tiny.en (float32): an SRT file
per input whose cues equal faster-whisper's segments (texts, times within 0.1 s),
transcripts on stdout, the real-time factor on stderr; a missing file, undecodable
audio and a model that is not Whisper are one line on stderr and exit code 2."""
from __future__ import annotations

import json

from tests import speech_clips
from tests.test_cli import armllm
from tests.tiny_model import write_tiny_llama
from tests.whisper_reference import assert_same_segments, cues, reference, text_of, tiny_en

FLOAT32 = ("--dtype", "float32", "--kv-cache-dtype", "f32")


def test_srt_files_equal_faster_whisper(tmp_path):
    model = tiny_en()
    speech, short = speech_clips.long_clip(20), speech_clips.clip(5)
    out = tmp_path / "subtitles"
    r = armllm("transcribe", str(model), str(speech), str(short), "--temperature", "0",
               "--output-format", "srt", "--output-dir", str(out), *FLOAT32)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{speech.stem}.srt",
                                                            f"{short.stem}.srt"])
    for path in (speech, short):
        assert_same_segments(cues((out / f"{path.stem}.srt").read_text()), reference(path))
    assert "transcribed 2 files" in r.stderr and "real-time factor" in r.stderr


def test_transcripts_to_stdout(tmp_path):
    model = tiny_en()
    clip = speech_clips.clip(2)
    r = armllm("transcribe", str(model), str(clip), "--temperature", "0", *FLOAT32)
    assert r.returncode == 0, r.stderr
    assert r.stdout == text_of(reference(clip)) + "\n"
    r = armllm("transcribe", str(model), str(clip), "--temperature", "0",
               "--output-format", "verbose_json", "--task", "translate", *FLOAT32)
    body = json.loads(r.stdout)
    assert body["task"] == "translate" and body["text"] == text_of(reference(clip))


def one_line_error(*args: str) -> str:
    r = armllm("transcribe", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("armllm: error: "), r.stderr
    assert not any("Traceback" in line for line in lines), r.stderr
    return lines[-1]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    model, clip = tiny_en(), speech_clips.clip(0)
    missing = tmp_path / "nothing.wav"
    assert f"{missing}: no such file" in one_line_error(str(model), str(clip), str(missing))
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all\n" * 50)
    assert f"{text}: not a decodable audio file" in one_line_error(str(model), str(text))
    llama = write_tiny_llama(tmp_path / "llama")
    assert "not a speech-to-text model (Whisper)" in one_line_error(str(llama), str(clip))
    assert "not one of this model's languages" in one_line_error(
        str(model), str(clip), "--language", "de")
