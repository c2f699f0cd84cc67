"""Initial posterior means: ``init_to_fan_in`` and ``init_to_module``."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    BayesianModel,
    bayesianize,
    fit,
    init_to_fan_in,
    init_to_module,
    predict,
)

GUIDES = {
    "dropout": lambda m, **kw: AutoDropout(m, dropout_rate=0.2, **kw),
    "mean_field": lambda m, **kw: AutoMeanField(m, **kw),
    "variational_dropout": lambda m, **kw: AutoVariationalDropout(m, **kw),
}


def _site(fn, name="w"):
    return {"name": name, "fn": fn, "is_observed": False}


# --------------------------------------------------------------------------------------------
# init_to_fan_in
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, fan_in", [((50, 20), 20), ((8, 3, 5, 5), 75), ((4, 2, 3), 6)], ids=str
)
def test_fan_in_weights_are_uniform_within_the_bound(shape, fan_in):
    prior = dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape))
    value = init_to_fan_in(_site(prior))
    bound = 1 / math.sqrt(fan_in)
    assert value.shape == shape
    assert value.abs().max() <= bound
    assert (value != 0).all()
    assert value.abs().max() > 0.8 * bound  # spread over the whole interval
    if value.numel() >= 1000:
        assert float(value.std()) == pytest.approx(bound / math.sqrt(3), rel=0.1)
        assert abs(float(value.mean())) < 0.1 * bound


def test_fan_in_biases_are_zero_and_constrained_sites_feasible():
    bias = init_to_fan_in(_site(dist.Normal(0.0, 1.0).expand((7,)).to_event(1)))
    assert torch.equal(bias, torch.zeros(7))
    scale = init_to_fan_in(_site(dist.LogNormal(0.0, 1.0)))
    assert float(scale) == pytest.approx(1.0)
    assert init_to_fan_in({"name": "obs", "fn": None, "is_observed": True}) is None


def test_fan_in_draws_are_random_but_seeded():
    prior = dist.Normal(0.0, 1.0).expand((5, 4)).to_event(2)
    pyro.set_rng_seed(1)
    a = init_to_fan_in(_site(prior))
    b = init_to_fan_in(_site(prior))
    pyro.set_rng_seed(1)
    assert torch.equal(a, init_to_fan_in(_site(prior)))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_guides_start_from_fan_in_means(make_guide):
    torch.manual_seed(0)
    x, y = torch.randn(10, 20), torch.randn(10, 2)
    model = BayesianMLP(20, 2, hidden=(50,), tau=1.0)
    med = make_guide(model).median(x, y)
    for name, fan_in in (("net.layers.0.weight", 20), ("net.layers.1.weight", 50)):
        w = med[name]
        assert (w != 0).all()
        assert w.abs().max() <= 1 / math.sqrt(fan_in) + 1e-7
        assert w.abs().max() > 0.8 / math.sqrt(fan_in)
        # hidden units differ: no two rows of a weight matrix are equal
        assert torch.unique(w, dim=0).shape[0] == w.shape[0]
    for name in ("net.layers.0.bias", "net.layers.1.bias"):
        assert torch.equal(med[name], torch.zeros_like(med[name]))


# --------------------------------------------------------------------------------------------
# init_to_module
# --------------------------------------------------------------------------------------------


def _trained_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(64, 3)
    y = torch.stack([x[:, 0] * x[:, 1], x[:, 2]], -1)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(30):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return net, x, y


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_init_to_module_means_equal_the_trained_weights(make_guide):
    net, x, y = _trained_net()
    model = BayesianModel(bayesianize(net), tau=10.0)
    guide = make_guide(model, init_loc_fn=init_to_module(net))
    med = guide.median(x, y)
    assert set(med) == {f"net.{k}" for k in net.state_dict()}
    for k, v in net.state_dict().items():
        torch.testing.assert_close(med[f"net.{k}"], v)


def test_init_to_module_dropout_locs_are_rescaled():
    """For MC dropout the posterior mean is (1-p) M, so M = W / (1-p)."""
    net, x, y = _trained_net()
    model = BayesianModel(bayesianize(net), tau=10.0)
    guide = AutoDropout(
        model, dropout_rate=0.2, input_dropout_rate=0.2, init_loc_fn=init_to_module(net)
    )
    guide(x, y)
    store = pyro.get_param_store()
    for k, v in net.state_dict().items():
        loc = store[f"{guide._pyro_name}.locs.net.{k}"].detach()
        expected = v / 0.8 if k.endswith("weight") else v  # biases are not dropped
        torch.testing.assert_close(loc, expected)


def test_init_to_module_predictions_start_at_the_trained_network():
    """The Gaussian guides with a tiny initial scale reproduce the trained network's outputs."""
    net, x, y = _trained_net()
    model = BayesianModel(bayesianize(net), tau=10.0)
    guide = AutoMeanField(model, init_scale=1e-6, init_loc_fn=init_to_module(net))
    guide(x, y)
    pred = predict(model, guide, x, num_samples=3, seed=0)
    torch.testing.assert_close(pred.mean, net(x).detach(), rtol=1e-3, atol=1e-3)


def test_init_to_module_wrong_shape_raises():
    net, x, y = _trained_net()
    wrong = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    model = BayesianModel(bayesianize(net), tau=10.0)
    guide = AutoMeanField(model, init_loc_fn=init_to_module(wrong))
    with pytest.raises(ValueError, match=r"parameter '0.weight' has shape \(5, 3\).*\(8, 3\)"):
        guide(x, y)


def test_init_to_module_unmatched_sites_use_the_fallback():
    net, x, y = _trained_net()
    partial = nn.Module()
    partial.add_module("2", nn.Linear(8, 2))  # only the last layer
    with torch.no_grad():
        partial.get_submodule("2").weight.fill_(0.5)

    def fallback(site):
        value = init_to_fan_in(site)
        return None if value is None else torch.full_like(value, -0.25)

    model = BayesianModel(bayesianize(net), tau=10.0)
    guide = AutoMeanField(model, init_loc_fn=init_to_module(partial, fallback=fallback))
    med = guide.median(x, y)
    assert torch.equal(med["net.2.weight"], torch.full((2, 8), 0.5))
    assert torch.equal(med["net.0.weight"], torch.full((8, 3), -0.25))
    assert torch.equal(med["net.0.bias"], torch.full((8,), -0.25))


def test_init_to_module_does_not_alias_the_module():
    net, x, y = _trained_net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = BayesianModel(bayesianize(net), tau=10.0)
    guide = AutoMeanField(model, init_loc_fn=init_to_module(net))
    fit(model, guide, x, y, num_steps=10, lr=0.1, progress=False, seed=0)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
