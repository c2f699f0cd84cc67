"""The messenger's contract with user code: how the linear and convolution calls of a model
reach the rules, and what the user sees.

* ``F.linear`` / ``F.conv1d`` / ``F.conv2d`` with a bias, strides, padding (numbers and the
  strings ``"same"`` / ``"valid"``), dilation and groups, positional or by keyword: under
  ``weight_draws()`` and after the context has exited they apply the drawn weights exactly as
  torch does; under ``local_reparameterization()`` they sample the distribution of weight
  sampling.
* A kernel drawn in a plate over output channels (fewer event dims than a kernel) is applied
  as drawn.
* A guided bias gets its own noise per example (not one draw shared by the minibatch), for
  every estimator; the weight noise is uncorrelated across examples too.
* ``weight_draws`` works as a decorator; it never warns; the warning of an unsupported use
  comes once per weight site.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_dropout import local_reparameterization, weight_draws
from pyro_dropout.handlers import GuidedValue, LocalReparameterizationWarning
from pyro_dropout.handlers.guided_value import plain

from ._stats import Z, mean_z, var_z

N = 3  # rows of the input

#: name -> (input shape, weight shape, op(x, w, b) as a user writes it)
CALLS = {
    "F.linear(x, w, b)": ((N, 3), (4, 3), lambda x, w, b: F.linear(x, w, b)),
    "F.linear(x, w, bias=b)": ((N, 3), (4, 3), lambda x, w, b: F.linear(x, w, bias=b)),
    "F.conv1d positional stride/padding/dilation/groups": (
        (N, 4, 9),
        (4, 2, 3),
        lambda x, w, b: F.conv1d(x, w, b, 2, 1, 2, 2),
    ),
    "F.conv1d keywords, padding='same'": (
        (N, 4, 9),
        (4, 2, 3),
        lambda x, w, b: F.conv1d(x, w, bias=b, padding="same", dilation=2, groups=2),
    ),
    "F.conv2d keywords, tuples": (
        (N, 4, 7, 6),
        (4, 2, 3, 2),
        lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
    ),
    "F.conv2d stride=2, padding='valid'": (
        (N, 4, 7, 6),
        (4, 4, 2, 2),
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding="valid"),
    ),
}


def _functional(x_shape, w_shape, op):
    """A functional model ``op(x, w, b)``, a hand-built mean-field guide and an input."""
    g = torch.Generator().manual_seed(3)
    ev = len(w_shape)
    out = w_shape[0]
    prior_w = dist.Normal(torch.zeros(w_shape), torch.ones(w_shape)).to_event(ev)
    prior_b = dist.Normal(torch.zeros(out), torch.ones(out)).to_event(1)
    q_w = dist.Normal(
        torch.randn(w_shape, generator=g), 0.1 + 0.3 * torch.rand(w_shape, generator=g)
    ).to_event(ev)
    q_b = dist.Normal(torch.randn(out, generator=g), torch.full((out,), 0.5)).to_event(1)

    def model(x):
        w = pyro.sample("w", prior_w)
        b = pyro.sample("b", prior_b)
        return op(x, w, b), w, b

    def guide(x):
        pyro.sample("w", q_w)
        pyro.sample("b", q_b)

    return model, guide, torch.randn(x_shape, generator=g)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_weight_draws_and_stale_values_apply_the_drawn_weights_like_torch(call):
    """Under ``weight_draws()`` the call gives exactly torch's result on the drawn weight and
    bias; so does the same call on the guided values after the context exited."""
    x_shape, w_shape, op = CALLS[call]
    model, guide, x = _functional(x_shape, w_shape, op)
    with weight_draws():
        tr = poutine.trace(guide).get_trace(x)
        out, w, b = poutine.replay(model, trace=tr)(x)
    assert isinstance(w, GuidedValue) and isinstance(b, GuidedValue)
    expected = op(x, plain(w), plain(b))
    assert out.shape == expected.shape
    assert torch.allclose(out, expected, atol=1e-5)
    # the values outlived their context: plain weights, same result
    assert torch.allclose(op(x, w, b), expected, atol=1e-5)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_local_reparameterization_samples_the_weight_sampling_distribution(call):
    """Per output element, the mean and variance under ``local_reparameterization()`` equal
    those of weight sampling, bias included (R draws in one vectorised pass each)."""
    x_shape, w_shape, op = CALLS[call]
    model, guide, x = _functional(x_shape, w_shape, op)
    r = 2000

    def draws(handler):
        with handler, pyro.plate("draws", r, dim=-2), torch.no_grad():
            tr = poutine.trace(guide).get_trace(x)
            return poutine.replay(model, trace=tr)(x)[0]

    lrt, ref = draws(local_reparameterization()), draws(weight_draws())
    assert lrt.shape == ref.shape and lrt.shape[:2] == (r, N)
    assert float(mean_z(lrt, ref).abs().max()) < Z
    assert float(var_z(lrt, ref).abs().max()) < Z


_KERNEL_MSG = r"'w' is used by F\.conv[12]d with a kernel of [23] event dims"


@pytest.mark.parametrize("ndim", [1, 2])
def test_kernel_drawn_per_output_channel_in_a_plate_is_applied_as_drawn(ndim):
    """A kernel sampled in a plate over output channels has fewer event dims than a
    convolution kernel: no rule applies, the convolution uses the drawn kernel and bias with
    the call's stride, padding, dilation and groups, and the use is reported."""
    g = torch.Generator().manual_seed(5)
    kernel = (2, 3) if ndim == 1 else (2, 3, 2)
    x = torch.randn((N, 4, 9) if ndim == 1 else (N, 4, 7, 6), generator=g)
    conv = F.conv1d if ndim == 1 else F.conv2d
    loc = torch.randn((4, *kernel), generator=g)

    def model(x):
        with pyro.plate("out", 4):
            w = pyro.sample("w", dist.Normal(loc, 0.3).to_event(len(kernel)))
            b = pyro.sample("b", dist.Normal(torch.zeros(4), 1.0))
        return conv(x, w, b, 2, 1, 2, 2), w, b

    with (
        local_reparameterization(),
        pytest.warns(LocalReparameterizationWarning, match=_KERNEL_MSG),
    ):
        out, w, b = model(x)
    assert isinstance(w, GuidedValue)
    assert torch.allclose(out, conv(x, plain(w), plain(b), 2, 1, 2, 2), atol=1e-5)
    with (
        local_reparameterization(),
        pytest.warns(LocalReparameterizationWarning, match=_KERNEL_MSG),
    ):
        _, w, b = model(x)
        out_kw = conv(x, w, bias=b, stride=2, padding=1, dilation=2, groups=2)
    assert torch.allclose(out_kw, conv(x, plain(w), plain(b), 2, 1, 2, 2), atol=1e-5)


#: (layer, estimator): every path that adds a guided Normal bias
BIAS_PATHS = [
    ("linear", "auto"),
    ("linear", "flipout"),
    ("linear", "per_example"),
    ("conv1d", "auto"),
    ("conv1d", "per_example"),
]


def _two_identical_rows_model(layer, w_scale, b_scale):
    shape = (3, 2) if layer == "linear" else (3, 2, 2)
    x = torch.ones((2, 2) if layer == "linear" else (2, 2, 3))
    ev = len(shape)
    q_w = dist.Normal(torch.full(shape, 0.5), torch.full(shape, w_scale)).to_event(ev)
    q_b = dist.Normal(torch.tensor([0.0, 1.0, -1.0]), torch.full((3,), b_scale)).to_event(1)
    prior_w = dist.Normal(torch.zeros(shape), torch.ones(shape)).to_event(ev)
    prior_b = dist.Normal(torch.zeros(3), torch.ones(3)).to_event(1)

    def model(x):
        w = pyro.sample("w", prior_w)
        b = pyro.sample("b", prior_b)
        return F.linear(x, w, b) if layer == "linear" else F.conv1d(x, w, b)

    def guide(x):
        pyro.sample("w", q_w)
        pyro.sample("b", q_b)

    return model, guide, x


def _pass_draws(model, guide, x, handler, r):
    with handler, pyro.plate("draws", r, dim=-2), torch.no_grad():
        tr = poutine.trace(guide).get_trace(x)
        return poutine.replay(model, trace=tr)(x)


def _row_corr(out):
    """Correlation across draws between the first output element of row 0 and of row 1."""
    a = out[:, 0].reshape(out.shape[0], -1)[:, 0]
    b = out[:, 1].reshape(out.shape[0], -1)[:, 0]
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


@pytest.mark.parametrize("layer,estimator", BIAS_PATHS)
def test_guided_bias_noise_is_drawn_per_example(layer, estimator):
    """Two identical examples in one pass: with a guided bias (large σ) their outputs are
    uncorrelated under every estimator, and each has the mean and variance of weight
    sampling; with weight draws the shared bias correlates them (so the check can fail)."""
    r = 4000
    model, guide, x = _two_identical_rows_model(layer, w_scale=0.05, b_scale=1.0)
    lrt = _pass_draws(model, guide, x, local_reparameterization(estimator=estimator), r)
    ref = _pass_draws(model, guide, x, weight_draws(), r)
    assert lrt.shape == ref.shape
    assert abs(_row_corr(lrt)) < 5 / math.sqrt(r)
    assert _row_corr(ref) > 0.5
    assert float(mean_z(lrt, ref).abs().max()) < Z
    assert float(var_z(lrt, ref).abs().max()) < Z


@pytest.mark.parametrize("layer,estimator", [("linear", "flipout"), ("conv1d", "auto")])
def test_flipout_noise_is_uncorrelated_across_examples(layer, estimator):
    """Flipout shares one perturbation per pass but flips its sign at random per example
    and channel: two identical examples get uncorrelated outputs (weight draws: correlated)."""
    r = 4000
    model, guide, x = _two_identical_rows_model(layer, w_scale=1.0, b_scale=1e-4)
    lrt = _pass_draws(model, guide, x, local_reparameterization(estimator=estimator), r)
    ref = _pass_draws(model, guide, x, weight_draws(), r)
    assert abs(_row_corr(lrt)) < 5 / math.sqrt(r)
    assert _row_corr(ref) > 0.5
    assert float(var_z(lrt, ref).abs().max()) < Z


def test_weight_draws_works_as_a_decorator():
    """``weight_draws(fn)`` runs ``fn`` with the drawn weights, even inside an enclosing
    ``local_reparameterization()``: the output is the product with the drawn weight."""
    model, guide, x = _functional(*CALLS["F.linear(x, w, b)"])

    @weight_draws
    def run(x):
        tr = poutine.trace(guide).get_trace(x)
        return poutine.replay(model, trace=tr)(x)

    with local_reparameterization():
        out, w, b = run(x)
    assert torch.allclose(out, F.linear(x, plain(w), plain(b)), atol=1e-6)


def _elementwise_model(x):
    w = pyro.sample("w", dist.Normal(torch.zeros(4, 3), 1.0).to_event(2))
    v = pyro.sample("v", dist.Normal(torch.zeros(4, 4), 1.0).to_event(2))
    return x @ (2.0 * w).T @ torch.tanh(v).T  # both weights meet an elementwise op first


def test_weight_draws_never_warns_about_unsupported_uses():
    with weight_draws():
        out = _elementwise_model(torch.randn(N, 3))
    assert out.shape == (N, 4)


def test_unsupported_uses_warn_once_per_weight_site():
    """Two weight sites used elementwise: one warning for each, naming it."""
    with pytest.warns(LocalReparameterizationWarning) as record:
        with local_reparameterization():
            for _ in range(2):
                _elementwise_model(torch.randn(N, 3))
    messages = [str(w.message) for w in record if w.category is LocalReparameterizationWarning]
    assert len(messages) == 2
    assert "'w' is used by" in messages[0] and "'v' is used by" in messages[1]
