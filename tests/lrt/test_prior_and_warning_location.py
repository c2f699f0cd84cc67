"""Two regressions found by the mutation campaign.

* Running a model *without* a guide under ``local_reparameterization()`` (prior draws, e.g. a
  prior-predictive ``Predictive``) with the common prior ``Normal(0., 1.).expand(shape)``: the
  rule saw the prior's fully broadcast ``loc`` shrunk to ``(1, 1)`` and failed with a shape
  error. The rule must answer with the prior's own pre-activation distribution.
* The local-reparameterisation warnings must point at the user's line, not inside the library
  (the call paths have different depths, so no fixed ``stacklevel`` is right).
"""

from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn as nn
from pyro.infer import Predictive
from pyro.nn import PyroModule, PyroSample

from pyro_dropout import AutoMeanField, local_reparameterization, weight_draws
from pyro_dropout.handlers import LocalReparameterizationWarning

from ._stats import Z, mean_z, var_z


class _PriorLinear(PyroModule):
    def __init__(self):
        super().__init__()
        self.layer = PyroModule[nn.Linear](2, 3)
        self.layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
        self.layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    def forward(self, x):
        return pyro.deterministic("f", self.layer(x))


class _PriorConv1d(PyroModule):
    def __init__(self):
        super().__init__()
        self.conv = PyroModule[nn.Conv1d](2, 3, 3, bias=False)
        self.conv.weight = PyroSample(dist.Normal(0.0, 0.5).expand([3, 2, 3]).to_event(3))

    def forward(self, x):
        return pyro.deterministic("f", self.conv(x))


@pytest.mark.parametrize(
    "make, x",
    [
        (_PriorLinear, torch.tensor([[1.0, -2.0], [0.5, 0.5], [0.0, 3.0], [1.0, 1.0]])),
        (_PriorConv1d, torch.linspace(-1, 1, 2 * 6).reshape(1, 2, 6)),
    ],
    ids=["linear", "conv1d"],
)
def test_prior_draws_under_lrt_match_weight_sampling_for_a_broadcast_prior(make, x):
    """Prior predictive inside ``local_reparameterization()`` (no guide): every output has the
    prior's mean and variance (compared with weight draws, |z| < Z per element)."""
    model = make()
    n = 4000
    with local_reparameterization():
        lrt = Predictive(model, num_samples=n, return_sites=["f"])(x)["f"]
    with weight_draws():
        ref = Predictive(model, num_samples=n, return_sites=["f"])(x)["f"]
    assert lrt.shape == ref.shape
    assert mean_z(lrt, ref).abs().max() < Z
    assert var_z(lrt, ref).abs().max() < Z


def _functional_model_with_weight_in_an_unsupported_op(x):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    return (x.unsqueeze(-1) * w.T).sum(-2)  # elementwise use: no rule


def test_lrt_warnings_point_at_the_users_line():
    """The unsupported-use warning is attributed to this file (the line of the model that used
    the weight), not to a module of the library, Pyro or torch."""
    model = _functional_model_with_weight_in_an_unsupported_op
    guide = AutoMeanField(model)
    x = torch.randn(5, 2)
    with local_reparameterization():
        with pytest.warns(LocalReparameterizationWarning) as record:
            guide(x)
            with pyro.poutine.replay(trace=pyro.poutine.trace(guide).get_trace(x)):
                model(x)
    assert record, "expected a warning"
    use_line = _line_of("# elementwise use: no rule")
    assert [(r.filename, r.lineno) for r in record] == [(__file__, use_line)] * len(record)


def _line_of(marker):
    """Line number (1-based) of the line of this file that contains ``marker``."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    (number,) = [i + 1 for i, line in enumerate(lines) if marker in line and "_line_of" not in line]
    return number


def _weight_drawn_in_a_plate_and_used_after_it(x, y):
    with pyro.plate("heads", 1, dim=-2):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    mean = torch.exp(w).sum() * x.sum(-1)  # no rule for exp, used after the plate block
    with pyro.plate("data", x.shape[0], dim=-1):
        pyro.sample("obs", dist.Normal(mean, 1.0), obs=y)


def test_a_use_after_a_plate_block_inside_the_model_is_reported():
    """Leaving a plate inside the model is not the end of the model run: a use without a rule
    there is reported (strict=True raises), while the ELBO's own use of the values after the
    model returned is not."""
    model = _weight_drawn_in_a_plate_and_used_after_it
    guide = AutoMeanField(model)
    x, y = torch.randn(4, 2), torch.randn(4)
    guide(x, y)
    with local_reparameterization(strict=True):
        with pytest.raises(NotImplementedError, match="'w' is used by torch.exp"):
            tr = pyro.poutine.trace(guide).get_trace(x, y)
            pyro.poutine.replay(model, trace=tr)(x, y)
    elbo = pyro.infer.Trace_ELBO(max_plate_nesting=2)
    with local_reparameterization():
        with pytest.warns(LocalReparameterizationWarning, match="torch.exp") as record:
            elbo.differentiable_loss(model, guide, x, y)
    assert len(record) == 1  # the model's use, once; not the log densities


def _conv_kernel_with_a_batch_dim(x):
    k = pyro.sample("k", dist.Normal(torch.zeros(3, 2, 3), 0.5).to_event(2))  # out-channels batch
    return torch.nn.functional.conv1d(x, k)


def test_a_kernel_with_too_few_event_dims_is_used_as_drawn_and_reported():
    """A convolution kernel whose leading dim is a batch dim of the site has no rule: it is used
    as drawn (exactly torch's convolution of the draw) and the use is reported."""
    x = torch.randn(2, 2, 6)
    guide = AutoMeanField(_conv_kernel_with_a_batch_dim)
    guide(x)
    with local_reparameterization():
        with pytest.warns(
            LocalReparameterizationWarning, match="'k' is used by F.conv1d with a kernel of 2 event"
        ):
            tr = pyro.poutine.trace(guide).get_trace(x)
            out = pyro.poutine.replay(_conv_kernel_with_a_batch_dim, trace=tr)(x)
    torch.testing.assert_close(out, torch.nn.functional.conv1d(x, tr.nodes["k"]["value"]))


def test_a_conditioned_weight_of_a_bayesian_layer_is_used_as_given_under_lrt():
    """A weight fixed by ``poutine.condition`` has no distribution to sample pre-activations
    from: the layer applies the given weight (with its bias draw), exactly."""
    from pyro_dropout import BayesianLinear

    layer = BayesianLinear(3, 2)
    x = torch.randn(4, 3)
    w = torch.arange(6.0).reshape(2, 3)
    with local_reparameterization():
        tr = pyro.poutine.trace(pyro.poutine.condition(layer, data={"weight": w})).get_trace(x)
    out = tr.nodes["_RETURN"]["value"]
    torch.testing.assert_close(out, x @ w.T + tr.nodes["bias"]["value"])
