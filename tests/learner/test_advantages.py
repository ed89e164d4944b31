import pytest
import torch

from learner.advantages import discounted_returns, group_advantages, is_zero_variance, step_advantages


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


def test_discounted_returns_of_a_terminal_reward():
    returns = discounted_returns(torch.tensor([0.0, 0.0, 1.0]), gamma=0.5)
    assert returns.dtype == torch.float64
    assert returns.tolist() == [0.25, 0.5, 1.0]
    assert discounted_returns(torch.tensor([1.0, 1.0]), gamma=1.0).tolist() == [2.0, 1.0]


def test_step_advantages_compare_only_steps_from_the_same_anchor_state():
    # Two rollouts start in state "s0"; the one that goes on to win scores higher there. "x" and "y" are
    # visited once each, so nothing compares them; "" is never grouped.
    anchors = [["s0", "x"], ["s0", "y", ""]]
    returns = [torch.tensor([0.9, 1.0], dtype=torch.float64), torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)]
    out = step_advantages(anchors, returns, eps=0.0)
    assert out[0].tolist() == [1.0, 0.0]
    assert out[1].tolist() == [-1.0, 0.0, 0.0]


def test_step_advantages_group_repeated_visits_of_a_state_within_one_rollout():
    # A looping rollout visits "a" three times; the visit that walked on to the win has the highest return.
    anchors = [["a", "b", "a", "c", "a"]]
    returns = [torch.tensor([0.5, 0.6, 0.7, 0.8, 0.9], dtype=torch.float64)]
    out = step_advantages(anchors, returns, eps=0.0)[0]
    expected = group_advantages(torch.tensor([0.5, 0.7, 0.9]), eps=0.0).tolist()
    assert out.tolist() == pytest.approx([expected[0], 0.0, expected[1], 0.0, expected[2]])


def test_a_state_whose_returns_are_equal_gets_exactly_zero_step_advantage():
    anchors = [["s"], ["s"]]
    out = step_advantages(anchors, [torch.zeros(1, dtype=torch.float64)] * 2)
    assert [o.tolist() for o in out] == [[0.0], [0.0]]
