"""Bayesian layers: prior specifications, sample sites and their shapes, forward semantics."""

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch.distributions import Independent, Normal

from pyro_dropout import (
    BayesianConv1d,
    BayesianConv2d,
    BayesianLinear,
    ImproperLogUniform,
)
from pyro_dropout.nn import make_prior


def _sites(fn, *args):
    trace = poutine.trace(fn).get_trace(*args)
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"]
    }


def _base(fn):
    while isinstance(fn, Independent):
        fn = fn.base_dist
    return fn


# --------------------------------------------------------------------------------------------
# prior specifications
# --------------------------------------------------------------------------------------------


def test_prior_none_is_standard_normal():
    p = make_prior(None, (2, 3))
    assert p.batch_shape == () and p.event_shape == (2, 3)
    assert isinstance(_base(p), Normal)
    assert torch.equal(_base(p).loc, torch.zeros(2, 3))
    assert torch.equal(_base(p).scale, torch.ones(2, 3))


@pytest.mark.parametrize("scale", [0.5, 3, 1e-3])
def test_prior_number_is_normal_scale(scale):
    p = make_prior(scale, (4,))
    assert p.batch_shape == () and p.event_shape == (4,)
    torch.testing.assert_close(_base(p).scale, torch.full((4,), float(scale)))
    torch.testing.assert_close(_base(p).loc, torch.zeros(4))


def test_prior_scalar_distribution_is_expanded_elementwise():
    p = make_prior(dist.Laplace(0.0, 0.1), (2, 3))
    assert p.batch_shape == () and p.event_shape == (2, 3)
    w = torch.randn(2, 3)
    torch.testing.assert_close(p.log_prob(w), dist.Laplace(0.0, 0.1).log_prob(w).sum())


def test_prior_improper_log_uniform():
    p = make_prior(ImproperLogUniform(), (2, 3))
    assert p.batch_shape == () and p.event_shape == (2, 3)
    assert isinstance(_base(p), ImproperLogUniform)
    w = torch.randn(2, 3)
    torch.testing.assert_close(p.log_prob(w), -w.abs().log().sum())


def test_prior_full_shape_distribution_is_reinterpreted():
    loc = torch.randn(2, 3)
    p = make_prior(dist.Normal(loc, 2.0), (2, 3))
    assert p.batch_shape == () and p.event_shape == (2, 3)
    assert torch.equal(_base(p).loc, loc)
    already_event = dist.Normal(loc, 2.0).to_event(2)
    assert make_prior(already_event, (2, 3)) is already_event


def test_prior_callable_receives_the_shape():
    seen = []

    def prior(shape):
        seen.append(shape)
        return dist.Normal(torch.zeros(shape), 0.3).to_event(len(shape))

    p = make_prior(prior, (5, 4))
    assert seen == [torch.Size((5, 4))]
    assert p.event_shape == (5, 4)
    assert make_prior(lambda shape: 0.2, (3,)).event_shape == (3,)  # callable -> number


@pytest.mark.parametrize("bad", ["foo", True, [1.0], object()])
def test_prior_bad_type_raises_type_error(bad):
    with pytest.raises(TypeError, match="prior must be"):
        make_prior(bad, (2, 3))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("-inf")])
def test_prior_non_positive_scale_raises_value_error(bad):
    with pytest.raises(ValueError, match="positive"):
        make_prior(bad, (2, 3))


def test_prior_wrong_shape_distribution_raises_value_error():
    with pytest.raises(ValueError, match=r"expected a scalar distribution or one of total shape"):
        make_prior(dist.Normal(torch.zeros(3), 1.0), (2, 3))


def test_prior_callable_returning_garbage_raises():
    with pytest.raises(TypeError):
        make_prior(lambda shape: "nope", (2,))


def test_layer_reports_a_bad_prior_when_it_runs():
    layer = BayesianLinear(3, 2, prior="foo")
    with pytest.raises(TypeError, match="prior must be"):
        layer(torch.randn(4, 3))
    layer = BayesianLinear(3, 2, prior=-2.0)
    with pytest.raises(ValueError, match="positive"):
        layer(torch.randn(4, 3))


def test_layer_prior_and_bias_prior_reach_the_sites():
    layer = BayesianLinear(3, 2, prior=0.5, bias_prior=2.0)
    sites = _sites(layer, torch.randn(4, 3))
    torch.testing.assert_close(_base(sites["weight"]["fn"]).scale, torch.full((2, 3), 0.5))
    torch.testing.assert_close(_base(sites["bias"]["fn"]).scale, torch.full((2,), 2.0))
    # bias_prior defaults to the weight prior
    sites = _sites(BayesianLinear(3, 2, prior=0.5), torch.randn(4, 3))
    torch.testing.assert_close(_base(sites["bias"]["fn"]).scale, torch.full((2,), 0.5))


def test_layer_with_improper_prior_runs_when_weights_are_given():
    """An improper prior cannot be sampled, but conditioned weights score under it."""
    layer = BayesianLinear(3, 2, prior=ImproperLogUniform())
    with pytest.raises(NotImplementedError, match="improper"):
        layer(torch.randn(4, 3))
    w, b = torch.randn(2, 3), torch.randn(2)
    conditioned = poutine.condition(layer, data={"weight": w, "bias": b})
    trace = poutine.trace(conditioned).get_trace(torch.randn(4, 3))
    trace.compute_log_prob()
    torch.testing.assert_close(trace.nodes["weight"]["log_prob_sum"], -w.abs().log().sum())


# --------------------------------------------------------------------------------------------
# sites, shapes and semantics
# --------------------------------------------------------------------------------------------

LAYERS = {
    "linear": (lambda: BayesianLinear(3, 2), (5, 3), (2, 3), (5, 2)),
    "linear-nobias": (lambda: BayesianLinear(3, 2, bias=False), (5, 3), (2, 3), (5, 2)),
    "conv1d": (
        lambda: BayesianConv1d(4, 6, 3, stride=2, padding=1, groups=2),
        (5, 4, 9),
        (6, 2, 3),
        (5, 6, 5),
    ),
    "conv2d": (
        lambda: BayesianConv2d(4, 6, (3, 2), padding=1, dilation=(1, 2)),
        (5, 4, 8, 8),
        (6, 4, 3, 2),
        (5, 6, 8, 8),
    ),
    "conv2d-same": (
        lambda: BayesianConv2d(2, 3, 3, padding="same", bias=False),
        (5, 2, 6, 6),
        (3, 2, 3, 3),
        (5, 3, 6, 6),
    ),
}


@pytest.mark.parametrize("make, x_shape, w_shape, out_shape", LAYERS.values(), ids=LAYERS.keys())
def test_layer_sites_and_output_shapes(make, x_shape, w_shape, out_shape):
    layer = make()
    x = torch.randn(x_shape)
    sites = _sites(layer, x)
    has_bias = layer.bias_shape is not None
    assert set(sites) == ({"weight", "bias"} if has_bias else {"weight"})
    assert sites["weight"]["value"].shape == w_shape
    assert sites["weight"]["fn"].event_shape == w_shape
    assert sites["weight"]["fn"].batch_shape == ()
    if has_bias:
        assert sites["bias"]["value"].shape == (w_shape[0],)
    assert layer(x).shape == out_shape
    assert layer.fan_in == torch.Size(w_shape[1:]).numel()


@pytest.mark.parametrize("make, x_shape, w_shape, out_shape", LAYERS.values(), ids=LAYERS.keys())
def test_layer_broadcasts_over_a_sample_plate(make, x_shape, w_shape, out_shape):
    layer = make()
    x = torch.randn(x_shape)
    with pyro.plate("samples", 3, dim=-2):
        trace = poutine.trace(layer).get_trace(x)
    assert trace.nodes["weight"]["value"].shape == (3, 1) + w_shape
    assert trace.nodes["_RETURN"]["value"].shape == (3,) + out_shape
    # Each sample's output is the layer applied with that sample's weights.
    out = trace.nodes["_RETURN"]["value"]
    for s in range(3):
        data = {"weight": trace.nodes["weight"]["value"][s, 0]}
        if "bias" in trace.nodes:
            data["bias"] = trace.nodes["bias"]["value"][s, 0]
        torch.testing.assert_close(out[s], poutine.condition(layer, data=data)(x))


def test_linear_with_given_weights_is_f_linear():
    layer = BayesianLinear(3, 2)
    w, b, x = torch.randn(2, 3), torch.randn(2), torch.randn(5, 3)
    out = poutine.condition(layer, data={"weight": w, "bias": b})(x)
    torch.testing.assert_close(out, F.linear(x, w, b))


def test_conv_with_given_weights_is_f_conv():
    conv2 = BayesianConv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2)
    w, b, x = torch.randn(6, 2, 3, 3), torch.randn(6), torch.randn(5, 4, 9, 9)
    out = poutine.condition(conv2, data={"weight": w, "bias": b})(x)
    torch.testing.assert_close(out, F.conv2d(x, w, b, 2, 1, 1, 2))
    conv1 = BayesianConv1d(2, 4, 3, dilation=2, padding=2)
    w1, b1, x1 = torch.randn(4, 2, 3), torch.randn(4), torch.randn(5, 2, 7)
    out = poutine.condition(conv1, data={"weight": w1, "bias": b1})(x1)
    torch.testing.assert_close(out, F.conv1d(x1, w1, b1, 1, 2, 2))


@pytest.mark.parametrize("cls", [BayesianConv1d, BayesianConv2d])
def test_conv_groups_must_divide_channels(cls):
    with pytest.raises(ValueError, match="divisible by groups"):
        cls(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="divisible by groups"):
        cls(4, 3, 3, groups=2)


def test_layers_have_no_torch_parameters():
    """The weights are sample sites, not ``nn.Parameter``s (so a guide owns all of them)."""
    for make, *_ in LAYERS.values():
        assert list(make().parameters()) == []
