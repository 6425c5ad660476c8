"""ops.RowSampler (sample.h: a step's rows to tokens in one call) against sample_spec's
numpy re-reading of the definition: tokens, logprobs and top lists equal to the bit for
every parameter combination; every variant this CPU runs gives ref's bits (the slots' e
and block sums too); the draw's distribution (chi-square); the uniform draw against
uint64 numpy; results that do not depend on the thread count or the claiming order;
the validation of every column."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import RUNNABLE_ISAS, examples
from tests.kernels import sample_spec as spec
from tests.kernels.sample_spec import RowParams

F32 = np.float32


def run_rows(rows: np.ndarray, params: list[RowParams], isa: str | None = None,
             pool: ops.ThreadPool | None = None, sampler: ops.RowSampler | None = None,
             begin: int = 0) -> dict:
    """The kernel's outputs for logits rows (copied: the kernel overwrites them)."""
    n = rows.shape[1]
    s = sampler or ops.RowSampler(n, begin + len(params), isa)
    masks = None
    if any(p.mask is not None for p in params):
        masks = np.stack([p.mask if p.mask is not None else np.full((n + 31) // 32, -1, np.int32)
                          for p in params])
    for i, p in enumerate(params):
        spec.fill(s, begin + i, p)
        s.mask_row[begin + i] = i if p.mask is not None else -1
    s.run(rows.copy(), begin, begin + len(params), masks, pool)
    end = begin + len(params)
    return {"token": s.token[begin:end].copy(), "logprob": s.logprob[begin:end].copy(),
            "top_ids": s.top_ids[begin:end].copy(),
            "top_logprobs": s.top_logprobs[begin:end].copy()}


def assert_matches_spec(rows: np.ndarray, params: list[RowParams], got: dict) -> None:
    for i, p in enumerate(params):
        want = spec.sample_row(rows[i], p)
        assert got["token"][i] == want.token, (i, p)
        assert np.array_equal(got["logprob"][i:i + 1], np.array([want.logprob], F32),
                              equal_nan=True), (i, p, got["logprob"][i], want.logprob)
        assert np.array_equal(got["top_ids"][i], want.top_ids), (i, p)
        assert np.array_equal(got["top_logprobs"][i], want.top_logprobs, equal_nan=True), (i, p)


def same_outputs(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


# ------------------------------------------------------------------ strategies


def logits_rows(rng: np.random.Generator, rows: int, n: int, kind: str) -> np.ndarray:
    """Rows of logits of one kind: spread, peaked (a few large), with ties (coarse
    values), with -inf and NaN entries, or nearly flat."""
    x = rng.standard_normal((rows, n)).astype(F32) * F32(3)
    if kind == "peaked":
        for r in range(rows):
            x[r, rng.integers(0, n, 3)] += F32(12)
    elif kind == "ties":
        x = np.round(x).astype(F32)
    elif kind == "specials":
        x[rng.random((rows, n)) < 0.2] = -np.inf
        x[rng.random((rows, n)) < 0.05] = np.nan
    elif kind == "flat":
        x *= F32(1e-3)
    elif kind == "head_tail":  # most mass in a tail below top-p's first floor (1e-3)
        x = (F32(-8) + x * F32(0.03)).astype(F32)
        for r in range(rows):
            x[r, rng.integers(0, n, 3)] = F32(0)
    return x


@st.composite
def row_params(draw, n: int) -> RowParams:
    history = draw(st.lists(st.integers(0, n - 1), max_size=12))
    return RowParams(
        temperature=draw(st.sampled_from([0.0, 0.0, 1e-6, 0.3, 0.8, 1.0, 1.0, 2.5, 100.0])),
        top_p=draw(st.sampled_from([1.0, 1.0, 0.95, 0.5, 0.1, 1e-6, 0.999999])),
        min_p=draw(st.sampled_from([0.0, 0.0, 0.05, 0.5, 1.0])),
        top_k=draw(st.sampled_from([-1, 0, 0, 1, 2, 5, max(n - 1, 1), n, n + 3])),
        num_logprobs=draw(st.integers(-1, 20)),
        repetition_penalty=draw(st.sampled_from([1.0, 1.0, 1.3, 0.7])),
        presence_penalty=draw(st.sampled_from([0.0, 0.0, 0.5, -1.5])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.0, 0.25, -0.75])),
        seed=draw(st.integers(0, 2**64 - 1)), stream=draw(st.integers(0, 3)),
        counter=draw(st.integers(0, 2**64 - 1)),
        history=history, prompt_len=draw(st.integers(0, len(history))),
        bias=draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from([-100.0, -1.5, 2.0,
                                                                             7.25, 100.0])),
                           max_size=4)),
        mask=draw(st.sampled_from([None, None, "random", "one"])))


def with_masks(rng: np.random.Generator, params: list[RowParams], n: int,
               masks: bool = True) -> None:
    """Each row's mask drawn as its params name it ("random", "one"; all None unless
    `masks`)."""
    for p in params:
        if not masks:
            p.mask = None
        elif isinstance(p.mask, str):
            allowed = rng.random(n) < 0.5 if p.mask == "random" else np.eye(n, dtype=bool)[
                rng.integers(0, n)]
            padded = np.zeros((n + 31) // 32 * 32, bool)
            padded[:n] = allowed
            p.mask = np.packbits(padded, bitorder="little").view(np.int32).copy()


# -------------------------------------------------------------- against spec


@settings(deadline=None, max_examples=examples(150),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(n=st.sampled_from([1, 2, 7, 16, 17, 33, 100, 257]), data=st.data(),
       kind=st.sampled_from(["spread", "peaked", "ties", "specials", "flat"]),
       seed=st.integers(0, 2**32 - 1))
def test_rows_match_the_spec(n, data, kind, seed):
    check_rows_match_the_spec(row_params, n, data, kind, seed)


def check_rows_match_the_spec(params_of, n: int, data, kind: str, seed: int,
                              masks: bool = True) -> None:
    """A batch of up to 5 rows of params_of(n) (masks None unless `masks`) sampled
    as sample_spec defines it."""
    rng = np.random.default_rng(seed)
    params = data.draw(st.lists(params_of(n), min_size=1, max_size=5))
    with_masks(rng, params, n, masks)
    rows = logits_rows(rng, len(params), n, kind)
    assert_matches_spec(rows, params, run_rows(rows, params))


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
@settings(deadline=None, max_examples=examples(25))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_every_variant_gives_refs_outputs(isa, data, seed):
    check_variant_gives_refs_outputs(isa, row_params, data, seed, [5, 16, 31, 64, 300, 1000],
                                     ["spread", "peaked", "ties", "specials"])


def check_variant_gives_refs_outputs(isa: str, params_of, data, seed: int, sizes: list[int],
                                     kinds: list[str], masks: bool = True) -> None:
    """A batch of up to 6 rows of params_of(n) gives ref's bits under `isa`."""
    n = data.draw(st.sampled_from(sizes))
    rng = np.random.default_rng(seed)
    params = data.draw(st.lists(params_of(n), min_size=1, max_size=6))
    with_masks(rng, params, n, masks)
    rows = logits_rows(rng, len(params), n, data.draw(st.sampled_from(kinds)))
    assert same_outputs(run_rows(rows, params, isa), run_rows(rows, params, "ref"))


@pytest.mark.parametrize("n", [49152, 151936])
def test_real_vocabularies_match_the_spec(n):
    rng = np.random.default_rng(n)
    rows = logits_rows(rng, 6, n, "peaked")
    rows[5] = logits_rows(rng, 1, n, "spread")[0]
    history = list(rng.integers(0, n, 300))
    params = [RowParams(temperature=0.0, num_logprobs=5),
              RowParams(temperature=0.8, top_p=0.95, seed=1, counter=7, num_logprobs=0),
              RowParams(temperature=1.0, seed=2, history=history, prompt_len=200,
                        repetition_penalty=1.1, frequency_penalty=0.5, num_logprobs=20),
              RowParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=3),
              RowParams(temperature=1.0, top_k=2000, seed=4, bias=[(5, 30.0), (9, -2.0)]),
              RowParams(temperature=1.0, top_p=0.9, seed=5)]
    got = run_rows(rows, params)
    assert_matches_spec(rows, params, got)
    for isa in RUNNABLE_ISAS:
        assert same_outputs(run_rows(rows, params, isa), got), isa


@pytest.mark.parametrize("n", [300, 1000, 5000])
@pytest.mark.parametrize("kind", ["spread", "flat", "ties", "head_tail"])
@pytest.mark.parametrize("num_logprobs", [-1, 1])  # e over the row, or beside it
def test_top_p_over_many_candidates_matches_the_spec(n, kind, num_logprobs):
    """Top-p sets found by the radix selection (hundreds to thousands of candidates),
    and its hand-over to the heap, against the spec's full sort; head_tail rows need a
    second, lower floor after a first collection that fell short."""
    rng = np.random.default_rng(n)
    params = [RowParams(temperature=t, top_p=p, top_k=k, min_p=mp, seed=n, counter=i,
                        num_logprobs=num_logprobs)
              for i, (t, p, k, mp) in enumerate([(1.0, 0.9, 0, 0.0), (2.0, 0.99, 0, 0.0),
                                                 (0.5, 0.3, 0, 0.0), (1.0, 0.6, n // 2, 0.0),
                                                 (1.5, 0.95, 0, 1e-3), (100.0, 0.999999, 0, 0.0),
                                                 (1.0, 0.9, n - 1, 0.0)])]
    rows = logits_rows(rng, len(params), n, kind)
    assert_matches_spec(rows, params, run_rows(rows, params))


# ----------------------------------------------------------------- the slots


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
@settings(deadline=None, max_examples=examples(40))
@given(n=st.integers(1, 300), above=st.sampled_from([0.0, 0.0, 3.5]),
       inv_t=st.sampled_from([1.0, 1.25, 10.0, 1e-3, 3.4e38]),
       keep_min=st.sampled_from([0.0, 1e-30, 1e-3, 0.5, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_slots_give_refs_bits(isa, n, above, inv_t, keep_min, seed):
    """sample_exp's m is at least every x (the sampler's maximum, or above it)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 20).astype(F32)
    x[rng.random(n) < 0.1] = -np.inf
    x[rng.random(n) < 0.05] = np.nan
    m = F32(above + (np.nanmax(x) if np.isfinite(x).any() else 0.0))
    k, ref = ops.kernels(isa), ops.kernels("ref")
    blocks = -(-n // 16)
    out = {}
    t = x[rng.integers(0, n)]
    for name, kern in (("isa", k), ("ref", ref)):
        e, sums = np.empty(n, F32), np.empty(blocks, F32)
        total = kern.sample_exp(x, m, inv_t, keep_min, e, sums)
        sums2 = np.empty(blocks, F32)
        total2 = kern.sample_block_sums(e, keep_min, sums2)
        out[name] = (e, sums, total, sums2, total2, kern.sample_argmax(x),
                     kern.sample_find_above(x, t), kern.sample_find_above(x, np.inf))
    for a, b in zip(out["isa"], out["ref"], strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b)), (a, b)
    e, sums, total, _, _, first_max, _, none_above = out["ref"]
    assert first_max == (spec.greedy(x) if not np.isnan(x).all() else -1)
    assert none_above == n
    assert np.array_equal(e, spec.e_values(x, m, inv_t))
    want_sums, cum = spec.block_sums(e, keep_min)
    assert np.array_equal(sums, want_sums) and total == cum[-1]


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
@settings(deadline=None, max_examples=examples(60))
@given(n=st.integers(1, 200), data=st.data())
def test_scan_slots_find_the_first(isa, n, data):
    """argmax and find_above on rows of few distinct values: ties everywhere, NaN
    and infinities at any place, the answer in any lane and in the tail."""
    values = st.sampled_from([0.0, -0.0, 1.0, 2.0, -np.inf, np.inf, np.nan])
    x = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), F32)
    t = data.draw(values)
    k = ops.kernels(isa)
    assert k.sample_argmax(x) == (spec.greedy(x) if not np.isnan(x).all() else -1)
    above = np.flatnonzero(x > t)
    assert k.sample_find_above(x, t) == (above[0] if len(above) else n)


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
@settings(deadline=None, max_examples=examples(40))
@given(n=st.integers(1, 300), keep_min=st.sampled_from([0.0, 1e-3, 0.5]),
       with_ids=st.booleans(), density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       seed=st.integers(0, 2**32 - 1))
def test_collect_slot_takes_the_kept_in_order(isa, n, keep_min, with_ids, density, seed):
    rng = np.random.default_rng(seed)
    e = np.where(rng.random(n) < density, rng.random(n), 0).astype(F32)
    e[rng.random(n) < 0.1] = keep_min  # at the floor: taken (unless 0)
    ids = rng.permutation(10 * n)[:n].astype(np.int32) if with_ids else None
    got_e, got_id = ops.kernels(isa).sample_collect(e, keep_min, ids)
    take = (e >= F32(keep_min)) & (e > 0)
    assert np.array_equal(got_e, e[take])
    assert np.array_equal(got_id, (ids if with_ids else np.arange(n))[take])


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
def test_exp_slot_in_place_and_at_the_cut(isa):
    k = ops.kernels(isa)
    x = np.array([0, -80, -80.00001, -79.99999, -1e-30, -0.0, -np.inf, np.nan, -1e30] * 3, F32)
    want = spec.e_values(x, 0.0, 1.0)
    assert want[0] == want[5] == 1 and want[1] > 0 and want[2] == 0
    assert want[6] == want[7] == want[8] == 0
    sums = np.empty(2, F32)
    k.sample_exp(x, 0.0, 1.0, 0.0, x, sums)
    assert np.array_equal(x, want)


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
def test_exp_slot_is_the_shared_exp_over_minus_80_to_0(isa):
    """Variants may drop the shared exp's clamp, NaN pass-through and two-step
    scaling on [-80, 0]: every 97th float there (and both ends) against the
    table's full exp, which gives ref's bits (test_elementwise)."""
    lo = np.array([-80.0], F32).view(np.uint32)[0]
    bits = np.append(np.arange(np.uint32(0x80000000), lo, 97, dtype=np.uint32), lo)
    d = np.append(bits.view(F32), F32(0))
    k = ops.kernels(isa)
    e = np.empty_like(d)
    k.sample_exp(d, 0.0, 1.0, 0.0, e, np.empty(-(-len(d) // 16), F32))
    assert np.array_equal(e, k.exp(d, np.empty_like(d)))


# ------------------------------------------------------------- distribution


def chi_square_limit(dof: int, z: float = 4.0) -> float:
    """The chi-square quantile z standard deviations up (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize("case", [
    RowParams(temperature=1.0),
    RowParams(temperature=0.8, top_p=0.9),
    RowParams(temperature=1.5, top_k=5, min_p=0.05),
    RowParams(temperature=0.5, top_k=6, top_p=0.8)])
def test_draws_follow_the_spec_probabilities(case):
    n, draws, batch = 12, 24000, 500
    x = np.linspace(-3, 2, n).astype(F32)[np.random.default_rng(1).permutation(n)]
    probs = spec_probabilities(x, case)
    s = ops.RowSampler(n, batch)
    counts = np.zeros(n, np.int64)
    for start in range(0, draws, batch):
        for i in range(batch):
            case.counter = start + i
            spec.fill(s, i, case)
        s.run(np.tile(x, (batch, 1)), 0, batch)
        counts += np.bincount(s.token, minlength=n)
    assert counts[probs == 0].sum() == 0
    live = probs > 0
    expected = probs[live] * draws
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    assert stat < chi_square_limit(max(int(live.sum()) - 1, 1)), (stat, counts, expected)


def spec_probabilities(x: np.ndarray, p: RowParams) -> np.ndarray:
    """The probability of each token under p: the kept e over its total (spec's sets)."""
    n = len(x)
    m = x.max()
    inv_t = F32(1.0 / np.float64(F32(p.temperature)))
    ids = np.sort(spec.largest_first(x)[:p.top_k]) if 0 < p.top_k < n else np.arange(n)
    e = spec.e_values(x[ids], m, inv_t)
    kept = e >= F32(p.min_p)
    if p.top_p < 1:
        sel = spec._top_p(e, kept, spec.block_sums(e, p.min_p)[1][-1], p.top_p)
        kept = np.isin(np.arange(len(ids)), sel)
    out = np.zeros(n)
    out[ids] = np.where(kept, e, 0)
    return out / out.sum()


@pytest.mark.parametrize("params, allowed", [
    (RowParams(top_p=0.5), {0, 1, 2, 3}),          # the running sum 4.0 reaches 0.5 * 8
    (RowParams(top_p=0.5000001), {0, 1, 2, 3, 4}),
    (RowParams(top_k=3), {0, 1, 2}),               # ties at the k-th value: lower ids
    (RowParams(top_k=4, top_p=0.5), {0, 1}),       # 0.5 * 4 = 2.0, reached at two
    (RowParams(top_p=0.5), set(range(300))),       # 600 candidates: past the radix
    (RowParams(top_k=500, top_p=0.25), set(range(125))),
])
def test_exact_ties_go_to_the_lower_ids(params, allowed):
    """Equal logits: every e is 1 and every sum exact, so top-p's target is met
    exactly (>= counts) and ties are cut by id. (With many candidates the radix
    selection cannot call a sum that lands on the target and hands it to the heap.)"""
    n = 8 if max(allowed) < 8 else 600
    draws = 400
    s = ops.RowSampler(n, draws)
    for i in range(draws):
        params.counter = i
        spec.fill(s, i, params)
    s.run(np.zeros((draws, n), F32), 0, draws)
    got = set(s.token.tolist())
    assert got <= allowed
    assert got == allowed if len(allowed) < 10 else max(got) >= 0.9 * max(allowed)


# ------------------------------------------------------------- uniform draw


def test_uniform_matches_numpy_uint64():
    rng = np.random.default_rng(3)
    edges = [0, 1, 2**63, 2**64 - 1]
    triples = [(a, b, c) for a in edges for b in edges for c in edges]
    triples += [tuple(int(v) for v in rng.integers(0, 2**64 - 1, 3, dtype=np.uint64,
                                                   endpoint=True)) for _ in range(300)]
    seeds, streams, counters = (np.array(v, np.uint64) for v in zip(*triples, strict=True))
    want = spec.uniform(seeds, streams, counters)
    got = np.array([ops.sample_uniform(*t) for t in triples])
    assert np.array_equal(got, want)
    assert (got >= 0).all() and (got < 1).all()


def test_uniform_is_uniform():
    u = spec.uniform(np.full(200000, 7, np.uint64), 0, np.arange(200000, dtype=np.uint64))
    counts = np.bincount((u * 20).astype(int), minlength=20)
    expected = len(u) / 20
    assert ((counts - expected) ** 2 / expected).sum() < chi_square_limit(19)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, "3"])
def test_uniform_refuses_non_uint64(bad):
    with pytest.raises(ValueError, match="seed must be an integer"):
        ops.sample_uniform(bad, 0, 0)


# --------------------------------------------------------- threads and order


def mixed_batch(rng: np.random.Generator, rows: int, n: int) -> list[RowParams]:
    kinds = [RowParams(temperature=0.0, num_logprobs=3),
             RowParams(temperature=0.8, top_p=0.95, num_logprobs=1),
             RowParams(temperature=1.0, top_k=7, repetition_penalty=1.2,
                       history=list(rng.integers(0, n, 30)), prompt_len=10, frequency_penalty=0.3),
             RowParams(temperature=1.2, min_p=0.1)]
    out = []
    for r in range(rows):
        p = RowParams(**{**kinds[r % len(kinds)].__dict__})
        p.seed, p.counter = 11, r
        out.append(p)
    return out


def test_results_do_not_depend_on_threads_or_claim_order(pools):
    rng = np.random.default_rng(5)
    n, rows = 3000, 23
    x = logits_rows(rng, rows, n, "peaked")
    params = mixed_batch(rng, rows, n)
    one = run_rows(x, params, pool=pools[1])
    for threads in (2, 3, 4):
        assert same_outputs(run_rows(x, params, pool=pools[threads]), one), threads
    assert same_outputs(run_rows(x, params), one)  # the default pool
    # the claiming order: the rows in reverse, and each row alone
    back = run_rows(x[::-1].copy(), params[::-1], pool=pools[4])
    assert same_outputs({k: v[::-1] for k, v in back.items()}, one)
    for r in (0, 5, 22):
        alone = run_rows(x[r:r + 1], params[r:r + 1])
        assert same_outputs(alone, {k: v[r:r + 1] for k, v in one.items()})


def test_scratch_is_left_ready_for_the_next_rows():
    """The penalties' per-token marks are cleared: a sampler reused for rows without
    history gives a fresh sampler's results."""
    rng = np.random.default_rng(6)
    n = 500
    x = logits_rows(rng, 8, n, "spread")
    params = mixed_batch(rng, 8, n)
    s = ops.RowSampler(n, 8)
    first = run_rows(x, params, sampler=s)
    again = run_rows(x, params, sampler=s)
    assert same_outputs(first, again)
    plain = [RowParams(temperature=1.0, seed=1, counter=i, num_logprobs=2) for i in range(8)]
    assert same_outputs(run_rows(x, plain, sampler=s), run_rows(x, plain))


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
def test_keep_row_leaves_rows_as_they_were(isa):
    """keep_row: the same tokens and logprobs as without it (the spec's), and a row
    without mask, bias or penalties left bit for bit as it was; with penalties or a
    mask, only those change it."""
    rng = np.random.default_rng(8)
    n = 3000
    x = logits_rows(rng, 8, n, "spread")
    params = [RowParams(temperature=t, top_p=p, top_k=k, min_p=mp, num_logprobs=lp, seed=5,
                        counter=i)
              for i, (t, p, k, mp, lp) in enumerate([
                  (0.0, 1.0, 0, 0.0, -1), (0.8, 0.95, 0, 0.0, -1), (1.0, 1.0, 0, 0.0, -1),
                  (1.3, 1.0, 40, 0.0, -1), (0.7, 0.9, 0, 0.05, 2), (1.0, 0.5, 0, 0.0, -1),
                  (0.9, 1.0, 0, 0.0, -1), (1.0, 0.99, 0, 0.0, 0)])]
    params[6].repetition_penalty, params[6].history, params[6].prompt_len = 1.3, [1, 2, 3], 1
    s = ops.RowSampler(n, len(params), isa)
    for i, p in enumerate(params):
        spec.fill(s, i, p)
    s.keep_row[:] = 1
    work = x.copy()
    s.run(work, 0, len(params))
    for i, p in enumerate(params):
        want = spec.sample_row(x[i], p)
        assert s.token[i] == want.token, i
        if i != 6:
            assert np.array_equal(work[i], x[i], equal_nan=True), i
    edited = work[6] != x[6]
    assert edited.any() and set(np.flatnonzero(edited)) <= {1, 2, 3}


# ------------------------------------------------------------------ run


def test_strided_rows_and_a_column_window():
    rng = np.random.default_rng(7)
    n = 200
    work = logits_rows(rng, 6, n + 56, "peaked")
    view = work[1:5, 8:8 + n]
    params = [RowParams(temperature=t, top_p=0.9, seed=3, counter=i, num_logprobs=2)
              for i, t in enumerate([0.0, 0.5, 1.0, 2.0])]
    s = ops.RowSampler(n, 10)
    s.token[:] = -7
    for i, p in enumerate(params):
        spec.fill(s, 3 + i, p)
    s.run(view.copy(), 3, 7)
    assert (s.token[:3] == -7).all() and (s.token[7:] == -7).all()
    for i, p in enumerate(params):
        assert s.token[3 + i] == spec.sample_row(view[i], p).token


def test_uint32_masks_and_a_row_with_one_token_left():
    n = 70
    x = np.zeros((2, n), F32)
    words = np.zeros((1, 3), np.uint32)
    words[0, 2] = 1 << (65 - 64)  # only token 65
    s = ops.RowSampler(n, 2)
    s.temperature[:] = [1.0, 0.0]
    s.mask_row[:] = 0
    s.num_logprobs[:] = 1
    s.run(x, 0, 2, words)
    assert list(s.token) == [65, 65]
    assert list(s.logprob) == [0.0, 0.0]
    assert list(s.top_ids[:, 0]) == [65, 65]


@pytest.mark.parametrize("row, want, temperature", [
    ([np.nan, np.nan, np.nan], 0, 0.0),                # every x NaN: token 0
    ([np.nan, np.nan, np.nan], 0, 1.0),
    ([np.nan, -np.inf, -np.inf], 1, 0.0),              # all -inf: the lowest -inf
    ([np.nan, -np.inf, -np.inf], 1, 1.0),
    ([1.0, np.inf, np.inf, 3.0], 1, 0.0),              # a +inf: the lowest one
    ([1.0, np.inf, np.inf, 3.0], 1, 1.0),
    ([2.0, 5.0, 5.0, np.nan, 5.0], 1, 0.0),            # greedy ties: the lowest id
])
def test_degenerate_rows_fall_back_to_greedy(row, want, temperature):
    x = np.array([row], F32)
    p = RowParams(temperature=temperature, num_logprobs=2, seed=9)
    got = run_rows(x, [p])
    assert got["token"][0] == want == spec.sample_row(x[0], p).token
    assert_matches_spec(x, [p], got)


def test_set_history_and_bias_check_what_enters():
    s = ops.RowSampler(10, 2)
    with pytest.raises(ValueError, match=r"history ids of row 1 must be in \[0, 10\), got 10"):
        s.set_history(1, np.array([1, 10], np.int32), 2, 0)
    with pytest.raises(ValueError, match="prompt_len must be in"):
        s.set_history(0, np.array([1, 2], np.int32), 2, 3)
    with pytest.raises(ValueError, match="length must be in"):
        s.set_history(0, np.array([1, 2], np.int32), 3, 0)
    with pytest.raises(ValueError, match="ids must be a 1-D int32"):
        s.set_history(0, np.array([1, 2]), 2, 0)
    with pytest.raises(ValueError, match="row 2 is outside"):
        s.set_history(2, np.array([1], np.int32), 1, 0)
    with pytest.raises(ValueError, match=r"bias ids of row 0 must be in \[0, 10\), got -1"):
        s.set_bias(0, np.array([-1], np.int32), np.array([1.0], F32))
    with pytest.raises(ValueError, match="one entry per id"):
        s.set_bias(0, np.array([1], np.int32), np.array([1.0, 2.0], F32))
    with pytest.raises(ValueError, match="must be finite"):
        s.set_bias(0, np.array([1], np.int32), np.array([np.nan], F32))


@pytest.mark.parametrize("column, value, match", [
    ("temperature", -0.5, r"temperature\[1\] must be in \[0, 100\], got -0.5"),
    ("temperature", 101.0, r"temperature\[1\]"),
    ("temperature", np.nan, r"temperature\[1\]"),
    ("top_p", 0.0, r"top_p\[1\] must be in \(0, 1\], got 0.0"),
    ("top_p", 1.5, r"top_p\[1\]"),
    ("min_p", -0.1, r"min_p\[1\] must be in \[0, 1\]"),
    ("top_k", -2, r"top_k\[1\] must be >= -1, got -2"),
    ("num_logprobs", 21, r"num_logprobs\[1\] must be in \[-1, 20\], got 21"),
    ("num_logprobs", -2, r"num_logprobs\[1\]"),
    ("mask_row", 0, r"mask_row\[1\] must be -1 or a row of masks \[0, 0\), got 0"),
    ("repetition_penalty", 0.0, r"repetition_penalty\[1\] must be finite and > 0"),
    ("presence_penalty", np.inf, r"presence_penalty\[1\]"),
    ("prompt_len", -1, r"prompt_len\[1\] must be in \[0, 0\] \(the history's length\), got -1"),
])
def test_run_names_the_bad_value_and_its_row(column, value, match):
    s = ops.RowSampler(10, 3)
    getattr(s, column)[1] = value
    with pytest.raises(ValueError, match=match):
        s.run(np.zeros((3, 10), F32), 0, 3)
    s.run(np.zeros((3, 10), F32), 2, 3)  # entry 1 is outside the run: fine


def test_run_checks_history_ids_changed_after_set_history():
    s = ops.RowSampler(10, 1)
    hist = np.array([1, 2, 3], np.int32)
    s.set_history(0, hist, 3, 1)
    s.repetition_penalty[0] = 1.2
    hist[2] = 12
    with pytest.raises(ValueError, match=r"history ids of row 0 must be in \[0, 10\), got 12 at 2"):
        s.run(np.zeros((1, 10), F32), 0, 1)


def test_run_checks_its_arrays():
    s = ops.RowSampler(40, 4)
    with pytest.raises(ValueError, match="at least 3 rows of 40"):
        s.run(np.zeros((2, 40), F32), 0, 3)
    with pytest.raises(ValueError, match="logits must have dtype float32"):
        s.run(np.zeros((4, 40)), 0, 3)
    with pytest.raises(ValueError, match="begin and end"):
        s.run(np.zeros((4, 40), F32), 2, 5)
    with pytest.raises(ValueError, match="masks must hold 2 words a row"):
        s.run(np.zeros((4, 40), F32), 0, 1, np.zeros((1, 1), np.int32))
    with pytest.raises(ValueError, match="logits is read-only"):
        ro = np.zeros((4, 40), F32)
        ro.flags.writeable = False
        s.run(ro, 0, 1)
    with pytest.raises(ValueError, match="vocab_size must be"):
        ops.RowSampler(0, 4)
    with pytest.raises(ValueError, match="max_rows must be"):
        ops.RowSampler(4, 0)
