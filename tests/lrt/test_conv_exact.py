"""Convolutions: the default estimator of every family samples q jointly over positions.

Output positions of a convolution share its kernel. Per-position local reparameterisation
(``estimator="lrt"``) draws them independently, so anything combining positions (a max-pool,
flatten + dense) gets another distribution: with a 1x1 kernel on an input of ones every
position equals the weight, the max over 10 positions has expectation 0 under q but 1.54
(the mean of the maximum of 10 standard normals) under per-position LRT. The defaults,
Flipout for Gaussian families and one weight draw per example for MC dropout, apply one
weight per example at every position. Checks: z < 3 between each default estimator and
weight sampling, for a max over positions and for BayesianConvNet's predictive class
probabilities; per-position LRT fails the same checks (the checks can fail).
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianConv1d,
    BayesianConvNet,
    BernoulliMaskedNormal,
    local_reparameterization,
    predict,
    weight_draws,
)

from ._layers import guide_from

R = 4000


def _max_over_positions(dists, estimator):
    layer = BayesianConv1d(1, 2, kernel_size=1, bias=False)
    x = torch.ones(1, 1, 10)
    handler = (
        weight_draws() if estimator == "weights" else local_reparameterization(estimator=estimator)
    )
    with handler, pyro.plate("draws", R, dim=-2), torch.no_grad():
        tr = poutine.trace(guide_from(dists)).get_trace(x)
        out = poutine.replay(layer, trace=tr)(x)  # (R, 1, 2, 10)
    return out.amax(-1).reshape(R, 2)


def _dists(family):
    loc = torch.tensor([[[0.5]], [[-1.0]]])
    if family == "normal":
        return {"weight": dist.Normal(loc, torch.full_like(loc, 1.0)).to_event(3)}
    return {"weight": BernoulliMaskedNormal(loc, 0.3, 0.4, event_dim=3)}


def _z(a, b):
    se = (a.var(0) / a.shape[0] + b.var(0) / b.shape[0]).sqrt()
    return ((a.mean(0) - b.mean(0)) / se).abs().max().item()


@pytest.mark.parametrize("family", ["normal", "dropout"])
def test_max_over_positions_matches_weight_sampling(family):
    pyro.set_rng_seed(0)
    dists = _dists(family)
    ref = _max_over_positions(dists, "weights")
    default = _max_over_positions(dists, "auto")
    assert _z(default, ref) < 3
    lrt = _max_over_positions(dists, "lrt")  # per position: another expectation
    assert _z(lrt, ref) > 10
    if family == "normal":  # the closed form: every position equals w ~ N(loc, 1)
        assert abs(ref.mean(0)[0].item() - 0.5) < 4 / math.sqrt(R)
        # E[max of 10 iid N(0.5, 1)] = 0.5 + 1.5388
        assert abs(lrt.mean(0)[0].item() - 2.0388) < 0.1


def _convnet_probs(guide_name, estimator):
    pyro.set_rng_seed(0)
    model = BayesianConvNet(1, 3, image_size=10, channels=(3, 4), hidden=8, kernel_size=3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 10, 10, generator=g)
    y = torch.randint(0, 3, (4,), generator=g)
    guide = {
        "mean_field": lambda m: AutoMeanField(m, init_scale=0.3),
        "dropout": lambda m: AutoDropout(m, dropout_rate=0.4, input_dropout_rate=0.4, scale=0.05),
        "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-1.0),
    }[guide_name](model)
    guide(x, y)
    lrt = estimator != "weights"
    kwargs = {} if estimator in ("weights", "auto") else {"estimator": estimator}
    pred = predict(model, guide, x, num_samples=R, local_reparameterization=lrt, seed=1, **kwargs)
    return pred._class_log_probs().exp().reshape(R, -1)  # (R, 4 * 3)


@pytest.mark.parametrize("guide_name", ["mean_field", "dropout", "variational_dropout"])
def test_convnet_predictive_probabilities_match_weight_sampling(guide_name):
    ref = _convnet_probs(guide_name, "weights")
    default = _convnet_probs(guide_name, "auto")
    assert _z(default, ref) < 3, guide_name


def test_per_position_lrt_is_detectably_different_on_the_convnet():
    ref = _convnet_probs("mean_field", "weights")
    lrt = _convnet_probs("mean_field", "lrt")
    assert _z(lrt, ref) > 3
