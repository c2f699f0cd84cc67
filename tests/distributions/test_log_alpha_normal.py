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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sigma2", [1.0, 5.0, 1e3, 1e30])
def test_variance_stays_finite_at_theta_zero(dtype, sigma2):
    """Variational dropout's additive parameterisation gives log α = log σ² − log(θ² + tiny):
    at θ = 0 in float32 that is log σ² + 87.3, beyond exp's range (88.7) for σ² ≥ 5, and
    ``(θ² + tiny) · exp(log α)`` was inf (and so was the draw). The variance is σ² to the
    rounding of log α (relative error ≤ |log α| · eps)."""
    theta = torch.tensor([0.0, 1e-30, 1e-3, 1.0], dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    log_alpha = torch.log(torch.tensor(sigma2, dtype=dtype)) - torch.log(theta * theta + tiny)
    d = LogAlphaNormal(theta, log_alpha)
    expected = torch.full_like(theta, sigma2)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(d.variance, expected, rtol=4 * eps * log_alpha.abs().max(), atol=0)
    assert torch.isfinite(d.scale).all() and torch.isfinite(d.rsample((100,))).all()
    assert torch.isfinite(d.log_prob(torch.zeros_like(theta))).all()
    assert torch.isfinite(kl_divergence(d, ImproperLogUniform().expand((4,)))).all()


@pytest.mark.parametrize("prior", ["normal", "log-uniform"])
def test_from_log_variance_is_the_same_family_and_kl(prior):
    """Built from log σ² (what AutoVariationalDropout learns): the variance is exp(log σ²),
    log α = log σ² - log(θ² + tiny), and draws, densities and KL (Gaussian prior: from σ² and
    log σ², never σ; log-uniform: from log α) and their gradients are those of the family built
    from that log α."""
    g = torch.Generator().manual_seed(4)
    theta = torch.randn(5, 3, generator=g, dtype=torch.float64).requires_grad_()
    log_var = torch.empty(5, 3, dtype=torch.float64).uniform_(-8, 1, generator=g)
    log_var.requires_grad_()
    tiny = torch.finfo(theta.dtype).tiny
    a = LogAlphaNormal.from_log_variance(theta, log_var)
    b = LogAlphaNormal(theta, log_var - torch.log(theta * theta + tiny))
    assert a.log_variance is log_var
    torch.testing.assert_close(b.log_variance, log_var)
    torch.testing.assert_close(a.variance, log_var.exp())
    for name in ("variance", "scale", "log_alpha", "mean", "stddev"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name))
    w = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(a.log_prob(w), b.log_prob(w))
    torch.manual_seed(0)
    draw = a.rsample((2,))
    torch.manual_seed(0)
    torch.testing.assert_close(draw, b.rsample((2,)))
    if prior == "normal":
        p = dist.Normal(0.3, 1.7).expand((5, 3))
        plain = torch.distributions.kl_divergence(
            torch.distributions.Normal(theta, log_var.exp().sqrt()), p
        )
    else:
        p = ImproperLogUniform((5, 3))
        plain = kl_divergence(b, p)
    kl_a, kl_b = kl_divergence(a, p), kl_divergence(b, p)
    torch.testing.assert_close(kl_a, kl_b)
    torch.testing.assert_close(kl_a, plain)
    grads = [torch.autograd.grad(k.sum(), [theta, log_var]) for k in (kl_a, plain)]
    for ga, gb in zip(*grads, strict=True):
        torch.testing.assert_close(ga, gb)
    big = a.expand((2, 5, 3))
    assert big.log_variance.shape == (2, 5, 3)
    torch.testing.assert_close(big.variance, a.variance.expand(2, 5, 3))
    torch.testing.assert_close(big.log_alpha, a.log_alpha.expand(2, 5, 3))


def test_from_log_variance_validates_its_arguments():
    with pytest.raises(ValueError, match="loc"):
        LogAlphaNormal.from_log_variance(torch.tensor([float("nan")]), torch.zeros(1), True)


def test_kl_gradient_is_finite_where_the_variance_is_denormal():
    """theta = 0 with a layer's log alpha (a weight vector that starts at zero): the variance
    alpha * tiny is denormal in float32, and the Normal-prior KL must keep finite gradients
    (through log sigma^2, not log of its square root). Measured before: nan for theta, inf for
    log alpha, so fit's second step had a nan loss."""
    theta = torch.zeros(16, requires_grad=True)
    log_alpha = torch.full((16,), -6.0, requires_grad=True)
    q = LogAlphaNormal(theta, log_alpha)
    assert q.variance.max() < torch.finfo(torch.float32).tiny  # denormal: the case at hand
    kl = kl_divergence(q, dist.Normal(0.0, 1.0).expand((16,))).sum()
    g_theta, g_log_alpha = torch.autograd.grad(kl, [theta, log_alpha])
    assert torch.isfinite(g_theta).all() and torch.isfinite(g_log_alpha).all()
    torch.testing.assert_close(g_log_alpha, torch.full((16,), -0.5), atol=1e-6, rtol=0)
