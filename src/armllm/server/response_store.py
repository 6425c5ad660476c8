"""response_store: the Responses API's stored responses (`store: true`, the
default): each response as it was answered and the conversation it ends (the
chat messages a `previous_response_id` continues from), in memory, bounded by a
count and an age (`--responses-store-size`, `--responses-store-ttl-s`). The
oldest entry goes first when the count is full; an entry past its age is gone
when next looked at. Evictions (either way) are counted for /metrics. Safe
from any thread: the event loop is the only writer today, but the lock costs
nothing beside a generation."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class StoredResponse:
    response: dict          # the response object, as GET /v1/responses/{id} answers it
    messages: list[dict]    # the conversation it ends: its input (no instructions) and output
    stored_at: float        # time.monotonic()


class ResponseStore:
    def __init__(self, max_entries: int, max_age_s: float):
        if max_entries < 0 or max_age_s <= 0:
            raise ValueError(f"the responses store needs a size >= 0 and an age > 0 s, got "
                             f"{max_entries} and {max_age_s}")
        self.max_entries, self.max_age_s = max_entries, max_age_s
        self.evictions = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, response: dict, messages: list[dict]) -> None:
        """Stores a response (nothing when the size is 0), evicting the oldest beyond
        the size."""
        with self._lock:
            if self.max_entries == 0:
                return
            self._entries[response_id] = StoredResponse(response, messages, time.monotonic())
            self._entries.move_to_end(response_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evictions += 1

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Whether the response was there (and is now gone)."""
        with self._lock:
            self._expire()
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    def _expire(self) -> None:
        """Drops the entries past their age (the oldest are first)."""
        cutoff = time.monotonic() - self.max_age_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.stored_at > cutoff:
                break
            del self._entries[key]
            self.evictions += 1
