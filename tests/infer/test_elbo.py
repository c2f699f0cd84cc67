"""MeanFieldELBO: the TraceMeanField_ELBO estimator without the unused log densities."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    ImproperLogUniform,
    local_reparameterization,
)
from pyro_dropout.infer import MeanFieldELBO

GUIDES = [
    (AutoDropout, {"dropout_rate": 0.2}, None),
    (AutoMeanField, {}, None),
    (AutoVariationalDropout, {}, ImproperLogUniform()),
    (AutoDropout, {"dropout_rate": 0.2}, ImproperLogUniform()),  # no analytic KL: MC fallback
]


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(40, 3, generator=g), torch.randn(40, generator=g)


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("guide_cls, kwargs, prior", GUIDES)
def test_same_loss_and_gradients_as_trace_mean_field(guide_cls, kwargs, prior, vectorize):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=4.0, prior=prior)
    guide = guide_cls(model, **kwargs)
    guide(x, y)
    params = [p for _, p in guide.named_parameters()]
    results = []
    for elbo in (
        TraceMeanField_ELBO(num_particles=3, vectorize_particles=vectorize),
        MeanFieldELBO(num_particles=3, vectorize_particles=vectorize),
    ):
        pyro.set_rng_seed(7)  # the same draws for both estimators
        with local_reparameterization():
            loss = elbo.differentiable_loss(model, guide, x, y)
        grads = torch.autograd.grad(loss, params)
        results.append((loss.detach(), grads))
    (l0, g0), (l1, g1) = results
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-4)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_skips_log_prob_of_sites_with_an_analytic_kl(monkeypatch):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=4.0)
    guide = AutoMeanField(model)
    guide(x, y)
    calls = []
    original = dist.Normal.log_prob

    def spy(self, value):
        calls.append(tuple(self.batch_shape))
        return original(self, value)

    monkeypatch.setattr(dist.Normal, "log_prob", spy)
    MeanFieldELBO().loss(model, guide, x, y)
    # Only the likelihood's Normal is evaluated (batch (40, 1) before to_event).
    assert calls == [(40, 1)]
    calls.clear()
    TraceMeanField_ELBO().loss(model, guide, x, y)
    assert len(calls) > 1  # Pyro's estimator evaluates every site


def test_auxiliary_guide_sites_and_monte_carlo_fallback_are_kept():
    def model():
        pyro.sample("z", dist.Gamma(2.0, 1.0))

    def guide():
        a = pyro.sample("a", dist.Normal(0.0, 1.0), infer={"is_auxiliary": True})
        pyro.sample("z", dist.LogNormal(a * 0.1, 0.5))

    for elbo_cls in (TraceMeanField_ELBO, MeanFieldELBO):
        pyro.set_rng_seed(3)
        losses = [elbo_cls().loss(model, guide) for _ in range(20)]
        if elbo_cls is TraceMeanField_ELBO:
            reference = losses
    assert losses == pytest.approx(reference)


def test_guide_sites_out_of_the_models_order_warn_as_pyros_elbo_does():
    """The mean-field order check (Pyro's ``TraceMeanField_ELBO`` check, kept here because
    Pyro's function is private): a guide that samples the model's sites in another order warns
    once per loss, at the caller's line, with both orders; the same order does not."""

    def model():
        pyro.sample("a", dist.Normal(0.0, 1.0))
        pyro.sample("b", dist.Normal(0.0, 1.0))

    def guide(order):
        def run():
            loc = pyro.param("loc", torch.tensor(0.0))
            for name in order:
                pyro.sample(name, dist.Normal(loc, 1.0))

        return run

    with pyro.validation_enabled(True):
        with pytest.warns(UserWarning, match="mean field restriction") as caught:
            MeanFieldELBO().differentiable_loss(model, guide("ba"))
        message = str(caught[0].message)
        assert "Model sites:\n  a\n  b" in message and "Guide sites:\n  b\n  a" in message
        assert caught[0].filename == __file__
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            MeanFieldELBO().differentiable_loss(model, guide("ab"))
