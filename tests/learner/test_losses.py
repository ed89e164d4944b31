import pytest
import torch

from learner.losses import LOSSES, clipped_ratio_loss, reinforce_loss, token_mean_loss


def _batch():
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])  # [N=2, T=3]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    return old, mask, adv


def test_ratio_one_gives_minus_mean_advantage():
    old, mask, adv = _batch()
    loss, stats = clipped_ratio_loss(old.clone(), old, adv, mask, clip_eps=0.2)
    assert float(loss) == pytest.approx(-adv.mean().item())
    assert stats["learner/ratio_mean"] == pytest.approx(1.0)
    assert stats["learner/clip_fraction"] == 0.0


def test_clipping_caps_a_positive_advantage_ratio():
    old, mask, adv = _batch()
    new = old + torch.log(torch.tensor(2.0))  # ratio 2 everywhere
    loss, stats = clipped_ratio_loss(new, old, adv, mask, clip_eps=0.2)
    # item 0 (A=+1): min(2, 1.2) = 1.2 -> -1.2; item 1 (A=-1): min(-2, -1.2) = -2 -> +2
    assert float(loss) == pytest.approx((-1.2 + 2.0) / 2)
    assert stats["learner/clip_fraction"] == pytest.approx(1.0)


def test_token_mean_weighs_tokens_not_items():
    old, mask, adv = _batch()
    loss, _ = token_mean_loss(old.clone(), old, adv, mask, clip_eps=0.2)
    assert float(loss) == pytest.approx((-1 - 1 + 1) / 3)


def test_reinforce_is_advantage_weighted_mean_logprob():
    old, mask, adv = _batch()
    loss, _ = reinforce_loss(old.clone(), old, adv, mask, clip_eps=0.2)
    assert float(loss) == pytest.approx(-((1.0 * -1.5) + (-1.0 * -0.5)) / 2)


def test_every_variant_is_registered_by_name():
    assert set(LOSSES.names()) >= {"clipped_ratio", "token_mean", "reinforce"}
    assert LOSSES.get("clipped_ratio") is clipped_ratio_loss
