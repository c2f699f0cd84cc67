"""Registering a rule for a user's weight family: the default estimator is ``"lrt"``, the rule
is found for the family and its subclasses (not for another estimator), an unknown estimator
is rejected, and ``local_reparameterization`` then answers the family's layers with it."""

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_dropout import local_reparameterization
from pyro_dropout.handlers import lookup_rule, register_local_reparameterization, registry


class PointMassNormal(dist.Normal):
    """A user's family (a Normal subclass) whose rule ignores the scale."""


class NarrowerPointMassNormal(PointMassNormal):
    pass


@pytest.fixture
def rules(monkeypatch):
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(registry, "_RULES", dict(registry._RULES))
    return registry._RULES


def _mean_only(fn, x, spec):
    return spec(x, fn.loc)


def test_a_registered_rule_is_found_for_lrt_by_default(rules):
    returned = register_local_reparameterization(PointMassNormal)(_mean_only)
    assert returned is _mean_only
    fn = PointMassNormal(torch.zeros(2, 3), torch.ones(2, 3))
    assert lookup_rule(fn) is _mean_only
    assert lookup_rule(fn, "lrt") is _mean_only
    assert lookup_rule(NarrowerPointMassNormal(0.0, 1.0), "lrt") is _mean_only
    # the plain Normal keeps its own rule; other estimators are not affected
    assert lookup_rule(dist.Normal(0.0, 1.0)) is not _mean_only
    assert lookup_rule(fn, "flipout") is lookup_rule(dist.Normal(0.0, 1.0), "flipout")


@pytest.mark.parametrize("estimator", ["flipout", "per_example"])
def test_a_rule_registered_for_another_estimator_leaves_lrt_alone(rules, estimator):
    register_local_reparameterization(PointMassNormal, estimator=estimator)(_mean_only)
    fn = PointMassNormal(0.0, 1.0)
    assert lookup_rule(fn, estimator) is _mean_only
    assert lookup_rule(fn) is lookup_rule(dist.Normal(0.0, 1.0))


def test_an_unknown_estimator_is_rejected(rules):
    with pytest.raises(ValueError, match="estimator must be one of"):
        register_local_reparameterization(PointMassNormal, estimator="weights")


def test_local_reparameterization_answers_with_the_registered_rule(rules):
    """The deterministic rule gives ``x @ loc.T`` exactly, although σ = 1 (the built-in
    Normal rule would add noise)."""
    register_local_reparameterization(PointMassNormal)(_mean_only)
    loc = torch.tensor([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]])

    def guide(x):
        pyro.sample("w", PointMassNormal(loc, torch.ones(2, 3)).to_event(2))

    def model(x):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        return F.linear(x, w)

    x = torch.randn(5, 3)
    with local_reparameterization():
        tr = poutine.trace(guide).get_trace(x)
        out = poutine.replay(model, trace=tr)(x)
    assert torch.allclose(out, x @ loc.T, atol=1e-6)
