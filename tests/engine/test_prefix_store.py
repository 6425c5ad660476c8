"""The prefix cache's disk tier (--prefix-cache-dir): blocks outlive the engine,
are written when evicted, guarded by the model's fingerprint and their digest
(a corrupt or foreign file is never served), capped with LRU eviction; an
engine that loads a prefix from disk gives the tokens of one that computes it."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from armllm.api import LLM
from armllm.engine.args import EngineArgs
from armllm.engine.block_manager import BlockManager
from armllm.engine.prefix_store import HEADER, PrefixStore
from armllm.engine.sequence import Sequence
from armllm.engine.setup import build_engine
from armllm.engine.state_pool import StatePool
from armllm.sampling import SamplingParams
from tests.tiny_model import write_tiny_llama

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
FP_A, FP_B = bytes(range(32)), bytes(range(1, 33))


@dataclass
class Params:
    max_tokens: int = 8
    n: int = 1


def block(seed: int, n: int = 4096) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, np.uint8).tobytes()


def key(i: int, group: int = 0) -> tuple[int, bytes]:
    return group, i.to_bytes(16, "little")


def written(store: PrefixStore) -> PrefixStore:
    store.flush()
    return store


# ------------------------------------------------------------ the store alone


def test_blocks_round_trip_and_outlive_the_store(tmp_path):
    store = PrefixStore(tmp_path, FP_A, [4096, 1024], 1 << 20)
    for i in range(3):
        store.save(key(i), block(i))
    store.save(key(1, group=1), block(7, 1024))
    with pytest.raises(ValueError, match="group 1 is 1024 bytes"):
        store.save(key(2, group=1), block(2))
    store.close()
    again = PrefixStore(tmp_path, FP_A, [4096, 1024], 1 << 20)
    assert len(again) == 4 and key(1) in again and key(5) not in again
    assert again.load(key(1)) == block(1)
    assert again.load(key(1, group=1)) == block(7, 1024)
    assert again.load(key(5)) is None and again.load(key(2, group=1)) is None
    assert not list(again.dir.glob("*.tmp"))
    again.close()


def test_a_corrupt_file_is_logged_removed_and_never_served(tmp_path, caplog):
    store = written(PrefixStore(tmp_path, FP_A, [4096], 1 << 20))
    store.save(key(0), block(0))
    store.save(key(1), block(1))
    written(store)
    path = store.dir / f"0-{key(0)[1].hex()}.kv"
    data = bytearray(path.read_bytes())
    data[HEADER.size + 100] ^= 1               # one bit of the payload
    path.write_bytes(bytes(data))
    short = store.dir / f"0-{key(1)[1].hex()}.kv"
    short.write_bytes(short.read_bytes()[:-10])  # a torn write
    with caplog.at_level(logging.WARNING, "armllm"):
        assert store.load(key(0)) is None
        assert store.load(key(1)) is None
    assert len([r for r in caplog.records if "prefix cache: ignoring" in r.message]) == 2
    assert not path.exists() and not short.exists() and key(0) not in store
    store.close()


def test_another_models_blocks_are_not_served(tmp_path):
    a = written(PrefixStore(tmp_path, FP_A, [4096], 1 << 20))
    a.save(key(0), block(0))
    written(a).close()
    b = PrefixStore(tmp_path, FP_B, [4096], 1 << 20)
    assert b.dir != a.dir and key(0) not in b
    # a file moved into the other model's folder fails its fingerprint check
    name = f"0-{key(0)[1].hex()}.kv"
    os.replace(a.dir / name, b.dir / name)
    b.close()
    b = PrefixStore(tmp_path, FP_B, [4096], 1 << 20)
    assert key(0) in b and b.load(key(0)) is None and b.rejected == 1
    b.close()


def test_the_cap_evicts_the_least_recently_used(tmp_path):
    file_bytes = HEADER.size + 4096
    store = PrefixStore(tmp_path, FP_A, [4096], 3 * file_bytes)
    for i in range(3):
        store.save(key(i), block(i))
        written(store)
    assert store.load(key(0)) == block(0)    # 0 is now more recent than 1
    store.save(key(3), block(3))
    written(store)
    assert [key(i) in store for i in range(4)] == [True, False, True, True]
    assert store.nbytes == 3 * file_bytes
    assert len(list(store.dir.glob("*.kv"))) == 3
    store.close()


def test_leftovers_of_a_crash_are_removed(tmp_path):
    store = PrefixStore(tmp_path, FP_A, [4096], 1 << 20)
    store.close()
    (store.dir / "abc.1.2.tmp").write_bytes(b"partial")
    (store.dir / "notes.txt").write_bytes(b"not a block")
    again = PrefixStore(tmp_path, FP_A, [4096], 1 << 20)
    assert len(again) == 0 and not (store.dir / "abc.1.2.tmp").exists()
    again.close()


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must hold at least one block"):
        PrefixStore(tmp_path, FP_A, [4096], 100)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ValueError, match="prefix_cache_dir"):
        PrefixStore(tmp_path / "file", FP_A, [4096], 1 << 20)
    with pytest.raises(ValueError, match="prefix_cache_gib"):
        EngineArgs(prefix_cache_dir=str(tmp_path), prefix_cache_gib=0)
    with pytest.raises(ValueError, match="needs prefix caching"):
        EngineArgs(prefix_cache_dir=str(tmp_path), enable_prefix_caching=False)


# ------------------------------------------------------------ in the engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"))


def prompt(n: int, seed: int) -> list[int]:
    return list(map(int, np.random.default_rng(seed).integers(2, 120, n)))


@pytest.fixture(scope="module")
def reference(model_dir):
    """Tokens as an engine that computes every prompt gives them."""
    ref = LLM(model_dir, dtype="float32", kv_cache_gib=0.01, enable_prefix_caching=False)
    yield lambda p: ref.generate(p, GREEDY)[0].outputs[0].token_ids
    ref.shutdown()


def test_a_restarted_engine_loads_the_prefix_and_gives_the_same_tokens(model_dir, reference,
                                                                      tmp_path):
    shared = prompt(70, 1)
    kw = dict(dtype="float32", kv_cache_gib=0.01, block_size=4, prefix_cache_dir=tmp_path)
    first = LLM(model_dir, **kw)
    first.generate(shared + [5], GREEDY)
    first.shutdown()                       # writes every cached block
    second = LLM(model_dir, **kw)
    out = second.generate(shared + [6, 7], GREEDY)[0]
    cached = len(shared) // 4 * 4
    assert out.outputs[0].metrics.num_cached_prompt_tokens == cached
    assert second.engine.blocks.disk_hits == cached // 4
    assert out.outputs[0].token_ids == reference(shared + [6, 7])
    second.shutdown()


def test_an_int8_cache_restarts_with_its_scales(model_dir, tmp_path):
    """An int8 cache's files hold its rows and their scales: a restarted engine's tokens
    and logprobs are those of an int8 engine that computes the whole prompt."""
    shared = prompt(70, 5)
    with_logprobs = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
    kw = dict(dtype="float32", kv_cache_dtype="int8", kv_cache_gib=0.01, block_size=4)
    first = LLM(model_dir, prefix_cache_dir=tmp_path, **kw)
    first.generate(shared + [5], GREEDY)
    first.shutdown()
    second = LLM(model_dir, prefix_cache_dir=tmp_path, **kw)
    out = second.generate(shared + [6, 7], with_logprobs)[0].outputs[0]
    assert second.engine.blocks.disk_hits == len(shared) // 4
    second.shutdown()
    cold = LLM(model_dir, enable_prefix_caching=False, **kw)
    want = cold.generate(shared + [6, 7], with_logprobs)[0].outputs[0]
    cold.shutdown()
    assert out.token_ids == want.token_ids and out.logprobs == want.logprobs


def test_evicted_blocks_come_back_from_disk(model_dir, reference, tmp_path):
    # 48 blocks of 4 tokens (K and V, 2 layers, 2 KV heads of 16, bf16): the other
    # prompts evict the first one's blocks
    small = 48 * 2 * 2 * 2 * 4 * 16 * 2 / 2**30
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=small, block_size=4,
              prefix_cache_dir=tmp_path)
    assert llm.engine.blocks.num_blocks == 48
    shared = prompt(60, 2)
    llm.generate(shared + [9], GREEDY)
    for s in range(3, 7):
        llm.generate(prompt(80, s), GREEDY)
    blocks = llm.engine.blocks
    assert not any(h in blocks.pools[0].cached for h in _hashes(blocks, shared))
    blocks.store.flush()
    out = llm.generate(shared + [10, 11], GREEDY)[0]
    assert out.outputs[0].metrics.num_cached_prompt_tokens == 60
    assert blocks.disk_hits == 15
    assert out.outputs[0].token_ids == reference(shared + [10, 11])
    assert blocks.num_free == blocks.num_blocks
    llm.shutdown()


def test_a_prefix_half_in_memory_half_on_disk(model_dir, reference, tmp_path):
    small = 48 * 2 * 2 * 2 * 4 * 16 * 2 / 2**30
    llm = LLM(model_dir, dtype="float32", kv_cache_gib=small, block_size=4,
              prefix_cache_dir=tmp_path)
    shared = prompt(60, 4)
    llm.generate(shared + [9], GREEDY)
    blocks = llm.engine.blocks
    hashes = _hashes(blocks, shared)
    for n in range(8, 120, 8):   # evict the prefix's tail (freed first), not its head
        llm.generate(prompt(n, n), GREEDY)
        in_memory = sum(h in blocks.pools[0].cached for h in hashes)
        if in_memory < len(hashes):
            break
    assert 0 < in_memory < len(hashes)
    assert all(h in blocks.pools[0].cached for h in hashes[:in_memory])
    blocks.store.flush()
    out = llm.generate(shared + [10, 11], GREEDY)[0]
    assert out.outputs[0].metrics.num_cached_prompt_tokens == 60
    assert blocks.disk_hits == len(hashes) - in_memory
    assert out.outputs[0].token_ids == reference(shared + [10, 11])
    llm.shutdown()


def _hashes(blocks, ids: list[int]) -> list[bytes]:
    from armllm.engine.block_manager import _ROOT_HASH, block_hash
    out, parent, bs = [], _ROOT_HASH, blocks.block_size
    for i in range(len(ids) // bs):
        parent = block_hash(parent, ids[i * bs:(i + 1) * bs])
        out.append(parent)
    return out


def test_another_kv_dtype_does_not_read_the_blocks(model_dir, tmp_path):
    shared = prompt(40, 3)
    kw = dict(dtype="float32", kv_cache_gib=0.01, block_size=4, prefix_cache_dir=tmp_path)
    first = LLM(model_dir, kv_cache_dtype="f32", **kw)
    first.generate(shared + [5], GREEDY)
    first.shutdown()
    second = LLM(model_dir, kv_cache_dtype="bf16", **kw)
    out = second.generate(shared + [6], GREEDY)[0]
    assert out.outputs[0].metrics.num_cached_prompt_tokens == 0
    assert second.engine.blocks.disk_hits == 0
    second.shutdown()


def test_a_store_needs_the_caches_bytes(tmp_path):
    store = PrefixStore(tmp_path, FP_A, [4096], 1 << 20)
    with pytest.raises(ValueError, match="the KV cache's bytes"):
        BlockManager(8, 4, True, None, store, None)
    store.close()


class FakeKV:
    """Block bytes per KV group and state slot bytes, as KVCache's read_block,
    write_block, read_state and write_state keep them."""

    def __init__(self, layout, nbytes, slots=0, state_bytes=16):
        self.data = [[bytes(nbytes[g])] * (n + 1) for g, (_, n) in enumerate(layout)]
        self.states = [bytes(state_bytes)] * slots

    def read_block(self, group, block):
        return self.data[group][block]

    def write_block(self, group, block, data):
        self.data[group][block] = data

    def read_state(self, slot):
        return self.states[slot]

    def write_state(self, slot, data):
        self.states[slot] = data


def test_state_checkpoints_go_to_disk_when_evicted_and_come_back(tmp_path):
    """A hybrid's checkpoints (interval 8, one checkpoint slot): the second prompt's
    checkpoint evicts the first's, which goes to disk; the first prompt's prefix
    then comes back with its state loaded into a checkpoint slot, the pending copy of
    the second's not disturbed."""
    bs, nbytes, sb = 4, [64], 16
    store = PrefixStore(tmp_path, FP_A, nbytes + [sb], 1 << 20)
    states = StatePool(2, 1, 8)
    kv = FakeKV([(0, 16)], nbytes, slots=3, state_bytes=sb)
    bm = BlockManager(16, bs, True, states, store, kv)
    first = list(range(100, 109))
    a = Sequence("a", first, Params())
    assert bm.allocate_slots(a, 8) is not None
    a.num_computed = 8
    bm.commit(a)                               # checkpoint of a's 8 tokens: slot 2, pending
    assert states.copies() == [(a.state_slot, 2)]
    kv.write_state(2, block(1, sb))            # the step makes the copy
    bm.release(a)
    b = Sequence("b", list(range(200, 209)), Params())
    assert bm.allocate_slots(b, 8) is not None
    b.num_computed = 8
    bm.commit(b)                               # evicts a's checkpoint: spilled first
    assert states.pending == [(b.state_slot, 2)]
    bm.release(b)
    store.flush()
    assert (1, a.block_hashes[1]) in store
    c = Sequence("c", first[:8] + [5], Params())
    prefix = bm.cached_prefix(c)
    # slot 2 is a pending copy's target: no free slot the load may write now
    assert prefix.num_tokens == 0
    states.copies()                            # the next step made it
    kv.write_state(2, block(2, sb))
    prefix = bm.cached_prefix(c)
    assert prefix.num_tokens == 8 and prefix.state == 2
    assert kv.read_state(2) == block(1, sb) and bm.disk_hits == 1
    assert (1, b.block_hashes[1]) in store      # b's checkpoint went to disk in its turn
    bm.close()


def test_a_full_and_a_window_pool_reload_what_each_needs(tmp_path):
    """Blocks of both pools go to disk; after a restart a prompt's full pool gets its
    whole run from there, its window pool only the blocks inside the window."""
    layout, nbytes, bs = [(0, 12), (8, 12)], [64, 32], 4
    ids = list(range(100, 125))                 # 6 full blocks, then one token
    store = PrefixStore(tmp_path, FP_A, nbytes, 1 << 20)
    kv = FakeKV(layout, nbytes)
    bm = BlockManager(layout, bs, True, None, store, kv)
    a = Sequence("a", ids, Params())
    assert bm.allocate_slots(a, len(ids)) is not None
    want = {}
    for g, table in enumerate(a.block_tables):  # the step writes every block it holds
        for i, b in enumerate(table):
            if b != bm.pools[g].null:
                kv.write_block(g, b, block(10 * g + i, nbytes[g]))
                want[g, i] = kv.read_block(g, b)
    a.num_computed = len(ids)
    bm.commit(a)
    bm.release(a)
    bm.close()
    kv2 = FakeKV(layout, nbytes)
    bm2 = BlockManager(layout, bs, True, None, PrefixStore(tmp_path, FP_A, nbytes, 1 << 20),
                       kv2)
    b = Sequence("b", ids[:24] + [7, 8], Params())
    prefix = bm2.cached_prefix(b)
    assert prefix.num_tokens == 24
    full, window = prefix.tables
    live = bm2.pools[1].first_live(24, bs)      # the window of the first token left
    assert live == 4 and window[:live] == [bm2.pools[1].null] * live
    assert [kv2.read_block(0, blk) for blk in full] == [want[0, i] for i in range(6)]
    assert [kv2.read_block(1, blk) for blk in window[live:]] == [want[1, i]
                                                                 for i in range(live, 6)]
    assert bm2.disk_hits == 6 + 6 - live
    assert bm2.allocate_slots(b, 26, prefix) is not None and b.num_computed == 24
    bm2.release(b)
    bm2.close()


def write_tiny_mistral(path, window: int):
    """The tiny Llama as a Mistral whose every layer attends `window` tokens back."""
    write_tiny_llama(path)
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral",
                  sliding_window=window)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_sliding_window_model_reloads_its_window(tmp_path_factory):
    model = write_tiny_mistral(tmp_path_factory.mktemp("mistral"), 8)
    folder = tmp_path_factory.mktemp("store")
    ref = LLM(model, dtype="float32", kv_cache_gib=0.01, enable_prefix_caching=False)
    shared = prompt(50, 6)
    want = ref.generate(shared + [6, 7], GREEDY)[0].outputs[0].token_ids
    ref.shutdown()
    kw = dict(dtype="float32", kv_cache_gib=0.01, block_size=4, prefix_cache_dir=folder)
    first = LLM(model, **kw)
    assert len(first.engine.runner.kv.groups) == 1 and first.engine.blocks.pools[0].window
    first.generate(shared + [5], GREEDY)
    first.shutdown()
    second = LLM(model, **kw)
    out = second.generate(shared + [6, 7], GREEDY)[0].outputs[0]
    assert out.metrics.num_cached_prompt_tokens == 48
    assert 0 < second.engine.blocks.disk_hits < 12    # the window's blocks, not all 12
    assert out.token_ids == want
    second.shutdown()


def test_tensor_parallel_is_refused_before_anything_starts(model_dir, tmp_path):
    with pytest.raises(ValueError, match="prefix_cache_dir"):
        build_engine(model_dir, EngineArgs(tensor_parallel_size=2,
                                           prefix_cache_dir=str(tmp_path)))


def test_a_script_that_never_shuts_down_still_writes_its_blocks(model_dir, tmp_path):
    script = (f"from armllm.api import LLM; from armllm.sampling import SamplingParams\n"
              f"llm = LLM({str(model_dir)!r}, dtype='float32', kv_cache_gib=0.01, "
              f"block_size=4, prefix_cache_dir={str(tmp_path)!r})\n"
              f"llm.generate(list(range(2, 40)), SamplingParams(max_tokens=2))\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert len(list(tmp_path.glob("*/*.kv"))) == 38 // 4
