"""suffix: suffix decoding (vLLM's `suffix` method, after Arctic Inference's
SuffixDecoding, arXiv 2411.04975). Two suffix trees (suffix_tree.py), cut at
suffix_decoding_max_tree_depth tokens: one per running request over its prompt and
output, and one shared over the outputs of recently finished requests (at most
suffix_decoding_max_cached_requests, the oldest dropped first). Each step, every
suffix of the context that occurs earlier in a tree is a candidate match; from each
the draft follows the most frequent continuation, at most
suffix_decoding_max_spec_factor x the match length and k tokens long, and stops
before a token whose estimated probability (the product of the count shares along
its path) is under suffix_decoding_min_token_prob. The candidate whose tokens'
probabilities sum highest wins (the request's own tree, then the longer match, on
a tie). A request that repeats itself (an agent loop's tool-call JSON) thus gets
long drafts from its own history and from the requests before it.

Per step a request costs O(new tokens x live matches): its tree's writer and its
match positions in the shared tree move on by the new tokens only."""
from __future__ import annotations

from collections import OrderedDict

from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.history import continues
from armllm.engine.spec.proposer import NO_DRAFT, Draft, ProposeInput, SeqKey
from armllm.engine.spec.suffix_tree import SuffixTree, SuffixWriter, draft, follow

# Tokens the shared tree holds at most (finished outputs, the oldest dropped first)
# besides the request cap: about 250 bytes of Python objects per token (measured by
# tools/bench_spec_lookup.py), so this bounds it near 130 MB however long the
# cached outputs are.
MAX_CACHED_TOKENS = 1 << 19
# floor(match length x spec factor) counts a product a rounding step under an integer
_ROUNDING_SLACK = 1e-6


class _RequestState:
    """One running request: its own tree (prompt and output so far) and where its
    context's suffixes stand in the shared tree."""
    __slots__ = ("num_prompt", "writer", "shared_nodes", "shared_offsets", "shared_version")

    def __init__(self, max_depth: int, num_prompt: int):
        self.num_prompt = num_prompt
        self.writer = SuffixWriter(SuffixTree(max_depth), [])
        self.shared_nodes: list = []
        self.shared_offsets: list[int] = []
        self.shared_version = -1      # the shared tree's version the positions are for


class SuffixProposer:
    """Drafts from suffix trees of this request and of recent outputs; no model,
    deterministic drafts."""

    wants_hidden = False

    def __init__(self, config: SpeculativeConfig):
        self._max_draft = config.num_speculative_tokens
        self._max_depth = config.suffix_decoding_max_tree_depth
        self._max_cached = config.suffix_decoding_max_cached_requests
        self._spec_factor = float(config.suffix_decoding_max_spec_factor)
        self._min_prob = float(config.suffix_decoding_min_token_prob)
        self._shared = SuffixTree(self._max_depth)
        # finished outputs in the shared tree, oldest first: key -> the list the
        # tree reads them from
        self._cached: OrderedDict[SeqKey, list[int]] = OrderedDict()
        self._cached_tokens = 0
        self._requests: dict[SeqKey, _RequestState] = {}

    @property
    def draft_seconds(self) -> float:
        return 0.0

    @property
    def cached_keys(self) -> list[SeqKey]:
        """The finished outputs the shared tree holds, oldest first."""
        return list(self._cached)

    def propose(self, inputs: list[ProposeInput]) -> list[Draft]:
        return [self._propose_one(inp) for inp in inputs]

    def release(self, key: SeqKey, token_ids: list[int], finished: bool) -> None:
        """Drops the request's own tree; a finished one's output joins the shared
        tree (its prompt length is known from the request's propose calls; one never
        seen there is not cached)."""
        state = self._requests.pop(key, None)
        if not finished or state is None:
            return
        output = token_ids[state.num_prompt:]
        if not output:
            return
        self._forget(key)
        self._cached[key] = self._shared.insert(output)
        self._cached_tokens += len(output)
        while self._cached and (len(self._cached) > self._max_cached
                                or self._cached_tokens > MAX_CACHED_TOKENS):
            self._forget(next(iter(self._cached)))

    def close(self) -> None:
        self._requests.clear()
        self._cached.clear()
        self._cached_tokens = 0
        self._shared = SuffixTree(self._max_depth)

    def _forget(self, key: SeqKey) -> None:
        seq = self._cached.pop(key, None)
        if seq is not None:
            self._shared.remove(seq)
            self._cached_tokens -= len(seq)

    def _propose_one(self, inp: ProposeInput) -> Draft:
        state = self._update(inp)
        num_draft = min(inp.k, self._max_draft)
        if num_draft <= 0:
            return NO_DRAFT
        tokens = self._best_draft(state, num_draft)
        return Draft(tokens) if tokens else NO_DRAFT

    def _update(self, inp: ProposeInput) -> _RequestState:
        """Brings the request's tree and shared-tree matches up to inp.token_ids."""
        token_ids = inp.token_ids
        state = self._requests.get(inp.key)
        if state is None or not continues(token_ids, state.writer.seq):
            state = self._requests[inp.key] = _RequestState(self._max_depth, inp.num_prompt)
        writer = state.writer
        new_tokens = token_ids[len(writer.seq):]
        shared_current = state.shared_version == self._shared.version
        for token in new_tokens:
            writer.append(token)
            if shared_current:
                follow(self._shared, state.shared_nodes, state.shared_offsets, token)
        return state

    def _best_draft(self, state: _RequestState, num_draft: int) -> list[int]:
        """The highest-scoring draft over every match in both trees."""
        if state.shared_version != self._shared.version:
            self._match_shared(state)
        depth_cap = self._max_depth
        spec_factor, min_prob = self._spec_factor, self._min_prob
        best_tokens: list[int] = []
        best_score = 0.0
        writer = state.writer
        for nodes, offsets in ((writer.nodes, writer.offsets),
                               (state.shared_nodes, state.shared_offsets)):
            num = len(nodes)
            for i in range(num):                    # longest match first
                match_len = num - i
                most = int(match_len * spec_factor + _ROUNDING_SLACK)
                if most > num_draft:
                    most = num_draft
                if most > depth_cap - match_len:
                    most = depth_cap - match_len
                if most <= best_score:              # cannot beat it even at probability 1
                    continue
                tokens, score = draft(nodes[i], offsets[i], most, min_prob)
                if score > best_score:
                    best_tokens, best_score = tokens, score
        return best_tokens

    def _match_shared(self, state: _RequestState) -> None:
        """Finds the context's suffixes in the shared tree afresh (it changed)."""
        state.shared_nodes, state.shared_offsets = [], []
        context = state.writer.seq
        for token in context[max(0, len(context) - self._max_depth):]:
            follow(self._shared, state.shared_nodes, state.shared_offsets, token)
        state.shared_version = self._shared.version
