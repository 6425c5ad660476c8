"""block_manager: which KV-cache blocks each sequence holds, and the prefix
cache (plain Python).

The blocks live in pools, one per KV group (model/kv_cache.py): the layers
that attend the whole sequence share one pool, sliding-window layers another.
A sequence has one block table per pool, all indexed by token block. A
window pool's table keeps only the blocks a query of this step or a later one
can read; an entry before that points at the pool's null block (an id no
sequence holds, which the kernels never read), and the block it held goes
back to the free list at the next allocate.

Every block has a reference count (the sequences whose block table lists
it). A full block of computed tokens is keyed by a chained hash of (the
previous block's hash, its token ids), so equal prefixes map to equal keys;
each pool caches its own blocks under those keys. A new sequence takes the
longest run of blocks that every pool can serve: all of them in a full pool,
those inside the first computed token's window in a window pool, always
leaving at least one token to compute (the last one produces the logits).
Blocks whose count drops to zero go to the free list but keep their contents
and hash: blocks without a hash are reused first, then hashed ones from the
least recently freed; a hashed block is evicted from the cache only when it
is handed out again. Sequences forked for parallel sampling share their
parent's blocks; a shared block is copied before it is written (copy on
write). Block ids index the KV cache's first dimension.

A hybrid model's recurrent layers keep a state per running sequence in a
pool of state slots (engine/state_pool.py): a sequence takes one with its
first blocks and gives it back with them; a forked completion takes its own, a
copy of its parent's. Its prefix cache serves a prompt only up to a state
checkpoint: a multiple of the pool's interval whose blocks every KV pool
serves and whose state was saved when a sequence's computed tokens reached it
(commit); the hit's state is copied into the new sequence's live slot.

With a PrefixStore (engine/prefix_store.py, --prefix-cache-dir), the cache
has a second tier on disk: a hashed block of any pool, and a hybrid's state
checkpoint, is written there when it is evicted (before its block or slot is
handed out again), and every one when the engine closes. cached_prefix()
fills what a prompt's prefix needs from the store where memory lacks it (a
full pool's run on from its first block; then, for the prefix it settles
on, each window pool's blocks inside the window and the state checkpoint),
loading each block into a free block that then sits in the cache as any
freed block does (the prefix's blocks already in memory are kept from
eviction while it loads) and a checkpoint into a checkpoint slot.

The scheduler asks once per sequence and step: allocate_slots() gives a
sequence room for its next tokens (a new one first takes the CachedPrefix
that cached_prefix() found), or changes nothing when they do not fit."""
from __future__ import annotations

import functools
import hashlib
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from armllm.engine.prefix_store import PrefixStore
from armllm.engine.sequence import Sequence
from armllm.engine.state_pool import StatePool

_ROOT_HASH = b""  # the parent of a sequence's first block


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """The key of a full block: a 128-bit digest of its parent's key and its
    tokens (a cryptographic digest: a collision would silently serve another
    prompt's KV)."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


@dataclass(frozen=True)
class CachedPrefix:
    """The blocks of a new sequence's longest cached prefix, from cached_prefix(), for
    allocate_slots() to take; the scheduler reads only num_tokens."""
    tables: list[list[int]]     # per pool, equally long (window pools: null before the window)
    num_tokens: int             # the tokens those blocks hold: where computing starts
    state: int | None = None    # the state checkpoint at num_tokens (a hybrid model's)


class BlockIO(Protocol):
    """The bytes of the KV cache's blocks (model/kv_cache.py's KVCache)."""

    def read_block(self, group: int, block: int) -> bytes: ...

    def write_block(self, group: int, block: int, data: bytes) -> None: ...

    def read_state(self, slot: int) -> bytes: ...

    def write_state(self, slot: int, data: bytes) -> None: ...


class BlockPool:
    """The blocks of one KV group: reference counts, the free list (in reuse order)
    and the prefix cache's entries; `evicting(block, hash)`, if set, is told of a
    cached block before it is handed out to hold other tokens."""

    evicting: Callable[[int, bytes], None] | None = None

    def __init__(self, num_blocks: int, window: int):
        self.num_blocks, self.window = num_blocks, window
        self.null = num_blocks      # table entry of a block out of every query's window
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}          # hash -> block holding those tokens
        # free blocks in reuse order: unhashed ones first, then hashed, least recently freed
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    def first_live(self, pos: int, block_size: int) -> int:
        """The first block a query at `pos` or later reads."""
        return max(0, pos - self.window + 1) // block_size if self.window else 0

    def take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        h = self.hash_of[block]
        if h is not None:  # evict: the block is about to hold other tokens
            if self.cached.get(h) == block:
                del self.cached[h]
                if self.evicting is not None:
                    self.evicting(block, h)
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def hold(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self.free[block]
        self.ref_count[block] += 1

    def drop(self, block: int) -> None:
        """One holder less; the last one frees the block: an unhashed block is reused
        first, a hashed one last (it may serve a prefix again)."""
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free[block] = None
            if self.hash_of[block] is None:
                self.free.move_to_end(block, last=False)

    def cow_needed(self, table: list[int], num_computed: int, block_size: int) -> bool:
        """Whether the block written next is shared and must be copied first."""
        i = num_computed // block_size
        return i < len(table) and table[i] != self.null and self.ref_count[table[i]] > 1

    def dead_held_alone(self, table: list[int], live: int) -> int:
        """Blocks before index `live` that only this table holds: what trimming the
        table to the window frees."""
        count, j = 0, min(live, len(table)) - 1
        while j >= 0 and table[j] != self.null:
            count += self.ref_count[table[j]] == 1
            j -= 1
        return count

    def trim(self, table: list[int], live: int) -> None:
        """Drops the table's blocks before index `live`, newest first (so the older
        ones stay longer in the prefix cache)."""
        j = min(live, len(table)) - 1
        while j >= 0 and table[j] != self.null:
            self.drop(table[j])
            table[j] = self.null
            j -= 1


def _spill(store: PrefixStore, kv: BlockIO, group: int, block: int, h: bytes) -> None:
    """A cached block's bytes go to the store, if it lacks them (an evicted block's
    before the next step overwrites it)."""
    if (group, h) not in store:
        store.save((group, h), kv.read_block(group, block))


def _spill_state(store: PrefixStore, kv: BlockIO, group: int, key: bytes, slot: int) -> None:
    """A state checkpoint's bytes go to the store (as group `group`: after the KV
    groups), if it lacks them."""
    if (group, key) not in store:
        store.save((group, key), kv.read_state(slot))


def _save_and_close(pools: list[BlockPool], states: StatePool | None, store: PrefixStore,
                    kv: BlockIO) -> None:
    try:
        for group, pool in enumerate(pools):
            for h, block in list(pool.cached.items()):
                _spill(store, kv, group, block, h)
        if states is not None:   # the checkpoints whose state is in their slot
            for key, slot in list(states.saved.items()):
                if states.settled(slot):
                    _spill_state(store, kv, len(pools), key, slot)
    except RuntimeError:   # at exit, an engine thread still stepping changed the cache
        pass
    finally:
        store.close()


class BlockManager:
    """num_blocks: one pool of that many blocks for layers that attend the whole
    sequence, or each pool's (window, num_blocks) in KV-group order (window 0: the
    whole sequence); states: a hybrid model's StatePool (None: no recurrent layers),
    whose checkpoint interval must be a multiple of block_size; store: the prefix
    cache's disk tier (prefix caching on), with kv the cache whose block and state
    bytes it keeps."""

    def __init__(self, num_blocks: int | Seq[tuple[int, int]], block_size: int,
                 enable_prefix_caching: bool = True, states: StatePool | None = None,
                 store: PrefixStore | None = None, kv: BlockIO | None = None):
        layout = [(0, num_blocks)] if isinstance(num_blocks, int) else list(num_blocks)
        if not layout or block_size < 1 or any(n < 1 or w < 0 for w, n in layout):
            raise ValueError(f"num_blocks and block_size must be >= 1 (and windows >= 0), got "
                             f"{num_blocks}, {block_size}")
        self.pools = [BlockPool(n, w) for w, n in layout]
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_queries = 0                     # prompt tokens looked up
        self.prefix_hits = 0                        # of which were found in the cache
        if states is not None and states.interval % block_size:
            raise ValueError(f"the state checkpoint interval {states.interval} is no multiple "
                             f"of the block size {block_size}")
        self.states = states
        self.store, self.kv = store, kv
        self.disk_hits = 0                          # blocks a prefix took from the store
        if store is not None:
            if kv is None or not enable_prefix_caching:
                raise ValueError("a prefix store needs prefix caching and the KV cache's "
                                 "bytes (kv)")
            for group, pool in enumerate(self.pools):
                pool.evicting = functools.partial(_spill, store, kv, group)
            if states is not None:
                states.evicting = functools.partial(_spill_state, store, kv, len(self.pools))
            # at the latest when the interpreter exits (a script that never closes)
            self._closer = weakref.finalize(self, _save_and_close, self.pools, states, store,
                                            kv)

    def _load_from_store(self, group: int, hashes: list[bytes]) -> None:
        """Makes pool `group` cache hashes' blocks, in order, up to the first that
        neither memory nor the store has: each missing one is loaded into a free block
        entered in the cache; the prefix's free blocks move to the recent end of the
        free list, and no load evicts one of them."""
        pool = self.pools[group]
        room = len(pool.free)    # free blocks a load may take without evicting the prefix's
        for h in hashes:
            if h in pool.cached:
                block = pool.cached[h]
                if pool.ref_count[block] == 0:
                    pool.free.move_to_end(block)
                    room -= 1
                continue
            if room <= 0 or (group, h) not in self.store or \
                    (payload := self.store.load((group, h))) is None:
                break
            block = pool.take_free()
            self.kv.write_block(group, block, payload)
            pool.cached[h] = block
            pool.hash_of[block] = h
            pool.drop(block)        # cached and free: at the recent end of the free list
            room -= 1
            self.disk_hits += 1

    def _load_state(self, key: bytes) -> int | None:
        """The checkpoint saved under key, loaded from the store into a checkpoint
        slot, or None."""
        payload = self.store.load((len(self.pools), key))
        if payload is None:
            return None
        slot = self.states.load(key, lambda s: self.kv.write_state(s, payload))
        if slot is not None:
            self.disk_hits += 1
        return slot

    def close(self, save: bool = True) -> None:
        """With a store: writes every cached block to it (save) and waits for the
        writes."""
        if self.store is None:
            return
        if save:
            self._closer()
        else:
            self._closer.detach()
            self.store.close()

    def _tables(self, seq: Sequence) -> list[list[int]]:
        """seq's block tables, empty ones for a sequence that holds no block."""
        return seq.block_tables or [[]] * len(self.pools)

    # -- hashing --------------------------------------------------------------------------

    def _extend_hashes(self, seq: Sequence, num_tokens: int) -> None:
        """seq.block_hashes covers every full block among seq's first num_tokens."""
        bs, hashes = self.block_size, seq.block_hashes
        full = num_tokens // bs
        if len(hashes) >= full:
            return
        ids = seq.all_ids
        for i in range(len(hashes), full):
            hashes.append(block_hash(hashes[-1] if hashes else _ROOT_HASH,
                                     ids[i * bs:(i + 1) * bs]))

    def cached_prefix(self, seq: Sequence) -> CachedPrefix:
        """The longest prefix of seq's tokens that every pool serves from its cache
        (window pools: the blocks in the window of the first token left to compute;
        null before), leaving at least one token to compute; no blocks on a miss.
        Takes nothing; with a store, it first loads what the prefix needs from there
        into the cache (the blocks, a hybrid's state checkpoint)."""
        empty = CachedPrefix([[] for _ in self.pools], 0)
        if not self.enable_prefix_caching or seq.block_tables or not seq.reuse_prefix \
                or (self.states is not None and not self.states.interval):
            return empty
        bs = self.block_size
        limit = (seq.num_tokens - 1) // bs
        self._extend_hashes(seq, limit * bs)
        hashes = seq.block_hashes[:limit]
        store = self.store

        def window_pools_serve(k: int) -> bool:
            return all(hashes[j] in p.cached or (store is not None and (g, hashes[j]) in store)
                       for g, p in enumerate(self.pools) if p.window
                       for j in range(p.first_live(k * bs, bs), k))

        def state_serves(k: int) -> bool:   # a checkpoint after k blocks, in memory or stored
            if self.states is None:
                return True
            if not self.states.is_boundary(k * bs):
                return False
            key = hashes[k - 1]
            return key in self.states.saved or (store is not None and
                                                (len(self.pools), key) in store)
        if self.states is not None:   # a hybrid's prefix ends at its last checkpoint
            k = len(hashes)
            while k and not state_serves(k):
                k -= 1
            del hashes[k:]
        for g, pool in enumerate(self.pools):  # a full pool serves a run from the first block
            if not pool.window:
                if store is not None:
                    self._load_from_store(g, hashes)
                miss = next((i for i, h in enumerate(hashes) if h not in pool.cached), None)
                del hashes[len(hashes) if miss is None else miss:]
        k = len(hashes)
        while k and (not window_pools_serve(k) or not state_serves(k)):
            k -= 1
        if not k:
            return empty
        state = None
        if store is not None:
            for g, pool in enumerate(self.pools):
                if pool.window:
                    self._load_from_store(g, hashes[pool.first_live(k * bs, bs):k])
        if self.states is not None:
            state = self.states.find(hashes[k - 1])
            if state is None:
                state = self._load_state(hashes[k - 1])
        tables = []
        for pool in self.pools:
            live = pool.first_live(k * bs, bs)
            hits = [pool.cached.get(h) for h in hashes[live:k]]
            if None in hits:   # a stored block failed its checks: compute the prompt
                return empty
            tables.append([pool.null] * live + hits)
        if self.states is not None and state is None:
            return empty
        return CachedPrefix(tables, k * bs, state)

    # -- accounting -----------------------------------------------------------------------

    def blocks_needed(self, seq: Sequence, num_tokens: int,
                      prefix: CachedPrefix | None = None) -> list[int]:
        """Per pool, the free blocks that taking `prefix` and growing seq to num_tokens
        tokens uses (less what trimming a window pool's table frees)."""
        bs, want = self.block_size, -(-num_tokens // self.block_size)
        cached = prefix.tables if prefix is not None else None
        needed = []
        for i, pool in enumerate(self.pools):
            table = cached[i] if cached and cached[i] else \
                (seq.block_tables[i] if seq.block_tables else [])
            fresh = max(0, want - len(table))
            if cached and cached[i]:  # cached blocks on the free list come back from it
                fresh += sum(1 for b in cached[i] if b != pool.null and pool.ref_count[b] == 0)
            else:
                fresh += pool.cow_needed(table, seq.num_computed, bs)
                if pool.window:
                    fresh -= pool.dead_held_alone(table, pool.first_live(seq.num_computed, bs))
            needed.append(fresh)
        return needed

    def most_blocks(self, num_tokens: int, chunk: int) -> list[int]:
        """Per pool, the most blocks one sequence of num_tokens tokens holds when it
        computes up to `chunk` tokens a step."""
        bs, whole = self.block_size, -(-num_tokens // self.block_size)
        return [min(whole, -(-(p.window - 1 + chunk) // bs) + 1) if p.window else whole
                for p in self.pools]

    # -- allocation -----------------------------------------------------------------------

    def allocate_slots(self, seq: Sequence, num_tokens: int,
                       prefix: CachedPrefix | None = None) -> list[tuple[int, int, int]] | None:
        """Gives seq room for num_tokens tokens: a newly admitted seq first takes
        `prefix` (from cached_prefix; its lookup is counted), then every table grows
        to num_tokens tokens and window pools' are trimmed to the window. Returns the
        block copies (pool, src, dst) to make before the step writes (copy on write of
        a shared block), or None, changing nothing, when the blocks do not fit."""
        needed = self.blocks_needed(seq, num_tokens, prefix)
        if any(n > len(p.free) for n, p in zip(needed, self.pools, strict=True)):
            return None
        if self.states is not None and seq.state_slot < 0:
            if (slot := self.states.take()) is None:
                return None
            seq.state_slot = slot
        if prefix is not None:
            self._take_prefix(seq, prefix)
        return self._grow(seq, num_tokens)

    def _take_prefix(self, seq: Sequence, prefix: CachedPrefix) -> None:
        for pool, table in zip(self.pools, prefix.tables, strict=True):
            for block in table:
                if block != pool.null:
                    pool.hold(block)
        seq.block_tables = [list(t) for t in prefix.tables]
        if prefix.state is not None:   # the checkpoint's state, before the step runs
            self.states.copy(prefix.state, seq.state_slot)
        seq.num_computed = prefix.num_tokens
        seq.num_committed_blocks = len(prefix.tables[0])
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed

    def _grow(self, seq: Sequence, num_tokens: int) -> list[tuple[int, int, int]]:
        bs = self.block_size
        if not seq.block_tables:
            seq.block_tables = [[] for _ in self.pools]
        want = -(-num_tokens // bs)
        copies = []
        for i, (pool, table) in enumerate(zip(self.pools, seq.block_tables, strict=True)):
            if pool.window:
                pool.trim(table, pool.first_live(seq.num_computed, bs))
            if pool.cow_needed(table, seq.num_computed, bs):
                j = seq.num_computed // bs
                src, dst = table[j], pool.take_free()
                pool.ref_count[src] -= 1  # still held by others: > 0
                table[j] = dst
                copies.append((i, src, dst))
            # the chunk's blocks in ascending order: the same blocks leave the free list,
            # and a run of them is a forward stream for decode attention (a freed
            # sequence's blocks come back tail first: on Zen 4 a head's keys read up to 12%
            # slower over descending blocks, 1.14-1.32x slower over scrambled ones)
            table.extend(sorted(pool.take_free() for _ in range(want - len(table))))
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent."""
        for pool, table in zip(self.pools, self._tables(parent), strict=True):
            for block in table:
                if block != pool.null:
                    pool.ref_count[block] += 1
        child.block_tables = [list(t) for t in parent.block_tables]
        if self.states is not None:
            slot = self.states.take()
            if slot is None:
                raise RuntimeError("no free state slot for a forked completion (the "
                                   "scheduler admits at most as many sequences as slots)")
            child.state_slot = slot
            self.states.copy(parent.state_slot, slot)
        child.num_computed = parent.num_computed
        child.block_hashes = list(parent.block_hashes)
        child.num_committed_blocks = parent.num_committed_blocks

    def commit(self, seq: Sequence) -> None:
        """Enters seq's newly completed full blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed // self.block_size
        self._extend_hashes(seq, full * self.block_size)
        for pool, table in zip(self.pools, self._tables(seq), strict=True):
            for i in range(seq.num_committed_blocks, full):
                block = table[i]
                if pool.hash_of[block] is not None:
                    continue  # already cached (a prefix hit, or committed last step)
                h = seq.block_hashes[i]
                if h not in pool.cached:  # else another block holds the same tokens: keep that
                    pool.cached[h] = block
                    pool.hash_of[block] = h
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)
        if self.states is not None and self.states.is_boundary(seq.num_computed):
            self.states.save(seq.block_hashes[seq.num_computed // self.block_size - 1],
                             seq.state_slot)

    def shrink(self, seq: Sequence) -> None:
        """Gives back the blocks past seq's computed tokens (those only rejected draft
        tokens of a speculative verify wrote)."""
        want = -(-seq.num_computed // self.block_size)
        for pool, table in zip(self.pools, seq.block_tables, strict=True):
            while len(table) > want:
                block = table.pop()
                if block != pool.null:
                    pool.drop(block)

    def release(self, seq: Sequence) -> None:
        """Drops seq's hold on its blocks; the last holder frees them, tail first so a
        prefix outlives its continuations in the cache."""
        for pool, table in zip(self.pools, self._tables(seq), strict=True):
            for block in reversed(table):
                if block != pool.null:
                    pool.drop(block)
        seq.block_tables = []
        seq.num_computed = seq.num_committed_blocks = 0
        if seq.state_slot >= 0:
            self.states.give_back(seq.state_slot)
            seq.state_slot = -1

    # -- state slots ----------------------------------------------------------------------

    def step_limit(self, num_computed: int) -> int | None:
        """The most tokens a sequence with num_computed tokens computed may compute this
        step (None: no limit): a hybrid's stop at each state checkpoint boundary."""
        return None if self.states is None else self.states.step_limit(num_computed)

    def take_state_copies(self) -> list[tuple[int, int]]:
        """The state slot copies (src, dst: forks, checkpoints saved and restored) asked
        for since the last call, in order: the next step makes them before it runs."""
        return [] if self.states is None else self.states.copies()

    # -- counters (over all pools) --------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pools)

    @property
    def num_free(self) -> int:
        return sum(len(p.free) for p in self.pools)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences, in the fullest pool."""
        return max(1.0 - len(p.free) / p.num_blocks for p in self.pools)

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(p.cached) for p in self.pools)
