"""The real LLMEngine with a model-free runner, for scheduler tests.

FakeRunner has ModelRunner's interface: run() makes the step's block copies,
writes each scheduled token id (instead of its K/V) into a simulated cache at
the slot its block table gives, and makes a "logits" row for each sequence
that samples from the last tokens it reads back from that cache, as attention
would; sample() turns each job's row into a token and spoils the row, as the
real sampler edits rows in place. So a wrong block table, a missed copy on write
or a fork sharing its parent's row changes the tokens, and check() finds
every sequence's own tokens in the cache. Either call can be made to fail,
as a model or a sampler might."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from armllm.engine.block_manager import BlockManager
from armllm.engine.llm_engine import LLMEngine
from armllm.engine.request_state import RequestState, SeqKey
from armllm.engine.sampler import SampleJob
from armllm.engine.scheduler import Scheduler, SchedulerOutput
from armllm.engine.sequence import Sequence
from armllm.model.config import ModelConfig
from armllm.model.loader import LoadedModel
from armllm.sampling import SampleResult, SamplingParams

VOCAB = 256                   # token t<i> is the word "t<i>"
NUM_SAMPLED = 23              # the fake model's tokens are 0..22
CONTEXT = 3                   # tokens the fake model reads back


def fake_model() -> LoadedModel:
    """A tokenizer and config without weights (the runner below needs none)."""
    words = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    config = ModelConfig("LlamaForCausalLM", VOCAB, hidden_size=8, intermediate_size=8,
                         num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8,
                         rms_norm_eps=1e-5, rope_theta=1e4, rope_scaling=None,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         attention_bias=False, qk_norm=False, sliding_window=0)
    return LoadedModel(None, config, None, tokenizer, {}, {})


class FakeRunner:
    def __init__(self, pool_blocks: list[int], block_size: int):
        self.block_size = block_size
        # per pool, per block (the null block of a window pool included)
        self.kv: list[list[list[int | None]]] = [
            [[None] * block_size for _ in range(n + 1)] for n in pool_blocks]
        self.last = SchedulerOutput([], [])           # the step run last
        self.sampled: dict[str, dict[int, Sequence]] = {}  # every completion that sampled
        self.fail_run = False                         # the next forward raises
        self.fail_sample: set[str] = set()            # requests whose next sample raises

    def slot(self, seq: Sequence, pos: int, pool: int = 0) -> tuple[list[int | None], int]:
        block = seq.block_tables[pool][pos // self.block_size]
        return self.kv[pool][block], pos % self.block_size

    def run(self, out: SchedulerOutput, states: Mapping[SeqKey, RequestState]
            ) -> tuple[list[Sequence], list[list[int]]]:
        self.last = out
        if self.fail_run:
            self.fail_run = False
            raise RuntimeError("injected forward failure")
        for pool, src, dst in out.copies:
            self.kv[pool][dst] = list(self.kv[pool][src])
        sampling, logits = [], []
        for item in out.scheduled:
            seq, ids = item.seq, item.seq.all_ids
            start, stop = seq.num_computed, seq.num_computed + item.num_new_tokens
            for pool in range(len(self.kv)):
                for pos in range(start, stop):
                    block, offset = self.slot(seq, pos, pool)
                    block[offset] = ids[pos]
            if stop == seq.num_tokens:  # the prompt is complete: this row samples
                # every pool must give the same context (a window pool's window >= CONTEXT)
                read = [[block[offset] for block, offset in
                         (self.slot(seq, pos, pool) for pos in range(max(0, stop - CONTEXT),
                                                                     stop))]
                        for pool in range(len(self.kv))]
                logits.append([sum(read[0]) * 7 if all(r == read[0] for r in read) else -1])
                sampling.append(seq)
        # rows as the engine slices and copies them (a copy for each forked completion)
        return sampling, np.array(logits, dtype=object).reshape(len(logits), 1)

    def sample(self, jobs: list[SampleJob], logits, masks) -> None:
        for job in jobs:
            seq, row = job.seq, job.rows[0]
            assert row[0] is not None, "a logits row sampled twice"
            if seq.request_id in self.fail_sample:
                self.fail_sample.discard(seq.request_id)
                job.error = RuntimeError("injected sampling failure")
                continue
            token = (row[0] + seq.index) % NUM_SAMPLED
            row[0] = None
            self.sampled.setdefault(seq.request_id, {})[seq.index] = seq
            job.results.append(SampleResult(token))


def expected_tokens(prompt: list[int], index: int, count: int) -> list[int]:
    """What completion `index` of a prompt holds after `count` tokens when every step
    reads its own tokens back from the cache."""
    ids = list(prompt)
    for _ in range(count):
        ids.append((sum(ids[-CONTEXT:]) * 7 + index) % NUM_SAMPLED)
    return ids[len(prompt):]


class SimEngine:
    """LLMEngine over FakeRunner, with what the tests look at: every StepOutput's
    end per completion, and the sequences of each request."""

    def __init__(self, num_blocks=16, block_size=4, max_num_seqs=4, max_tokens=16,
                 max_model_len=64, caching=True, window=0, num_window_blocks=0):
        """window, num_window_blocks: a second pool, for sliding-window layers."""
        layout = [(0, num_blocks)] + ([(window, num_window_blocks)] if window else [])
        self.blocks = BlockManager(layout, block_size, caching)
        self.sched = Scheduler(self.blocks, max_num_seqs, max_tokens, max_model_len)
        self.runner = FakeRunner([n for _, n in layout], block_size)
        self.engine = LLMEngine(fake_model(), self.sched, self.runner)
        self.params: dict[str, SamplingParams] = {}
        self.first: dict[str, Sequence] = {}
        self.ends: Counter[tuple[str, int]] = Counter()        # completions ended
        self.reasons: Counter[str] = Counter()
        self.tokens: dict[tuple[str, int], list[int]] = {}    # from the StepOutputs
        self.text: dict[tuple[str, int], str] = {}
        self.aborted: set[str] = set()                          # ends not yet reported

    def add(self, rid: str, prompt: list[int], max_tokens: int = 8, n: int = 1,
            priority: int = 0) -> Sequence:
        params = SamplingParams(max_tokens=max_tokens, n=n)
        self.engine.add_request(rid, list(prompt), params, priority)
        self.params[rid] = params
        self.first[rid] = self.sched.sequences(rid)[0]
        return self.first[rid]

    def requests(self, rid: str) -> list[Sequence]:
        """The request's completions made so far (forks included), by index."""
        made = {0: self.first[rid], **self.runner.sampled.get(rid, {})}
        return [made[i] for i in sorted(made)]

    def step(self) -> SchedulerOutput:
        """One engine step; returns what it scheduled."""
        self.runner.last = SchedulerOutput([], [])
        self.aborted.clear()
        for out in self.engine.step():
            key = (out.request_id, out.index)
            self.tokens.setdefault(key, []).extend(out.new_token_ids)
            self.text[key] = self.text.get(key, "") + out.text_delta
            if out.finish_reason is not None:
                self.ends[key] += 1
                self.reasons[out.finish_reason] += 1
        return self.runner.last

    def abort(self, rid: str) -> None:
        """Aborts now; the ends come with the next step."""
        if self.engine.abort(rid):
            self.aborted.add(rid)

    def drain(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.engine.has_unfinished():
                return
            self.step()
        raise AssertionError("the scheduler made no progress: deadlock")

    def check(self) -> None:
        """Every invariant of the block manager and scheduler, and of what the engine
        has reported."""
        bs = self.blocks.block_size
        for i, pool in enumerate(self.blocks.pools):
            holders = Counter()
            for s in self.sched.running:
                table = s.block_tables[i]
                # a window pool's table: null entries, then the blocks it holds, from
                # the window of the first token the last step computed on (the next
                # allocate drops the ones before the next token's window)
                held = [b for b in table if b != pool.null]
                assert table[len(table) - len(held):] == held, f"{s.key}: a null inside"
                live = pool.first_live(s.num_computed, bs)
                assert len(table) - len(held) <= live, f"{s.key}: a live block dropped"
                assert len(set(held)) == len(held), "a block listed twice"
                most = self.blocks.most_blocks(s.num_tokens, self.sched.max_tokens)[i]
                assert len(held) <= most, f"{s.key} holds {len(held)} blocks, at most {most}"
                assert len(table) * bs >= s.num_computed
                holders.update(held)
                ids = s.all_ids
                for pos in range(live * bs, s.num_computed):  # the cache holds its tokens
                    block, offset = self.runner.slot(s, pos, i)
                    assert block[offset] == ids[pos], f"{s.key} reads a wrong token at {pos}"
            for b in range(pool.num_blocks):
                assert pool.ref_count[b] == holders[b], f"block {b}: ref {pool.ref_count[b]}"
                assert (b in pool.free) == (holders[b] == 0), f"block {b} both free and used"
            for h, b in pool.cached.items():
                assert pool.hash_of[b] == h
            for b, h in enumerate(pool.hash_of):
                assert h is None or pool.cached[h] == b
        for s in self.sched.waiting:
            assert s.block_tables == [] and s.num_computed == 0
        assert len(self.sched.running) <= self.sched.max_num_seqs
        # every completion ends once, and its tokens are those it read from the cache
        open_ids = set()
        for rid, params in self.params.items():
            for index in range(params.n):
                key = (rid, index)
                assert self.ends[key] <= 1, f"{key} ended twice"
                if not self.ends[key]:
                    open_ids.add(rid)
                tokens = self.tokens.get(key, [])
                prompt = self.first[rid].prompt_ids
                assert tokens == expected_tokens(prompt, index, len(tokens)), key
                assert self.text.get(key, "") == "".join(f" t{t}" for t in tokens), key
        assert self.engine.num_unfinished_requests == len(open_ids - self.aborted)
        # the engine keeps a state for every unfinished sequence, and for no other
        assert set(self.engine._states) == {s.key for s in self.sched.running
                                            + self.sched.waiting}
        assert self.engine.has_unfinished() == bool(open_ids)
