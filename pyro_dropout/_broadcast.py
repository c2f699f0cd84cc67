"""Broadcast helpers shared by the distributions, layers and handlers."""

__all__ = ["unexpand"]


def unexpand(t):
    """View ``t`` with every broadcast (stride-0) dimension shrunk back to size 1."""
    if t.dim() == 0 or all(s != 0 or n == 1 for s, n in zip(t.stride(), t.shape, strict=True)):
        return t
    index = tuple(
        slice(0, 1) if (s == 0 and n > 1) else slice(None)
        for s, n in zip(t.stride(), t.shape, strict=True)
    )
    return t[index]
