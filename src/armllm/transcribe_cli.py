"""`armllm transcribe MODEL FILE...`: speech to text with a Whisper model from the
command line. Every file is decoded first (a missing or undecodable one stops the
command before the model loads), then all are transcribed together, their windows
batched by the engine (LLM.transcribe), with a progress bar on stderr (on a
terminal) and the real-time factor at the end. Each transcript goes to stdout, or
with --output-dir into DIR/<file name>.<format's extension>. The engine loads when
the command runs (see cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from armllm.cmdline import UsageError, progress_bar
from armllm.engine.args import SERVER_ONLY, EngineArgs

# --output-format -> (audio/formats.py's response format, file extension)
OUTPUT_FORMATS = {"txt": ("text", "txt"), "srt": ("srt", "srt"), "vtt": ("vtt", "vtt"),
                  "json": ("json", "json"), "verbose_json": ("verbose_json", "json")}
# transcriptions in flight at once: the cross-attention pool holds a window per sequence
DEFAULT_MAX_NUM_SEQS = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a Whisper model: a Hugging Face directory "
                   "(WhisperForConditionalGeneration safetensors), a CTranslate2 directory "
                   "as faster-whisper keeps them (model.bin), or a Hub name ORG/NAME")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="audio files: anything ffmpeg decodes (wav, flac, mp3, ogg, webm, "
                        "m4a, ...)")
    p.add_argument("--language", default=None,
                   help="the spoken language, a code (en) or name (english) (default: "
                        "detected from the first 30 s of each file)")
    p.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                   help="translate: into English (default: transcribe)")
    p.add_argument("--temperature", type=float, default=None,
                   help="one temperature, no fallback (0: greedy) (default: Whisper's fallback "
                        "schedule 0, 0.2, ... 1.0)")
    p.add_argument("--prompt", default=None,
                   help="text before the first window's: spellings, names, style")
    p.add_argument("--output-format", default="txt", choices=list(OUTPUT_FORMATS),
                   help="txt, srt, vtt, json ({\"text\": ...}) or verbose_json (segments "
                        "with times) (default: txt)")
    p.add_argument("--word-timestamps", action="store_true",
                   help="each word's start and end too: json and verbose_json output carry "
                        "\"words\" [{word, start, end}] (long-form decoding only)")
    p.add_argument("--output-dir", default=None, metavar="DIR",
                   help="write each transcript to DIR/<file name>.<extension> instead of "
                        "stdout")
    p.add_argument("--batched", action="store_true",
                   help="decode every <=30 s chunk of a file at once, none conditioned on the "
                        "text before (faster on many cores; Whisper's own long-form decoding "
                        "goes window after window)")
    p.add_argument("--max-audio-seconds", type=float, default=None, metavar="S",
                   help="refuse a file longer than this (default: no limit)")
    EngineArgs.add_cli_args(p, exclude=(*SERVER_ONLY, "speculative_config"))
    p.set_defaults(func=run, max_num_seqs=DEFAULT_MAX_NUM_SEQS)


def run(args: argparse.Namespace) -> int:
    from armllm.audio.decode import SAMPLE_RATE, AudioError, load_audio
    from armllm.audio.formats import render, word_json
    from armllm.audio.transcribe import TranscribeOptions

    files = [Path(f) for f in args.files]
    for f in files:
        if not f.is_file():
            raise UsageError(f"{f}: no such file")
    if args.max_audio_seconds is not None and not args.max_audio_seconds > 0:
        raise UsageError(f"--max-audio-seconds must be > 0, got {args.max_audio_seconds}")
    if args.temperature is not None and not 0 <= args.temperature <= 1:
        raise UsageError(f"--temperature must be in [0, 1], got {args.temperature}")
    fmt, extension = OUTPUT_FORMATS[args.output_format]
    outputs = _output_paths(files, args.output_dir, extension)
    try:
        options = TranscribeOptions(
            language=args.language, task=args.task, initial_prompt=args.prompt,
            word_timestamps=args.word_timestamps,
            **({} if args.temperature is None else {"temperature": args.temperature}))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    pcms = []
    for f in files:
        try:
            pcms.append(load_audio(f, max_seconds=args.max_audio_seconds))
        except AudioError as exc:
            raise UsageError(f"{f}: {exc}") from None

    llm = load_transcriber(args, options)
    durations = [len(p) / SAMPLE_RATE for p in pcms]
    progress = _Progress(durations)
    t0 = time.perf_counter()
    try:
        results = llm.transcribe(pcms, options, batched=args.batched,
                                 on_segment=progress.segment)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    wall = time.perf_counter() - t0
    progress.finish()
    for f, out, result in zip(files, outputs, results, strict=True):
        granularities = ("segment", "word") if args.word_timestamps else ("segment",)
        body = render(fmt, result.segments, result.info, args.task, granularities)
        if args.word_timestamps and fmt == "json":
            body["words"] = [word_json(w) for s in result.segments for w in s.words or ()]
        text = json.dumps(body, ensure_ascii=False) + "\n" if isinstance(body, dict) else body
        if out is not None:
            out.write_text(text, encoding="utf-8")
        else:
            if len(files) > 1:
                print(f"==> {f} <==")
            sys.stdout.write(text)
    audio = sum(durations)
    written = f", written to {args.output_dir}" if args.output_dir else ""
    print(f"transcribed {len(files)} file{'s' if len(files) > 1 else ''}{written}: "
          f"{audio:.1f} s of audio in {wall:.1f} s: real-time factor {wall / audio:.3f} "
          f"({audio / wall:.1f}x real time)", file=sys.stderr)
    return 0


def _output_paths(files: list[Path], output_dir: str | None, extension: str
                  ) -> list[Path | None]:
    """Where each transcript goes (None: stdout); a UsageError for two files that would
    overwrite each other's."""
    if output_dir is None:
        return [None] * len(files)
    directory = Path(output_dir)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--output-dir {directory}: not a directory")
    paths = [directory / f"{f.stem}.{extension}" for f in files]
    seen: dict[Path, Path] = {}
    for f, out in zip(files, paths, strict=True):
        if out in seen:
            raise UsageError(f"{seen[out]} and {f} would both be written to {out}")
        seen[out] = f
    directory.mkdir(parents=True, exist_ok=True)
    return paths


class _Progress:
    """A bar on stderr (on a terminal) of the audio transcribed so far: each file's
    latest segment end over all files' duration."""

    def __init__(self, durations: list[float]):
        self.durations = durations
        self.done = [0.0] * len(durations)
        self.tty = sys.stderr.isatty()
        self.total = sum(durations)

    def segment(self, i: int, segment, info) -> None:
        self.done[i] = min(max(self.done[i], segment.end), self.durations[i])
        if self.tty:
            seconds = sum(self.done)
            print(f"\r{progress_bar(seconds, self.total)} {seconds:.0f}/{self.total:.0f} s of "
                  "audio", end="", file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.tty:
            print(f"\r{progress_bar(1, 1)} {self.total:.0f}/{self.total:.0f} s of audio",
                  file=sys.stderr)


def load_transcriber(args, options):
    """The engine (armllm.generate_cli.load_llm) for a Whisper model that runs `options`;
    a UsageError for a model that is not Whisper, or a language it does not know."""
    from armllm.generate_cli import load_llm

    def check(llm) -> None:
        try:
            llm.check_transcription(options)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return load_llm(args, check)
