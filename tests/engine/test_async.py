"""AsyncLLM: the engine on its own thread under asyncio: concurrent requests
equal the synchronous outputs, incremental outputs add up, cancelling the
consumer aborts the request and frees its blocks, bad requests raise."""
from __future__ import annotations

import asyncio

import pytest

from armllm.api import LLM, AsyncLLM
from armllm.engine.engine_thread import EngineClosed
from armllm.sampling import SamplingParams
from tests.engine.test_engine import GREEDY, prompts
from tests.tiny_model import write_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def allm(model_dir):
    llm = AsyncLLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    yield llm
    llm.shutdown()


async def collect(llm: AsyncLLM, prompt, params, **kw):
    last, deltas = None, [[] for _ in range(params.n)]
    async for out in llm.generate(prompt, params, **kw):
        for c in out.outputs:
            deltas[c.index] += c.new_token_ids
        last = out
    return last, deltas


def free_blocks(llm: AsyncLLM) -> int:
    return llm.engine_thread.call(lambda e: e.blocks.num_free).result(timeout=10)


def test_concurrent_requests_equal_the_sync_engine(model_dir, allm):
    ps = prompts(6, seed=21)
    want = [o.token_ids for o in LLM(model_dir, dtype="float32",
                                     kv_cache_gib=0.01).generate(ps, GREEDY)]

    async def main():
        return await asyncio.gather(*(collect(allm, p, GREEDY) for p in ps))

    results = asyncio.run(main())
    for (last, deltas), tokens in zip(results, want, strict=True):
        assert last.finished and last.token_ids == tokens and deltas[0] == tokens
        assert last.finish_reason == "length"
    assert free_blocks(allm) == allm.engine.blocks.num_blocks


def test_parallel_sampling_and_text_deltas(allm):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=2)

    async def main():
        text = ["", ""]
        async for out in allm.generate("w1 w2 w3", params, request_id="pair"):
            assert out.request_id == "pair"
            for c in out.outputs:
                text[c.index] += c.text_delta
        return out, text

    out, text = asyncio.run(main())
    assert [c.text for c in out.outputs] == text and text[0] == text[1] != ""


def test_cancelling_the_consumer_aborts_the_request(allm):
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    async def main():
        got = asyncio.Event()

        async def consume():
            async for _ in allm.generate(prompts(1, seed=22)[0], params, request_id="long"):
                got.set()

        task = asyncio.create_task(consume())
        await got.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the engine thread frees the blocks at its next step
            if free_blocks(allm) == allm.engine.blocks.num_blocks:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())
    assert allm.engine_thread.call(lambda e: e.num_unfinished_requests).result(10) == 0
    assert allm.stats().finished.get("abort") == 1


def test_breaking_out_early_aborts_too(allm):
    async def main():
        stream = allm.generate([3, 4, 5], SamplingParams(max_tokens=300, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert allm.engine_thread.call(lambda e: e.num_unfinished_requests).result(10) == 0


def test_bad_requests_raise_and_the_engine_keeps_serving(allm):
    async def main():
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await collect(allm, [3, 100_000], GREEDY)
        with pytest.raises(ValueError, match="exceeds max_model_len"):
            await collect(allm, [3] * 10, SamplingParams(max_tokens=10_000))
        await collect(allm, [3], GREEDY, request_id="dup")
        last, _ = await collect(allm, [3, 4], GREEDY)
        return last

    assert asyncio.run(main()).finished


def test_shutdown_refuses_new_requests(model_dir):
    llm = AsyncLLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    llm.shutdown()
    assert not llm.engine_thread.alive

    async def main():
        await collect(llm, [3, 4], GREEDY)

    with pytest.raises(EngineClosed):
        asyncio.run(main())
