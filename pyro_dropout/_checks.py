"""Argument checks shared by constructors and functions: errors name the argument."""

import numbers

__all__ = ["is_positive", "positive_int", "positive_number"]


def positive_int(value, name):
    """``value`` as an int if it is an integer >= 1 (not a bool or a float), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def positive_number(value, name):
    """``value`` as a float if it is a real number > 0 (not a bool or a string), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def is_positive(value):
    """Whether ``value`` is a number (or a tensor of numbers) > 0 everywhere; False for a
    string, a bool or anything that does not compare with 0 (no raw TypeError)."""
    if isinstance(value, (bool, str, bytes)):
        return False
    try:
        return bool((value > 0).all()) if hasattr(value, "all") else bool(value > 0)
    except (TypeError, RuntimeError, ValueError):
        return False
