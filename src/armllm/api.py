"""api: the embedded APIs over one LLMEngine.

`LLM(model).generate(prompts, params)` runs synchronously in the caller's
thread; `AsyncLLM(model)` puts the engine on its own thread and gives each
request an async iterator of incremental outputs (cancelling the consuming
task aborts the request). AsyncLLM reaches its engine only through an
EngineClient (engine/client.py): the engine thread or, data parallel, the
router over the replicas. Both take the fields of EngineArgs as keywords and
answer what a caller must know before sending a request: the model's limits
(max_model_len, max_num_seqs, vocab_size) and check_request, which refuses a
request that could never be served, whatever the load."""
from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from armllm.audio.service import (
    Transcription,
    check_options,
    transcribe_stream,
)
from armllm.audio.transcribe import Segment, TranscribeOptions, TranscriptionInfo
from armllm.engine.client import EngineClient
from armllm.engine.data_parallel import ReplicaRouter, start_replicas
from armllm.engine.embedding import PoolingParams
from armllm.engine.engine_thread import EngineClosed, EngineThread
from armllm.engine.llm_engine import ContextLengthExceeded, RequestRejected
from armllm.engine.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EngineStats,
    OutputCollector,
    RequestOutput,
    ScoreOutput,
    StepOutput,
    embedding_result,
    score_result,
)
from armllm.engine.setup import EngineArgs, build_engine
from armllm.model.loader import model_path
from armllm.model.score_head import score_prompt
from armllm.sampling import FALLBACK_DEFAULTS, SamplingParams, model_sampling_defaults

__all__ = ["LLM", "AsyncLLM", "RequestOutput", "CompletionOutput", "EmbeddingOutput",
           "ScoreOutput", "EngineArgs", "RequestRejected", "ContextLengthExceeded", "EngineClosed",
           "TranscribeOptions", "Transcription"]

Prompt = str | list[int]


class _LLMBase:
    """What LLM and AsyncLLM share: the engine, prompts, defaults, chat, and what
    the model is (its limits, whether it speaks harmony)."""

    def __init__(self, model: str | Path, progress=None, **engine_args):
        args = EngineArgs(**engine_args)
        # a Hub name (ORG/NAME...) becomes a local path here, once, before any replica
        # or tensor-parallel rank starts: they all load that path
        model = model_path(model)
        self._replicas = []   # data-parallel replicas 1.. (AsyncLLM)
        if args.data_parallel_size > 1:
            if not isinstance(self, AsyncLLM):
                raise ValueError(f"data_parallel_size={args.data_parallel_size}: replicas "
                                 "serve concurrent requests; use AsyncLLM (armllm serve)")
            args, self._replicas = start_replicas(model, args)
        try:
            self.engine = build_engine(model, args, progress)
            for replica in self._replicas:
                replica.wait_ready()
        except BaseException:
            for replica in self._replicas:
                replica.shutdown()
            if hasattr(self, "engine"):
                self.engine.close()
            raise
        self.block_size = args.block_size
        self.loaded = self.engine.loaded
        self.tokenizer = self.engine.tokenizer
        # GPT-OSS: the output is in harmony channels, its tool calls and reasoning too
        self.speaks_harmony = self.engine.harmony is not None

    def default_sampling_params(self, **overrides) -> SamplingParams:
        """SamplingParams with the model's own defaults (generation_config.json, or a
        GGUF's general.sampling.* keys: temperature, top_p, top_k, min_p,
        repetition_penalty; do_sample=false means greedy) or, for a model that sets
        none of them, FALLBACK_DEFAULTS; then `overrides` (None values are ignored)."""
        kw = model_sampling_defaults(self.loaded.generation_config)
        try:
            defaults = SamplingParams(**(kw or FALLBACK_DEFAULTS))
        except ValueError as exc:
            raise ValueError(f"{self.loaded.path}: the model's sampling defaults: {exc}") \
                from None
        merged = {**defaults.__dict__, **{k: v for k, v in overrides.items() if v is not None}}
        return SamplingParams(**merged)

    @staticmethod
    def _prompt_list(prompts) -> list[Prompt]:
        """One prompt (a string or token ids) as a list of one; a list of them as is."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                              and all(isinstance(t, int) for t in prompts))
        batch = [prompts] if single else list(prompts)
        if not batch:
            raise ValueError("no prompts given")
        return batch

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in prompt):
            return list(prompt)
        raise ValueError(f"a prompt is a string or a list of token ids, got "
                         f"{type(prompt).__name__}")

    @property
    def is_reranker(self) -> bool:
        """The model scores query-document pairs (score, /v1/rerank): a cross-encoder or
        reranker checkpoint (model/score_head.py)."""
        return self.loaded.score_head is not None

    def score_prompt(self, query: str, document: str) -> list[int]:
        """The token ids the reranker scores a query and a document with: its score
        template's text (a GGUF's, or --score-template), else the tokenizer's pair
        encoding."""
        for name, text in (("query", query), ("document", document)):
            if not isinstance(text, str):
                raise ValueError(f"a {name} is a string, got {type(text).__name__}")
        return score_prompt(self.tokenizer, self.loaded.score_template, query, document)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                    **template_kwargs) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template;
        template_kwargs are its extra variables (tools=[...], enable_thinking=False)."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt,
                                                  **template_kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def max_model_len(self) -> int:
        """Tokens one sequence may hold, prompt and output together (at most what the
        KV cache holds)."""
        return self.engine.max_model_len

    @property
    def max_num_seqs(self) -> int:
        """Sequences (completions) the engine runs at once; more wait their turn."""
        return self.engine.scheduler.max_num_seqs

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1."""
        return self.loaded.config.vocab_size

    def check_request(self, prompt_ids: list[int], params: SamplingParams | PoolingParams,
                      encoder_input=None) -> None:
        """Raises RequestRejected (a ValueError naming the value and, in `field`, what
        to change) if this request could never be served, whatever the load (see
        LLMEngine.check_request). Reads only the engine's fixed limits, so any thread
        may call it."""
        self.engine.check_request(prompt_ids, params, encoder_input)

    @property
    def transcribes_speech(self) -> bool:
        """Whether the model is a speech-to-text encoder-decoder (Whisper): it serves
        transcribe(); check_request refuses text requests."""
        return self.loaded.config.encoder is not None

    def check_transcription(self, options: TranscribeOptions | None = None) -> None:
        """Raises RequestRejected, naming in `field` what to change, if a transcription
        with these options could never run: "model" when the model is not Whisper,
        "language" for a language it does not know."""
        check_options(self.loaded, options)

class LLM(_LLMBase):
    """A model loaded for in-process, synchronous generation."""

    def __init__(self, model: str | Path, progress=None, **engine_args):
        super().__init__(model, progress, **engine_args)
        self._ids = itertools.count()

    def generate(self, prompts, params: SamplingParams | None = None,
                 priority: int = 0) -> list[RequestOutput]:
        """Runs every prompt (a string, token ids, or a list of either) to completion;
        without params, the model's generation_config.json defaults apply. Every
        prompt is checked before any runs."""
        params = params or self.default_sampling_params()
        ids = [self.prompt_ids(p) for p in self._prompt_list(prompts)]
        for p in ids:
            self.check_request(p, params)
        collectors = {}
        for p in ids:
            rid = f"req-{next(self._ids)}"
            self.engine.add_request(rid, p, params, priority)
            collectors[rid] = OutputCollector(rid, p, params.n, params.logprobs is not None)
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id in collectors:
                    collectors[out.request_id].add(out)
        return [c.output for c in collectors.values()]

    def embed(self, prompts, dimensions: int | None = None,
              priority: int = 0) -> list[EmbeddingOutput]:
        """The embedding of every prompt (a string, token ids, or a list of either),
        pooled as the model's pooling config says (model/pooling.py), truncated to
        `dimensions` where the model allows it. The prompts run batched through the
        engine; every one is checked before any runs."""
        ids = [self.prompt_ids(p) for p in self._prompt_list(prompts)]
        outs = self._pool_all(ids, PoolingParams(dimensions), priority)
        return [embedding_result(p, out) for p, out in zip(ids, outs, strict=True)]

    def score(self, query: str, documents: str | list[str], priority: int = 0
              ) -> list[ScoreOutput]:
        """A reranker's relevance score, in (0, 1), of each document (a string or a
        list of them) for the query, in the documents' order. The pairs run batched
        through the engine (the query's shared prefix from the prefix cache); every one
        is checked before any runs."""
        docs = [documents] if isinstance(documents, str) else list(documents)
        if not docs:
            raise ValueError("no documents given")
        ids = [self.score_prompt(query, d) for d in docs]
        outs = self._pool_all(ids, PoolingParams(task="score"), priority)
        return [score_result(p, out) for p, out in zip(ids, outs, strict=True)]

    def _pool_all(self, ids: list[list[int]], params: PoolingParams, priority: int
                  ) -> list[StepOutput]:
        """Each prompt's one StepOutput of a pooling request (embed, score), every
        prompt checked before any runs."""
        for p in ids:
            self.check_request(p, params)
        done: dict[str, StepOutput | None] = {}
        for p in ids:
            rid = f"req-{next(self._ids)}"
            self.engine.add_request(rid, p, params, priority)
            done[rid] = None
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id in done:
                    done[out.request_id] = out
        return list(done.values())

    def stream(self, prompt: Prompt, params: SamplingParams | None = None
               ) -> Iterator[StepOutput]:
        """Runs one prompt, yielding each step's StepOutput (new token ids, text delta,
        finish reason); the generator's return value is the RequestOutput. Closing the
        generator early aborts the request."""
        params = params or self.default_sampling_params()
        rid = f"req-{next(self._ids)}"
        ids = self.prompt_ids(prompt)
        self.check_request(ids, params)
        self.engine.add_request(rid, ids, params)
        collector = OutputCollector(rid, ids, params.n, params.logprobs is not None)
        try:
            while not collector.output.finished:
                for out in self.engine.step():
                    if out.request_id == rid:
                        collector.add(out)
                        yield out
        finally:
            if not collector.output.finished:
                self.engine.abort(rid)
                while self.engine.has_unfinished() and not collector.output.finished:
                    for out in self.engine.step():
                        if out.request_id == rid:
                            collector.add(out)
        return collector.output

    def chat(self, messages: list[dict], params: SamplingParams | None = None,
             add_generation_prompt: bool = True, **template_kwargs) -> RequestOutput:
        return self.generate(self.chat_prompt(messages, add_generation_prompt,
                                              **template_kwargs), params)[0]

    def transcribe(self, audio, options: TranscribeOptions | None = None, *,
                   batched: bool = False, max_seconds: float | None = None,
                   on_segment: Callable[[int, Segment, TranscriptionInfo], None] | None = None
                   ) -> Transcription | list[Transcription]:
        """Speech to text with a Whisper model: audio is a file's path or bytes, or 16 kHz
        mono float samples, or a list of them, transcribed together (their windows
        batched by the engine); the result one Transcription each (info, segments,
        text). options: TranscribeOptions (language, task, temperature, prompts, ...);
        batched: every ≤30 s chunk at once, none conditioned on the text before
        (throughput); on_segment(i, segment, info) is called as each segment of audio
        i is decoded (progress). Raises ValueError for bad audio or options before
        anything runs."""
        many = isinstance(audio, list)
        files = audio if many else [audio]
        self.check_transcription(options)
        stepper = _EngineStepper(self.engine, self._ids)

        async def one(i: int, a) -> Transcription:
            info, segments = await transcribe_stream(stepper.generate, self.loaded, a, options,
                                                     batched=batched, max_seconds=max_seconds)
            result = Transcription(info)
            async for segment in segments:
                result.segments.append(segment)
                if on_segment is not None:
                    on_segment(i, segment, info)
            return result

        async def run() -> list[Transcription]:
            return await stepper.drive(asyncio.gather(*(one(i, a)
                                                        for i, a in enumerate(files))))

        results = asyncio.run(run())
        return results if many else results[0]

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def shutdown(self) -> None:
        """Stops the engine's rank processes (tensor parallel; otherwise nothing to
        stop); the LLM is unusable afterwards."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


class AsyncLLM(_LLMBase):
    """A model served from its own engine thread to asyncio code:

        llm = AsyncLLM(model)
        async for out in llm.generate("Hello", params):
            print(out.outputs[0].text_delta, end="")

    Every call is safe from the event loop's thread; the engine itself is touched
    only by the engine thread."""

    def __init__(self, model: str | Path, progress=None, **engine_args):
        super().__init__(model, progress, **engine_args)
        local = EngineThread(self.engine)
        self._router = ReplicaRouter([local, *self._replicas], self.block_size) \
            if self._replicas else None
        self._client: EngineClient = self._router or local

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0,
                       encoder_input=None) -> AsyncIterator[RequestOutput]:
        """Yields the request's RequestOutput after every step that changed it
        (cumulative text and ids, with this step's part in the *_delta/new_* fields);
        the last one has finished=True. Raises ValueError (RequestRejected: see
        check_request) for a bad request before anything is queued, EngineClosed
        after shutdown. Closing the iterator early, or cancelling the task consuming
        it, aborts the request. encoder_input: an encoder-decoder's (Whisper's) one
        window of log-mel features [n_mels, frames] (armllm.audio)."""
        params = params or self.default_sampling_params()
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        ids = self.prompt_ids(prompt)
        self.check_request(ids, params, encoder_input)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[StepOutput] = asyncio.Queue()

        def sink(out: StepOutput) -> None:  # on the engine thread
            loop.call_soon_threadsafe(inbox.put_nowait, out)

        collector = OutputCollector(request_id, ids, params.n, params.logprobs is not None)
        try:
            await asyncio.wrap_future(self._client.add(request_id, ids, params, sink,
                                                       priority, encoder_input))
        except asyncio.CancelledError:  # the engine may have taken it already
            self._client.abort(request_id)
            raise
        try:
            while not collector.output.finished:
                yield collector.add(await inbox.get())
        finally:
            if not collector.output.finished:  # the consumer stopped or was cancelled
                self._client.abort(request_id)

    async def embed(self, prompt: Prompt, dimensions: int | None = None,
                    request_id: str | None = None, priority: int = 0) -> EmbeddingOutput:
        """The prompt's embedding (see LLM.embed), batched with whatever else the engine
        runs. Raises ValueError (RequestRejected) for a bad request before anything is
        queued; cancelling the awaiting task aborts the request."""
        params = PoolingParams(dimensions)
        request_id = request_id or f"embd-{uuid.uuid4().hex}"
        ids = self.prompt_ids(prompt)
        self.check_request(ids, params)
        return embedding_result(ids, await self._pooled(request_id, ids, params, priority))

    async def score(self, query: str, document: str, request_id: str | None = None,
                    priority: int = 0) -> ScoreOutput:
        """The reranker's relevance score of the document for the query (see
        LLM.score), batched with whatever else the engine runs. Raises ValueError
        (RequestRejected) for a bad request before anything is queued; cancelling the
        awaiting task aborts the request."""
        return await self.score_ids(self.score_prompt(query, document), request_id, priority)

    async def score_ids(self, ids: list[int], request_id: str | None = None,
                        priority: int = 0) -> ScoreOutput:
        """The reranker's score of a prompt already made (score_prompt)."""
        params = PoolingParams(task="score")
        request_id = request_id or f"score-{uuid.uuid4().hex}"
        self.check_request(ids, params)
        return score_result(ids, await self._pooled(request_id, ids, params, priority))

    async def _pooled(self, request_id: str, ids: list[int], params: PoolingParams,
                      priority: int) -> StepOutput:
        """A pooling request's one StepOutput (embed, score_ids)."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[StepOutput] = loop.create_future()

        def sink(out: StepOutput) -> None:  # on the engine thread
            loop.call_soon_threadsafe(lambda: result.done() or result.set_result(out))

        try:
            await asyncio.wrap_future(self._client.add(request_id, ids, params, sink,
                                                       priority))
            return await result
        except asyncio.CancelledError:
            self._client.abort(request_id)
            raise

    async def transcribe(self, audio, options: TranscribeOptions | None = None, *,
                         batched: bool = False, max_seconds: float | None = None,
                         priority: int = 0) -> Transcription:
        """One audio's transcription (see LLM.transcribe), its windows batched with
        whatever else the engine runs."""
        info, segments = await self.transcribe_stream(audio, options, batched=batched,
                                                      max_seconds=max_seconds,
                                                      priority=priority)
        return Transcription(info, [s async for s in segments])

    async def transcribe_stream(self, audio, options: TranscribeOptions | None = None, *,
                                batched: bool = False, max_seconds: float | None = None,
                                priority: int = 0
                                ) -> tuple[TranscriptionInfo, AsyncIterator[Segment]]:
        """The info (language, duration) and the segments of one audio as they are
        decoded. Raises ValueError for bad audio or options before anything runs."""
        self.check_transcription(options)
        return await transcribe_stream(self.generate, self.loaded, audio, options,
                                       batched=batched, max_seconds=max_seconds,
                                       priority=priority)

    def check_transcription(self, options: TranscribeOptions | None = None) -> None:
        """LLM's check, and a data-parallel AsyncLLM refuses every transcription (field
        "model"): Whisper's rules run as logits processors in this process."""
        if self._router is not None:
            raise RequestRejected("transcription runs on one engine: Whisper's decoding "
                                  "rules run in this process (serve it without data "
                                  "parallel)", "model")
        super().check_transcription(options)

    def abort(self, request_id: str) -> None:
        """Aborts a request at the engine's next step: its blocks are freed and its
        generate() iterator ends with finish_reason "abort". Unknown or finished ids
        are ignored."""
        self._client.abort(request_id)

    def stats(self) -> EngineStats:
        """The engine's gauges and counters as of its last step or command (data
        parallel: every replica's summed)."""
        return self._client.stats()

    def replica_stats(self) -> list[tuple[int, bool, EngineStats | None]] | None:
        """Data parallel: (index, alive, stats) of each replica; None for one engine."""
        return None if self._router is None else self._router.replica_stats()

    @property
    def failure(self) -> str | None:
        """Why the engine thread stopped on its own (a tensor-parallel rank died: every
        request in flight ended with this error), or None."""
        if self._client.alive or self._client.closed_by_shutdown:
            return None
        return self._client.failure

    @property
    def is_running(self) -> bool:
        """False once the engine thread has stopped (shut down, or died of a bug)."""
        return self._client.alive

    def shutdown(self) -> None:
        """Aborts what is in flight and stops the engine thread (and the rank processes
        of a tensor-parallel engine); generate() then raises EngineClosed."""
        self._client.shutdown()
        self.engine.close()

    async def __aenter__(self) -> AsyncLLM:
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.shutdown)


class _EngineStepper:
    """AsyncLLM.generate's shape over a synchronous engine that this asyncio loop steps
    (LLM.transcribe): requests wait on futures that drive() resolves as the engine's
    steps finish them."""

    def __init__(self, engine, ids: Iterator[int]):
        self.engine, self._ids = engine, ids
        self._waiting: dict[str, tuple[OutputCollector, asyncio.Future]] = {}

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       request_id: str | None = None, priority: int = 0,
                       encoder_input=None) -> AsyncIterator[RequestOutput]:
        rid = f"req-{next(self._ids)}"
        self.engine.add_request(rid, prompt_ids, params, priority,
                                encoder_input=encoder_input)
        collector = OutputCollector(rid, prompt_ids, params.n, params.logprobs is not None)
        done = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (collector, done)
        yield await done

    async def drive(self, work: Awaitable) -> Any:
        """Steps the engine while `work` runs; returns its result."""
        task = asyncio.ensure_future(work)
        while not task.done():
            if self.engine.has_unfinished():
                for out in self.engine.step():
                    entry = self._waiting.get(out.request_id)
                    if entry is None:
                        continue
                    collector, done = entry
                    collector.add(out)
                    if collector.output.finished:
                        del self._waiting[out.request_id]
                        done.set_result(collector.output)
            await asyncio.sleep(0)
        return task.result()
