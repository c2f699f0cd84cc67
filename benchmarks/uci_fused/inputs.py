"""The network's inputs for each family's kernels: the layers' parameters in the kernels'
layout and the random draws, in the order the local-reparameterisation rules draw them
(first layer, then second; a layer's mask before its noise), so that the tests can hand both
paths the same numbers."""

from __future__ import annotations

import torch

from pyro_dropout.distributions import concrete_keep_mask

from .closed_form_kl import dropout_rates
from .kernels import compiled, np
from .networks import scratch

#: Where the step's random numbers come from: ``"kernel"`` (counter-based draws from a seed
#: that torch draws: the masks inside the network kernels, the normals by ``fill_normal``)
#: or ``"torch"`` (torch's generator, drawn as the LRT rules draw them: the tests' exact
#: check against the Pyro loss).
RNG = ("kernel", "torch")


def _seed():
    return np.uint64(int(torch.randint(0, 2**62, (), dtype=torch.int64)))


def standard_normal(ctx, key, shape, like, rng):
    """N(0, 1) draws of ``shape`` into ``ctx``'s kept tensor ``key`` (see
    :func:`~.networks.scratch`): torch's ``normal_``, or with ``rng="kernel"`` the kernels'
    ``fill_normal`` (Box-Muller on a counter-based stream; half the time of torch's)."""
    t = scratch(ctx, key, shape, like)
    if rng == "torch":
        return t.normal_()
    compiled()["fill_normal"](t.numpy().reshape(-1), _seed())
    return t


def by_layer(values, members, hidden):
    """The four sites' tensors (in ``SITES`` order) in the kernels' layout: the first
    layer's as ``(M, D, H)`` (contiguous in the units), the hidden layer's as ``(M, H)``, the
    output bias as ``(M,)``."""
    w1, b1, w2, b2 = values
    return (
        w1.reshape(members, hidden, -1).transpose(1, 2),
        b1.reshape(members, hidden),
        w2.reshape(members, hidden),
        b2.reshape(members),
    )


def gaussian_inputs(model, x, locs, variances, rng, ctx=None):
    """The inputs of :class:`~.networks.GaussianMLP` from the sites' means and variances."""
    members, batch, hidden = x.shape[0], x.shape[1], model.layers[0].out_features
    w1m, b1m, m2, b2m = by_layer(locs, members, hidden)
    w1v, b1v, v2, b2v = by_layer(variances, members, hidden)
    eps1 = standard_normal(ctx, "eps1", (members, batch, hidden), x, rng)
    eps2 = standard_normal(ctx, "eps2", (members, batch), x, rng)
    return x, w1m, w1v, b1m, b1v, m2, v2, b2m, b2v, eps1, eps2


def dropout_inputs(model, guide, x, rng, locs, ctx=None):
    """The inputs of :class:`~.networks.DropoutMLP`. With ``rng="torch"`` the masks'
    uniforms come from ``torch.rand`` (drawn as the LRT rules draw them); with ``"kernel"``
    the kernels draw them from a seed that torch draws."""
    members, batch = x.shape[0], x.shape[1]
    hidden = model.layers[0].out_features
    rate = torch.as_tensor(dropout_rates(guide)[0], dtype=x.dtype)
    keep = (1 - rate).reshape(-1).expand(members)
    seed, u1, u2 = 0, None, None
    if rng == "kernel":
        seed = int(_seed())
    else:
        u1 = torch.rand(members, batch, x.shape[2], dtype=x.dtype)
    eps1 = standard_normal(ctx, "eps1", (members, batch, hidden), x, rng)
    if rng != "kernel":
        u2 = torch.rand(members, batch, hidden, dtype=x.dtype)
    eps2 = standard_normal(ctx, "eps2", (members, batch), x, rng)
    w1, b1, w2, b2 = by_layer(locs, members, hidden)
    return x, seed, u1, keep, w1, b1, eps1, u2, w2, b2, eps2, guide.scale**2


def concrete_inputs(guide, x, locs, rates, hidden, rng, ctx=None):
    """The inputs of :class:`~.networks.ConcreteMLP` from the sites' means and the two
    layers' drop rates ``(M,)`` (clamped as the guide clamps them): the relaxed keep masks
    drawn by the library's :func:`~pyro_dropout.distributions.concrete_keep_mask` (their
    gradient to ``logit p`` goes through the kernels' backward, not through the masks)."""
    members, batch = x.shape[0], x.shape[1]
    t = guide.temperature
    per_member = [p.detach().to(x.dtype).reshape(members, 1, 1) for p in rates]
    z1 = concrete_keep_mask(per_member[0], t, (members, batch, x.shape[2]))
    eps1 = standard_normal(ctx, "eps1", (members, batch, hidden), x, rng)
    z2 = concrete_keep_mask(per_member[1], t, (members, batch, hidden))
    eps2 = standard_normal(ctx, "eps2", (members, batch), x, rng)
    lp = [torch.logit(p).reshape(members) for p in rates]
    inv = [torch.reciprocal(1 - p).reshape(members) for p in rates]
    w1, b1, w2, b2 = by_layer(locs, members, hidden)
    return (x, z1, z2, lp[0], lp[1], inv[0], inv[1], w1, b1, eps1, w2, b2, eps2,
            guide.scale**2, 1.0 / t)  # fmt: skip
