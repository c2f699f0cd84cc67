"""``fit`` trains with local reparameterisation and analytic KLs (issue: LRT tests, 5).

* A spy messenger of our own, wrapped around ``fit``, sees every ``bayesian_layer`` message:
  with ``local_reparameterization=True`` (the default) each one has already been answered by
  the LRT messenger (``msg["done"]``) when it reaches the spy; with ``False`` none is.
* The KL part of ``TraceMeanField_ELBO`` is analytic for every guide/prior pair the library
  registers: on the model with its likelihood blocked (only the KL remains), repeated losses
  are *identical* (zero variance, not merely small), equal the sum of the registered KLs, and
  ``fit``'s reported losses at learning rate 0 are identical too. A Monte-Carlo KL
  (``Trace_ELBO``) on the same model varies, so the check can fail.
"""

import math

import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger
from torch.distributions import kl_divergence

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    ImproperLogUniform,
    fit,
)

from ._models import GUIDES, make_guide, regression_data, small_mlp


class LayerSpy(Messenger):
    """Counts ``bayesian_layer`` messages and whether an inner handler already answered them;
    records the scale of the ``obs`` site."""

    def __init__(self):
        super().__init__()
        self.layers = 0
        self.intercepted = 0
        self.obs_scales = []

    def _pyro_bayesian_layer(self, msg):
        self.layers += 1
        self.intercepted += bool(msg["done"])

    def _pyro_post_sample(self, msg):
        if msg["name"] == "obs":
            self.obs_scales.append(float(msg["scale"]))


@pytest.mark.parametrize("vectorize", [False, True], ids=["seq", "vectorized"])
@pytest.mark.parametrize("lrt", [True, False], ids=["lrt", "no_lrt"])
@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_fit_routes_every_layer_through_the_lrt_messenger(guide_name, lrt, vectorize):
    n, batch, steps = 48, 16, 6
    x, y = regression_data(n)
    model = small_mlp()
    guide = make_guide(guide_name, model, x, y)
    spy = LayerSpy()
    with spy:
        losses = fit(
            model,
            guide,
            x,
            y,
            num_steps=steps,
            batch_size=batch,
            local_reparameterization=lrt,
            num_particles=2,
            vectorize_particles=vectorize,
            progress=False,
            seed=0,
            jit=False,  # eager: the spy counts the messages of every step's model run
        )
    assert len(losses) == steps and all(math.isfinite(v) for v in losses)
    # Two Bayesian layers, one model run per step (vectorised), or one per particle.
    runs = steps * (1 if vectorize else 2)
    assert spy.layers == 2 * runs
    assert spy.intercepted == (spy.layers if lrt else 0)
    # num_data=N reached the model: the likelihood of a B-point minibatch is scaled by N/B.
    assert spy.obs_scales == [n / batch] * runs


class _KLOnly:
    """The model with its likelihood blocked: a loss of only KL terms. Keeps the model's
    ``max_plate_nesting`` (``fit`` reads it; Pyro would otherwise guess 0 from the blocked
    trace and put vectorised particles on the data dim)."""

    def __init__(self, model):
        self.max_plate_nesting = model.max_plate_nesting
        self._fn = poutine.block(model, hide=["obs"])

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


def _kl_only(model):
    return _KLOnly(model)


def _registered_kl_sum(model, guide, x, y):
    """Σ_sites KL(q ‖ p) from the registered closed forms, computed by hand."""
    # Priors read off the model replayed with a guide draw (an improper prior cannot sample).
    guide_tr = poutine.trace(guide).get_trace(x, y)
    prior_tr = poutine.trace(poutine.replay(_kl_only(model), trace=guide_tr)).get_trace(x, y)
    q = guide.get_distributions()
    total = 0.0
    assert set(q) == {
        "net.layers.0.weight",
        "net.layers.0.bias",
        "net.layers.1.weight",
        "net.layers.1.bias",
    }
    for name in q:
        site = prior_tr.nodes[name]
        total += float(kl_divergence(q[name], site["fn"]).sum().detach())
    return total


CASES = [
    ("mean_field", 1.0),
    ("dropout", 1.0),
    ("variational_dropout", 1.0),
    ("variational_dropout", "log_uniform"),
    ("mean_field", "log_uniform"),
]


def _model_and_guide(guide_name, prior, x, y):
    model = small_mlp(prior=ImproperLogUniform() if prior == "log_uniform" else prior)
    return model, make_guide(guide_name, model, x, y)


@pytest.mark.parametrize("vectorize", [False, True], ids=["seq", "vectorized"])
@pytest.mark.parametrize("guide_name, prior", CASES)
def test_trace_mean_field_kl_is_analytic(guide_name, prior, vectorize):
    x, y = regression_data(32)
    model, guide = _model_and_guide(guide_name, prior, x, y)
    elbo = TraceMeanField_ELBO(num_particles=3, vectorize_particles=vectorize, max_plate_nesting=1)
    losses = [elbo.loss(_kl_only(model), guide, x, y) for _ in range(5)]
    assert max(losses) == min(losses), f"KL-only loss varies: {losses} (Monte-Carlo fallback?)"
    # ... and it is the sum of the registered closed forms (float32 sums: rel 1e-5).
    assert losses[0] == pytest.approx(_registered_kl_sum(model, guide, x, y), rel=1e-5)


def test_monte_carlo_kl_control_does_vary():
    """The zero-variance criterion is not vacuous: Trace_ELBO's KL is a Monte-Carlo term."""
    x, y = regression_data(32)
    model, guide = _model_and_guide("mean_field", 1.0, x, y)
    losses = [Trace_ELBO().loss(_kl_only(model), guide, x, y) for _ in range(5)]
    assert max(losses) - min(losses) > 1e-3


@pytest.mark.parametrize(
    "guide_cls, kwargs",
    [
        (AutoMeanField, {"init_scale": 0.1}),
        (AutoDropout, {"dropout_rate": 0.3}),
        (AutoVariationalDropout, {}),
    ],
    ids=["mean_field", "dropout", "variational_dropout"],
)
def test_fit_kl_only_losses_are_constant_at_zero_learning_rate(guide_cls, kwargs):
    """``fit`` itself uses the analytic KL: with lr = 0 the parameters stay put and the
    reported losses of the KL-only model are identical, with and without LRT and particles."""
    x, y = regression_data(32)
    model = small_mlp()
    guide = guide_cls(model, **kwargs)
    guide(x, y)
    for kw in ({}, {"num_particles": 3, "vectorize_particles": True}):
        for lrt in (True, False):
            losses = fit(
                _kl_only(model),
                guide,
                x,
                y,
                num_steps=4,
                lr=0.0,
                local_reparameterization=lrt,
                progress=False,
                **kw,
            )
            assert max(losses) == min(losses), f"{kw} lrt={lrt}: {losses}"
    # The full loss (with the likelihood) does vary: fit really draws weights/pre-activations.
    losses = fit(model, guide, x, y, num_steps=4, lr=0.0, progress=False)
    assert max(losses) > min(losses)


def test_fit_default_is_lrt():
    x, y = regression_data(16)
    model = small_mlp()
    guide = make_guide("mean_field", model, x, y)
    spy = LayerSpy()
    with spy:
        fit(model, guide, x, y, num_steps=2, progress=False)
    assert spy.layers == 4 and spy.intercepted == 4
    torch.testing.assert_close(torch.tensor(spy.obs_scales), torch.ones(2))
