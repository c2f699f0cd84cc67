"""``TraceMeanField_ELBO`` takes the analytic KL path at every site for every guide.

Pyro silently falls back to a Monte-Carlo KL when ``kl_divergence`` raises
``NotImplementedError`` (see ``pyro/infer/trace_mean_field_elbo.py``), so two checks:

* ``kl_divergence(guide_fn, model_fn)`` dispatches for every site and has the guide site's
  batch shape (also inside a vectorised particle plate);
* with the likelihood hidden, the ELBO loss is the sum of those KLs and is deterministic for
  fixed parameters (under local reparameterisation as in ``fit``), while the same check on
  Pyro's ``AutoNormal`` (Delta at the site, MC KL) is not: the test can tell the two apart.
"""

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from torch.distributions import kl_divergence

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    ImproperLogUniform,
    local_reparameterization,
)

PRIORS = {"normal": 0.5, "log_uniform": ImproperLogUniform()}
GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.2),
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.05),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
    "concrete_dropout": lambda m: AutoConcreteDropout(m, init_rate=0.2),
}
# MC dropout is variational inference under a Gaussian prior only (no KL to the log-uniform).
CASES = [
    pytest.param(prior, guide, id=f"{guide}-{prior}")
    for prior in PRIORS
    for guide in GUIDES
    if not (prior == "log_uniform" and guide in ("dropout", "concrete_dropout"))
]


def _data():
    torch.manual_seed(0)
    x = torch.randn(20, 3)
    return x, x[:, 0] + 0.1 * torch.randn(20)


def _setup(prior, guide_name):
    x, y = _data()
    model = BayesianMLP(3, 2, hidden=(6,), tau=4.0, prior=PRIORS[prior])
    guide = GUIDES[guide_name](model)
    y2 = torch.stack([y, -y], -1)
    guide(x, y2)
    # move the parameters away from their initial values a little
    with torch.no_grad():
        for _, p in pyro.get_param_store().named_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, guide, x, y2


def _site_pairs(model, guide, *args):
    guide_trace = poutine.trace(guide).get_trace(*args)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args)
    return {
        name: (site["fn"], model_trace.nodes[name]["fn"])
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample"
    }


@pytest.mark.parametrize("prior, guide_name", CASES)
def test_kl_divergence_dispatches_at_every_site(prior, guide_name):
    model, guide, x, y = _setup(prior, guide_name)
    pairs = _site_pairs(model, guide, x, y)
    assert len(pairs) == 4
    for name, (q, p) in pairs.items():
        kl = kl_divergence(q, p)  # raises NotImplementedError if not registered
        assert kl.shape == q.batch_shape, name
        assert torch.isfinite(kl).all(), name


@pytest.mark.parametrize("prior, guide_name", CASES)
def test_kl_dispatches_inside_a_particle_plate(prior, guide_name):
    """``vectorize_particles=True`` expands the guide distributions: the KL must still match."""
    model, guide, x, y = _setup(prior, guide_name)
    with pyro.plate("particles", 3, dim=-2):
        pairs = _site_pairs(model, guide, x, y)
    for name, (q, p) in pairs.items():
        assert q.batch_shape == (3, 1), name
        kl = kl_divergence(q, p)
        assert kl.shape == (3, 1), name
        torch.testing.assert_close(kl, kl[:1].expand(3, 1))


def _kl_only_loss(model, guide, x, y, lrt=True):
    """The ELBO loss with the observation hidden: only the KL terms remain."""
    prior_only = poutine.block(model, hide=["obs"])
    elbo = TraceMeanField_ELBO()
    if lrt:
        with local_reparameterization():
            return elbo.differentiable_loss(prior_only, guide, x, y).item()
    return elbo.differentiable_loss(prior_only, guide, x, y).item()


@pytest.mark.parametrize("prior, guide_name", CASES)
def test_kl_part_of_the_loss_is_deterministic_and_analytic(prior, guide_name):
    model, guide, x, y = _setup(prior, guide_name)
    losses = [_kl_only_loss(model, guide, x, y) for _ in range(5)]
    assert len(set(losses)) == 1, losses
    expected = sum(kl_divergence(q, p).item() for q, p in _site_pairs(model, guide, x, y).values())
    assert losses[0] == pytest.approx(expected, rel=1e-5, abs=1e-4)
    # the full loss (with the likelihood) still goes through the same path and is finite
    with local_reparameterization():
        assert torch.isfinite(TraceMeanField_ELBO().differentiable_loss(model, guide, x, y))


def test_control_autonormal_kl_is_monte_carlo():
    """Negative control: the same check detects Pyro's MC fallback (Delta at the site)."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=4.0, prior=0.5)
    guide = AutoNormal(model)
    losses = torch.tensor([_kl_only_loss(model, guide, x, y, lrt=False) for _ in range(5)])
    assert losses.std() > 0.1
