"""args: EngineArgs, the engine's settings, validated where they enter, and their
command-line flags. Each field is written once, with its default and help; every
armllm subcommand that loads a model gets its flags from here (add_cli_args) and
builds its EngineArgs from the parsed flags (from_cli_args).

This module stays light (it loads neither the engine nor the kernels), so that
building the command line's parser loads nothing heavier."""
from __future__ import annotations

import argparse
import os
import typing
from dataclasses import dataclass, field, fields

from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.topology import rank_cpus
from armllm.model.quantize import SCHEME_NAMES, parse_scheme
from armllm.model.reasoning import REASONING_PARSERS
from armllm.model.score_head import parse_score_tokens, read_score_template

WEIGHT_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "float32": "f32",
                 "f32": "f32"}
KV_CACHE_DTYPES = ("bf16", "f32", "int8")
QUANTIZATION_CHOICES = ("auto", "none", *SCHEME_NAMES)
MAX_THREADS = 4096  # what the kernel thread pool accepts
MAX_RANKS = 64     # tensor-parallel ranks the all-reduce segment holds (comm.h)
# what only a server honours: replicas serve concurrent requests (AsyncLLM)
SERVER_ONLY = ("data_parallel_size",)
DEFAULT_KV_FRACTION = 0.4  # of available memory after the weights, when kv_cache_gib is unset


def _flag(default, help: str, **argparse_kwargs):
    """A field with its command-line help and argparse options (choices, metavar),
    plus `unset`: what a default of None means, and `flag`: the name of a default-on
    switch's --no-... flag."""
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass
class EngineArgs:
    """The engine's settings; each field is also the flag --field-name (a default-on
    switch: the --no-... flag named in its metadata)."""

    dtype: str = _flag(
        "auto", "weight precision (auto = bfloat16); with --quantization, of the weights "
        "left unquantized", choices=("auto", "bfloat16", "float32"))
    quantization: str = _flag(
        "auto", "linear layers: auto = as the checkpoint stores them (GGUF Q8_0/Q4_x, "
        "compressed-tensors) else --dtype; none = all in --dtype; a scheme quantizes at load "
        "(w8a8: int8 per channel; w4a8: int4 group 32; -asym: activations with zero points; "
        f"all: {', '.join(SCHEME_NAMES)})", choices=QUANTIZATION_CHOICES, metavar="SCHEME")
    quantize_lm_head: bool = _flag(
        False, "quantize a float lm_head with the scheme too (under auto a quantized one, "
        "e.g. a GGUF's Q8_0 token embedding, runs as is)")
    score_from_tokens: str | None = _flag(
        None, "serve a causal reranker (Qwen3-Reranker): its relevance score is "
        "sigmoid(logit(TRUE) - logit(FALSE)) at the prompt's last token, and only those "
        "two rows of its lm_head are loaded", metavar="FALSE,TRUE",
        unset="a reranker is a one-label sequence classifier or a GGUF of pooling type rank")
    score_template: str | None = _flag(
        None, "a reranker's prompt: text or a file holding {query} and {document} "
        "(Qwen3-Reranker's instruction format)", metavar="TEMPLATE",
        unset="a GGUF's tokenizer.chat_template.rerank, else the tokenizer's pair encoding")
    max_model_len: int | None = _flag(
        None, "tokens per sequence, prompt + output", metavar="TOKENS",
        unset="the model's context, capped by the KV cache")
    kv_cache_gib: float | None = _flag(
        None, "KV cache size", metavar="GIB",
        unset=f"--max-num-seqs sequences at full length, within {DEFAULT_KV_FRACTION:.0%} of "
              "the memory left after the weights")
    kv_cache_dtype: str = _flag("bf16", "KV cache precision (int8: a bf16 scale per token "
                                "and head, about half bf16's memory)", choices=KV_CACHE_DTYPES)
    block_size: int = _flag(16, "tokens per KV cache block", metavar="TOKENS")
    max_num_seqs: int = _flag(32, "sequences decoded together in one step", metavar="N")
    max_num_batched_tokens: int = _flag(
        2048, "token rows per engine step (prompt chunks + decodes)", metavar="TOKENS")
    enable_prefix_caching: bool = _flag(
        True, "do not reuse the KV cache of earlier prompts' shared prefixes",
        flag="--no-prefix-caching")
    prefix_cache_dir: str | None = _flag(
        None, "keep the prefix cache's blocks in this folder too, so they outlive the "
        "process: blocks evicted from memory and all cached blocks at shutdown are written "
        "there, and a prompt whose prefix is there loads it instead of computing it (one "
        "folder per model, weight format and KV dtype)", metavar="DIR", unset="off")
    prefix_cache_gib: float = _flag(
        16.0, "the most the --prefix-cache-dir files take; the least recently used go "
        "first", metavar="GIB")
    threads: int | None = _flag(
        None, "kernel threads, one count per process (per rank with tensor parallel)",
        metavar="N", unset="$ARMLLM_NUM_THREADS, else the CPUs this process (rank) may "
        "run on")
    tensor_parallel_size: int = _flag(
        1, "ranks (processes) the model is split over by heads and MLP columns, one per "
        "NUMA node by default, communicating through shared memory", metavar="N",
        aliases=("-tp",))
    data_parallel_size: int = _flag(
        1, "independent engine replicas (processes, each of --tensor-parallel-size ranks) "
        "behind one server, one per NUMA node by default; each request goes to the least "
        "loaded, or to one whose prefix cache holds its first blocks (AsyncLLM and serve)",
        metavar="N", aliases=("-dp",))
    cpus: str | None = _flag(
        None, "each rank's CPUs (tensor-parallel ranks of each data-parallel replica in "
        "turn), separated by |, e.g. '0-47|48-95'", metavar="LISTS",
        unset="one NUMA node's CPUs per rank (a node shared by several ranks is split "
        "between them)")
    reasoning_parser: str | None = _flag(
        None, "a reasoning model's thinking goes to reasoning_content, its answer to content "
        "(qwen3: <think>...</think>; deepseek_r1: the template opens <think>; harmony: "
        "GPT-OSS's analysis channel); structured outputs constrain the answer only",
        choices=REASONING_PARSERS, unset="harmony for GPT-OSS tokenizers, else none")
    speculative_config: str | dict | None = _flag(
        None, "speculative decoding, as vLLM spells it: a JSON object with method (ngram, "
        "suffix, draft_model, self_draft, mtp), num_speculative_tokens (the most drafted per "
        "step; fewer where acceptance or the batch makes drafting not pay), model (draft_model's "
        "checkpoint) and the method's options, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 4}\'', metavar="JSON",
        unset="off")

    def __post_init__(self):
        if self.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_model_len is not None and (not _is_int(self.max_model_len)
                                               or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2, got "
                             f"{self.max_model_len!r}")
        if self.kv_cache_gib is not None and not (isinstance(self.kv_cache_gib, (int, float))
                                                  and self.kv_cache_gib > 0):
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib!r}")
        if self.quantization != "auto":
            parse_scheme(self.quantization)  # raises ValueError naming the value
        if self.prefix_cache_dir is not None:
            if not isinstance(self.prefix_cache_dir, (str, os.PathLike)) or \
                    not str(self.prefix_cache_dir):
                raise ValueError(f"prefix_cache_dir must be a folder path, got "
                                 f"{self.prefix_cache_dir!r}")
            if not self.enable_prefix_caching:
                raise ValueError("prefix_cache_dir needs prefix caching (it was turned off)")
        if not isinstance(self.prefix_cache_gib, (int, float)) or isinstance(
                self.prefix_cache_gib, bool) or not self.prefix_cache_gib > 0:
            raise ValueError(f"prefix_cache_gib must be > 0, got {self.prefix_cache_gib!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        parse_score_tokens(self.score_from_tokens)   # raises ValueError naming the value
        read_score_template(self.score_template)
        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        if not _is_int(self.tensor_parallel_size) or not \
                1 <= self.tensor_parallel_size <= MAX_RANKS:
            raise ValueError(f"tensor_parallel_size must be an integer from 1 to {MAX_RANKS}, "
                             f"got {self.tensor_parallel_size!r}")
        if not _is_int(self.data_parallel_size) or not \
                1 <= self.data_parallel_size <= MAX_RANKS:
            raise ValueError(f"data_parallel_size must be an integer from 1 to {MAX_RANKS}, "
                             f"got {self.data_parallel_size!r}")
        if self.cpus is not None:
            if not isinstance(self.cpus, str):
                raise ValueError(f"cpus must be a string such as '0-47|48-95', got "
                                 f"{self.cpus!r}")
            # raises naming the value
            rank_cpus(self.tensor_parallel_size * self.data_parallel_size, self.cpus, [])
        SpeculativeConfig.parse(self.speculative_config)   # raises naming the value
        if self.threads is not None and (not _is_int(self.threads)
                                         or not 1 <= self.threads <= MAX_THREADS):
            raise ValueError(f"threads must be an integer from 1 to {MAX_THREADS}, got "
                             f"{self.threads!r}")

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                     unset: dict[str, str] | None = None) -> None:
        """Adds a flag per field to an "engine" group of `parser`, except the fields
        named in `exclude` (which a subcommand cannot honour). `unset` rewords what
        an unset flag means in this subcommand, for fields whose default is None.
        A subcommand with another default value sets it with parser.set_defaults()."""
        group = parser.add_argument_group("engine")
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in exclude:
                continue
            meta = dict(f.metadata)
            help_text = meta.pop("help")
            flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
            aliases = meta.pop("aliases", ())
            unset_note = meta.pop("unset", None)
            if unset and f.name in unset:
                unset_note = unset[f.name]
            kind = _base_type(hints[f.name])
            if kind is bool:
                action = "store_false" if f.default else "store_true"
                group.add_argument(flag, dest=f.name, action=action, default=f.default,
                                   help=help_text)
                continue
            note = "%(default)s" if f.default is not None else unset_note.replace("%", "%%")
            group.add_argument(flag, *aliases, dest=f.name, type=kind, default=f.default,
                               help=f"{help_text} (default: {note})", **meta)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The EngineArgs of parsed flags (excluded ones keep their defaults); raises
        ValueError naming a bad value."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)
                      if hasattr(args, f.name)})


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _base_type(hint) -> type:
    """int for `int | None`, and so on."""
    options = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return options[0]
