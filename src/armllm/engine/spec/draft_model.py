"""draft_model: the draft-model proposer, for SpeculativeConfig's methods
draft_model (a smaller checkpoint with the target's tokenizer, in any format
armllm loads) and self_draft (the target's first draft_layers layers, then its
final norm and lm_head, sharing the target's weight arrays).

The draft runs in the engine's process, on the same kernel thread pool, through
a ModelRunner of its own: its own KV cache (one pool, no prefix cache), its
own block lists and state slots, its own workspace and batches. For each
sequence it remembers the tokens whose K/V (and a hybrid's recurrent state) it
holds. A propose call catches every drafting sequence up to its token_ids in
one batched forward (chunked within the token budget): the rows from where
those tokens and token_ids first differ, so the K/V of rejected drafts is
overwritten; the last rows give the first draft tokens, k - 1 one-row forwards
the rest. A sequence asked for no draft (k = 0) costs nothing: it catches up
when it is next asked.

A recurrent state cannot be rolled back: a hybrid draft (Qwen3.5's Gated
DeltaNet) drafts on a copy of each sequence's state in a scratch slot, so its
live state stays at the last token of token_ids, and the next call recomputes
the drafts that were kept.

Greedy and seeded requests, and those with DRY, XTC or bad words (which only the
sampling kernel runs), get argmax drafts (Draft.probs None): a point mass
leaves a seeded request's output the output without speculation, token for
token, whatever k the controller picks (with drawn drafts the draws a verify
takes depend on k, which depends on measured timings). Other sampled requests
get tokens drawn from the draft's own distribution at the request's temperature,
top-k, top-p, min-p and penalties (armllm.sampling.sampling_probs), and those distributions
in Draft.probs: rejection sampling then keeps the target's distribution exact
and accepts a draft token with probability sum(min(p, q)), the overlap of the
two distributions, where an argmax draft is accepted only with the target's
probability of that one token (at temperature 1 often far below the overlap
of a draft that models the target well)."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from armllm.engine.args import EngineArgs
from armllm.engine.runner import ModelRunner
from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.draft_batch import DraftBatch
from armllm.engine.spec.proposer import NO_DRAFT, Draft, ProposeInput, SeqKey
from armllm.model.decoder import DecoderModel
from armllm.model.kv_cache import KVCache
from armllm.model.loader import LoadedModel
from armllm.sampling import apply_penalties, sampling_probs

log = logging.getLogger("armllm")

# weight of the newest measurement in draft_seconds' moving average: about the last
# ten drafting calls count
SECONDS_EMA_WEIGHT = 0.1
# a constant of the draft's random streams (each seeded from the machine's entropy),
# apart from any stream of the target's sampler (rejection sampling needs them independent)
DRAFT_STREAM = 0x5D8AF7


def self_draft_model(target: LoadedModel, draft_layers: int | None) -> DecoderModel:
    """The target's first draft_layers layers (None: a quarter of them, at least one)
    then its final norm and lm_head, over the target's own weight arrays."""
    model, c = target.model, target.model.config
    name = f"self_draft of {target.path.name}"
    if c.encoder is not None:
        raise ValueError(f"{name}: an encoder-decoder ({c.architecture}) has no self-draft: "
                         f"its decoder's first layers alone do not model its text")
    if model.weights.lm_head is None:
        raise ValueError(f"{name}: an embedding model ({c.architecture}) has no lm_head")
    if model.comm is not None:
        raise ValueError(f"{name}: a tensor-parallel model's layers run on every rank; "
                         f"self_draft needs tensor_parallel_size 1 (or a draft_model)")
    layers = max(1, c.num_layers // 4) if draft_layers is None else draft_layers
    if not 1 <= layers <= c.num_layers:
        raise ValueError(f"{name}: draft_layers must be from 1 to the model's "
                         f"{c.num_layers} layers, got {layers}")
    linear = tuple(i for i in c.linear_layers if i < layers)
    config = dataclasses.replace(
        c, num_layers=layers, moe_layers=tuple(i for i in c.moe_layers if i < layers),
        sliding_layers=tuple(i for i in c.sliding_layers if i < layers),
        linear_layers=linear, delta_net=c.delta_net if linear else None, mtp_layers=0)
    weights = dataclasses.replace(model.weights, layers=model.weights.layers[:layers], mtp=None)
    return DecoderModel(config, weights)


def check_draft_model(draft: LoadedModel, target: LoadedModel) -> None:
    """Raises a ValueError naming the model unless both are decoders with an lm_head
    whose vocabularies agree (check_same_vocabulary)."""
    c = draft.config
    if c.encoder is not None or not c.has_lm_head:
        raise ValueError(f"draft model {draft.path}: a {c.architecture} "
                         f"{'encoder-decoder' if c.encoder else 'embedding model'} cannot "
                         f"draft text; use a decoder with an lm_head")
    if target.config.encoder is not None:
        raise ValueError(f"{target.path}: an encoder-decoder ({target.config.architecture}) "
                         f"cannot be verified against a draft model")
    check_same_vocabulary(target, draft)


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Raises a ValueError naming both models unless every token id their tokenizers
    both have is the same token, every id of the draft's tokenizer is a row of the
    target's lm_head (the target scores every draft) and every id of the target's
    tokenizer one of the draft's embeddings (the draft reads every token). Vocabularies
    padded to other sizes beyond the tokens are fine."""
    target_tokens = {i: t for t, i in target.tokenizer.get_vocab(with_added_tokens=True).items()}
    draft_tokens = {i: t for t, i in draft.tokenizer.get_vocab(with_added_tokens=True).items()}
    both = f"draft model {draft.path} and target {target.path}"
    differ = sorted(i for i, token in draft_tokens.items()
                    if i in target_tokens and target_tokens[i] != token)
    if differ:
        i = differ[0]
        raise ValueError(f"{both} have different tokenizers: {len(differ)} ids differ, e.g. "
                         f"id {i} is {draft_tokens[i]!r} in the draft, {target_tokens[i]!r} "
                         f"in the target")
    for ids, rows, which, other in ((draft_tokens, target.config.vocab_size, "draft", "target"),
                                    (target_tokens, draft.config.vocab_size, "target", "draft")):
        if ids and max(ids) >= rows:
            raise ValueError(f"{both} have different vocabularies: the {which}'s tokenizer "
                             f"has id {max(ids)} ({ids[max(ids)]!r}), beyond the {other} "
                             f"model's {rows} tokens")


@dataclass
class _SeqDraft:
    """What the draft holds of one sequence."""
    table: np.ndarray                 # [max_blocks] int32: its KV blocks (num_blocks of them)
    num_blocks: int = 0
    computed: list[int] = field(default_factory=list)   # the tokens at positions 0.. whose
                                      # K/V (and recurrent state) the draft's cache holds
    kept: int = 0                     # of which token_ids of the last call (no drafts)
    state_slot: int = -1              # a hybrid's live recurrent state slot
    rng: np.random.Generator | None = None   # its sampled drafts' draws


@dataclass
class _Job:
    """One sequence's drafting in one propose call."""
    index: int                        # of its input
    inp: ProposeInput
    seq: _SeqDraft
    k: int                            # tokens to draft
    start: int                        # the first position the catch-up computes
    scratch: int = -1                 # a hybrid's state slot to draft on (k > 1)
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)


class DraftModelProposer:
    """The Proposer of methods draft_model and self_draft (see the module docstring).
    Its KV cache holds max_num_seqs sequences of max_model_len tokens (capped by the
    draft's context), or num_blocks blocks of args.block_size tokens when given: the
    target cache's blocks plus max_num_seqs * (1 + ceil((k - 1) / block_size)) hold
    whatever the target's holds, and its drafts. A sequence that does not fit gets no
    draft until others release theirs."""

    wants_hidden = False

    def __init__(self, config: SpeculativeConfig, target: LoadedModel, args: EngineArgs,
                 max_num_seqs: int, max_model_len: int, num_blocks: int | None = None,
                 draft: LoadedModel | None = None):
        for name, value, least in (("max_num_seqs", max_num_seqs, 1),
                                   ("max_model_len", max_model_len, 2),
                                   ("num_blocks", 1 if num_blocks is None else num_blocks, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"DraftModelProposer: {name} must be an integer >= {least}, "
                                 f"got {value!r}")
        if config.method == "draft_model":
            if draft is None:
                raise ValueError(f"DraftModelProposer: method draft_model needs the loaded "
                                 f"draft model ({config.model})")
            check_draft_model(draft, target)
            self.loaded: LoadedModel | None = draft
            model = draft.model
        elif config.method == "self_draft":
            self.loaded, model = None, self_draft_model(target, config.draft_layers)
        else:
            raise ValueError(f"DraftModelProposer drafts for methods draft_model and "
                             f"self_draft, got method {config.method!r}")
        c = model.config
        # the draft proposes from the ids both models score; its probs rows are the
        # target's width
        self.vocab, self.target_vocab = min(c.vocab_size, target.config.vocab_size), \
            target.config.vocab_size
        self.model_vocab = c.vocab_size
        self.max_model_len = min(max_model_len, c.max_position_embeddings)
        bs = self.block_size = args.block_size
        self.max_blocks = -(-self.max_model_len // bs)
        num_blocks = num_blocks or max_num_seqs * self.max_blocks
        self.hybrid = bool(c.linear_layers)
        # a hybrid's state slots: max_num_seqs live ones, then as many scratch ones
        self.kv = KVCache(c, num_blocks, bs, args.kv_cache_dtype,
                          state_slots=2 * max_num_seqs if self.hybrid else 0)
        self.max_seqs = max_num_seqs
        self.max_tokens = max(args.max_num_batched_tokens, max_num_seqs)
        self.runner = ModelRunner(model, self.kv, self.max_tokens, max_num_seqs,
                                  self.max_model_len)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))   # popped lowest first
        self.free_states = list(range(max_num_seqs - 1, -1, -1)) if self.hybrid else []
        self.free_scratch = list(range(2 * max_num_seqs - 1, max_num_seqs - 1, -1)) \
            if self.hybrid else []
        self._seqs: dict[SeqKey, _SeqDraft] = {}
        self._seconds = 0.0
        self._seed_source = np.random.default_rng()
        self._batch = DraftBatch(self.max_tokens, max_num_seqs, self.max_blocks, bs)
        what = f"self-draft ({c.num_layers} of {target.config.num_layers} layers)" \
            if self.loaded is None else f"draft model {self.loaded.path}"
        log.info("speculative %s: KV cache of %d blocks of %d tokens (%.2f GiB, %s), "
                 "max_model_len %d", what, num_blocks, bs, self.kv.nbytes / 2**30,
                 args.kv_cache_dtype, self.max_model_len)

    @property
    def draft_seconds(self) -> float:
        return self._seconds

    # -- the Proposer protocol ------------------------------------------------------------

    def propose(self, inputs: list[ProposeInput]) -> list[Draft]:
        drafts = [NO_DRAFT] * len(inputs)
        jobs = [job for i, inp in enumerate(inputs) if inp.k > 0
                and (job := self._job(i, inp)) is not None]
        if not jobs:
            return drafts
        began = time.perf_counter()
        for batch in (jobs[i:i + self.max_seqs] for i in range(0, len(jobs), self.max_seqs)):
            self._catch_up(batch)
            self._draft_rest(batch)
            for job in batch:
                ids, seq = job.inp.token_ids, job.seq
                # an attention cache keeps the K/V of the drafts fed back; a recurrent
                # state stayed at the last of token_ids (the drafts ran on a copy)
                seq.computed = list(ids) if self.hybrid else [*ids, *job.tokens[:-1]]
                seq.kept = len(ids)
                if job.scratch >= 0:
                    self.free_scratch.append(job.scratch)
                drafts[job.index] = Draft(job.tokens,
                                          np.stack(job.probs) if job.probs else None)
        seconds = time.perf_counter() - began
        self._seconds = seconds if not self._seconds else \
            self._seconds + SECONDS_EMA_WEIGHT * (seconds - self._seconds)
        return drafts

    def release(self, key: SeqKey, token_ids: list[int], finished: bool) -> None:
        seq = self._seqs.pop(key, None)
        if seq is None:
            return
        self.free_blocks.extend(int(b) for b in reversed(seq.table[:seq.num_blocks]))
        if seq.state_slot >= 0:
            self.free_states.append(seq.state_slot)

    def close(self) -> None:
        self._seqs.clear()
        self.runner = self.kv = self.loaded = None

    # -- one propose call -----------------------------------------------------------------

    def _job(self, index: int, inp: ProposeInput) -> _Job | None:
        """The sequence's drafting this call, its blocks and state slot taken; None (no
        draft) when it does not fit the draft's context or cache, or holds a token the
        draft cannot read."""
        ids = inp.token_ids
        # the drafts fed back sit at positions up to len(ids) + k - 2 < max_model_len
        k = min(inp.k, self.max_model_len + 1 - len(ids))
        if k < 1 or not ids:
            return None
        seq = self._seqs.get(inp.key)
        if seq is None:
            seq = self._seqs[inp.key] = _SeqDraft(np.zeros(self.max_blocks, np.int32))
        # at least the last token runs: its logits give the first draft
        start = min(common_prefix(seq.computed, ids, seq.kept), len(ids) - 1)
        if self.hybrid and start < len(seq.computed):
            start = 0   # the state holds later tokens: recompute from a zero state
        if max(ids[start:]) >= self.model_vocab or min(ids[start:]) < 0:
            self.release(inp.key, ids, False)
            return None
        if not self._grow(seq, len(ids) + k - 1):
            return None   # nothing ran: what it holds stays valid
        if self.hybrid and seq.state_slot < 0:
            if not self.free_states:
                return None
            seq.state_slot = self.free_states.pop()
        job = _Job(index, inp, seq, k, start)
        if self.hybrid and k > 1:
            if self.free_scratch:
                job.scratch = self.free_scratch.pop()
            else:
                job.k = 1   # no copy of the state to draft further on
        if not _point_mass(inp.params) and seq.rng is None:
            seq.rng = np.random.default_rng([int(self._seed_source.integers(2**63)),
                                             inp.key[1], DRAFT_STREAM])
        return job

    def _grow(self, seq: _SeqDraft, num_tokens: int) -> bool:
        """seq's blocks cover num_tokens positions (False, changing nothing: too few free)."""
        want = -(-num_tokens // self.block_size)
        if want - seq.num_blocks > len(self.free_blocks):
            return False
        while seq.num_blocks < want:
            seq.table[seq.num_blocks] = self.free_blocks.pop()
            seq.num_blocks += 1
        return True

    def _catch_up(self, jobs: list[_Job]) -> None:
        """Computes each job's token_ids from its start, in forwards of at most
        max_tokens rows; each sequence's last row gives its first draft token."""
        pending = deque((job, job.start) for job in jobs)
        while pending:
            parts, used = [], 0
            while pending and used < self.max_tokens:
                job, start = pending.popleft()
                end = len(job.inp.token_ids)
                stop = min(end, start + self.max_tokens - used)
                parts.append((job, job.inp.token_ids[start:stop], start, stop == end))
                used += stop - start
                if stop < end:
                    pending.appendleft((job, stop))
            logits = self._forward([(job.seq, ids, start, job.seq.state_slot, last)
                                    for job, ids, start, last in parts])
            done = [job for job, _, _, last in parts if last]   # in logits-row order
            for row, job in enumerate(done):
                self._choose(job, logits[row])

    def _draft_rest(self, jobs: list[_Job]) -> None:
        """Draft tokens 2..k: one row per sequence and forward, each its last draft at
        the next position (a hybrid's on the copy of its state in its scratch slot)."""
        copies = [(job.seq.state_slot, job.scratch) for job in jobs if job.scratch >= 0]
        for j in range(1, max(job.k for job in jobs)):
            active = [job for job in jobs if job.k > j]
            logits = self._forward([(job.seq, job.tokens[-1:], len(job.inp.token_ids) + j - 1,
                                     job.scratch, True) for job in active], copies)
            copies = []
            for row, job in enumerate(active):
                self._choose(job, logits[row])

    def _forward(self, parts: list[tuple[_SeqDraft, list[int], int, int, bool]],
                 state_copies: list[tuple[int, int]] = ()) -> np.ndarray:
        """One forward of the draft: per part (sequence, its token ids, the first one's
        position, its state slot, whether its last row needs logits). Returns the logits
        rows (a view of the workspace, valid until the next forward)."""
        batch = self._batch
        batch.clear()
        for seq, ids, start, state_slot, wants_logits in parts:
            batch.add(ids, start, seq.table[:seq.num_blocks], wants_logits, state_slot)
        meta = batch.meta(with_state_slots=self.hybrid)
        return self.runner.forward(meta, (), state_copies)

    def _choose(self, job: _Job, logits: np.ndarray) -> None:
        """The job's next draft token from the draft's logits row (modified): the argmax
        for a greedy request, else a draw from the request's distribution, kept for
        Draft.probs. Penalties apply as the target's sampler applies them, with the
        drafts so far as output."""
        row, params = logits[:self.vocab], job.inp.params
        if params.repetition_penalty != 1.0 or params.presence_penalty or \
                params.frequency_penalty:
            ids, num_prompt = job.inp.token_ids, job.inp.num_prompt
            apply_penalties(row, params, ids[:num_prompt], [*ids[num_prompt:], *job.tokens])
        if _point_mass(params):
            job.tokens.append(int(np.argmax(row)))
            return
        probs = np.zeros(self.target_vocab, np.float32)
        sampling_probs(row, params, probs[:self.vocab])
        cdf = np.cumsum(probs, dtype=np.float64)
        # the first token whose interval of the cumulative mass holds the draw
        token = int(np.searchsorted(cdf, job.seq.rng.random() * cdf[-1], side="right"))
        job.tokens.append(min(token, self.vocab - 1))
        job.probs.append(probs)


def _point_mass(params) -> bool:
    """Whether a request's drafts are argmax tokens (greedy and seeded requests, and
    those with a sampler only the kernel runs: DRY, XTC, bad words, which then verifies
    them with the drafts before each as output)."""
    return params.greedy or params.seed is not None or params.kernel_only


def common_prefix(held: list[int], ids: list[int], known: int) -> int:
    """How many leading tokens `held` and `ids` share; `known`: a length the two likely
    share (checked at C speed, so only the tokens after it are compared one by one)."""
    n = min(len(held), len(ids))
    i = known if known <= n and held[:known] == ids[:known] else 0
    while i < n and held[i] == ids[i]:
        i += 1
    return i
