"""block_manager: which KV-cache blocks each sequence owns (plain Python).

Blocks are handed out from a free list and returned when a sequence
finishes or is preempted; block ids index the KV cache's first dimension."""
from __future__ import annotations

from collections import deque

from armllm.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks for seq to hold num_tokens tokens."""
        want = -(-num_tokens // self.block_size)
        return max(0, want - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self.free)} free")
        seq.block_table.extend(self.free.popleft() for _ in range(need))

    def release(self, seq: Sequence) -> None:
        self.free.extend(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0

    @property
    def num_free(self) -> int:
        return len(self.free)
