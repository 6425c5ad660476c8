"""The MTP proposer (engine/spec/mtp.py) on tiny random Qwen3.5 checkpoints with an
MTP block (tests/model/test_qwen3_5.py's, its layer perturbed off layer 3's copy),
against a reference written here in torch (float64) from the raw safetensors: the
fc over [norm(embedding of t_{p+1}) | norm(h_p)], the gated full-attention layer
(partial RoPE, per-head q/k norms), its dense MLP or routed experts with the gated
shared expert, the block's norm and the lm_head, all norms (1 + w); drafts chained
through the block's normed output. The hidden states both read are the target's
own (a prefill of each prefix, its final norm's output).

Each sequence is fed as the engine feeds it: a prompt in two chunks, then decode
steps whose drafts are partly accepted (0 to all of them), next to a second
sequence in the same forwards, a third that starts after a prefix-cache hit, and a
preempted one recomputed from its prompt. The proposer's logits and drafts at every
step equal the reference's, from the safetensors checkpoint and from llama.cpp's
GGUF of it (its nextn tensors). A checkpoint without MTP weights is refused."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.engine.spec.config import SpeculativeConfig
from armllm.engine.spec.mtp import MTPProposer
from armllm.engine.spec.proposer import NO_DRAFT, ProposeInput
from armllm.model.decoder import BatchMeta, KVCache, Workspace
from armllm.model.loader import load_model
from armllm.sampling import SamplingParams

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from tests.model.test_qwen3_5 import convert, tokenizer, write_tiny  # noqa: E402,F401 - a fixture

K = 3   # draft tokens a step
CONFIG = SpeculativeConfig(method="mtp", num_speculative_tokens=K)
PARAMS = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory):   # noqa: F811 - the fixture imported above
    """name -> (checkpoint path, transformers model, the raw tensors)."""
    made = {}

    def get(name: str):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            hf = write_tiny(path, name, tokenizer)
            made[name] = path, hf, perturb_mtp_layer(path)
        return made[name]
    return get


def perturb_mtp_layer(path) -> dict[str, np.ndarray]:
    """The MTP layer off the copy of layer 3 it starts as (so that running the target's
    layer instead would show); returns every tensor of the checkpoint."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(path / "model.safetensors")
    rng = np.random.default_rng(11)
    for name, value in tensors.items():
        if name.startswith("mtp.layers."):
            tensors[name] = (value + rng.standard_normal(value.shape).astype(np.float32)
                             * 0.3 * value.std()).astype(np.float32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return tensors


class ReferenceMTP:
    """The MTP block from the raw checkpoint tensors, float64, whole sequences at a
    time (no cache)."""

    def __init__(self, tensors: dict[str, np.ndarray], hf_config):
        self.t = {n: torch.from_numpy(v).double() for n, v in tensors.items()}
        self.head = self.t.get("lm_head.weight", self.t["model.embed_tokens.weight"])
        c = hf_config
        self.eps, self.heads, self.kv_heads, self.head_dim = (
            c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        rope = c.rope_parameters
        self.rot = int(c.head_dim * rope["partial_rotary_factor"])
        self.theta = rope["rope_theta"]
        self.top_k = getattr(c, "num_experts_per_tok", 0)

    def w(self, name: str):
        return self.t[f"mtp.layers.0.{name}"]

    def norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + weight)

    def rope(self, x, positions):   # x [n, heads, head_dim]: the first `rot` dims turn
        inv = 1.0 / self.theta ** (torch.arange(0, self.rot, 2, dtype=torch.float64) / self.rot)
        angles = positions.double()[:, None] * inv[None]
        cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2,
                                                                          -1)[:, None]
        r, rest = x[..., :self.rot], x[..., self.rot:]
        half = self.rot // 2
        turned = torch.cat([-r[..., half:], r[..., :half]], -1)
        return torch.cat([r * cos + turned * sin, rest], -1)

    def mlp(self, x, prefix: str):
        gate = x @ self.w(f"{prefix}gate_proj.weight").T
        up = x @ self.w(f"{prefix}up_proj.weight").T
        return (torch.nn.functional.silu(gate) * up) @ self.w(f"{prefix}down_proj.weight").T

    def moe(self, x):
        probs = torch.softmax(x @ self.w("mlp.gate.weight").T, -1)
        top, chosen = torch.topk(probs, self.top_k, -1)
        top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for row in range(x.shape[0]):
            for weight, e in zip(top[row], chosen[row], strict=True):
                out[row] += weight * self.mlp(x[row:row + 1], f"mlp.experts.{int(e)}.")[0]
        shared = torch.sigmoid(x @ self.w("mlp.shared_expert_gate.weight").T)
        return out + shared * self.mlp(x, "mlp.shared_expert.")

    def __call__(self, hidden: np.ndarray, next_ids: list[int], positions: list[int]):
        """The block's output g (after its norm) of every row: hidden [n, hidden] the
        target's h_p, next_ids t_{p+1}, at `positions` (ascending, each row attends
        to those before it); lm_head(g) are the logits."""
        t, n = self.t, len(next_ids)
        e = self.norm(t["model.embed_tokens.weight"][next_ids],
                      t["mtp.pre_fc_norm_embedding.weight"])
        h = self.norm(torch.from_numpy(np.asarray(hidden)).double(),
                      t["mtp.pre_fc_norm_hidden.weight"])
        x = torch.cat([e, h], -1) @ t["mtp.fc.weight"].T
        a = self.norm(x, self.w("input_layernorm.weight"))
        q, gate = (a @ self.w("self_attn.q_proj.weight").T).view(
            n, self.heads, 2 * self.head_dim).chunk(2, -1)
        k = (a @ self.w("self_attn.k_proj.weight").T).view(n, self.kv_heads, self.head_dim)
        v = (a @ self.w("self_attn.v_proj.weight").T).view(n, self.kv_heads, self.head_dim)
        pos = torch.tensor(positions)
        q = self.rope(self.norm(q, self.w("self_attn.q_norm.weight")), pos)
        k = self.rope(self.norm(k, self.w("self_attn.k_norm.weight")), pos)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * self.head_dim ** -0.5
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)
        attn = (attn * torch.sigmoid(gate)).reshape(n, -1)
        x = x + attn @ self.w("self_attn.o_proj.weight").T
        m = self.norm(x, self.w("post_attention_layernorm.weight"))
        x = x + (self.moe(m) if self.top_k else self.mlp(m, "mlp."))
        return self.norm(x, t["mtp.norm.weight"])

    def drafts(self, hidden: np.ndarray, token_ids: list[int], base: int, k: int):
        """The k drafts (and their logits rows) after token_ids, the block having seen
        positions base.. (hidden: the target's h of positions 0..len - 2)."""
        last = len(token_ids) - 2
        rows_h = [torch.from_numpy(hidden[p]).double() for p in range(base, last + 1)]
        ids = list(token_ids[base + 1:last + 2])
        positions = list(range(base, last + 1))
        tokens, logits_rows = [], []
        for s in range(k):
            g = self(torch.stack(rows_h).numpy(), ids, positions)
            logits = self.head @ g[-1]
            tokens.append(int(logits.argmax()))
            logits_rows.append(logits.numpy())
            rows_h.append(g[-1])
            ids.append(tokens[-1])
            positions.append(last + 1 + s)
        return tokens, logits_rows


def target_hidden(lm, token_ids: list[int]) -> np.ndarray:
    """The target's last hidden states (after its final norm) of every position, from
    one prefill (the target itself is checked against transformers in
    tests/model/test_qwen3_5.py)."""
    t, bs = len(token_ids), 8
    blocks = -(-t // bs)
    kv = KVCache(lm.config, blocks, bs, "f32", state_slots=1)
    ws = Workspace(lm.config, t, 1, lm.model.formats)
    positions = np.arange(t, dtype=np.int32)
    meta = BatchMeta(np.asarray(token_ids, np.int32), positions, positions,
                     np.array([0, t], np.int32), np.array([t], np.int32),
                     np.arange(blocks, dtype=np.int32).reshape(1, -1), np.zeros(0, np.int64),
                     state_slots=np.zeros(1, np.int32))
    lm.model.forward(meta, kv, ws)
    return lm.model.final_hidden(ws, np.arange(t))


class Recorder:
    """Wraps the proposer's block: each logits row of every forward, with the sequence
    (the proposer's record of it) whose row it is."""

    def __init__(self, proposer: MTPProposer):
        self.rows: list[tuple[object, np.ndarray]] = []
        forward = proposer.block.forward

        def recorded(batch):
            logits, g = forward(batch)
            wanting = [rows.seq for rows in batch if rows.logits]
            self.rows += [(seq, logits[r].copy()) for r, seq in enumerate(wanting)]
            return logits, g
        proposer.block.forward = recorded

    def of(self, seq) -> list[np.ndarray]:
        return [logits for held, logits in self.rows if held is seq]


class Stream:
    """One sequence as the engine shows it to the proposer: what it kept this step."""

    def __init__(self, key, prompt: list[int], chunks: list[int], accepts: list[int],
                 base: int = 0):
        self.key, self.token_ids, self.num_prompt = key, list(prompt), len(prompt)
        self.chunks, self.accepts = list(chunks), list(accepts)
        self.start = self.base = base
        self.rng = np.random.default_rng(len(prompt))
        self.num_kept = 0

    def next_input(self, lm, draft) -> ProposeInput | None:
        """The input after this step's rows; `draft`: the proposer's last draft."""
        if self.chunks:   # a prompt chunk (the prompt's last one samples a token)
            self.start += self.num_kept
            self.num_kept = self.chunks.pop(0)
            if self.start + self.num_kept == self.num_prompt:
                self.token_ids.append(int(self.rng.integers(1000)))
            k = 0 if self.chunks else K
        elif self.accepts:   # a decode: the last token and `a` of the drafts are kept
            a = min(self.accepts.pop(0), len(draft.tokens))
            self.start += self.num_kept
            self.num_kept = 1 + a
            # the target's own token after the accepted drafts (not the next draft)
            bonus = int(self.rng.integers(1000))
            if a < len(draft.tokens) and bonus == draft.tokens[a]:
                bonus += 1
            self.token_ids += draft.tokens[:a] + [bonus]
            k = K
        else:
            return None
        hidden = target_hidden(lm, self.token_ids[:self.start + self.num_kept])
        return ProposeInput(self.key, list(self.token_ids), self.num_prompt, self.start,
                            self.num_kept, k, PARAMS,
                            hidden[self.start:self.start + self.num_kept].copy())


def run_and_check(proposer: MTPProposer, lm, ref: ReferenceMTP, streams: list[Stream],
                  tol: float = 2e-4) -> int:
    """Feeds the streams step by step, each step's drafts and logits checked against
    the reference; returns the drafts checked."""
    recorder = Recorder(proposer)
    drafts = {s.key: NO_DRAFT for s in streams}
    checked = 0
    while True:
        pairs = [(s, s.next_input(lm, drafts[s.key])) for s in streams]
        pairs = [(s, inp) for s, inp in pairs if inp is not None]
        if not pairs:
            return checked
        recorder.rows.clear()
        out = dict(zip((s.key for s, _ in pairs),
                       proposer.propose([inp for _, inp in pairs]), strict=True))
        for s, inp in pairs:
            if not inp.k:
                assert out[s.key] is NO_DRAFT
                continue
            hidden = target_hidden(lm, inp.token_ids[:-1])
            want, want_logits = ref.drafts(hidden, inp.token_ids, s.base, inp.k)
            assert out[s.key].tokens == want and out[s.key].probs is None, (s.key, inp.start)
            # the observing forward's last row, then one row a chained forward
            ours = recorder.of(proposer._seqs[s.key])
            assert len(ours) == len(want_logits)
            for got, logits in zip(ours, want_logits, strict=True):
                assert np.max(np.abs(got - logits)) <= tol * np.abs(logits).max()
            checked += len(want)
        drafts = {**drafts, **out}


def prompt(seed: int, n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, 1000, n)]


def proposer_for(lm, max_num_seqs: int = 4, **kw) -> MTPProposer:
    return MTPProposer(CONFIG, lm, max_num_seqs=max_num_seqs, max_model_len=128, block_size=8,
                       kv_cache_dtype="f32", **kw)


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_drafts_and_logits_match_the_reference(tiny, name):
    """Two sequences in the same forwards: prompts in two chunks, then decode steps
    accepting 0, 2, all, 1, 0, 3 (and 3, 0, 1, 2, ...) of the drafts; the rejected
    drafts' K/V is overwritten before any row reads it."""
    path, hf, tensors = tiny(name)
    lm = load_model(path, "f32")
    ref = ReferenceMTP(tensors, hf.config)
    streams = [Stream(("a", 0), prompt(1, 21), [13, 8], [0, 2, K, 1, 0, 3]),
               Stream(("b", 0), prompt(2, 12), [5, 7], [K, 0, 1, 2, K, 0])]
    assert run_and_check(proposer_for(lm), lm, ref, streams) == 2 * 7 * K


def test_prefix_hit_preemption_and_small_forwards(tiny):
    """A sequence whose first 16 tokens were a prefix-cache hit is seen from position
    16 (its attention over what the block saw); a preempted sequence (released)
    comes back recomputed from its prompt; forwards of at most 6 rows and one
    sequence split a step's rows across forwards; a pool of 9 blocks serves them.
    Inputs without hidden states or kept rows draft nothing."""
    path, hf, tensors = tiny("dense")
    lm = load_model(path, "f32")
    ref = ReferenceMTP(tensors, hf.config)
    proposer = proposer_for(lm, max_num_seqs=1, max_num_batched_tokens=6, num_blocks=9)
    odd = [ProposeInput(("x", 0), [1, 2, 3], 2, 0, 2, K, PARAMS),
           ProposeInput(("y", 0), [1, 2, 3], 2, 2, 0, K, PARAMS, np.zeros((0, 64), np.float32))]
    assert proposer.propose(odd) == [NO_DRAFT, NO_DRAFT]
    hit = Stream(("hit", 0), prompt(3, 30), [6, 8], [1, K, 0], base=16)
    first = Stream(("pre", 0), prompt(4, 10), [10], [2, 1])
    run_and_check(proposer, lm, ref, [hit, first])
    proposer.release(("pre", 0), first.token_ids, finished=False)
    proposer.release(("hit", 0), hit.token_ids, finished=True)
    assert proposer.num_free_blocks == 9
    # recomputed: the whole sequence is its prompt now
    again = Stream(("pre", 0), first.token_ids, [9, len(first.token_ids) - 9], [0, K])
    assert run_and_check(proposer, lm, ref, [again]) == 3 * K


def test_gguf_nextn_block_drafts_as_the_checkpoint(tiny, tmp_path):
    """llama.cpp's converter writes the block as its nextn layer: the same drafts."""
    path, hf, tensors = tiny("dense")
    lm = load_model(convert(path, tmp_path / "mtp.gguf"), "f32")
    assert lm.model.weights.mtp is not None
    streams = [Stream(("g", 0), prompt(5, 14), [9, 5], [1, 0, K])]
    assert run_and_check(proposer_for(lm), lm, ReferenceMTP(tensors, hf.config), streams) \
        == 4 * K


def test_a_model_without_mtp_weights_is_refused(smollm2_gguf):
    lm = load_model(smollm2_gguf, "f32")
    with pytest.raises(ValueError, match="Qwen3.5 and Qwen3.6"):
        MTPProposer(CONFIG, lm, 4, 128, 16)
