"""state_pool: which recurrent-state slots each sequence holds, and the state
checkpoints the prefix cache keeps (plain Python).

A hybrid model's recurrent layers (Qwen3.5's Gated DeltaNet) keep, per
sequence, a fixed-size state instead of KV blocks (model/kv_cache.py's state
pool). A running sequence holds one live slot. A forked completion takes its
own, a copy of its parent's.

The prefix cache serves a hybrid's prompt only from a checkpoint: the state
after a prefix's first `interval` * j tokens, kept in a slot of its own under
the chained hash of the prefix's last block (engine/block_manager.py), least
recently used first to go. A sequence whose computed tokens reach a multiple
of `interval` checkpoints its live state there; the scheduler ends a prefill
chunk at each such boundary (step_limit), so a hit starts where a miss's
chunk did and computes the rest exactly as the miss did, bit for bit.

Copies between slots are not made here: copies() hands them, in order, to
the next step, which makes them before any layer runs. With the prefix
cache on disk, `evicting(key, slot)` is told of a checkpoint before its slot
is reused, and load() puts a checkpoint read from disk in a slot of its own."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class StatePool:
    """`live` slots for running sequences (ids 0..live-1) and `checkpoints` slots
    (the ids after) for states at multiples of `interval` tokens (0: none)."""

    evicting: Callable[[bytes, int], None] | None = None

    def __init__(self, live: int, checkpoints: int = 0, interval: int = 0):
        if live < 1 or checkpoints < 0 or (checkpoints and interval < 1):
            raise ValueError(f"a state pool needs >= 1 live slot, >= 0 checkpoints and an "
                             f"interval >= 1 for them, got {live}, {checkpoints}, {interval}")
        self.live, self.interval = live, interval if checkpoints else 0
        self.free = list(range(live - 1, -1, -1))          # popped lowest first
        self.free_checkpoints = list(range(live + checkpoints - 1, live - 1, -1))
        self.saved: OrderedDict[bytes, int] = OrderedDict()  # prefix key -> slot, LRU first
        self.pending: list[tuple[int, int]] = []            # (src, dst) for the next step

    @property
    def num_slots(self) -> int:
        """Every slot, live and checkpoint: the state pool's size."""
        return self.live + len(self.free_checkpoints) + len(self.saved)

    def take(self) -> int | None:
        """A free live slot, or None when every one is held."""
        return self.free.pop() if self.free else None

    def give_back(self, slot: int) -> None:
        self.free.append(slot)

    def copy(self, src: int, dst: int) -> None:
        """dst's state becomes src's before the next step runs."""
        self.pending.append((src, dst))

    def copies(self) -> list[tuple[int, int]]:
        """The copies asked for since the last call, in order."""
        copies, self.pending = self.pending, []
        return copies

    # -- checkpoints ----------------------------------------------------------------------

    def step_limit(self, num_computed: int) -> int | None:
        """The most tokens a sequence with num_computed tokens may compute this step so
        that it stops at the next checkpoint boundary (None: no limit)."""
        if not self.interval:
            return None
        return self.interval - num_computed % self.interval

    def is_boundary(self, num_tokens: int) -> bool:
        return bool(self.interval) and num_tokens > 0 and num_tokens % self.interval == 0

    def save(self, key: bytes, src: int) -> None:
        """Checkpoints live slot src's state under key (a state already saved there is
        only refreshed); the least recently used checkpoint makes room."""
        if key in self.saved:
            self.saved.move_to_end(key)
            return
        slot = self._checkpoint_slot()
        if slot is None:
            return
        self.saved[key] = slot
        self.copy(src, slot)

    def _checkpoint_slot(self) -> int | None:
        """A free checkpoint slot, else the least recently used checkpoint's (told to
        `evicting` first if its state is in the slot, not still a pending copy)."""
        if self.free_checkpoints:
            return self.free_checkpoints.pop()
        if not self.saved:
            return None
        key, slot = self.saved.popitem(last=False)
        if self.evicting is not None and self.settled(slot):
            self.evicting(key, slot)
        return slot

    def settled(self, slot: int) -> bool:
        """Whether slot holds its state now (no pending copy writes it)."""
        return all(dst != slot for _, dst in self.pending)

    def load(self, key: bytes, fill: Callable[[int], None]) -> int | None:
        """Saves a checkpoint read from elsewhere under key: fill(slot) writes its
        state into the slot it takes, now rather than as a pending copy, so the slot
        is one no pending copy reads or writes (a free one, else the least recently
        used such checkpoint's); None when there is none."""
        busy = {slot for pair in self.pending for slot in pair}
        if self.free_checkpoints:
            slot = self.free_checkpoints.pop()
        else:
            old = next((k for k, s in self.saved.items() if s not in busy), None)
            if old is None:
                return None
            slot = self.saved.pop(old)
            if self.evicting is not None:
                self.evicting(old, slot)
        fill(slot)
        self.saved[key] = slot
        return slot

    def find(self, key: bytes) -> int | None:
        """The checkpoint saved under key (now the most recently used), or None."""
        slot = self.saved.get(key)
        if slot is not None:
            self.saved.move_to_end(key)
        return slot
