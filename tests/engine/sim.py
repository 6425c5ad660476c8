"""The real LLMEngine with a model-free runner, for scheduler tests.

FakeRunner has ModelRunner's interface: run() makes the step's block copies,
writes each scheduled token id (instead of its K/V) into a simulated cache at
the slot its block table gives, and makes a "logits" row for each sequence
that samples from the last tokens it reads back from that cache, as attention
would; sample() turns a row into a token and spoils the row, as the real
sampler edits rows in place. So a wrong block table, a missed copy on write
or a fork sharing its parent's row changes the tokens, and check() finds
every sequence's own tokens in the cache. Either call can be made to fail,
as a model or a sampler might."""
from __future__ import annotations

from collections import Counter

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from armllm.engine.block_manager import BlockManager
from armllm.engine.llm_engine import LLMEngine
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
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.last = SchedulerOutput([], [])           # the step run last
        self.sampled: dict[str, dict[int, Sequence]] = {}  # every completion that sampled
        self.fail_run = False                         # the next forward raises
        self.fail_sample: set[str] = set()            # requests whose next sample raises

    def slot(self, seq: Sequence, pos: int) -> tuple[list[int | None], int]:
        return self.kv[seq.block_table[pos // self.block_size]], pos % self.block_size

    def run(self, out: SchedulerOutput) -> tuple[list[Sequence], list[list[int]]]:
        self.last = out
        if self.fail_run:
            self.fail_run = False
            raise RuntimeError("injected forward failure")
        for src, dst in out.copies:
            self.kv[dst] = list(self.kv[src])
        sampling, logits = [], []
        for item in out.scheduled:
            seq, ids = item.seq, item.seq.all_ids
            start, stop = seq.num_computed, seq.num_computed + item.num_new_tokens
            for pos in range(start, stop):
                block, offset = self.slot(seq, pos)
                block[offset] = ids[pos]
            if stop == seq.num_tokens:  # the prompt is complete: this row samples
                context = [self.slot(seq, pos) for pos in range(max(0, stop - CONTEXT), stop)]
                logits.append([sum(block[offset] for block, offset in context) * 7])
                sampling.append(seq)
        return sampling, logits

    def sample(self, seq: Sequence, row: list[int]) -> SampleResult:
        assert row[0] is not None, "a logits row sampled twice"
        if seq.request_id in self.fail_sample:
            self.fail_sample.discard(seq.request_id)
            raise RuntimeError("injected sampling failure")
        token = (row[0] + seq.index) % NUM_SAMPLED
        row[0] = None
        self.sampled.setdefault(seq.request_id, {})[seq.index] = seq
        return SampleResult(token)


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
                 max_model_len=64, caching=True):
        self.blocks = BlockManager(num_blocks, block_size, caching)
        self.sched = Scheduler(self.blocks, max_num_seqs, max_tokens, max_model_len)
        self.runner = FakeRunner(num_blocks, block_size)
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
        bm, bs = self.blocks, self.blocks.block_size
        holders = Counter()
        for s in self.sched.running:
            assert len(set(s.block_table)) == len(s.block_table), "a block listed twice"
            assert len(s.block_table) * bs >= s.num_computed
            holders.update(s.block_table)
            ids = s.all_ids
            for pos in range(s.num_computed):  # the cache holds this sequence's tokens
                block, offset = self.runner.slot(s, pos)
                assert block[offset] == ids[pos], f"{s.key} reads a wrong token at {pos}"
        for s in self.sched.waiting:
            assert s.block_table == [] and s.num_computed == 0
        for b in range(bm.num_blocks):
            assert bm.ref_count[b] == holders[b], f"block {b}: ref {bm.ref_count[b]}"
            assert (b in bm.free) == (holders[b] == 0), f"block {b} both free and used"
        for h, b in bm.cached.items():
            assert bm.hash_of[b] == h
        for b, h in enumerate(bm.hash_of):
            assert h is None or bm.cached[h] == b
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
        assert self.engine.has_unfinished() == bool(open_ids)
