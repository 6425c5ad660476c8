"""llm_engine: the step loop: schedule, run, postprocess (stop conditions,
detokenization), and what each step emits per request."""
from __future__ import annotations

import time
from dataclasses import dataclass

from armllm.engine.block_manager import BlockManager
from armllm.engine.runner import ModelRunner
from armllm.engine.scheduler import Scheduler
from armllm.engine.sequence import Sequence
from armllm.model.llama import KVCache
from armllm.model.loader import LoadedModel
from armllm.model.tokenizer import IncrementalDetokenizer, TextTokenizer
from armllm.sampling import SampleResult, SamplingParams


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finish_reason: str | None


class LLMEngine:
    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int = 16,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, kv_dtype: str = "bf16"):
        c = loaded.config
        self.loaded = loaded
        self.tokenizer = TextTokenizer(loaded.tokenizer, loaded.tokenizer_config)
        self.max_model_len = min(max_model_len or c.max_position_embeddings,
                                 c.max_position_embeddings)
        self.blocks = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens,
                                   self.max_model_len)
        kv = KVCache(c, num_blocks, block_size, kv_dtype)
        self.runner = ModelRunner(loaded.model, kv, max_num_batched_tokens, max_num_seqs,
                                  self.max_model_len)
        gen_eos = loaded.generation_config.get("eos_token_id")  # an int or a list in the wild
        eos = set(c.eos_token_ids) | set([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
        eos_tok = self.tokenizer.token_id(self.tokenizer.eos_token)
        self.eos_token_ids = frozenset(eos | ({eos_tok} if eos_tok is not None else set()))
        self._seqs: dict[str, Sequence] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._pending_text: dict[str, str] = {}

    def add_request(self, request_id: str, prompt_ids: list[int],
                    params: SamplingParams) -> Sequence:
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab = self.loaded.config.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= int(t) < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        seq = Sequence(request_id, [int(t) for t in prompt_ids], params, self.eos_token_ids)
        self.scheduler.add(seq)
        self._seqs[request_id] = seq
        self._detok[request_id] = IncrementalDetokenizer(self.tokenizer, seq.prompt_ids,
                                                         params.skip_special_tokens)
        self._pending_text[request_id] = ""
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[StepOutput]:
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        return [self._postprocess(seq, sample) for seq, sample in self.runner.run(out)]

    def _postprocess(self, seq: Sequence, sample: SampleResult) -> StepOutput:
        now = time.monotonic()
        seq.output_ids.append(sample.token)
        seq.timings.token_times.append(now)
        if seq.timings.first_token is None:
            seq.timings.first_token = now
        if sample.logprob is not None:
            seq.logprobs.append((sample.token, sample.logprob, sample.top_logprobs))
        p = seq.params
        reason = None
        eos = not p.ignore_eos and sample.token in seq.eos_token_ids
        if sample.token in p.stop_token_ids or eos:
            reason = "stop"
        elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        # text not yet emitted; emitted text never holds a whole stop string
        pending = self._pending_text[seq.request_id]
        if reason is None or sample.token not in seq.eos_token_ids | set(p.stop_token_ids):
            pending += self._detok[seq.request_id].add(sample.token)
        full = seq.text + pending
        hits = [at for at in (full.find(stop, len(seq.text)) for stop in p.stop) if at >= 0]
        if hits:
            pending, reason = full[len(seq.text):min(hits)], "stop"
        # hold back what may be the start of a stop string until it is decided
        hold = max((len(stop) - 1 for stop in p.stop), default=0) if reason is None else 0
        delta = pending[:len(pending) - hold] if hold else pending
        seq.text += delta
        self._pending_text[seq.request_id] = pending[len(delta):]
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.runner.forget(seq)
            del self._detok[seq.request_id], self._pending_text[seq.request_id]
            self._seqs.pop(seq.request_id, None)
        return StepOutput(seq.request_id, [sample.token], delta, reason)
