"""The per-family rules behind ``local_reparameterization(estimator=...)``.

* ``"per_example"`` for a Normal weight (stored without event dims once ``Independent`` is
  stripped): Linear, vector, Conv1d and Conv2d weights, exact moments.
* MC dropout's rule with ``estimator="lrt"`` on convolutions: per-input-channel rates with
  groups, inside a vectorising plate, match the exact moments; rates that vary across kernel
  positions are rejected with a clear error; rates given as a full (not broadcast) tensor are
  fine.
* MC dropout on Linear layers: a 1x1 layer, a slab σ per output unit, a vector weight.
* Every estimator keeps the layer's dtype (bfloat16) and the input's device (whatever torch's
  default device is).

Tolerances: z-scores from Monte-Carlo standard errors, ``|z| < Z = 5`` (see ``_stats.py``).
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    BayesianConv1d,
    BayesianConv2d,
    BayesianLinear,
    BernoulliMaskedNormal,
    local_reparameterization,
    weight_draws,
)

from ._layers import exact_moments, guide_from, lrt_draws, make_dists, make_layer
from ._stats import Z, max_abs, mean_z, one_sample_var_z, one_sample_z, var_z

R = 4000


def _assert_exact_moments(out, mean, var):
    out = out.reshape(out.shape[0], -1)
    assert max_abs(one_sample_z(out, mean.reshape(-1))) < Z
    assert max_abs(one_sample_var_z(out, var.reshape(-1))) < Z


@pytest.mark.parametrize("kind", ["linear", "conv1d", "conv2d", "conv2d_groups"])
def test_per_example_normal_weights_have_the_exact_moments(kind):
    layer, x = make_layer(kind)
    dists = make_dists(layer, "normal")
    out = lrt_draws(layer, guide_from(dists), x, R, estimator="per_example")
    mean, var = exact_moments(layer, dists, x)
    assert out.shape == (R, *mean.shape)
    _assert_exact_moments(out, mean, var)


def _vector_model(x):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    return x @ w


@pytest.mark.parametrize(
    "family,estimator", [("normal", "per_example"), ("dropout", "lrt"), ("dropout", "auto")]
)
def test_vector_weight_matches_weight_sampling(family, estimator):
    """``x @ w`` with a weight vector: one output per example (shape ``(draws, N)``), with
    the mean and variance of weight sampling."""
    loc = torch.tensor([1.0, -0.5, 2.0])
    if family == "normal":
        q = dist.Normal(loc, torch.tensor([0.2, 0.5, 0.3])).to_event(1)
    else:
        q = BernoulliMaskedNormal(loc, 0.2, 0.3, event_dim=1)
    guide = guide_from({"w": q})
    x = torch.tensor([[1.0, 2.0, -1.0], [0.5, 0.0, 1.5]])

    def draws(handler):
        with handler, pyro.plate("draws", R, dim=-2), torch.no_grad():
            tr = poutine.trace(guide).get_trace(x)
            return poutine.replay(_vector_model, trace=tr)(x)

    lrt = draws(local_reparameterization(estimator=estimator))
    ref = draws(weight_draws())
    assert lrt.shape == ref.shape == (R, 2)
    assert max_abs(mean_z(lrt, ref)) < Z
    assert max_abs(var_z(lrt, ref)) < Z


# -- MC dropout with estimator="lrt" on convolutions ---------------------------------------


def _conv1d_groups():
    g = torch.Generator().manual_seed(11)
    layer = BayesianConv1d(4, 4, kernel_size=3, padding=1, groups=2)
    x = torch.randn(2, 4, 6, generator=g)
    return layer, x


@pytest.mark.parametrize("kind", ["conv1d", "conv2d", "conv1d_groups", "conv2d_groups"])
def test_dropout_lrt_on_convolutions_has_the_exact_moments(kind):
    """Per-input-channel rates (0.1 ... 0.5), in a vectorising plate: the input-dropping rule
    has each output element's exact mean and variance, groups included."""
    layer, x = _conv1d_groups() if kind == "conv1d_groups" else make_layer(kind)
    dists = make_dists(layer, "dropout_per_input")
    out = lrt_draws(layer, guide_from(dists), x, R, estimator="lrt")
    mean, var = exact_moments(layer, dists, x)
    assert out.shape == (R, *mean.shape)
    _assert_exact_moments(out, mean, var)


def test_dropout_lrt_accepts_a_full_rate_tensor_constant_over_kernel_positions():
    """A rate given as a full tensor (one value per input channel, repeated over the kernel,
    not broadcast) is the same family as per-channel rates."""
    layer, x = make_layer("conv1d")
    dists = make_dists(layer, "dropout")
    w = dists["weight"]
    rate = torch.linspace(0.1, 0.5, 2).reshape(1, 2, 1).repeat(1, 1, 3).contiguous()
    dists["weight"] = BernoulliMaskedNormal(w.loc, 0.2, rate, event_dim=3)
    out = lrt_draws(layer, guide_from(dists), x, R, estimator="lrt")
    mean, var = exact_moments(layer, dists, x)
    _assert_exact_moments(out, mean, var)


#: (layer, its input, dropout rate varying across kernel positions, drawn in a plate)
VARYING_RATES = {
    "conv1d, kernel 2": (
        lambda: BayesianConv1d(2, 3, kernel_size=2),
        (2, 2, 5),
        torch.tensor([0.1, 0.4]).reshape(1, 1, 2),
        False,
    ),
    "conv2d, kernel (3, 1)": (
        lambda: BayesianConv2d(2, 3, kernel_size=(3, 1)),
        (2, 2, 5, 4),
        torch.tensor([0.1, 0.2, 0.4]).reshape(1, 1, 3, 1),
        False,
    ),
    "conv1d, one input channel": (
        lambda: BayesianConv1d(1, 3, kernel_size=3),
        (2, 1, 5),
        torch.tensor([0.1, 0.2, 0.4]).reshape(1, 1, 3),
        False,
    ),
    "conv1d, in a plate": (
        lambda: BayesianConv1d(2, 3, kernel_size=3),
        (2, 2, 5),
        torch.tensor([0.1, 0.2, 0.4]).reshape(1, 1, 3),
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(VARYING_RATES))
def test_dropout_lrt_rejects_rates_that_vary_across_kernel_positions(case):
    """The convolution rule drops input elements, so a kernel tap cannot have its own rate."""
    make, x_shape, rate, in_plate = VARYING_RATES[case]
    layer = make()
    loc = torch.randn(layer.weight_shape)
    qw = BernoulliMaskedNormal(loc, 0.2, rate, event_dim=len(loc.shape))
    guide = guide_from({"weight": qw})
    x = torch.randn(x_shape)
    with pytest.raises(ValueError, match="must not vary across kernel positions"):
        if in_plate:
            lrt_draws(layer, guide, x, 3, estimator="lrt")
        else:
            with local_reparameterization(estimator="lrt"):
                tr = poutine.trace(guide).get_trace(x)
                poutine.replay(layer, trace=tr)(x)


# -- MC dropout on Linear layers ------------------------------------------------------------


def _single_pass(layer, dists, x):
    with local_reparameterization(estimator="lrt"), torch.no_grad():
        tr = poutine.trace(guide_from(dists)).get_trace(x)
        return poutine.replay(layer, trace=tr)(x)


def test_dropout_lrt_on_a_one_by_one_linear_layer():
    """A 1 -> 1 layer with one slab σ, one pass over R identical examples (independent
    per example): the exact mean and variance."""
    layer = BayesianLinear(1, 1)
    dists = make_dists(layer, "dropout")
    x = torch.full((R, 1), 1.5)
    out = _single_pass(layer, dists, x)
    mean, var = exact_moments(layer, dists, x[:1])
    assert out.shape == (R, 1)
    _assert_exact_moments(out, mean, var)


def test_dropout_lrt_with_a_slab_scale_per_output_unit():
    """σ = 0.1 for output 0 and 2.0 for output 1 (two distinct values): each output has its
    own exact variance."""
    layer = BayesianLinear(3, 2)
    dists = make_dists(layer, "dropout")
    loc = dists["weight"].loc
    dists["weight"] = BernoulliMaskedNormal(loc, torch.tensor([[0.1], [2.0]]), 0.3, event_dim=2)
    x = torch.tensor([1.0, -2.0, 0.5]).expand(R, 3)
    out = _single_pass(layer, dists, x)
    mean, var = exact_moments(layer, dists, x[:1])
    assert out.shape == (R, 2)
    _assert_exact_moments(out, mean, var)


# -- dtype and device -----------------------------------------------------------------------

ESTIMATOR_PATHS = [
    ("linear", "lrt"),
    ("linear", "flipout"),
    ("linear", "per_example"),
    ("conv1d", "flipout"),
    ("conv1d", "per_example"),
]


def _model_with_guided_bias(layer, dtype):
    """A library layer (its op is answered by the messenger itself, outside any torch function
    dispatch) with a guided Normal weight and bias, all in ``dtype``."""
    g = torch.Generator().manual_seed(2)
    if layer == "linear":
        model, x = BayesianLinear(2, 3), torch.randn(4, 2, generator=g)
    else:
        model, x = BayesianConv1d(2, 3, kernel_size=3), torch.randn(4, 2, 5, generator=g)
    shape = model.weight_shape
    q_w = dist.Normal(
        torch.randn(shape, generator=g).to(dtype), (0.1 + torch.rand(shape, generator=g)).to(dtype)
    ).to_event(len(shape))
    q_b = dist.Normal(torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)).to_event(1)
    return model, guide_from({"weight": q_w, "bias": q_b}), x.to(dtype)


@pytest.mark.parametrize("layer,estimator", ESTIMATOR_PATHS)
def test_every_estimator_keeps_a_bfloat16_layer_in_bfloat16(layer, estimator):
    model, guide, x = _model_with_guided_bias(layer, torch.bfloat16)
    with local_reparameterization(estimator=estimator):
        tr = poutine.trace(guide).get_trace(x)
        out = poutine.replay(model, trace=tr)(x)
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("layer,estimator", ESTIMATOR_PATHS)
def test_noise_is_created_on_the_input_device_not_the_default_device(layer, estimator):
    """With torch's default device set elsewhere (here the ``meta`` device), the sampled
    pre-activations stay on the device of the input and weights."""
    model, guide, x = _model_with_guided_bias(layer, torch.float32)
    with local_reparameterization(estimator=estimator):
        tr = poutine.trace(guide).get_trace(x)
        with torch.device("meta"):
            out = poutine.replay(model, trace=tr)(x)
    assert out.device == x.device
    assert torch.isfinite(out).all()
