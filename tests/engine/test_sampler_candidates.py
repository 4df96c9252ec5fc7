"""filter_logits ranks only the candidates (top-k via torch.topk, a min-p / top-p bound) and must
return what the full stable argsort (filter_logits_sorted, its definition) returns, bit for bit:
on random rows with ties, -inf, all-equal rows, NaN and inf, k past the vocabulary and k = 1; the
Sampler's probabilities and its seeded draws are then the old chain's too. Which rows take the
candidates' route and which fall back is checked, so the fast route cannot silently vanish."""

import math
from dataclasses import replace

import pytest
import torch

from sparkd.engine.sampler import (Sampler, SamplingParams, _mass_threshold, apply_repetition_penalty,
                                   filter_logits, filter_logits_sorted, survivors)

FILTERS = [(40, 0.95, 0.05), (0, 0.95, 0.0), (0, 1.0, 0.05), (40, 1.0, 0.0), (1, 1.0, 0.0), (1, 0.5, 0.5),
           (0, 0.5, 0.1), (5, 0.3, 0.0), (3, 1.0, 1.0), (0, 1e-9, 0.0), (2000, 0.9, 0.0),
           (0, 0.999999, 1e-6), (7, 1.0, 0.0), (0, 1.0, 0.0),
           (-3, 0.0, 1.5), (0, -0.5, 0.0), (2, 1.5, -0.1)]     # out of SamplingParams' ranges: as the sort


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN included, -0.0 told from 0.0)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def random_rows(n_vocab: int, count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n_vocab)
    out = []
    for i in range(count):
        row = torch.randn(n_vocab, generator=g) * (0.5 + i % 6)
        if i % 4 == 1:
            row = row.round()                                   # many ties, at the cut too
        if i % 4 == 2:
            row[torch.randint(n_vocab, (n_vocab // 2,), generator=g)] = float("-inf")
        if i % 9 == 3:
            row[:] = 1.5                                        # all equal
        if i % 9 == 5:
            row[:] = float("-inf")
            row[n_vocab // 2] = 0.25                            # one finite token
        out.append(row)
    return out


def odd_rows(n_vocab: int) -> list[torch.Tensor]:
    """Rows the full sort handles its own way (the candidates' route hands them over)."""
    out = []
    for value in (float("nan"), float("inf")):
        row = torch.linspace(-3, 3, n_vocab)
        row[n_vocab // 3] = value
        out.append(row)
    out.append(torch.full((n_vocab,), float("-inf")))
    signed_zeros = torch.zeros(n_vocab)
    signed_zeros[::2] = -0.0
    return out + [signed_zeros]


@pytest.mark.parametrize("n_vocab", [1, 2, 7, 64, 1000, 3000])
def test_filter_equals_the_full_sort_bit_for_bit(n_vocab):
    for row in random_rows(n_vocab, 14) + odd_rows(n_vocab):
        for k, top_p, min_p in FILTERS + [(n_vocab, 0.9, 0.0), (n_vocab + 5, 0.9, 0.02), (n_vocab - 1, 1.0, 0.0)]:
            got, want = filter_logits(row, k, top_p, min_p), filter_logits_sorted(row, k, top_p, min_p)
            assert same_bits(got, want), (n_vocab, row[:8], k, top_p, min_p)


def full_vocab_rows() -> list[torch.Tensor]:
    """151936 tokens: model-like rows (48 lifted tokens over noise) and flat ones."""
    g = torch.Generator().manual_seed(5)
    peaked = []
    for _ in range(2):
        row = torch.randn(151936, generator=g) * 1.5
        row[torch.randperm(151936, generator=g)[:48]] += torch.linspace(14.0, 4.0, 48)
        peaked.append(row)
    return peaked + [torch.randn(151936, generator=g) * 3.0]


def test_full_vocabulary_rows_take_the_candidates_route_and_agree():
    for i, row in enumerate(full_vocab_rows()):
        for k, top_p, min_p in [(40, 0.95, 0.05), (0, 0.95, 0.0), (0, 1.0, 0.05), (40, 1.0, 0.0)]:
            assert survivors(row, k, top_p, min_p) is not None, (i, k, top_p, min_p)
            assert same_bits(filter_logits(row, k, top_p, min_p), filter_logits_sorted(row, k, top_p, min_p))


def test_undecidable_rows_fall_back_to_the_full_sort():
    """A decision exactly on its threshold (4 equal tokens: the third has 0.5 before it; 2 equal
    ones under min-p 1), a NaN or +inf row: no candidates' answer, and filter_logits still gives the full sort's."""
    quarter = torch.zeros(4)
    assert survivors(quarter, 0, 0.5, 0.0) is None
    assert survivors(torch.zeros(2), 0, 1.0, 1.0) is None        # min-p 1: the second is on the edge
    assert survivors(torch.tensor([1.0, float("nan"), 0.0]), 2, 1.0, 0.0) is None
    assert survivors(torch.tensor([1.0, float("inf"), 0.0]), 0, 1.0, 0.5) is None
    assert torch.equal(survivors(torch.tensor([0.0, 2.0, 2.0, 1.0]), 2, 1.0, 0.0), torch.tensor([1, 2]))
    for row, args in [(quarter, (0, 0.5, 0.0)), (torch.tensor([1.0, float("nan"), 0.0]), (2, 1.0, 0.0))]:
        assert same_bits(filter_logits(row, *args), filter_logits_sorted(row, *args))


def test_mass_threshold_bounds_the_top_p_prefix():
    """The tokens with exp >= t hold the mass asked for; those with exp >= 2t do not (t is the
    largest power of two that does)."""
    g = torch.Generator().manual_seed(3)
    for i in range(200):
        exps = torch.exp(-torch.rand(1000, generator=g, dtype=torch.float64) * (1 + 4 * i))
        exps[0] = 1.0
        if i % 3 == 0:
            exps[5:50] = 0.0
        mass = float(exps.sum()) * float(torch.rand(1, generator=g, dtype=torch.float64))
        t = _mass_threshold(exps, mass)
        assert t > 0 and float(exps[exps >= t].sum()) >= mass, (i, t)
        assert t == 1.0 or float(exps[exps >= 2 * t].sum()) < mass, (i, t)
    assert _mass_threshold(torch.tensor([1.0, 0.0], dtype=torch.float64), 1.5) == 0.0   # never reached


PARAMS = [SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
          SamplingParams(temperature=0.7, top_p=0.9),
          SamplingParams(temperature=1.3, min_p=0.05),
          SamplingParams(temperature=0.5, top_k=1),
          SamplingParams(temperature=1.0, top_k=50000),
          SamplingParams(temperature=2.0, top_k=5, top_p=0.3, repetition_penalty=1.3, repetition_window=8)]


def old_probabilities(p: SamplingParams, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
    """Sampler.probabilities as it was: the full sort in the same chain."""
    logits = logits.float()
    if p.repetition_window:
        logits = apply_repetition_penalty(logits, history[-p.repetition_window:], p.repetition_penalty)
    return torch.softmax(filter_logits_sorted(logits, p.top_k, p.top_p, p.min_p).double() / p.temperature, dim=0)


@pytest.mark.parametrize("pi", range(len(PARAMS)))
def test_probabilities_and_seeded_draws_are_the_old_chains(pi):
    """Same logits and history: the same float64 probabilities, and a seeded Sampler draws the tokens
    the old chain drew from a generator seeded alike, leaving that generator in the same state."""
    p = PARAMS[pi]
    sampler = Sampler(replace(p, seed=11))
    old = torch.Generator().manual_seed(11)
    rows = random_rows(1000, 12)
    history, got, want = [3, 1, 4, 1, 5], [], []
    for i in range(40):
        row = rows[i % len(rows)]
        probs = old_probabilities(p, row, history)
        assert same_bits(sampler.probabilities(row, history), probs), (p, i)
        got.append(sampler(row, history))
        want.append(int(torch.multinomial(probs, 1, generator=old)))
        history.append(want[-1])
    assert got == want and torch.equal(sampler.generator.get_state(), old.get_state())


def test_thresholds_placed_on_the_full_sorts_own_numbers_still_agree():
    """top_p and min_p set exactly on (and one ulp either side of) the full sort's mass before a
    rank / probability ratio: the candidates' sums round otherwise, so only the fallback near a
    threshold keeps the answers equal (with no tolerance these rows disagree)."""
    for row in random_rows(1000, 14)[:12:2]:
        probs = torch.softmax(torch.sort(row, descending=True).values.double(), dim=0)
        before = torch.cumsum(probs, dim=0) - probs
        for j in (1, 2, 3, 5, 8, 13, 21):
            for edge in (float(before[j]), float(probs[j] / probs[0]), float(probs[j]) / float(probs[0])):
                for value in (math.nextafter(edge, 0.0), edge, math.nextafter(edge, 1.0)):
                    for args in ((0, value, 0.0), (0, 1.0, value), (40, value, 0.01)):
                        if 0.0 < value <= 1.0:
                            got, want = filter_logits(row, *args), filter_logits_sorted(row, *args)
                            assert same_bits(got, want), (j, args)
