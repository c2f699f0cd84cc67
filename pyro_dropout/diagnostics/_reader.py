"""Read the arrays of an object written by ``to_inference_data`` (either ArviZ line)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import _arviz_compat as compat


def attrs(data: Any) -> dict[str, Any]:
    """Root attributes, falling back to the posterior's (both carry the export's attrs)."""
    out = {}
    if compat.has_group(data, "posterior"):
        out.update(compat.get_group(data, "posterior").attrs)
    out.update(compat.root_attrs(data))
    return out


def obs_name(data: Any) -> str:
    """Name of the observed variable (attribute ``obs_name``, else the only log-lik variable)."""
    name = attrs(data).get("obs_name")
    if name:
        return str(name)
    names = list(compat.get_group(data, "log_likelihood").data_vars)
    if len(names) != 1:
        raise ValueError(f"cannot tell the observed variable among {names}; set attrs['obs_name']")
    return names[0]


def family(data: Any) -> str:
    """Guide family recorded at export (``"unknown"`` if absent)."""
    return str(attrs(data).get("guide_family", "unknown"))


def config(data: Any) -> dict:
    """Guide settings recorded at export (parsed from the JSON attribute)."""
    raw = attrs(data).get("guide_config", "{}")
    try:
        return dict(json.loads(raw))
    except (TypeError, ValueError):
        return {}


def draws(data: Any, group: str, var: str) -> np.ndarray:
    """``group[var]`` with chain and draw merged into one leading axis of size ``S``."""
    da = compat.get_group(data, group)[var].transpose("chain", "draw", ...)
    v = np.asarray(da.values)
    return v.reshape((-1, *v.shape[2:]))


def values(data: Any, group: str, var: str) -> np.ndarray:
    """``group[var]`` as a numpy array (for data groups without chain/draw)."""
    return np.asarray(compat.get_group(data, group)[var].values)


def has_var(data: Any, group: str, var: str) -> bool:
    """Whether ``group`` exists and holds ``var``."""
    return compat.has_group(data, group) and var in compat.get_group(data, group)


def task(data: Any) -> str:
    """``"classification"`` or ``"regression"`` (attribute ``task``, else inferred)."""
    t = attrs(data).get("task")
    if t in ("classification", "regression"):
        return str(t)
    name = obs_name(data)
    return (
        "classification" if has_var(data, "posterior_predictive", f"{name}_probs") else "regression"
    )
