"""Two regressions found by the mutation campaign.

* Running a model *without* a guide under ``local_reparameterization()`` (prior draws, e.g. a
  prior-predictive ``Predictive``) with the common prior ``Normal(0., 1.).expand(shape)``: the
  rule saw the prior's fully broadcast ``loc`` shrunk to ``(1, 1)`` and failed with a shape
  error. The rule must answer with the prior's own pre-activation distribution.
* The local-reparameterisation warnings must point at the user's line, not inside the library
  (the call paths have different depths, so no fixed ``stacklevel`` is right).
"""

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
    assert all(r.filename == __file__ for r in record), [r.filename for r in record]
