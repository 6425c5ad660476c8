"""block_manager: which KV-cache blocks each sequence holds, and the prefix
cache (plain Python).

Every block has a reference count (the sequences whose block table lists
it). A full block of computed tokens is keyed by a chained hash of (the
previous block's hash, its token ids), so equal prefixes map to equal keys.
A new sequence takes the longest run of cached blocks that matches its
tokens, always leaving at least one token to compute (the last one produces
the logits). Blocks whose count drops to zero go to the free list but keep
their contents and hash: blocks without a hash are reused first, then hashed
ones from the least recently freed; a hashed block is evicted from the cache
only when it is handed out again. Sequences forked for parallel sampling
share their parent's blocks; a shared block is copied before it is written
(copy on write). Block ids index the KV cache's first dimension."""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from armllm.engine.sequence import Sequence

_ROOT_HASH = b""  # the parent of a sequence's first block


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """The key of a full block: a 128-bit digest of its parent's key and its
    tokens (a cryptographic digest: a collision would silently serve another
    prompt's KV)."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}          # hash -> block holding those tokens
        # free blocks in reuse order: unhashed ones first, then hashed, least recently freed
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.prefix_queries = 0                     # prompt tokens looked up
        self.prefix_hits = 0                        # of which were found in the cache

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

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks of the longest cached prefix of seq's tokens, leaving at least one
        token to compute. Takes nothing."""
        if not self.enable_prefix_caching or seq.block_table:
            return []
        limit = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, limit * self.block_size)
        hits = []
        for h in seq.block_hashes[:limit]:
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    # -- accounting -----------------------------------------------------------------------

    def _cow_needed(self, seq: Sequence) -> bool:
        """Whether the block seq writes next is shared and must be copied first."""
        i = seq.num_computed // self.block_size
        return i < len(seq.block_table) and self.ref_count[seq.block_table[i]] > 1

    def blocks_needed(self, seq: Sequence, num_tokens: int, prefix: list[int] = ()) -> int:
        """Free blocks that taking `prefix` and growing seq to num_tokens tokens uses."""
        want = -(-num_tokens // self.block_size)
        fresh = max(0, want - len(seq.block_table) - len(prefix))
        revived = sum(1 for b in prefix if self.ref_count[b] == 0)  # cached but on the free list
        return fresh + revived + self._cow_needed(seq)

    def can_allocate(self, seq: Sequence, num_tokens: int, prefix: list[int] = ()) -> bool:
        return self.blocks_needed(seq, num_tokens, prefix) <= len(self.free)

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        h = self.hash_of[block]
        if h is not None:  # evict: the block is about to hold other tokens
            if self.cached.get(h) == block:
                del self.cached[h]
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def _hold(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self.free[block]
        self.ref_count[block] += 1

    def take_prefix(self, seq: Sequence, prefix: list[int]) -> None:
        """Gives a newly admitted seq the cached blocks `prefix` (from cached_prefix)
        and counts the lookup."""
        for block in prefix:
            self._hold(block)
        seq.block_table = list(prefix)
        seq.num_computed = len(prefix) * self.block_size
        seq.num_committed_blocks = len(prefix)
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed

    def allocate(self, seq: Sequence, num_tokens: int) -> list[tuple[int, int]]:
        """Grows seq's table to hold num_tokens tokens. Returns the block copies
        (src, dst) to make before the step writes: copy on write of a shared block."""
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError(f"out of KV blocks: need {self.blocks_needed(seq, num_tokens)}, "
                               f"{len(self.free)} free")
        copies = []
        if self._cow_needed(seq):
            i = seq.num_computed // self.block_size
            src = seq.block_table[i]
            dst = self._take_free()
            self.ref_count[src] -= 1  # still held by others: > 0
            seq.block_table[i] = dst
            copies.append((src, dst))
        want = -(-num_tokens // self.block_size)
        seq.block_table.extend(self._take_free() for _ in range(want - len(seq.block_table)))
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent."""
        for block in parent.block_table:
            self.ref_count[block] += 1
        child.block_table = list(parent.block_table)
        child.num_computed = parent.num_computed
        child.block_hashes = list(parent.block_hashes)
        child.num_committed_blocks = parent.num_committed_blocks

    def commit(self, seq: Sequence) -> None:
        """Enters seq's newly completed full blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed // self.block_size
        self._extend_hashes(seq, full * self.block_size)
        for i in range(seq.num_committed_blocks, full):
            block = seq.block_table[i]
            if self.hash_of[block] is not None:
                continue  # already cached (a prefix hit, or committed last step)
            h = seq.block_hashes[i]
            if h not in self.cached:  # else another block holds the same tokens: keep that one
                self.cached[h] = block
                self.hash_of[block] = h
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)

    def release(self, seq: Sequence) -> None:
        """Drops seq's hold on its blocks; the last holder frees them, tail first so a
        prefix outlives its continuations in the cache."""
        for block in reversed(seq.block_table):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free[block] = None
                if self.hash_of[block] is None:
                    self.free.move_to_end(block, last=False)
        seq.block_table = []
        seq.num_computed = seq.num_committed_blocks = 0

    # -- counters -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences."""
        return 1.0 - len(self.free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)
