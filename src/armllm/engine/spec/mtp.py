"""mtp: drafting with the multi-token-prediction block a checkpoint ships beside
its layers (Qwen3.5 / Qwen3.6's mtp.* tensors, llama.cpp's nextn layer in their
GGUFs; model/weights.py's MTPWeights), the method vLLM calls "mtp".

At position p the block reads the target's last hidden state h_p (after the
target's final norm) and the embedding of the next token t_{p+1}:

    x = fc([rms_norm(embed(t_{p+1}), embed_norm) | rms_norm(h_p, hidden_norm)])
    g = rms_norm(layer(x), norm)          logits(t_{p+2}) = lm_head(g)

where layer is a full-attention decoder layer like the target's (gated
attention, its MLP or experts) with its own paged KV cache, RoPE at p, and the
three norms are Qwen3.5's (1 + w) ones (the loader adds the 1). Drafting k
tokens after the last kept position P: d_1 is the argmax of the logits at P;
each further d_{s+1} comes from one more row at position P + s whose inputs are
the previous row's g (after the block's norm, as vLLM chains it) and d_s.

Every step the block runs over every row the target computed and kept, prefill
chunks included (one forward for all sequences), so that its cache holds its K/V
at every position; then k - 1 chained one-row forwards for the sequences that
draft. The K/V written at draft positions is overwritten when the target's kept
rows reach those positions (a row attends only to positions at or before its own).
Drafts are greedy (the argmax, probs None), as vLLM drafts with MTP: rejection
sampling then accepts a draft token with the target's probability of it.

A sequence's block cache starts where the block first saw it: a prefix-cache hit
(or any gap in what it saw) starts it afresh at the first kept row, its positions
counted from there. RoPE makes attention depend only on the distance between two
positions, so that equals attending to the positions the block has seen, not to
K/V it never wrote. Qwen3.5 / 3.6 ship one MTP layer; a checkpoint with more is
refused (vLLM's predictor would run layer s mod n at draft step s, which leaves the
other layers' caches without the target's positions)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from armllm import ops
from armllm.engine.spec.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from armllm.engine.spec.draft_batch import DraftBatch
from armllm.engine.spec.proposer import NO_DRAFT, Draft, ProposeInput, SeqKey
from armllm.model import arch
from armllm.model.config import ModelConfig
from armllm.model.decoder import DecoderModel
from armllm.model.kv_cache import KVCache
from armllm.model.loader import LoadedModel
from armllm.model.weights import ModelWeights

MTP_CHECKPOINTS = ("Qwen3.5 and Qwen3.6 checkpoints (their mtp.* tensors; "
                   "mtp_num_hidden_layers in config.json) and their GGUFs from llama.cpp's "
                   "convert_hf_to_gguf.py (nextn tensors)")
DRAFT_SECONDS_WEIGHT = 0.2   # the latest call's share of the draft_seconds average


def mtp_config(c: ModelConfig) -> ModelConfig:
    """The config of a decoder whose one layer is the MTP block's: full attention,
    sparse when the model's layers are."""
    return dataclasses.replace(c, num_layers=1, linear_layers=(), delta_net=None,
                               moe_layers=(0,) if c.moe_layers else (), sliding_layers=(),
                               mtp_layers=0)


@dataclass
class _Seq:
    """One sequence's place in the block's cache."""
    base: int                  # the first position the block saw (its cache's position 0)
    seen: int                  # positions observed so far: the next kept row's, normally
    blocks: list[int] = field(default_factory=list)


@dataclass
class _Rows:
    """Rows of one sequence for a forward: positions pos0.. (true positions), the next
    token and the hidden state each reads, and whether its last row wants logits."""
    seq: _Seq
    pos0: int
    next_ids: np.ndarray       # [n] int32
    hidden: np.ndarray         # [n, hidden] float32
    logits: bool

    def part(self, first: int, count: int, last: bool) -> _Rows:
        end = first + count
        return _Rows(self.seq, self.pos0 + first, self.next_ids[first:end],
                     self.hidden[first:end], self.logits and last)


class MTPBlock:
    """The MTP block over its own KV cache and workspace: `forward` runs rows of
    several sequences (each with its positions' block table) in one call."""

    def __init__(self, target: LoadedModel, num_blocks: int, block_size: int,
                 max_tokens: int, max_seqs: int, max_model_len: int, kv_cache_dtype: str):
        c, w = target.config, target.model.weights
        mtp = w.mtp
        self.config = mtp_config(c)
        steps = arch.of(c).layer(self.config, 0)
        if tuple(mtp.layers[0].steps) != tuple(steps):
            raise ValueError(f"{target.path}: the MTP layer's steps {mtp.layers[0].steps} "
                             f"are not a full-attention layer's {steps}")
        self.mtp, self.embed = mtp, w.embed
        self.model = DecoderModel(self.config, ModelWeights(w.dtype, w.embed, mtp.layers,
                                                            mtp.norm, w.lm_head))
        self.kv = KVCache(self.config, num_blocks, block_size, kv_cache_dtype)
        self.ws = self.model.new_workspace(max_tokens, max_seqs, max_seq_len=max_model_len)
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.max_blocks = -(-max_model_len // block_size)
        h = c.hidden_size
        self._cat = np.empty((max_tokens, 2 * h), np.float32)   # [norm(embed) | norm(hidden)]
        self._fc_out = np.empty((max_tokens, h), np.float32)
        self._batch = DraftBatch(max_tokens, max_seqs, self.max_blocks, block_size)

    def forward(self, batch: list[_Rows]) -> tuple[np.ndarray, np.ndarray]:
        """The logits [R, vocab] and the block's output g [R, hidden] (after its norm)
        of the last row of each entry of `batch` that wants logits, in order (views of
        the workspace, valid until the next call). At most max_seqs entries of at most
        max_tokens rows in all; each sequence's blocks cover its rows."""
        eps, h = self.config.rms_norm_eps, self.config.hidden_size
        arrays = self._batch
        arrays.clear()
        for rows in batch:
            seq = rows.seq
            kept = arrays.add(rows.next_ids, rows.pos0 - seq.base, seq.blocks, rows.logits)
            self._cat[kept, h:] = rows.hidden
        row, r = arrays.num_rows, arrays.num_logits
        cat, embedded = self._cat[:row], self._cat[:row, :h]
        ops.embedding(arrays.ids[:row], self.embed, out=embedded)
        ops.rms_norm(embedded, self.mtp.embed_norm, eps, out=embedded)
        ops.rms_norm(cat[:, h:], self.mtp.hidden_norm, eps, out=cat[:, h:])
        x = ops.linear(cat, self.mtp.fc, out=self._fc_out[:row])
        meta = arrays.meta()
        logits = self.model.forward(meta, self.kv, self.ws, inputs=x)
        # the head leaves each logits row's input, normalized by the block's norm, here
        return logits, self.ws.selected[:r]


class MTPProposer:
    """Drafts with the target's own MTP block (see the module docstring). Its cache
    holds num_blocks blocks of block_size tokens of one layer's K/V (default:
    max_num_seqs sequences at max_model_len; the target's full-attention pool's block
    count is enough, as long as prefixes are not shared); a sequence that finds no
    free block drafts nothing that step and is seen afresh from the next.
    max_num_batched_tokens: the rows one forward runs (a step's kept rows beyond it
    run in several); kv_cache_dtype as the engine's."""

    wants_hidden = True

    def __init__(self, config: SpeculativeConfig, target: LoadedModel, max_num_seqs: int,
                 max_model_len: int, block_size: int, *, max_num_batched_tokens: int = 2048,
                 kv_cache_dtype: str = "bf16", num_blocks: int | None = None):
        if config.method != "mtp":
            raise ValueError(f"MTPProposer drafts for method mtp, got {config.method!r}")
        c = target.config
        if target.model.weights.mtp is None:
            why = (f"its config counts {c.mtp_layers} but their tensors were not loaded (a "
                   f"tensor-parallel rank loads none; a quantized copy may have dropped "
                   f"them)" if c.mtp_layers else f"this {c.architecture} checkpoint has none")
            raise ValueError(f"{target.path}: speculative method mtp drafts with the "
                             f"checkpoint's multi-token-prediction layers, and {why}; they "
                             f"come with {MTP_CHECKPOINTS}")
        if len(target.model.weights.mtp.layers) != 1:
            raise ValueError(f"{target.path}: {len(target.model.weights.mtp.layers)} MTP "
                             f"layers; armllm drafts with one (as Qwen3.5 / 3.6 ship)")
        for name, value in (("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len),
                            ("block_size", block_size),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_blocks is None:
            num_blocks = max_num_seqs * -(-max_model_len // block_size)
        self.config, self.max_model_len = config, max_model_len
        self.block = MTPBlock(target, num_blocks, block_size,
                              max(max_num_batched_tokens, max_num_seqs), max_num_seqs,
                              max_model_len, kv_cache_dtype)
        self._free = list(range(num_blocks - 1, -1, -1))   # popped from the end: 0 first
        self._seqs: dict[SeqKey, _Seq] = {}
        self._draft_seconds = 0.0

    @property
    def draft_seconds(self) -> float:
        """The observing and chained forwards of a call that drafts (an average)."""
        return self._draft_seconds

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def propose(self, inputs: list[ProposeInput]) -> list[Draft]:
        began = time.perf_counter()
        plans: list[tuple[int, _Rows, int]] = []   # (input index, observed rows, drafts)
        for i, inp in enumerate(inputs):
            plan = self._plan(inp)
            if plan is not None:
                plans.append((i, *plan))
        # the rows the target kept, every sequence's, in as few forwards as fit
        tokens: dict[int, list[int]] = {}
        hidden: dict[int, np.ndarray] = {}
        for batch in self._batches(plans):
            logits, g = self.block.forward([rows for _, rows in batch])
            r = 0
            for i, rows in batch:
                if rows.logits:
                    tokens[i] = [int(np.argmax(logits[r]))]
                    hidden[i] = g[r].copy()
                    r += 1
        # then one row a draft token, batched over the sequences still drafting
        wanted = {i: k for i, rows, k in plans if rows.logits}
        last_pos = {i: rows.pos0 + len(rows.next_ids) - 1 for i, rows, _ in plans}
        seqs = {i: rows.seq for i, rows, _ in plans}
        for s in range(1, max(wanted.values(), default=0)):
            drafting = [i for i, k in wanted.items() if k > s]
            for first in range(0, len(drafting), self.block.max_seqs):
                part = drafting[first:first + self.block.max_seqs]
                logits, g = self.block.forward([
                    _Rows(seqs[i], last_pos[i] + s, np.array(tokens[i][-1:], np.int32),
                          hidden[i][None], True) for i in part])
                for r, i in enumerate(part):
                    tokens[i].append(int(np.argmax(logits[r])))
                    hidden[i] = g[r].copy()
        if tokens:
            took = time.perf_counter() - began
            self._draft_seconds += DRAFT_SECONDS_WEIGHT * (took - self._draft_seconds)
        return [Draft(tokens[i]) if i in tokens else NO_DRAFT for i in range(len(inputs))]

    def release(self, key: SeqKey, token_ids: list[int], finished: bool) -> None:
        seq = self._seqs.pop(key, None)
        if seq is not None:
            self._free.extend(reversed(seq.blocks))

    def close(self) -> None:
        self._seqs.clear()
        self.block = None

    def _plan(self, inp: ProposeInput) -> tuple[_Rows, int] | None:
        """The rows the block runs for `inp` (None: none) and the drafts it then makes:
        the kept rows whose next token is known; drafts only when the last of them is
        the sequence's last position."""
        n = min(inp.num_kept, len(inp.token_ids) - 1 - inp.start)
        h = self.block.config.hidden_size
        if n < 1 or inp.start < 0 or inp.hidden is None or \
                inp.hidden.shape != (inp.num_kept, h):
            return None
        last = inp.start + n - 1
        k = 0
        if last == len(inp.token_ids) - 2:   # d_1 follows token_ids
            k = max(0, min(inp.k, MAX_SPECULATIVE_TOKENS, self.max_model_len - len(inp.token_ids)))
        seq = self._seqs.get(inp.key)
        if seq is None or not seq.base <= inp.start <= seq.seen:   # new, or a gap: afresh
            self.release(inp.key, inp.token_ids, False)
            seq = self._seqs[inp.key] = _Seq(inp.start, inp.start)
        # blocks for the kept rows and the draft rows after them
        if not self._grow(seq, last + max(k - 1, 0) - seq.base + 1):
            self.release(inp.key, inp.token_ids, False)
            return None
        seq.seen = last + 1
        next_ids = np.asarray(inp.token_ids[inp.start + 1:last + 2], np.int32)
        return _Rows(seq, inp.start, next_ids, inp.hidden[:n], k > 0), k

    def _grow(self, seq: _Seq, num_tokens: int) -> bool:
        """Blocks for the sequence's first num_tokens cache positions; False when the
        pool (or the block table) has too few."""
        need = -(-num_tokens // self.block.kv.block_size) - len(seq.blocks)
        if need > len(self._free) or num_tokens > self.block.max_blocks * \
                self.block.kv.block_size:
            return False
        for _ in range(need):
            seq.blocks.append(self._free.pop())
        return True

    def _batches(self, plans: list[tuple[int, _Rows, int]]
                 ) -> Iterator[list[tuple[int, _Rows]]]:
        """The plans' rows in forwards of at most max_tokens rows and max_seqs
        sequences; a sequence's rows that do not fit go on in the next forward."""
        batch: list[tuple[int, _Rows]] = []
        used = 0
        for i, rows, _ in plans:
            n, done = len(rows.next_ids), 0
            while done < n:
                take = min(n - done, self.block.max_tokens - used)
                batch.append((i, rows.part(done, take, done + take == n)))
                used, done = used + take, done + take
                if used == self.block.max_tokens or len(batch) == self.block.max_seqs:
                    yield batch
                    batch, used = [], 0
        if batch:
            yield batch

