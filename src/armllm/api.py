"""api: the embedded API: `LLM(model).generate(prompts, params)` and
`LLM.chat(messages, params)`, synchronous, on one engine."""
from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from armllm.engine.llm_engine import LLMEngine
from armllm.model.llama import KVCache
from armllm.model.loader import load_model
from armllm.sampling import SamplingParams

log = logging.getLogger("armllm")

DEFAULT_KV_FRACTION = 0.4  # of available memory after the weights, when kv_cache_gib is unset


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list | None = None
    metrics: dict = field(default_factory=dict)


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


class LLM:
    """A model loaded for in-process generation."""

    def __init__(self, model: str | Path, dtype: str = "auto", kv_cache_gib: float | None = None,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, block_size: int = 16,
                 kv_cache_dtype: str = "bf16", progress=None):
        weight_dtype = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "float32": "f32",
                        "f32": "f32"}.get(dtype)
        if weight_dtype is None:
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {dtype!r}")
        for name, value in (("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens),
                            ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.loaded = load_model(model, weight_dtype, progress)
        c = self.loaded.config
        model_len = min(max_model_len or c.max_position_embeddings, c.max_position_embeddings)
        per_block = KVCache.bytes_per_block(c, block_size, kv_cache_dtype)
        if kv_cache_gib is not None:
            if not kv_cache_gib > 0:
                raise ValueError(f"kv_cache_gib must be > 0, got {kv_cache_gib}")
            num_blocks = int(kv_cache_gib * 2**30 // per_block)
        else:  # enough for every sequence at full length, within a share of free memory
            want = max_num_seqs * -(-model_len // block_size)
            num_blocks = min(want, int(_available_bytes() * DEFAULT_KV_FRACTION // per_block))
        if num_blocks < 1:
            raise ValueError(f"the KV cache fits no block of {per_block} bytes")
        model_len = min(model_len, num_blocks * block_size)
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB), max_model_len %d, "
                 "%.1f sequences at full length", num_blocks, block_size,
                 num_blocks * per_block / 2**30, model_len,
                 num_blocks * block_size / model_len)
        self.engine = LLMEngine(self.loaded, num_blocks, block_size, max_num_seqs,
                                max_num_batched_tokens, model_len, kv_cache_dtype)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def default_sampling_params(self, **overrides) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (temperature,
        top_p, top_k, min_p, repetition_penalty; do_sample=false means greedy), then
        `overrides` (None values are ignored)."""
        gen = self.loaded.generation_config
        kw = {k: gen[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
              if gen.get(k) is not None}
        if gen.get("do_sample") is False:
            kw["temperature"] = 0.0
        try:
            defaults = SamplingParams(**kw)
        except ValueError as exc:
            raise ValueError(f"{self.loaded.path}: generation_config.json: {exc}") from None
        merged = {**defaults.__dict__, **{k: v for k, v in overrides.items() if v is not None}}
        return SamplingParams(**merged)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise ValueError(f"a prompt is a string or a list of token ids, got "
                         f"{type(prompt).__name__}")

    def generate(self, prompts, params: SamplingParams | None = None) -> list[RequestOutput]:
        """Runs every prompt (a string, token ids, or a list of either) to completion;
        without params, the model's generation_config.json defaults apply."""
        params = params or self.default_sampling_params()
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                              and all(isinstance(t, int) for t in prompts))
        batch = [prompts] if single else list(prompts)
        if not batch:
            raise ValueError("no prompts given")
        seqs = []
        for prompt in batch:
            seqs.append(self.engine.add_request(f"req-{next(self._ids)}",
                                                self._prompt_ids(prompt), params))
        while self.engine.has_unfinished():
            self.engine.step()
        return [self._output(seq) for seq in seqs]

    def stream(self, prompt, params: SamplingParams | None = None):
        """Runs one prompt, yielding each step's (new token ids, text delta, finish reason);
        the last item carries the finish reason. Returns the RequestOutput."""
        seq = self.engine.add_request(f"req-{next(self._ids)}", self._prompt_ids(prompt),
                                      params or self.default_sampling_params())
        while not seq.finished:
            for out in self.engine.step():
                if out.request_id == seq.request_id:
                    yield out
        return self._output(seq)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat(self, messages: list[dict], params: SamplingParams | None = None,
             add_generation_prompt: bool = True) -> RequestOutput:
        return self.generate(self.chat_prompt(messages, add_generation_prompt), params)[0]

    @staticmethod
    def _output(seq) -> RequestOutput:
        t = seq.timings
        metrics = {"arrival": t.arrival, "first_scheduled": t.first_scheduled,
                   "first_token": t.first_token, "finished": t.finished,
                   "ttft_s": (t.first_token - t.arrival) if t.first_token else None,
                   "tpot_s": ((t.token_times[-1] - t.token_times[0]) / (len(t.token_times) - 1)
                              if len(t.token_times) > 1 else None)}
        return RequestOutput(seq.request_id, seq.prompt_ids, seq.text, list(seq.output_ids),
                             seq.finish_reason, seq.logprobs or None, metrics)
