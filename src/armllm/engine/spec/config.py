"""config: SpeculativeConfig, what --speculative-config says (vLLM's spelling: a
JSON object such as '{"method": "ngram", "num_speculative_tokens": 4}'),
validated where it enters. Light: it loads neither numpy nor the kernels."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

# method -> what it proposes from
METHODS = {
    "ngram": "the longest earlier match of the last tokens in the prompt and output",
    "suffix": "a suffix tree over this request and recent requests' outputs",
    "draft_model": "a smaller checkpoint with the same tokenizer (`model`)",
    "self_draft": "the target's first `draft_layers` layers and its head (no extra weights)",
    "mtp": "the checkpoint's own multi-token-prediction layers (Qwen3.5/3.6)",
}
MAX_SPECULATIVE_TOKENS = 16  # verify rows per sequence and step the workspace is sized for


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int = 4            # most draft tokens per sequence and step
    model: str | None = None                   # draft_model: its path or hub name
    prompt_lookup_max: int = 4                 # ngram: longest suffix matched
    prompt_lookup_min: int = 2                 # ngram: shortest
    suffix_decoding_max_tree_depth: int = 24   # suffix: longest context + draft kept
    suffix_decoding_max_cached_requests: int = 1000   # suffix: finished outputs kept
    suffix_decoding_max_spec_factor: float = 1.0      # suffix: draft <= factor * match length
    suffix_decoding_min_token_prob: float = 0.1       # suffix: a token's share to be drafted
    draft_layers: int | None = None            # self_draft: target layers run (None: a quarter)
    # no speculation in a step with more running sequences than this (None: decided by
    # the measured cost of verify rows alone)
    disable_by_batch_size: int | None = None

    def __post_init__(self):
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"speculative_config: {name} {why}, got "
                              f"{getattr(self, name)!r}")
        if self.method not in METHODS:
            raise bad("method", f"must be one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if not _is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise bad("num_speculative_tokens", f"must be an integer from 1 to "
                      f"{MAX_SPECULATIVE_TOKENS}")
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise bad("model", "must name the draft checkpoint for method draft_model")
        if self.method != "draft_model" and self.model is not None:
            raise bad("model", f"is only for method draft_model (method is {self.method})")
        for name in ("prompt_lookup_max", "prompt_lookup_min",
                     "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise bad(name, "must be a positive integer")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise bad("prompt_lookup_min", f"must be <= prompt_lookup_max "
                      f"({self.prompt_lookup_max})")
        if not (isinstance(self.suffix_decoding_max_spec_factor, (int, float))
                and self.suffix_decoding_max_spec_factor > 0):
            raise bad("suffix_decoding_max_spec_factor", "must be > 0")
        if not (isinstance(self.suffix_decoding_min_token_prob, (int, float))
                and 0 <= self.suffix_decoding_min_token_prob <= 1):
            raise bad("suffix_decoding_min_token_prob", "must be in [0, 1]")
        if self.draft_layers is not None and (not _is_int(self.draft_layers)
                                              or self.draft_layers < 1):
            raise bad("draft_layers", "must be a positive integer")
        if self.disable_by_batch_size is not None and (
                not _is_int(self.disable_by_batch_size) or self.disable_by_batch_size < 1):
            raise bad("disable_by_batch_size", "must be a positive integer")

    @classmethod
    def parse(cls, value: str | dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From --speculative-config's JSON text, a dict of the same fields, or a
        SpeculativeConfig; None stays None. Raises ValueError naming what is wrong."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config must be a JSON object such as "
                                 f'\'{{"method": "ngram", "num_speculative_tokens": 4}}\', '
                                 f"got {value!r} ({exc.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        if "method" not in value:
            raise ValueError(f"speculative_config needs a method ({', '.join(METHODS)})")
        return cls(**value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
