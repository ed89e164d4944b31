import pytest
import torch

from learner.losses import LOSSES, clipped_ratio_loss, reinforce_loss


def _batch():
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])  # [N=2, T=3]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    return old, mask, adv


def test_ratio_one_gives_minus_advantage_per_token_and_zero_on_padding():
    old, mask, adv = _batch()
    terms = clipped_ratio_loss(old.clone(), old, adv, mask, clip_eps=0.2)
    assert terms.tolist() == [[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0]]


def test_clipping_caps_a_positive_advantage_ratio():
    old, mask, adv = _batch()
    new = old + torch.log(torch.tensor(2.0))  # ratio 2 everywhere
    terms = clipped_ratio_loss(new, old, adv, mask, clip_eps=0.2)
    # item 0 (A=+1): min(2, 1.2) = 1.2 -> -1.2; item 1 (A=-1): min(-2, -1.2) = -2 -> +2
    assert terms[0, :2].tolist() == pytest.approx([-1.2, -1.2])
    assert terms[1, 0].item() == pytest.approx(2.0)


def test_reinforce_is_minus_advantage_times_logprob():
    old, mask, adv = _batch()
    terms = reinforce_loss(old.clone(), old, adv, mask, clip_eps=0.2)
    assert terms.flatten().tolist() == pytest.approx([1.0, 2.0, 0.0, -0.5, 0.0, 0.0])


def test_every_variant_is_registered_by_name():
    assert set(LOSSES.names()) >= {"clipped_ratio", "reinforce"}
    assert LOSSES.get("clipped_ratio") is clipped_ratio_loss
