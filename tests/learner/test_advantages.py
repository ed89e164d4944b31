import pytest
import torch

from learner.advantages import group_advantages, is_zero_variance


def test_known_vector():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), eps=0.0)
    # mean 0.25, population std sqrt(0.1875) = 0.4330
    assert adv.tolist() == pytest.approx([1.7320508, -0.5773503, -0.5773503, -0.5773503])


def test_advantages_sum_to_zero_and_have_unit_population_std():
    adv = group_advantages(torch.tensor([3.0, 1.0, 0.5, 2.0, 2.0]), eps=0.0)
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv.std(correction=0)) == pytest.approx(1.0)


def test_zero_variance_group_has_zero_advantages():
    assert group_advantages(torch.ones(8)).tolist() == [0.0] * 8
    assert is_zero_variance([1.0] * 8) and is_zero_variance([0.0, 0.0])
    assert not is_zero_variance([0.0, 1.0])


def test_advantages_are_float64_and_exactly_zero_for_equal_rewards_that_do_not_average_exactly():
    rewards = torch.tensor([0.1] * 6, dtype=torch.float64)
    assert float((rewards - rewards.mean()).abs().max()) > 0  # the naive formula leaves round-off
    adv = group_advantages(rewards)
    assert adv.dtype == torch.float64
    assert adv.tolist() == [0.0] * 6
    assert group_advantages(torch.tensor([0.1] * 8)).tolist() == [0.0] * 8  # float32 input too


def test_an_empty_group_is_zero_variance_everywhere():
    from gates.allocators._common import is_zero_variance as allocator_rule

    assert is_zero_variance([]) and allocator_rule([])
