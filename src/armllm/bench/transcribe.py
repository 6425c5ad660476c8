"""`armllm bench transcribe`: speech-to-text speed of a Whisper model in-process, on
an audio file the user gives (armllm ships none, and synthesizing speech would need a
speech synthesizer at run time): greedy decoding (temperature 0, no fallback), so
every run decodes the same tokens.

batch 1: the clip alone, after one unmeasured warm-up transcription of its first
seconds: wall time, real-time factor (wall / audio seconds: below 1 is faster than
real time) and its inverse, the speed (audio seconds per wall second, "x real
time"). concurrent: --concurrency copies of the clip at once, their windows batched
by the engine: throughput in audio seconds per wall second, and its gain over batch 1.
--seconds cuts the clip (or repeats it) to a length, e.g. 60 s as Whisper benchmarks
often use."""
from __future__ import annotations

import argparse
import time

import numpy as np

from armllm.bench.offline import _memory, _print_setup, _setup, _write_json
from armllm.bench.rss import peak_rss_bytes
from armllm.cmdline import UsageError
from armllm.engine.args import SERVER_ONLY, EngineArgs
from armllm.transcribe_cli import load_transcriber

WARMUP_SECONDS = 5.0   # of the clip, transcribed once before timing


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a Whisper model: a Hugging Face directory, a CTranslate2 "
                   "directory (faster-whisper's), or a Hub name ORG/NAME")
    p.add_argument("--audio", required=True, metavar="FILE",
                   help="the speech to transcribe (required: armllm ships no audio), any "
                        "format ffmpeg decodes; e.g. a minute of speech")
    p.add_argument("--seconds", type=float, default=None, metavar="S",
                   help="use the clip's first S seconds, repeated if it is shorter "
                        "(default: the whole clip)")
    p.add_argument("--concurrency", type=int, default=8, metavar="N",
                   help="copies of the clip transcribed at once for the throughput figure "
                        "(default 8; --max-num-seqs bounds how many decode together)")
    p.add_argument("--language", default=None,
                   help="the clip's language (default: detected, English-only models: en)")
    p.add_argument("--batched", action="store_true",
                   help="decode every <=30 s chunk of a copy at once (throughput mode) "
                        "instead of Whisper's window after window")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    EngineArgs.add_cli_args(p, exclude=(*SERVER_ONLY, "speculative_config"))
    p.set_defaults(max_num_seqs=8)


def clip_samples(path: str, seconds: float | None) -> np.ndarray:
    """The clip's 16 kHz samples, cut or repeated to `seconds`."""
    from armllm.audio.decode import SAMPLE_RATE, AudioError, load_audio
    try:
        pcm = load_audio(path)
    except AudioError as exc:
        raise UsageError(f"--audio {path}: {exc}") from None
    if seconds is not None:
        n = int(seconds * SAMPLE_RATE)
        pcm = np.resize(pcm, n) if n > len(pcm) else pcm[:n]
    return np.ascontiguousarray(pcm, np.float32)


def run(args: argparse.Namespace) -> int:
    from armllm.audio.decode import SAMPLE_RATE
    from armllm.audio.transcribe import TranscribeOptions
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.seconds is not None and not args.seconds > 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    pcm = clip_samples(args.audio, args.seconds)
    audio_s = len(pcm) / SAMPLE_RATE
    try:
        options = TranscribeOptions(language=args.language, temperature=0.0)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    llm = load_transcriber(args, options)
    load_peak = peak_rss_bytes()

    def timed(copies: int) -> tuple[float, list]:
        t0 = time.perf_counter()
        results = llm.transcribe([pcm] * copies, options, batched=args.batched)
        return time.perf_counter() - t0, results

    llm.transcribe(pcm[:int(WARMUP_SECONDS * SAMPLE_RATE)], options, batched=args.batched)
    wall_1, (alone,) = timed(1)
    wall_n, together = timed(args.concurrency)
    result = {
        **_setup(llm, args), "audio": args.audio, "audio_seconds": audio_s,
        "batched": args.batched,
        "batch_1": {"wall_s": wall_1, "real_time_factor": wall_1 / audio_s,
                    "speed_x": audio_s / wall_1, "segments": len(alone.segments),
                    "text_chars": len(alone.text)},
        "concurrent": {"copies": args.concurrency, "wall_s": wall_n,
                       "audio_seconds_per_s": args.concurrency * audio_s / wall_n,
                       "gain_over_batch_1": args.concurrency * wall_1 / wall_n,
                       "same_text_as_batch_1": sum(r.text == alone.text for r in together)},
        "memory": {**_memory(llm, args, load_peak),
                   "encoder_bytes": llm.loaded.model.weights.encoder_nbytes},
    }
    _print(result)
    _write_json(args.json, result)
    return 0


def _print(r: dict) -> None:
    _print_setup("transcribe", r)
    b, c = r["batch_1"], r["concurrent"]
    mode = "batched chunks" if r["batched"] else "long-form, window after window"
    print(f"workload: {r['audio']}, {r['audio_seconds']:.1f} s of audio, greedy "
          f"(temperature 0), {mode}; one warm-up transcription first")
    print(f"batch 1:    {b['wall_s']:.2f} s: real-time factor {b['real_time_factor']:.3f}, "
          f"{b['speed_x']:.1f}x real time ({b['segments']} segments)")
    print(f"concurrent: {c['copies']} copies in {c['wall_s']:.2f} s: "
          f"{c['audio_seconds_per_s']:.1f} audio seconds per second, "
          f"{c['gain_over_batch_1']:.2f}x batch 1's throughput "
          f"({c['same_text_as_batch_1']}/{c['copies']} with batch 1's text)")
    gib = 2.0 ** 30
    m = r["memory"]
    print(f"memory: peak RSS while loading {m['load_peak_rss_bytes'] / gib:.2f} GiB (weights "
          f"{m['weights_bytes'] / gib:.2f} GiB, of which the encoder "
          f"{m['encoder_bytes'] / gib:.2f}; KV cache and cross-attention pool "
          f"{m['kv_cache_bytes'] / gib:.2f} GiB)")
