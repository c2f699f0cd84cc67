"""Broadcast helpers shared by the distributions, layers and handlers."""

from collections.abc import Iterable

import torch

__all__ = ["broadcast_shape", "is_uniform", "ntuple", "unexpand"]


def unexpand(t):
    """View ``t`` with every broadcast (stride-0) dimension shrunk back to size 1."""
    if t.dim() == 0 or all(s != 0 or n == 1 for s, n in zip(t.stride(), t.shape, strict=True)):
        return t
    index = tuple(
        slice(0, 1) if (s == 0 and n > 1) else slice(None)
        for s, n in zip(t.stride(), t.shape, strict=True)
    )
    return t[index]


def is_uniform(t):
    """Whether ``t`` holds one value broadcast (a scalar prior's scale, say)."""
    return unexpand(t).numel() == 1


def broadcast_shape(*shapes):
    """``torch.broadcast_shapes`` for the hot path.

    torch's version goes through its reference implementation (about 30 µs a call here); this
    pure-Python one is a few µs. Raises ``RuntimeError`` on shapes that do not broadcast, like
    torch.
    """
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for i, n in enumerate(shape):
            j = offset + i
            if n != 1:
                if out[j] != 1 and out[j] != n:
                    raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
                out[j] = n
    return torch.Size(out)


def ntuple(x, n):
    """A convolution's argument (stride, padding, dilation, kernel size) as an ``n``-tuple: a
    number repeated, an iterable as a tuple (what ``torch.nn``'s private ``_single`` and
    ``_pair`` do)."""
    return tuple(x) if isinstance(x, Iterable) else (x,) * n
