"""``LogAlphaNormal``: a Normal(θ, αθ²) that carries log α for the VD KL and the LRT rule."""

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import kl_divergence

from pyro_dropout.distributions import (
    ImproperLogUniform,
    LogAlphaNormal,
    kl_normal_log_uniform,
)


def _example(shape=(4, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.empty(shape).uniform_(-6, 6, generator=g)


def test_is_the_normal_with_variance_alpha_theta_squared():
    theta, log_alpha = _example()
    d = LogAlphaNormal(theta, log_alpha)
    var = theta**2 * log_alpha.exp()
    torch.testing.assert_close(d.variance, var)
    torch.testing.assert_close(d.scale, var.sqrt())
    w = torch.randn(4, 3)
    torch.testing.assert_close(d.log_prob(w), dist.Normal(theta, var.sqrt()).log_prob(w))


def test_scale_stays_positive_at_theta_zero():
    d = LogAlphaNormal(torch.zeros(3), torch.zeros(3))
    assert (d.scale > 0).all() and torch.isfinite(d.scale.log()).all()


def test_kl_uses_log_alpha_and_agrees_with_the_plain_normal():
    theta, log_alpha = _example()
    q = LogAlphaNormal(theta, log_alpha)
    plain = dist.Normal(theta, q.scale)
    torch.testing.assert_close(
        kl_normal_log_uniform(q), kl_normal_log_uniform(plain), rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        kl_divergence(q, ImproperLogUniform().expand((4, 3))),
        kl_normal_log_uniform(plain),
        rtol=1e-4,
        atol=1e-5,
    )


def test_kl_gradient_flows_to_log_alpha_directly():
    theta, log_alpha = _example()
    log_alpha.requires_grad_(True)
    kl_normal_log_uniform(LogAlphaNormal(theta, log_alpha)).sum().backward()
    assert (log_alpha.grad < 0).all()  # larger α, smaller KL (Molchanov's curve is monotone)


@pytest.mark.parametrize("batch", [(2, 4, 3), (5, 1, 4, 3)])
def test_expand_keeps_log_alpha_and_the_variance(batch):
    theta, log_alpha = _example()
    d = LogAlphaNormal(theta, log_alpha).expand(batch)
    assert type(d) is LogAlphaNormal and d.batch_shape == batch
    assert d.log_alpha.shape == batch and d.variance.shape == batch
    torch.testing.assert_close(d.variance[(0,) * (len(batch) - 2)], theta**2 * log_alpha.exp())


def test_broadcasts_its_arguments():
    d = LogAlphaNormal(torch.randn(4, 3), torch.tensor(-2.0))
    assert d.batch_shape == (4, 3) and d.log_alpha.shape == (4, 3)
