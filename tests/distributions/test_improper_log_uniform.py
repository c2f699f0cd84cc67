"""Tests of :class:`ImproperLogUniform`, the scale-invariant prior of variational dropout."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import kl_divergence

from pyro_dropout.distributions import ImproperLogUniform, neg_kl_log_uniform_molchanov

from ._helpers import seeded


def test_log_prob_is_minus_log_abs():
    w = torch.tensor([0.5, -0.5, 2.0, -3.0, 1.0, 1e-20], dtype=torch.float64)
    lp = ImproperLogUniform().log_prob(w)
    torch.testing.assert_close(lp, -torch.log(w.abs()))
    assert lp[4] == 0
    # Scale invariance: log p(c w) - log p(w) = -log|c| for every w.
    torch.testing.assert_close(
        ImproperLogUniform().log_prob(3 * w) - lp,
        torch.full_like(lp, -torch.log(torch.tensor(3.0)).item()),
    )


def test_log_prob_broadcasts_with_batch_shape():
    d = ImproperLogUniform().expand([4, 3])
    assert d.log_prob(torch.tensor(2.0)).shape == (4, 3)
    assert d.log_prob(torch.rand(7, 1, 3) + 0.1).shape == (7, 4, 3)
    assert ImproperLogUniform(batch_shape=(2,)).log_prob(torch.ones(2)).shape == (2,)


def test_log_prob_validates_its_value():
    with pytest.raises(ValueError):
        ImproperLogUniform().log_prob(torch.tensor(float("nan")))


def test_log_prob_at_zero_is_large_but_finite():
    """An exact 0 (which a Gaussian guide can draw) must not make Pyro's trace warn of +inf."""
    lp = ImproperLogUniform().log_prob(torch.tensor([0.0, 1e-30]))
    assert torch.isfinite(lp).all() and lp[0] >= lp[1] > 60


def test_sample_raises_a_helpful_error():
    d = ImproperLogUniform().expand([3])
    for method in (d.sample, d.rsample):
        with pytest.raises(NotImplementedError, match="improper") as info:
            method()
        message = str(info.value)
        assert "cannot be sampled" in message and "guide" in message
    assert not d.has_rsample


def test_sampling_it_in_a_model_raises_the_same_error():
    def model():
        pyro.sample("w", ImproperLogUniform().expand([2]).to_event(1))

    with pytest.raises(NotImplementedError, match="improper"):
        model()


@settings(max_examples=40, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), max_size=3).map(tuple),
    extra=st.lists(st.integers(1, 3), max_size=2).map(tuple),
)
def test_expand_keeps_class_property(batch, extra):
    d = ImproperLogUniform(batch_shape=batch)
    e = d.expand(extra + batch)
    assert type(e) is ImproperLogUniform
    assert e.batch_shape == extra + batch and e.event_shape == ()
    assert e._validate_args == d._validate_args
    assert e.log_prob(torch.full(extra + batch, 2.0)).shape == extra + batch
    assert torch.isnan(e.mean).all() and e.mean.shape == extra + batch
    assert torch.isnan(e.variance).all()


def test_plate_keeps_class():
    def model():
        with pyro.plate("p", 4):
            pyro.sample("w", ImproperLogUniform(), obs=torch.ones(4))

    trace = pyro.poutine.trace(model).get_trace()
    fn = trace.nodes["w"]["fn"]
    assert type(fn) is ImproperLogUniform and fn.batch_shape == (4,)


def test_to_event_prior_with_normal_guide_kl():
    seeded(40)
    loc, scale = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.1
    prior = ImproperLogUniform().expand([3]).to_event(1)
    assert prior.event_shape == (3,) and prior.batch_shape == ()
    kl = kl_divergence(dist.Normal(loc, scale).to_event(1), prior)
    assert kl.shape == ()
    log_alpha = 2 * torch.log(scale) - torch.log(loc**2)
    torch.testing.assert_close(kl, -neg_kl_log_uniform_molchanov(log_alpha).sum())
    # With batch dims: the KL keeps the guide's batch shape.
    prior_b = ImproperLogUniform().expand([2, 3]).to_event(1)
    q_b = dist.Normal(loc.expand(2, 3), scale.expand(2, 3)).to_event(1)
    kl_b = kl_divergence(q_b, prior_b)
    assert kl_b.shape == (2,)
    torch.testing.assert_close(kl_b, kl.expand(2))
    assert prior.log_prob(torch.ones(3)) == 0
