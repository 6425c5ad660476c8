"""response_output: a response's output items (Responses API) built as the
completion arrives, and the events that say so.

Fed the reasoning text, the answer's text and the whole tool calls in the order
the model writes them (a stream's deltas, or a finished completion's parts),
Output keeps the items (reasoning, message, function_call) and the events a
stream sends for them: an item is added, its content part added, its text
arrives as deltas, then the part and the item are done. A new kind of output
closes the item before it. Text that is only white space is held until more
text follows (so the blank between calls opens no message); a response with
no message and no call still gets a message (empty, or that white space).
`as_message()` is the turn as a chat message, for a continued conversation."""
from __future__ import annotations

import uuid


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Output:
    def __init__(self, encrypted_reasoning: bool = False):
        self.items: list[dict] = []          # every item added, in order
        self._encrypted = encrypted_reasoning   # reasoning also in encrypted_content
        self._open: dict | None = None       # the item whose text is arriving
        self._space = ""                     # white space not yet given to a message
        self._events: list[tuple[str, dict]] = []
        self._closed = False

    def take_events(self) -> list[tuple[str, dict]]:
        """The events since last asked: (type, fields) pairs."""
        events, self._events = self._events, []
        return events

    # -- what the completion writes ------------------------------------------------------

    def reasoning(self, text: str) -> None:
        if not text:
            return
        if self._open is None or self._open["type"] != "reasoning":
            self._open_item({"type": "reasoning", "summary": [], "content": []},
                            {"type": "reasoning_text", "text": ""})
        self._append(text, "response.reasoning_text.delta")

    def text(self, text: str) -> None:
        if not text:
            return
        if self._open is None or self._open["type"] != "message":
            if not text.strip():
                self._space += text
                return
            text, self._space = self._space + text, ""
            self._open_item({"type": "message", "role": "assistant", "content": []},
                            {"type": "output_text", "text": "", "annotations": []})
        self._append(text, "response.output_text.delta")

    def call(self, call: dict) -> None:
        """A whole tool call ({"id", "function": {"name", "arguments"}})."""
        self._close_open(incomplete=False)
        self._space = ""
        fn = call["function"]
        item = {"id": _item_id("fc"), "type": "function_call", "call_id": call["id"],
                "name": fn["name"], "arguments": "", "status": "in_progress"}
        index = self._add(item)
        self._event("response.function_call_arguments.delta", item_id=item["id"],
                    output_index=index, delta=fn["arguments"])
        item["arguments"] = fn["arguments"]
        self._event("response.function_call_arguments.done", item_id=item["id"],
                    output_index=index, name=fn["name"], arguments=fn["arguments"])
        item["status"] = "completed"
        self._event("response.output_item.done", output_index=index, item=_copy(item))

    def close(self, incomplete: bool) -> None:
        """The completion has ended (incomplete: cut by its token limit)."""
        if self._closed:
            return
        self._closed = True
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            self._close_open(incomplete)
            self._open_item({"type": "message", "role": "assistant", "content": []},
                            {"type": "output_text", "text": "", "annotations": []})
            if self._space:
                self._append(self._space, "response.output_text.delta")
        self._close_open(incomplete)

    # -- the turn, for a continued conversation --------------------------------------------

    def as_message(self) -> dict:
        """The output as one assistant chat message: its text, its calls (arguments as
        JSON text) and its reasoning."""
        message: dict = {"role": "assistant", "content": ""}
        reasoning, calls = [], []
        for item in self.items:
            if item["type"] == "message":
                message["content"] += item["content"][0]["text"]
            elif item["type"] == "reasoning":
                reasoning.append(item["content"][0]["text"])
            else:
                calls.append({"id": item["call_id"], "type": "function",
                              "function": {"name": item["name"],
                                           "arguments": item["arguments"]}})
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        return message

    # -- items and their events ----------------------------------------------------------

    def _open_item(self, item: dict, part: dict) -> None:
        self._close_open(incomplete=False)
        item = {"id": _item_id("rs" if item["type"] == "reasoning" else "msg"), **item,
                "status": "in_progress"}
        index = self._add(item)
        item["content"].append(part)
        self._event("response.content_part.added", item_id=item["id"], output_index=index,
                    content_index=0, part=dict(part))
        self._open = item

    def _append(self, text: str, kind: str) -> None:
        item = self._open
        item["content"][0]["text"] += text
        extra = {"logprobs": []} if kind == "response.output_text.delta" else {}
        self._event(kind, item_id=item["id"], output_index=self.items.index(item),
                    content_index=0, delta=text, **extra)

    def _close_open(self, incomplete: bool) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index = self.items.index(item)
        part = item["content"][0]
        done = "response.reasoning_text.done" if item["type"] == "reasoning" \
            else "response.output_text.done"
        extra = {"logprobs": []} if item["type"] == "message" else {}
        self._event(done, item_id=item["id"], output_index=index, content_index=0,
                    text=part["text"], **extra)
        self._event("response.content_part.done", item_id=item["id"], output_index=index,
                    content_index=0, part=dict(part))
        item["status"] = "incomplete" if incomplete else "completed"
        if item["type"] == "reasoning" and self._encrypted:
            item["encrypted_content"] = part["text"]
        self._event("response.output_item.done", output_index=index, item=_copy(item))

    def _add(self, item: dict) -> int:
        self.items.append(item)
        added = _copy(item)
        if "content" in added:
            added["content"] = []
        self._event("response.output_item.added", output_index=len(self.items) - 1,
                    item=added)
        return len(self.items) - 1

    def _event(self, kind: str, **fields) -> None:
        self._events.append((kind, fields))


def _copy(item: dict) -> dict:
    """An item as it stands now (its content parts copied too)."""
    copy = dict(item)
    if "content" in copy:
        copy["content"] = [dict(part) for part in copy["content"]]
    return copy
