"""Guide arguments: per-layer dropout rates, learned slab scale and argument validation."""

import pyro
import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
    local_reparameterization,
)

W0, W1 = "net.layers.0.weight", "net.layers.1.weight"


def _model():
    return BayesianMLP(3, 1, hidden=(6,), tau=10.0)


def _data():
    torch.manual_seed(0)
    x = torch.randn(16, 3)
    return x, x[:, 0]


def _weight_fn(guide, name):
    x, y = _data()
    return poutine.trace(guide).get_trace(x, y).nodes[name]["fn"]


# --------------------------------------------------------------------------------------------
# per-layer dropout rates
# --------------------------------------------------------------------------------------------


def test_dropout_rate_mapping_sets_each_layer():
    guide = AutoDropout(_model(), dropout_rate={W0: 0.1, W1: 0.5})
    fn0, fn1 = _weight_fn(guide, W0), _weight_fn(guide, W1)
    torch.testing.assert_close(fn0.dropout_rate, torch.full((1, 3), 0.1))
    torch.testing.assert_close(fn1.dropout_rate, torch.full((1, 6), 0.5))
    # the initial posterior mean E[W] = (1 - p) M is the fan-in init in both layers
    med = guide.median()
    store = pyro.get_param_store()
    torch.testing.assert_close(store[f"{guide._pyro_name}.locs.{W0}"] * 0.9, med[W0])
    torch.testing.assert_close(store[f"{guide._pyro_name}.locs.{W1}"] * 0.5, med[W1])


def test_dropout_rate_mapping_allows_zero_for_a_layer():
    model = _model()
    guide = AutoDropout(model, dropout_rate={W0: 0.0, W1: 0.3})
    x, y = _data()
    losses = fit(model, guide, x, y, num_steps=3, progress=False, seed=0)
    assert all(map(torch.isfinite, torch.tensor(losses)))
    torch.testing.assert_close(_weight_fn(guide, W0).dropout_rate, torch.zeros(1, 3))


def test_dropout_rate_mapping_unknown_site_raises():
    guide = AutoDropout(_model(), dropout_rate={W0: 0.1, W1: 0.1, "net.layers.9.weight": 0.2})
    x, y = _data()
    with pytest.raises(ValueError, match=r"unknown: \['net.layers.9.weight'\], missing: \[\]"):
        guide(x, y)


def test_dropout_rate_mapping_missing_site_raises():
    guide = AutoDropout(_model(), dropout_rate={W0: 0.1})
    x, y = _data()
    with pytest.raises(ValueError, match=r"unknown: \[\], missing: \['net.layers.1.weight'\]"):
        guide(x, y)


def test_dropout_rate_mapping_bias_site_is_unknown():
    """Biases are not dropped, so a rate for a bias site is an unknown key."""
    guide = AutoDropout(_model(), dropout_rate={W0: 0.1, W1: 0.1, "net.layers.0.bias": 0.1})
    x, y = _data()
    with pytest.raises(ValueError, match=r"unknown: \['net.layers.0.bias'\]"):
        guide(x, y)


def test_dropout_rate_mapping_bad_value_names_the_key():
    with pytest.raises(ValueError, match=r"dropout_rate\['net.layers.0.weight'\]"):
        AutoDropout(_model(), dropout_rate={W0: 1.0, W1: 0.1})


def test_learned_slab_scale():
    x, y = _data()
    model = _model()
    guide = AutoDropout(model, dropout_rate=0.2, scale=0.05, learn_scale=True)
    fn = _weight_fn(guide, W0)
    torch.testing.assert_close(fn.scale, torch.full((6, 3), 0.05))
    assert f"{guide._pyro_name}.scales.{W0}" in pyro.get_param_store()
    fit(model, guide, x, y, num_steps=20, lr=0.05, progress=False, seed=0)
    scale = pyro.get_param_store()[f"{guide._pyro_name}.scales.{W0}"]
    assert (scale > 0).all() and not torch.allclose(scale, torch.full_like(scale, 0.05))
    assert guide.config == {"dropout_rate": 0.2, "scale": 0.05, "learn_scale": True}


def test_dropout_under_lrt_is_standard_dropout_on_the_input():
    """With a tiny slab, a layer under local reparameterisation zeroes whole input units."""
    model = BayesianMLP(3, 6, hidden=(), tau=1.0)
    guide = AutoDropout(model, dropout_rate=0.5, scale=1e-6)
    x = torch.ones(2000, 3)
    guide(x, torch.zeros(2000, 6))  # with y: the likelihood site must be observed
    m = pyro.get_param_store()[f"{guide._pyro_name}.locs.{W0}"].detach()
    with local_reparameterization():
        trace = poutine.trace(guide).get_trace(x)
        f = poutine.replay(model, trace=trace)(x).detach()
    f = f - pyro.get_param_store()[f"{guide._pyro_name}.locs.net.layers.0.bias"].detach()
    # every row is M z for a binary z: solve for z and check it is 0/1 and ~half are kept
    z = torch.linalg.lstsq(m, f.T).solution.T
    assert torch.allclose(z, z.round(), atol=1e-2)
    assert set(z.round().unique().tolist()) <= {0.0, 1.0}
    assert abs(float(z.round().mean()) - 0.5) < 0.05


# --------------------------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs, argument",
    [
        (AutoDropout, dict(dropout_rate=1.0), "dropout_rate"),
        (AutoDropout, dict(dropout_rate=-0.1), "dropout_rate"),
        (AutoDropout, dict(dropout_rate="0.1"), "dropout_rate"),
        (AutoDropout, dict(scale=0.0), "scale"),
        (AutoDropout, dict(scale=-1.0), "scale"),
        (AutoDropout, dict(scale=float("nan")), "scale"),
        (AutoVariationalDropout, dict(alpha="foo"), "alpha"),
        (AutoVariationalDropout, dict(init_log_alpha=9.0), "init_log_alpha"),
        (AutoVariationalDropout, dict(init_log_alpha=-8.5), "init_log_alpha"),
        (AutoVariationalDropout, dict(init_scale=0.0), "init_scale"),
        (AutoMeanField, dict(init_scale=0.0), "init_scale"),
        (AutoMeanField, dict(init_scale=-0.1), "init_scale"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_argument(cls, kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\b"):
        cls(_model(), **kwargs)


def test_guide_configs_are_recorded():
    model = _model()
    assert AutoDropout(model, dropout_rate=0.3).config["dropout_rate"] == 0.3
    vd = AutoVariationalDropout(model, alpha="unit", init_log_alpha=-3.0)
    assert vd.config == {
        "alpha": "unit",
        "init_log_alpha": -3.0,
        "init_scale": 0.01,
    }
