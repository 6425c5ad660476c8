"""sample_words: a request's DRY sequence breakers and bad words, strings, as the
token-id sequence lists the sampling kernel reads (ops.sequence_list, sample.h),
made once per distinct list of strings for the engine's tokenizer.

- DRY breakers, as llama.cpp turns them into tokens: a token whose text holds the
  breaker is a breaker of one token; a token whose text ends with a proper prefix
  of the breaker heads a breaker whose tail is the rest of the breaker's text,
  tokenized (at most MAX_BREAKER_TAIL tokens). A breaker is cut to
  MAX_BREAKER_CHARS characters first. Texts are each token decoded alone.
- bad words, as vLLM tokenizes them: each word (its leading spaces stripped)
  alone and after one space, without special tokens; the spaced form only where
  it is as long as the plain one and starts with another token."""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import numpy as np

from armllm import ops
from armllm.model.tokenizer import TextTokenizer

# llama.cpp's bounds on a breaker: its characters, and the tokens of its tail
MAX_BREAKER_CHARS = 40
MAX_BREAKER_TAIL = 20
# distinct lists of breakers or bad words whose sequence lists are kept
CACHED_LISTS = 64


class SampleWords:
    """The sequence lists of one tokenizer's requests, for ids below vocab_size (the
    model's logits; a tokenizer id at or past it is refused)."""

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._texts: list[str] | None = None
        self._by_last_char: dict[str, list[int]] = {}
        self.breakers = lru_cache(CACHED_LISTS)(self._breakers)
        self.bad_words = lru_cache(CACHED_LISTS)(self._bad_words)

    def _encode(self, text: str, name: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        bad = next((t for t in ids if t >= self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"{name} {text!r} has token id {bad}, outside the model's "
                             f"vocabulary [0, {self.vocab_size})")
        return ids

    def _token_texts(self) -> list[str]:
        """Every token's text, decoded alone (the tokenizer's batch decode, once)."""
        if self._texts is None:
            ids = [[t] for t in range(self.vocab_size)]
            self._texts = self.tokenizer.tokenizer.decode_batch(ids, skip_special_tokens=False)
            by_last: dict[str, list[int]] = defaultdict(list)
            for t, text in enumerate(self._texts):
                if text:
                    by_last[text[-1]].append(t)
            self._by_last_char = dict(by_last)
        return self._texts

    def _breakers(self, breakers: tuple[str, ...]) -> np.ndarray:
        """The DRY breakers' sequence list (see the module docstring)."""
        texts = self._token_texts()
        seqs: set[tuple[int, ...]] = set()
        for breaker in breakers:
            breaker = breaker[:MAX_BREAKER_CHARS]
            seqs.update((t,) for t, text in enumerate(texts) if breaker in text)
            for cut in range(1, len(breaker)):   # a token ending with breaker[:cut]
                head, tail = breaker[:cut], breaker[cut:]
                tail_ids = None
                for t in self._by_last_char.get(head[-1], ()):
                    if texts[t].endswith(head) and breaker not in texts[t]:
                        if tail_ids is None:
                            tail_ids = tuple(self._encode(tail, "dry_sequence_breakers")
                                             [:MAX_BREAKER_TAIL])
                        seqs.add((t, *tail_ids))
        return ops.sequence_list(seqs)

    def _bad_words(self, words: tuple[str, ...]) -> np.ndarray:
        """The bad words' sequence list (see the module docstring)."""
        seqs: list[list[int]] = []
        for word in words:
            plain = self._encode(word.lstrip(), "bad_words")
            spaced = self._encode(" " + word.lstrip(), "bad_words")
            seqs += [s for s in (plain,) if s]
            if spaced and plain and spaced[0] != plain[0] and len(spaced) == len(plain):
                seqs.append(spaced)
        return ops.sequence_list(seqs)
