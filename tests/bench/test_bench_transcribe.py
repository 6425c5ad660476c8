"""`armllm bench transcribe` on whisper-tiny.en: one quick run over 5 s of speech
reports every figure, positive and consistent with each other (no timed assertions);
bad input is one line and exit code 2."""
from __future__ import annotations

import json

import pytest

from armllm.cli import main
from tests import speech_clips
from tests.bench.test_offline_and_plan import one_line_error
from tests.tiny_model import write_tiny_llama
from tests.whisper_reference import tiny_en


def test_reports_real_time_factor_and_throughput(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "transcribe", str(tiny_en()), "--audio",
                 str(speech_clips.clip(4)), "--seconds", "5", "--concurrency", "2",
                 "--json", str(out)]) == 0
    r, text = json.loads(out.read_text()), capsys.readouterr().out
    assert r["audio_seconds"] == 5.0 and r["batched"] is False
    b, c = r["batch_1"], r["concurrent"]
    assert b["wall_s"] > 0 and b["segments"] >= 1 and b["text_chars"] > 0
    assert b["real_time_factor"] == pytest.approx(b["wall_s"] / 5.0)
    assert b["speed_x"] == pytest.approx(1 / b["real_time_factor"])
    assert c["copies"] == 2 and c["wall_s"] > 0
    assert c["audio_seconds_per_s"] == pytest.approx(2 * 5.0 / c["wall_s"])
    assert c["gain_over_batch_1"] == pytest.approx(c["audio_seconds_per_s"] / b["speed_x"])
    assert c["same_text_as_batch_1"] == 2
    m = r["memory"]
    assert 0 < m["encoder_bytes"] < m["weights_bytes"] and m["kv_cache_bytes"] > 0
    assert "real-time factor" in text and "audio seconds per second" in text


def test_bad_input_exits_2(tmp_path, capsys):
    model = str(tiny_en())
    with pytest.raises(SystemExit) as exit_:   # argparse: --audio is required
        main(["bench", "transcribe", model])
    assert exit_.value.code == 2 and "--audio" in capsys.readouterr().err
    text = tmp_path / "notes.txt"
    text.write_text("no audio here\n" * 20)
    assert "not a decodable audio file" in one_line_error(
        capsys, ["bench", "transcribe", model, "--audio", str(text)])
    assert "--concurrency must be >= 1" in one_line_error(
        capsys, ["bench", "transcribe", model, "--audio", str(text), "--concurrency", "0"])
    llama = write_tiny_llama(tmp_path / "llama")
    assert "not a speech-to-text model" in one_line_error(
        capsys, ["bench", "transcribe", str(llama), "--audio", str(speech_clips.clip(0))])
