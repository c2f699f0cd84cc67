"""Small Bayesian layers, hand-built guide distributions and an independent torch reference.

The reference applies sampled weights with plain ``torch.einsum`` / ``F.conv*d`` (one grouped
call for all draws), independently of the library's ``LinearSpec`` / ``ConvSpec``.
"""

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_dropout import (
    BayesianConv1d,
    BayesianConv2d,
    BayesianLinear,
    BernoulliMaskedNormal,
    local_reparameterization,
)

LAYERS = ("linear", "conv1d", "conv2d")


def make_layer(kind):
    """A tiny layer and ``K = 2`` distinct inputs for it (one with exact zeros)."""
    g = torch.Generator().manual_seed(123)
    if kind == "linear":
        layer, x = BayesianLinear(4, 3), torch.randn(2, 4, generator=g)
    elif kind == "conv1d":
        layer = BayesianConv1d(2, 3, kernel_size=3, padding=1)
        x = torch.randn(2, 2, 6, generator=g)
    elif kind == "conv2d":
        layer = BayesianConv2d(2, 3, kernel_size=3, stride=2, padding=1, dilation=1)
        x = torch.randn(2, 2, 5, 5, generator=g)
    elif kind == "conv2d_dilated":
        layer = BayesianConv2d(2, 3, kernel_size=2, padding=1, dilation=2)
        x = torch.randn(2, 2, 4, 4, generator=g)
    elif kind == "conv2d_groups":
        layer = BayesianConv2d(4, 4, kernel_size=3, padding=1, groups=2)
        x = torch.randn(2, 4, 4, 4, generator=g)
    else:
        raise ValueError(kind)
    x[1, 0] = 0.0  # a zero input unit/channel: its weights must contribute neither mean nor var
    return layer, x


def make_dists(layer, family, *, dropout_rate=0.3, scale_mult=1.0):
    """Hand-built guide distributions ``{"weight": q_W, "bias": q_b}`` for ``layer``.

    * ``"normal"``: mean-field Normal, element-wise σ in [0.1, 0.5].
    * ``"dropout"``: BernoulliMaskedNormal, p = ``dropout_rate``, one shared σ = 0.2 (the
      Linear rule's shortcut branch).
    * ``"dropout_elementwise"``: element-wise σ in [0.05, 0.3] (the general branch).
    * ``"dropout_per_input"``: one rate per input unit / channel (0.1 ... 0.5).
    """
    g = torch.Generator().manual_seed(7)
    shape = layer.weight_shape
    ev = len(shape)
    out = shape[0]
    if family == "normal":
        loc = 0.5 * torch.randn(shape, generator=g)
        scale = 0.1 + 0.4 * torch.rand(shape, generator=g)
        qw = dist.Normal(loc, scale * scale_mult).to_event(ev)
    else:
        loc = torch.randn(shape, generator=g)
        if family == "dropout":
            scale, rate = torch.tensor(0.2), torch.tensor(dropout_rate)
        elif family == "dropout_elementwise":
            scale = 0.05 + 0.25 * torch.rand(shape, generator=g)
            rate = torch.tensor(dropout_rate)
        elif family == "dropout_per_input":
            scale = torch.tensor(0.2)
            n_in = shape[1]
            rate = torch.linspace(0.1, 0.5, n_in).reshape((1, n_in) + (1,) * (ev - 2))
        else:
            raise ValueError(family)
        qw = BernoulliMaskedNormal(loc, scale * scale_mult, rate, event_dim=ev)
    qb = dist.Normal(0.3 * torch.randn(out, generator=g), torch.full((out,), 0.3)).to_event(1)
    return {"weight": qw, "bias": qb}


def guide_from(dists):
    def guide(*args, **kwargs):
        return {name: pyro.sample(name, d) for name, d in dists.items()}

    return guide


def repeat_rows(x, r):
    """``x`` of shape ``(K, ...)`` tiled to ``(r * K, ...)`` (row ``i`` is input ``i % K``)."""
    return x.unsqueeze(0).expand((r,) + x.shape).reshape((r * x.shape[0],) + x.shape[1:])


def lrt_draws(layer, guide, x, r, estimator="auto"):
    """``r`` draws of the layer output for each of the ``K`` inputs: ``(r, K, *out)``.

    The guide and the layer run once inside ``pyro.plate("draws", r, dim=-2)`` under
    ``local_reparameterization(estimator=...)``: every draw has its own weight distribution
    sample (ε of Flipout, masks of per-example draws), so the ``r`` outputs of an input are
    independent draws of its marginal for every estimator. (Rows of one pass are not
    independent under Flipout, which shares one perturbation per pass.)
    """
    with local_reparameterization(estimator=estimator), pyro.plate("draws", r, dim=-2):
        tr = poutine.trace(guide).get_trace(x)
        out = poutine.replay(layer, trace=tr)(x)
    return out


def reference(layer, x, w, b):
    """``layer`` applied with each of ``S`` weight draws ``w (S, *W)``, ``b (S, out)`` to each
    input: ``(S, K, *out)``; plain torch, no library code."""
    s = w.shape[0]
    if isinstance(layer, BayesianLinear):
        return torch.einsum("soi,ki->sko", w, x) + b[:, None, :]
    spec = layer.spec
    conv = F.conv1d if spec.ndim == 1 else F.conv2d
    groups = spec.groups
    o = w.shape[1]
    # Stack the S kernels as output channels, grouped so that group j holds every draw's
    # group-j filters: (groups, S, o/groups, ...) flattened.
    wg = w.reshape((s, groups, o // groups) + w.shape[2:]).transpose(0, 1)
    wg = wg.reshape((s * o,) + w.shape[2:])
    y = conv(x, wg, None, spec.stride, spec.padding, spec.dilation, groups)
    spatial = y.shape[2:]
    y = y.reshape((x.shape[0], groups, s, o // groups) + spatial).permute(
        2, 0, 1, 3, *range(4, 4 + spec.ndim)
    )
    y = y.reshape((s, x.shape[0], o) + spatial)
    return y + b[(slice(None), None, slice(None)) + (None,) * spec.ndim]


def weight_draws(layer, dists, x, r):
    """``r`` outputs computed from sampled weights ``W ~ q``: ``(r, K, *out)``."""
    w = dists["weight"].sample((r,))
    b = dists["bias"].sample((r,))
    return reference(layer, x, w, b)


def exact_moments(layer, dists, x):
    """Exact per-element mean and variance of the output: ``op(x, E W) + E b`` and
    ``op(x², Var W) + Var b``. Weights within one output element are independent under both
    families (a dropout mask is shared down a column, i.e. across outputs, never within a row).
    """
    qw, qb = dists["weight"], dists["bias"]
    mean = reference(layer, x, qw.mean.unsqueeze(0), qb.mean.unsqueeze(0))[0]
    var = reference(layer, x * x, qw.variance.unsqueeze(0), qb.variance.unsqueeze(0))[0]
    return mean, var
