"""Lazy imports of optional dependencies with an installation hint."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS_HINT = "pip install pyro-dropout[examples]"


def require(module: str, package: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says how to install it.

    Args:
        module: Dotted module name to import, e.g. ``"statsmodels.datasets.co2"``.
        package: Distribution name to mention, e.g. ``"statsmodels"``.
        purpose: What needs it, e.g. ``"load_co2()"``.

    Returns:
        The imported module.

    Example:
        >>> require("numpy", "numpy", "this example").__name__
        'numpy'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{purpose} needs the optional package {package!r}, which is not installed; "
            f"install the extras with `{EXTRAS_HINT}` (or `pip install {package}`)"
        ) from err
