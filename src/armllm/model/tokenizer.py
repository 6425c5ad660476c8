"""tokenizer: text <-> token ids for a loaded model, and Hugging Face style
chat templates (Jinja, sandboxed). Turning a growing completion into text
deltas is engine/completion.py's IncrementalDetokenizer."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' tojson for chat templates: plain JSON (Jinja's own escapes HTML
    characters and sorts keys), as the model saw its tools and tool calls in training."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


# what apply_chat_template passes to the template itself (its arguments and the
# environment's globals): extra template variables may not replace them
TEMPLATE_OWN_NAMES = frozenset({"messages", "add_generation_prompt", "continue_final_message",
                                "bos_token", "eos_token", "raise_exception", "strftime_now"})


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any]):
        self.tokenizer, self.config = tokenizer, config
        self.chat_template = config.get("chat_template")
        if isinstance(self.chat_template, list):  # [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in self.chat_template}
            self.chat_template = named.get("default") or next(iter(named.values()), None)
        self.bos_token = self._token_text(config.get("bos_token"))
        self.eos_token = self._token_text(config.get("eos_token"))
        self.add_bos = bool(config.get("add_bos_token", False))
        self._template = None

    @staticmethod
    def _token_text(value: Any) -> str | None:
        return value.get("content") if isinstance(value, dict) else value

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tokenizer.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.token_id(self.bos_token)
        if add_special_tokens and self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]  # tokenizer.json without a post-processor: add BOS as HF would
        return ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """A text pair (a reranker's query and document) as the tokenizer's
        post-processor joins them (transformers' tokenizer(first, second))."""
        ids = self.tokenizer.encode(first, pair=second, add_special_tokens=True).ids
        bos = self.token_id(self.bos_token)
        if self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **kwargs: Any) -> str:
        """The prompt text for a conversation, as HF's apply_chat_template renders it;
        kwargs are extra template variables (none may be one of TEMPLATE_OWN_NAMES)."""
        clash = sorted(TEMPLATE_OWN_NAMES & kwargs.keys())
        if clash:
            raise ValueError(f"chat template variables {', '.join(clash)} cannot be set: "
                             "the template call sets them itself")
        if not self.chat_template:
            raise ValueError("this model has no chat template (tokenizer_config.json "
                             "chat_template); use a plain prompt")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"messages[{i}] must be an object with a role")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt exclude each other")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = _tojson
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        try:
            text = self._template.render(messages=messages, bos_token=self.bos_token or "",
                                         eos_token=self.eos_token or "",
                                         add_generation_prompt=add_generation_prompt, **kwargs)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None
        if continue_final_message:
            final = messages[-1].get("content")
            if isinstance(final, str) and final.strip() and final.strip() in text:
                text = text[:text.rindex(final.strip()) + len(final.strip())]
        return text
