"""Local reparameterisation in the code users write: ``F.linear`` (``PyroModule[nn.Linear]``),
``x @ w.T``, ``x @ w`` with an ``(in, out)`` weight, ``torch.matmul`` / ``mm``, the transposes
``w.t()``, ``w.mT``, ``w.transpose(0, 1)``, ``w.permute(1, 0)``, a vector weight, and
``F.conv2d`` (``PyroModule[nn.Conv2d]``); the warnings when a weight meets another operation.

Each variant is checked against weight sampling (``weight_draws()``) on two different input
rows: per row, the means, variances and the covariances between output units agree (LRT is
exact jointly over the units of one example, for every family), and across the two rows the
outputs are independent under LRT (the point of the trick) but not under weight sampling.
"""

import contextlib
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    local_reparameterization,
    weight_draws,
)
from pyro_dropout.handlers import LocalReparameterizationWarning

from ._stats import Z, mean_z, var_z

D, H, R = 3, 4, 4000

#: name -> (weight shape, forward(x, w) computing x W^T in the user's style)
OPS = {
    "F.linear": ((H, D), lambda x, w: F.linear(x, w)),
    "x @ w.T": ((H, D), lambda x, w: x @ w.T),
    "x @ w.t()": ((H, D), lambda x, w: x @ w.t()),
    "x @ w.mT": ((H, D), lambda x, w: x @ w.mT),
    "x @ w.transpose(0, 1)": ((H, D), lambda x, w: x @ w.transpose(0, 1)),
    "x @ w.transpose(-1, -2)": ((H, D), lambda x, w: x @ w.transpose(-1, -2)),
    "x @ w.permute(1, 0)": ((H, D), lambda x, w: x @ w.permute(1, 0)),
    "torch.matmul(x, w.T)": ((H, D), lambda x, w: torch.matmul(x, w.T)),
    "x.matmul(w.T)": ((H, D), lambda x, w: x.matmul(w.T)),
    "torch.mm(x, w.T)": ((H, D), lambda x, w: torch.mm(x, w.T)),
    "x @ w (in, out)": ((D, H), lambda x, w: x @ w),
    "F.linear(x, w.T) (in, out)": ((D, H), lambda x, w: F.linear(x, w.T)),
    "x @ w (vector)": ((D,), lambda x, w: (x @ w).unsqueeze(-1)),
}
GUIDES = {
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.3),
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.4, input_dropout_rate=0.4, scale=0.1),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-0.5),
}


def _model(shape, op):
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape)))
        f = op(x, w)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 1.0).to_event(1), obs=y)
        return f

    return model


def _draws(model, guide, x, handler, r=R):
    """``r`` draws in one vectorised pass (a plate left of the data plate): the user ops
    broadcast over the weights' sample dimension under both handlers."""
    with handler(), pyro.plate("draws", r, dim=-2), torch.no_grad():
        tr = poutine.trace(guide).get_trace(x)
        return poutine.replay(model, trace=tr)(x)  # (R, rows, H)


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
@pytest.mark.parametrize("op_name", sorted(OPS))
def test_every_user_op_samples_the_same_per_example_distribution(op_name, guide_name):
    pyro.set_rng_seed(0)
    shape, op = OPS[op_name]
    model = _model(shape, op)
    x = torch.tensor([[1.0, -0.5, 2.0], [0.3, 1.5, -1.0]])
    guide = GUIDES[guide_name](model)
    guide(x, torch.zeros(2, shape[0] if len(shape) == 2 and op_name.count("in, out") == 0 else H))
    lrt = _draws(model, guide, x, local_reparameterization)
    ref = _draws(model, guide, x, weight_draws)
    for row in range(2):
        a, b = lrt[:, row], ref[:, row]
        assert mean_z(a, b).abs().max() < Z
        assert var_z(a, b).abs().max() < Z
        # covariance between output units of one example (the products of centred pairs)
        ca, cb = a - a.mean(0), b - b.mean(0)
        pa = (ca[:, :, None] * ca[:, None, :]).flatten(1)
        pb = (cb[:, :, None] * cb[:, None, :]).flatten(1)
        assert mean_z(pa, pb).abs().max() < Z
    # LRT noise is independent across examples; a weight draw is shared by both rows
    corr_lrt = torch.corrcoef(torch.stack([lrt[:, 0, 0], lrt[:, 1, 0]]))[0, 1]
    corr_ref = torch.corrcoef(torch.stack([ref[:, 0, 0], ref[:, 1, 0]]))[0, 1]
    assert abs(float(corr_lrt)) < 5 / math.sqrt(R)
    assert abs(float(corr_ref)) > 10 / math.sqrt(R)


def test_user_conv2d_matches_weight_sampling_per_output_element():
    """PyroModule[nn.Conv2d]'s F.conv2d under LRT: each output element's mean and variance
    equal weight sampling's (per-position marginals)."""
    from pyro.nn import PyroModule, PyroSample

    pyro.set_rng_seed(0)
    conv = PyroModule[torch.nn.Conv2d](2, 3, 3)
    conv.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2, 3, 3]).to_event(4))
    conv.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    def model(x, y=None):
        f = conv(x).flatten(-3)  # broadcasts over the draws
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 1.0).to_event(1), obs=y)
        return f

    x = torch.randn(1, 2, 4, 4)
    for make in GUIDES.values():
        guide = make(model)
        guide(x, torch.zeros(1, 12))
        lrt = _draws(model, guide, x, local_reparameterization, 3000)[:, 0]
        ref = _draws(model, guide, x, weight_draws, 3000)[:, 0]
        assert mean_z(lrt, ref).abs().max() < Z and var_z(lrt, ref).abs().max() < Z


# --------------------------------------------------------------------------------------------
# never silent
# --------------------------------------------------------------------------------------------


def _elementwise_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([H, D]).to_event(2))
    b = pyro.sample("b", dist.Normal(0.0, 1.0).expand([H]).to_event(1))
    f = x @ (2.0 * w).T + b  # the product meets w through an elementwise op first
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(f, 1.0).to_event(1), obs=y)
    return f


def test_a_weight_used_elementwise_warns_once_naming_site_and_op():
    x, y = torch.randn(8, D), torch.randn(8, H)
    guide = AutoMeanField(_elementwise_model)
    guide(x, y)
    with pytest.warns(LocalReparameterizationWarning) as record:
        with local_reparameterization():
            for _ in range(3):
                tr = poutine.trace(guide).get_trace(x, y)
                f = poutine.replay(_elementwise_model, trace=tr)(x, y)
    messages = [str(w.message) for w in record if w.category is LocalReparameterizationWarning]
    assert len(messages) == 1  # once per site, not per call; the bias's "+" is not reported
    assert "'w'" in messages[0] and "Tensor.mul" in messages[0]
    assert f.shape == (8, H)
    with pytest.raises(NotImplementedError, match="'w' is used by"):
        with local_reparameterization(strict=True):
            tr = poutine.trace(guide).get_trace(x, y)
            poutine.replay(_elementwise_model, trace=tr)(x, y)


def test_uses_after_the_model_returned_are_not_reported():
    """The ELBO's Monte-Carlo log densities and Predictive's stacking touch the weights after
    the model ran: no warning (Trace_ELBO evaluates log q(w) and log p(w) on them)."""
    from pyro.infer import SVI, Trace_ELBO
    from pyro.optim import Adam

    model = _model((H, D), lambda x, w: x @ w.T)
    x, y = torch.randn(8, D), torch.randn(8, H)
    guide = AutoMeanField(model)
    svi = SVI(model, guide, Adam({"lr": 0.01}), Trace_ELBO())
    with local_reparameterization(strict=True):
        for _ in range(2):
            svi.step(x, y)


def test_a_weight_used_twice_in_one_run_warns():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D, D]).to_event(2))
        f = torch.tanh(x @ w.T) @ w.T  # a weight shared by two layers (an unrolled RNN)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 1.0).to_event(1), obs=y)

    x, y = torch.randn(8, D), torch.randn(8, D)
    guide = AutoMeanField(model)
    guide(x, y)
    with pytest.warns(LocalReparameterizationWarning, match="more than one operation"):
        with local_reparameterization():
            tr = poutine.trace(guide).get_trace(x, y)
            poutine.replay(model, trace=tr)(x, y)
    with contextlib.ExitStack() as stack:  # weight draws: one common draw, no warning
        stack.enter_context(weight_draws())
        tr = poutine.trace(guide).get_trace(x, y)
        poutine.replay(model, trace=tr)(x, y)
