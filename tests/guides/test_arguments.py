"""Guide arguments: per-layer dropout rates, learned slab scale and argument validation."""

import warnings

import pyro
import pyro.distributions as dist
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
    predict,
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
    assert guide.config == {
        "dropout_rate": 0.2,
        "input_dropout_rate": 0.0,
        "scale": 0.05,
        "learn_scale": True,
    }


def test_dropout_under_lrt_is_standard_dropout_on_the_input():
    """With a tiny slab, a layer under local reparameterisation zeroes whole input units."""
    model = BayesianMLP(3, 6, hidden=(), tau=1.0)
    guide = AutoDropout(model, dropout_rate=0.5, input_dropout_rate=0.5, scale=1e-6)
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
        (AutoDropout, dict(input_dropout_rate=1.0), "input_dropout_rate"),
        (AutoDropout, dict(input_dropout_rate="0"), "input_dropout_rate"),
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


# --------------------------------------------------------------------------------------------
# the model's inputs (issue 39)
# --------------------------------------------------------------------------------------------


def test_a_one_input_model_never_predicts_as_if_x_were_zero():
    """AutoDropout's default keeps the model's inputs (``input_dropout_rate=0``): on a
    one-input network, dropping the input makes a draw predict as if x = 0. Before, with
    ``dropout_rate=0.1`` on every layer, ~10 % of the 400 draws at x = 2 of a fit of y = 2x
    sat near f(0) = 0 (P(none of 400) = 0.9^400 ≈ 5e-19); now none may be further than 2
    from f(2) = 4 (the hidden layer's dropout moved a draw by at most 1.03, seed 1)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, generator=g) * 4 - 2
    y = 2 * x.squeeze(-1) + 0.1 * torch.randn(200, generator=g)
    model = BayesianMLP(1, 1, hidden=(50,), tau=100.0)
    guide = AutoDropout(model)
    assert guide.config["input_dropout_rate"] == 0.0
    fit(model, guide, x, y, num_steps=300, lr=1e-2, progress=False, seed=0)
    assert guide._rates == {"net.layers.0.weight": 0.0, "net.layers.1.weight": 0.1}
    f = predict(model, guide, torch.tensor([[2.0]]), num_samples=400, seed=1, site="_RETURN")
    f = f.samples.reshape(-1)
    assert abs(float(f.mean()) - 4.0) < 0.5
    assert not ((f - 4.0).abs() > 2.0).any(), "a draw dropped the input"
    # asked for, the input is dropped again: about 10 % of the draws near f(0)
    guide = AutoDropout(model, input_dropout_rate=0.1)
    fit(model, guide, x, y, num_steps=300, lr=1e-2, progress=False, seed=0)
    f = predict(model, guide, torch.tensor([[2.0]]), num_samples=400, seed=1, site="_RETURN")
    dropped = float(((f.samples.reshape(-1) - 4.0).abs() > 2.0).float().mean())
    assert 0.04 < dropped < 0.18  # Binomial(400, 0.1): SD 0.015, ±4 SD


def test_input_layers_are_found_through_views_and_user_ops():
    """The sites that read a tensor passed to the model (or a view of it) are the input
    layers; a layer on a computed tensor is not."""

    def model(x, y=None):
        w1 = pyro.sample("w1", dist.Normal(torch.zeros(4, 6), 1.0).to_event(2))
        w2 = pyro.sample("w2", dist.Normal(torch.zeros(4), 1.0).to_event(1))
        h = torch.relu(x.reshape(-1, 6) @ w1.T)  # a view of the input
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(h @ w2, 1.0), obs=y)

    x, y = torch.randn(5, 2, 3), torch.randn(5)
    guide = AutoDropout(model, dropout_rate=0.3)
    guide(x, y)
    assert guide._rates == {"w1": 0.0, "w2": 0.3}
    guide = AutoDropout(model, dropout_rate=0.3, input_dropout_rate=0.2)
    guide(x, y)
    assert guide._rates == {"w1": 0.2, "w2": 0.3}


def test_a_model_whose_every_layer_reads_the_inputs_warns_that_nothing_is_dropped():
    model = BayesianMLP(3, 1, hidden=(), tau=1.0)
    x = torch.randn(10, 3)
    with pytest.warns(UserWarning, match="input_dropout_rate"):
        AutoDropout(model, dropout_rate=0.2)(x, torch.zeros(10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AutoDropout(model, dropout_rate=0.2, input_dropout_rate=0.2)(x, torch.zeros(10))
        AutoDropout(model, dropout_rate=0.0)(x, torch.zeros(10))


def test_input_dropout_rate_and_a_mapping_exclude_each_other():
    with pytest.raises(ValueError, match="input_dropout_rate is not used with a dropout_rate"):
        AutoDropout(_model(), dropout_rate={W0: 0.1, W1: 0.1}, input_dropout_rate=0.1)
    assert "input_dropout_rate" not in AutoDropout(_model(), dropout_rate={W0: 0.1, W1: 0.1}).config
