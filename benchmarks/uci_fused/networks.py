"""The D-H-1 network's pre-activation draws on the kernels, as autograd Functions: one per
family (Gaussian, MC dropout, Concrete dropout). :class:`~.gradients.ManualGradients` calls
their ``forward`` and ``backward`` itself, with a :class:`StepContext` for autograd's."""

from __future__ import annotations

import torch

from .kernels import as_array, compiled, constants, np


class StepContext:
    """Stands in for autograd's context when the step calls a Function's forward and backward
    itself (no graph is recorded); ``buffers`` keeps the step's large tensors across steps."""

    def __init__(self, buffers=None):
        self.buffers = buffers

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def scratch(ctx, key, shape, like):
    """An uninitialised tensor of ``shape``: one kept across steps by the hand-written step's
    context (a :class:`StepContext` with ``buffers``), a new one under autograd (which may
    keep it).

    Why: a fresh 6 MB tensor per step is fresh pages from the kernel (a page fault and zeroing
    per 4 kB on first touch): ``torch.randn`` of (240, 128, 50) took 8.6 ms where filling a
    kept tensor with ``normal_`` took 4.3 ms."""
    buffers = getattr(ctx, "buffers", None)
    shape = torch.Size(shape)
    if buffers is None:
        return like.new_empty(shape)
    key = (key, shape, like.dtype)  # an epoch's last, smaller minibatch keeps its own
    t = buffers.get(key)
    if t is None:
        t = buffers[key] = like.new_empty(shape)
    return t


def _arrays(*tensors):
    return [as_array(t) for t in tensors]


class GaussianMLP(torch.autograd.Function):
    """The whole D-H-1 network's pre-activation draws, given the layers' means and variances
    (first layer as ``(M, D, H)``, the rest ``(M, H)`` and ``(M,)``) and the noise ξ:
    returns ``f`` ``(M, B)``. Gradients for the parameters (not for ``x`` or the noise)."""

    @staticmethod
    def forward(ctx, x, w1m, w1v, b1m, b1v, m2, v2, b2m, b2v, eps1, eps2):
        shape = eps1.shape
        a, r = scratch(ctx, "a", shape, x), scratch(ctx, "r", shape, x)
        f, r2 = scratch(ctx, "f", shape[:2], x), scratch(ctx, "r2", shape[:2], x)
        compiled()["gaussian_forward"](
            *_arrays(x, w1m, w1v, b1m, b1v, eps1, m2, v2, b2m, b2v, eps2),
            constants(x),
            *_arrays(a, r, f, r2),
        )
        ctx.save_for_backward(x, a, r, r2, m2, v2)
        return f

    @staticmethod
    def backward(ctx, gf):
        x, a, r, r2, m2, v2 = ctx.saved_tensors
        members, _, d = x.shape
        gw1m, gw1v = (scratch(ctx, k, (members, d, m2.shape[1]), x) for k in ("gw1m", "gw1v"))
        gb1m, gb1v, gm2, gv2 = (
            scratch(ctx, k, m2.shape, x) for k in ("gb1m", "gb1v", "gm2", "gv2")
        )
        gb2m, gb2v = scratch(ctx, "gb2m", (members,), x), scratch(ctx, "gb2v", (members,), x)
        outs = (gw1m, gw1v, gb1m, gb1v, gm2, gv2, gb2m, gb2v)
        compiled()["gaussian_backward"](
            *_arrays(gf, x, a, r, r2, m2, v2), constants(x), *_arrays(*outs)
        )
        return (None, *outs, None, None)


class DropoutMLP(torch.autograd.Function):
    """The D-H-1 network's pre-activation draws under MC dropout, given the masks' uniforms
    (``u1`` ``(M, B, D)`` and ``u2`` ``(M, B, H)``, or ``None``: drawn inside the kernels from
    ``seed``), the normal noise, ``M`` of each layer (first as ``(M, D, H)``), the biases'
    means, the keep probabilities ``(M,)`` and σ²: returns ``f`` ``(M, B)``. Gradients for
    ``M`` and the biases' means."""

    @staticmethod
    def forward(ctx, x, seed, u1, keep, w1, b1, eps1, u2, w2, b2, eps2, slab_var):
        use = u1 is not None
        if not use:  # placeholders of the right type, never read
            u1 = u2 = x.new_empty((1, 1, 1))
        a = scratch(ctx, "a", eps1.shape, x)
        f, r2 = scratch(ctx, "f", eps1.shape[:2], x), scratch(ctx, "r2", eps1.shape[:2], x)
        seed = np.uint64(seed)
        x_, u1_, keep_, w1_, b1_, eps1_, u2_, w2_, b2_, eps2_ = _arrays(
            x, u1, keep, w1, b1, eps1, u2, w2, b2, eps2
        )
        compiled()["dropout_forward"](
            x_, seed, use, u1_, keep_, w1_, b1_, eps1_, u2_, w2_, b2_, eps2_,
            constants(x, slab_var), *_arrays(a, f, r2),
        )  # fmt: skip
        ctx.save_for_backward(x, u1, keep, a, u2, w2, r2)
        ctx.slab_var, ctx.seed, ctx.use = slab_var, seed, use
        return f

    @staticmethod
    def backward(ctx, gf):
        x, u1, keep, a, u2, w2, r2 = ctx.saved_tensors
        members, _, d = x.shape
        gw1 = scratch(ctx, "gw1", (members, d, w2.shape[1]), x)
        gb1, gw2 = scratch(ctx, "gb1", w2.shape, x), scratch(ctx, "gw2", w2.shape, x)
        gb2 = scratch(ctx, "gb2", (members,), x)
        gf_, x_, u1_, keep_, a_, u2_, w2_, r2_ = _arrays(gf, x, u1, keep, a, u2, w2, r2)
        compiled()["dropout_backward"](
            gf_, x_, ctx.seed, ctx.use, u1_, keep_, a_, u2_, w2_, r2_,
            constants(x, ctx.slab_var), *_arrays(gw1, gb1, gw2, gb2),
        )  # fmt: skip
        return None, None, None, None, gw1, gb1, None, None, gw2, gb2, None, None


class ConcreteMLP(torch.autograd.Function):
    """The D-H-1 network's pre-activation draws under Concrete dropout, given the relaxed keep
    masks ``z1`` ``(M, B, D)`` and ``z2`` ``(M, B, H)`` (drawn from ``logit p``: the gradient to
    ``logit p`` of each layer comes back through ``lp1``/``lp2``, which only the backward
    reads), ``1 / (1 - p)`` of each layer ``(M,)``, the mean weights ``m'`` (first as
    ``(M, D, H)``), the biases' means, the noise, σ² and 1 / t: returns ``f`` ``(M, B)``."""

    @staticmethod
    def forward(ctx, x, z1, z2, lp1, lp2, inv1, inv2, w1, b1, eps1, w2, b2, eps2, slab_var, inv_t):
        a = scratch(ctx, "a", eps1.shape, x)
        f, r2 = scratch(ctx, "f", eps1.shape[:2], x), scratch(ctx, "r2", eps1.shape[:2], x)
        consts = constants(x, slab_var, inv_t)
        compiled()["concrete_forward"](
            *_arrays(x, z1, z2, inv1, inv2, w1, b1, eps1, w2, b2, eps2),
            consts,
            *_arrays(a, f, r2),
        )
        ctx.save_for_backward(x, z1, z2, inv1, inv2, w1, a, w2, r2)
        ctx.consts = consts
        return f

    @staticmethod
    def backward(ctx, gf):
        x, z1, z2, inv1, inv2, w1, a, w2, r2 = ctx.saved_tensors
        members, _, d = x.shape
        gw1 = scratch(ctx, "gw1", (members, d, w2.shape[1]), x)
        gb1, gw2 = scratch(ctx, "gb1", w2.shape, x), scratch(ctx, "gw2", w2.shape, x)
        names = ("gb2", "glp1", "glp2", "ginv1", "ginv2")
        gb2, glp1, glp2, ginv1, ginv2 = (scratch(ctx, k, (members,), x) for k in names)
        outs = (gw1, gb1, gw2, gb2, glp1, glp2, ginv1, ginv2)
        compiled()["concrete_backward"](
            *_arrays(gf, x, z1, z2, inv1, inv2, w1, a, w2, r2), ctx.consts, *_arrays(*outs)
        )
        # x, z1, z2, lp1, lp2, inv1, inv2, w1, b1, eps1, w2, b2, eps2, slab_var, inv_t
        return (None, None, None, glp1, glp2, ginv1, ginv2, gw1, gb1, None, gw2, gb2, None,
                None, None)  # fmt: skip
