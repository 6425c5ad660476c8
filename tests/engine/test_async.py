"""AsyncLLM: the engine on its own thread under asyncio: concurrent requests
equal the synchronous outputs, incremental outputs add up, cancelling the
consumer or abort() ends the request and frees its blocks, bad requests raise
(check_request names what to change) and the engine keeps serving."""
from __future__ import annotations

import asyncio

import pytest

from armllm.api import LLM, AsyncLLM, ContextLengthExceeded, EngineClosed, RequestRejected
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


async def wait_idle(llm: AsyncLLM, timeout: float = 10.0) -> None:
    """Until the engine holds no request and every KV block is free again."""
    for _ in range(int(timeout / 0.01)):
        s = llm.stats()
        if s.num_running == s.num_waiting == 0 and s.num_free_blocks == s.num_blocks:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine is not idle: {llm.stats()}")


def test_concurrent_requests_equal_the_sync_engine(model_dir, allm):
    ps = prompts(6, seed=21)
    want = [o.token_ids for o in LLM(model_dir, dtype="float32",
                                     kv_cache_gib=0.01).generate(ps, GREEDY)]

    async def main():
        results = await asyncio.gather(*(collect(allm, p, GREEDY) for p in ps))
        await wait_idle(allm)
        return results

    results = asyncio.run(main())
    for (last, deltas), tokens in zip(results, want, strict=True):
        assert last.finished and last.token_ids == tokens and deltas[0] == tokens
        assert last.finish_reason == "length"


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
        await wait_idle(allm)  # the engine thread frees the blocks at its next step

    asyncio.run(main())
    assert allm.stats().finished.get("abort") == 1


def test_breaking_out_early_aborts_too(allm):
    async def main():
        stream = allm.generate([3, 4, 5], SamplingParams(max_tokens=300, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()
        await wait_idle(allm)

    asyncio.run(main())
    assert allm.stats().finished.get("abort") == 1


def test_abort_ends_the_stream_with_reason_abort(allm):
    params = SamplingParams(max_tokens=300, ignore_eos=True, n=2)

    async def main():
        outs = []
        async for out in allm.generate([3, 4, 5], params, request_id="stop-me"):
            outs.append(out)
            if len(outs) == 2:
                allm.abort("stop-me")
        await wait_idle(allm)
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and [c.finish_reason for c in outs[-1].outputs] == ["abort"] * 2
    assert len(outs[-1].token_ids) < 300
    allm.abort("stop-me")          # finished, and unknown ids: ignored
    allm.abort("never-was")
    assert allm.is_running


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


def test_limits_and_check_request_name_what_to_change(allm):
    """check_request refuses, with the field to change, every request the engine could
    never serve; the limits it checks against are the engine's."""
    assert allm.max_model_len == 512 and allm.vocab_size == allm.loaded.config.vocab_size
    assert allm.max_num_seqs == 32
    ok = SamplingParams(max_tokens=10)
    allm.check_request([3, 4], ok)
    allm.check_request([3] * 500, SamplingParams(max_tokens=12))   # exactly 512
    cases = [
        ([], ok, RequestRejected, "prompt", "empty"),
        ([3, allm.vocab_size], ok, RequestRejected, "prompt", f"id {allm.vocab_size} is outside"),
        ([3, -1], ok, RequestRejected, "prompt", "id -1 is outside"),
        ([3, "4"], ok, RequestRejected, "prompt", "list of token ids"),
        ([3] * 512, ok, ContextLengthExceeded, "prompt", "the prompt has 512 tokens"),
        ([3] * 500, SamplingParams(max_tokens=13), ContextLengthExceeded, "max_tokens",
         "= 513 exceeds max_model_len 512"),
        ([3], SamplingParams(n=33), RequestRejected, "n", "n = 33 completions exceeds "
                                                           "max_num_seqs 32"),
    ]
    for ids, params, kind, field, message in cases:
        with pytest.raises(kind, match=message) as info:
            allm.check_request(ids, params)
        assert info.value.field == field and isinstance(info.value, ValueError)
    assert not issubclass(RequestRejected, ContextLengthExceeded)


def test_sync_llm_checks_every_prompt_before_running_any(model_dir):
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    with pytest.raises(ContextLengthExceeded, match="max_model_len 512") as info:
        llm.generate([[3, 4], [3] * 510], SamplingParams(max_tokens=8))
    assert info.value.field == "max_tokens"
    assert llm.stats().num_prompt_tokens == 0     # the first prompt was not queued either
    with pytest.raises(RequestRejected, match="outside the vocabulary"):
        next(llm.stream([3, 10**6]))


def test_shutdown_refuses_new_requests(model_dir):
    llm = AsyncLLM(model_dir, dtype="float32", kv_cache_gib=0.01)
    assert llm.is_running
    llm.shutdown()
    assert not llm.is_running

    async def main():
        await collect(llm, [3, 4], GREEDY)

    with pytest.raises(EngineClosed):
        asyncio.run(main())
