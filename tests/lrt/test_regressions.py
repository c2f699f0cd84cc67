"""Regression tests for library bugs found while writing the LRT tests (now fixed)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    AutoDropout,
    AutoVariationalDropout,
    BayesianConv2d,
    BayesianLinear,
    BayesianMLP,
    local_reparameterization,
)


@pytest.mark.parametrize("alpha", ["unit", "layer"])
def test_variational_dropout_unit_and_layer_alpha_build(alpha):
    """guides/variational_dropout.py:115 and :123 store/read the per-unit or per-layer log α
    in a parameter group named ``"log_alpha"``, which is also the name of the method
    ``AutoVariationalDropout.log_alpha``: ``AutoWeightGuide._set`` (guides/base.py:107) sees
    ``hasattr(self, "log_alpha")``, skips creating the PyroModule container and
    ``deep_setattr``s onto the bound method ("'method' object has no attribute 'net'").
    ``alpha="unit"`` and ``alpha="layer"`` therefore cannot be built at all.
    Fix: call the group e.g. ``"log_alphas"`` in both places."""
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    guide = AutoVariationalDropout(model, alpha=alpha)
    guide(torch.randn(5, 3), torch.randn(5))
    assert guide.log_alpha("net.layers.0.weight").shape == (4, 3)


def test_lrt_dropout_grouped_conv():
    """handlers/lrt_rules.py:51-64 (``_input_keep_prob``): for a grouped convolution the
    dropout rate has ``in_channels / groups`` channels but the layer input has
    ``in_channels``, so the input mask does not broadcast ("Attempting to broadcast a
    dimension of length 2 at -3"). In weight space one mask value per (channel-in-group, tap)
    is shared by every group, so the right keep probability of input channel ``c`` is that of
    ``c mod (in_channels / groups)``. Fix: after ``keep = keep[(...,) + (0,) * spec.ndim]``
    add ``if spec.groups > 1: keep = keep.repeat((1,) * (keep.dim() - 1) + (spec.groups,))``
    (``test_lrt_moments.py::test_lrt_moments_grouped_conv_dropout`` checks the moments)."""
    conv = BayesianConv2d(4, 4, kernel_size=3, padding=1, groups=2)
    guide = AutoDropout(conv, dropout_rate=0.3, input_dropout_rate=0.3)
    x = torch.randn(2, 4, 5, 5)
    guide(x)
    with local_reparameterization():
        tr = poutine.trace(guide).get_trace(x)
        out = poutine.replay(conv, trace=tr)(x)
    assert out.shape == (2, 4, 5, 5)


def _unit_guide(x):
    pyro.sample("weight", dist.Normal(torch.ones(3, 4), 1.0).to_event(2))
    pyro.sample("bias", dist.Normal(torch.zeros(3), 1.0).to_event(1))


def test_lrt_with_particle_plate_outside_the_context():
    """handlers/lrt_messenger.py:80-85: the messenger records ``msg["fn"]`` in
    ``_pyro_sample``. A plate entered *outside* ``local_reparameterization()`` broadcasts the
    distribution only after that (handlers run innermost first), so the record has batch
    ``()`` while the weights have ``(P, 1)``; ``_align_batch`` returns None and the layer
    silently uses the shared weight draw (no per-example noise, no variance reduction).
    Fix: decide freshness in ``_pyro_sample`` (e.g. remember ``id(msg)``) but store
    ``msg["fn"]`` in ``_pyro_post_sample``, when every handler has broadcast it."""
    layer = BayesianLinear(4, 3)
    x = torch.randn(1, 4).expand(6, 4)
    with pyro.plate("particles", 5, dim=-2), local_reparameterization():
        tr = poutine.trace(_unit_guide).get_trace(x)
        out = poutine.replay(layer, trace=tr)(x)
    assert out.shape == (5, 6, 3)
    # Per-example noise: identical inputs give different pre-activations.
    assert not torch.equal(out[:, 0], out[:, 1])
