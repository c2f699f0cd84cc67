"""The tensors in nested arguments (lists, tuples, named ones too, and dicts), as torch's
functions take them. Why our own: torch's pytree is private (``torch.utils._pytree``; torch
2.13 has no public one), and these two walks are all the library needs of it."""

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["map_tensors", "tensors"]


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to each tensor in its lists, tuples and dicts (a dict
    comes back as a plain ``dict``; other values are kept)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        out = [map_tensors(v, fn) for v in value]
        return type(value)(*out) if hasattr(type(value), "_fields") else type(value)(out)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``'s lists, tuples and dicts, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []
