"""Which sites and biases the messenger treats as guided weights.

* Only real-valued sites (support ``real``, also an equal copy of it) are weights: a positive
  matrix site is used as drawn, one draw for the minibatch.
* A bias of another family than Normal is added as drawn (shared over the minibatch); a
  plain (deterministic) bias is added in the layer's layout, also on convolutions under the
  Gaussian LRT rule.
* ``LocalReparameterizationMessenger()`` defaults to ``"auto"``; ``estimator="weights"`` is
  refused by ``local_reparameterization`` (that is ``weight_draws()``).
"""

import copy
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.distributions import constraints

from pyro_dropout import local_reparameterization
from pyro_dropout.handlers import LocalReparameterizationMessenger
from pyro_dropout.handlers.guided_value import plain

N = 64  # identical input rows


def _run(model, guide, x, **kwargs):
    with local_reparameterization(**kwargs), torch.no_grad():
        tr = poutine.trace(guide).get_trace(x)
        return poutine.replay(model, trace=tr)(x)


class _RealCopyNormal(dist.Normal):
    support = copy.deepcopy(constraints.real)


def _matrix_model(prior):
    def model(x):
        w = pyro.sample("w", prior)
        return x @ w.T

    return model


def test_a_positive_matrix_site_is_used_as_drawn():
    prior = dist.LogNormal(torch.zeros(2, 3), 1.0).to_event(2)

    def guide(x):
        pyro.sample("w", dist.LogNormal(torch.zeros(2, 3), 0.5).to_event(2))

    out = _run(_matrix_model(prior), guide, torch.ones(N, 3))
    assert out.shape == (N, 2) and out.std(0).max() == 0  # one draw for every row


def test_a_copied_real_support_is_a_weight():
    assert _RealCopyNormal.support is not constraints.real
    prior = _RealCopyNormal(torch.zeros(2, 3), 1.0).to_event(2)

    def guide(x):
        pyro.sample("w", _RealCopyNormal(torch.zeros(2, 3), 0.5).to_event(2))

    out = _run(_matrix_model(prior), guide, torch.ones(N, 3))
    assert out.std(0).min() > 0  # sampled per example (the Normal's LRT rule)


def _linear_model_with_bias(bias_prior):
    def model(x):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        b = pyro.sample("b", bias_prior)
        return F.linear(x, w, b)

    return model


def test_a_bias_of_another_family_is_added_as_drawn():
    loc = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])

    def guide(x):
        pyro.sample("w", dist.Normal(loc, 1e-6).to_event(2))  # nearly deterministic weights
        pyro.sample("b", dist.Laplace(torch.zeros(2), 1.0).to_event(1))

    model = _linear_model_with_bias(dist.Laplace(torch.zeros(2), 1.0).to_event(1))
    out = _run(model, guide, torch.ones(N, 3))
    assert out.shape == (N, 2)
    assert out.std(0).max() < 1e-4  # the Laplace bias: one draw shared by the minibatch
    assert (out[0] - 1.0).abs().max() > 1e-3  # and it was added


@pytest.mark.parametrize("estimator", ["lrt", "flipout", "per_example"])
def test_a_plain_bias_on_a_convolution_is_added_per_channel(estimator):
    loc = torch.randn(3, 2, 3, generator=torch.Generator().manual_seed(0))
    b = torch.tensor([10.0, -5.0, 2.0])

    def model(x):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2, 3), 1.0).to_event(3))
        return F.conv1d(x, w, b)

    def guide(x):
        pyro.sample("w", dist.Normal(loc, 1e-6).to_event(3))

    x = torch.randn(4, 2, 7, generator=torch.Generator().manual_seed(1))
    out = _run(model, guide, x, estimator=estimator)
    torch.testing.assert_close(out, F.conv1d(x, loc, b), atol=1e-4, rtol=0)


def test_messenger_defaults_to_auto_and_weights_is_refused():
    messenger = LocalReparameterizationMessenger()
    assert messenger.estimator == "auto" and messenger.strict is False
    with pytest.raises(ValueError, match="weight_draws"):
        local_reparameterization(estimator="weights")


def test_values_that_outlive_the_context_are_plain_weights():
    """After ``local_reparameterization()`` exits, a guided value it drew is the weight itself:
    ``F.linear`` gives torch's result on it, with no noise and no warning."""

    def guide(x):
        return pyro.sample("w", dist.Normal(torch.zeros(2, 3), 0.5).to_event(2))

    x = torch.ones(N, 3)
    with local_reparameterization(), torch.no_grad():
        w = poutine.trace(guide).get_trace(x).nodes["w"]["value"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = F.linear(x, w)
        torch.testing.assert_close(out, x @ plain(w).T)
        assert float((2.0 * w).sum()) == pytest.approx(2.0 * float(plain(w).sum()))
    assert out.std(0).max() == 0
