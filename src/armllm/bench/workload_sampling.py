"""The sampling of a benchmark's requests: the model's own defaults (its
generation_config.json or a GGUF's general.sampling.* keys, else armllm's
FALLBACK_DEFAULTS, as `armllm serve` and `LLM` apply them), overridden field by
field by --temperature, --top-p, --top-k, --min-p, --repetition-penalty or
--greedy; request i is seeded with --seed + i, so a sampled run repeats; and the
words and JSON object that state the workload beside its numbers."""
from __future__ import annotations

from dataclasses import dataclass

from armllm.sampling import (
    FALLBACK_DEFAULTS,
    MODEL_DEFAULT_FIELDS,
    SamplingParams,
    model_sampling_defaults,
)


@dataclass(frozen=True)
class WorkloadSampling:
    fields: dict                   # temperature, top_p, top_k, min_p, repetition_penalty
    defaults: str                  # where the fields the command line left come from:
    #                                "model" (its own) or "fallback" (it sets none)
    overridden: tuple[str, ...]    # the fields the command line set

    @classmethod
    def resolve(cls, generation_config: dict, overrides: dict, model: str) -> WorkloadSampling:
        """The model's defaults under the command line's (generate_cli.sampling_overrides);
        a model default SamplingParams refuses is a ValueError naming the model."""
        own = model_sampling_defaults(generation_config)
        try:
            merged = SamplingParams(**{**(own or FALLBACK_DEFAULTS), **overrides})
        except ValueError as exc:
            raise ValueError(f"{model}: the model's sampling defaults: {exc}") from None
        fields = {k: getattr(merged, k) for k in MODEL_DEFAULT_FIELDS}
        fields["top_k"] = max(fields["top_k"], 0)   # -1 and 0 both mean off
        return cls(fields, "model" if own else "fallback",
                   tuple(k for k in MODEL_DEFAULT_FIELDS if k in overrides))

    @property
    def greedy(self) -> bool:
        return self.fields["temperature"] == 0.0

    def params(self, max_tokens: int, seed: int) -> SamplingParams:
        """A benchmark request's: exactly max_tokens tokens (EOS ignored), seeded."""
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=seed, **self.fields)

    def describe(self) -> str:
        """e.g. 'sampled (temperature 0.6, top_p 0.95, top_k 20, min_p 0, repetition_penalty
        1; the model's defaults; request i seeded with --seed + i)' or 'greedy (...)'."""
        f = self.fields
        if self.greedy:
            values = f"temperature 0, repetition_penalty {f['repetition_penalty']:g}"
        else:
            values = ", ".join(f"{k} {f[k]:g}" for k in MODEL_DEFAULT_FIELDS)
        source = {"model": "the model's defaults",
                  "fallback": "armllm's fallback defaults (the model sets none)"}[self.defaults]
        if self.overridden:
            source = f"{', '.join(self.overridden)} from the command line, the rest {source}"
        seeds = "" if self.greedy else "; request i seeded with --seed + i"
        return f"{'greedy' if self.greedy else 'sampled'} ({values}; {source}{seeds})"

    def report(self) -> dict:
        """What a result's JSON holds: the fields, whether greedy, where they came from,
        and describe()'s words."""
        return {**self.fields, "greedy": self.greedy, "defaults": self.defaults,
                "from_command_line": list(self.overridden), "description": self.describe()}


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of request `index` (0-based, in the order sent) of a run."""
    return seed + index
