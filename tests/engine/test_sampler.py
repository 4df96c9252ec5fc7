"""Sampler on literal logits: each filter, the penalty, greedy, and seeded reproducibility."""

import pytest
import torch

from sparkd.engine.sampler import (Sampler, SamplingError, SamplingParams, apply_repetition_penalty,
                                   filter_logits, warm_sampler)

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, -1.0])   # ranked: 1, 2, 0, 3, 4


def kept(out: torch.Tensor) -> list[int]:
    return [i for i, v in enumerate(out.tolist()) if v != float("-inf")]


def test_greedy_takes_argmax():
    assert Sampler(SamplingParams(temperature=0))(LOGITS) == 1


def test_top_k_keeps_k_best():
    assert kept(filter_logits(LOGITS, top_k=2, top_p=1.0, min_p=0.0)) == [1, 2]


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = torch.softmax(LOGITS, 0)            # token 1: 0.61, token 2: 0.22, token 0: 0.08
    assert probs[1] < 0.7 < probs[1] + probs[2]
    assert kept(filter_logits(LOGITS, top_k=0, top_p=0.7, min_p=0.0)) == [1, 2]
    assert kept(filter_logits(LOGITS, top_k=0, top_p=0.5, min_p=0.0)) == [1]


def test_min_p_is_relative_to_the_best_token():
    # token 2 has e^-1 = 0.37 of the best token's probability, token 0 has e^-2 = 0.14
    assert kept(filter_logits(LOGITS, top_k=0, top_p=1.0, min_p=0.3)) == [1, 2]
    assert kept(filter_logits(LOGITS, top_k=0, top_p=1.0, min_p=0.1)) == [0, 1, 2]


def test_filters_always_keep_the_best_token():
    assert kept(filter_logits(LOGITS, top_k=0, top_p=1e-9, min_p=1.0)) == [1]


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    out = apply_repetition_penalty(LOGITS, [1, 4, 1], penalty=2.0)
    assert out.tolist() == [1.0, 1.5, 2.0, 0.5, -2.0]


def test_repetition_penalty_can_change_the_greedy_choice():
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0))
    assert s(LOGITS, history=[1]) == 2


def test_repetition_window_limits_the_history():
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0, repetition_window=1))
    assert s(LOGITS, history=[1, 0]) == 1      # only token 0 is in the window


def _draws(seed: int, n: int = 20) -> list[int]:
    sampler = Sampler(SamplingParams(seed=seed))
    return [sampler(torch.zeros(1000)) for _ in range(n)]


def test_same_seed_same_draws_other_seed_differs():
    assert _draws(7) == _draws(7)
    assert _draws(7) != _draws(8)


def test_warm_sampler_moves_no_generator():
    """generate's warm-up of the host chain draws from a throwaway Sampler: a seeded request's draws
    around it and torch's global generator are as they were."""
    state, want = torch.get_rng_state(), _draws(7, 3)
    sampler, got = Sampler(SamplingParams(seed=7)), []
    for params in (SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, top_k=40),
                   SamplingParams(temperature=0.8, top_p=0.95, seed=7)):
        warm_sampler(params, 1000)
        got.append(sampler(torch.zeros(1000)))
    assert got == want and torch.equal(torch.get_rng_state(), state)


def test_draws_stay_inside_the_filtered_set():
    s = Sampler(SamplingParams(temperature=1.5, top_k=2, seed=0))
    assert {s(LOGITS) for _ in range(200)} == {1, 2}


def test_temperature_sharpens_the_distribution():
    low = Sampler(SamplingParams(temperature=0.05, seed=1))
    assert all(low(LOGITS) == 1 for _ in range(50))


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("top_k", -1), ("top_p", 0.0),
                                         ("top_p", 1.5), ("min_p", -0.1), ("repetition_penalty", 0.0),
                                         ("repetition_window", -1)])
def test_bad_parameter_is_named(field, value):
    with pytest.raises(SamplingError, match=f"could not use sampling parameter {field}="):
        SamplingParams(**{field: value})


def test_logits_must_be_one_row():
    with pytest.raises(SamplingError, match=r"shape \(2, 5\)"):
        Sampler()(torch.zeros(2, 5))
