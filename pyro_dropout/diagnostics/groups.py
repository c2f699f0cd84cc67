"""The ArviZ groups of one set of posterior draws: :func:`build_groups` turns the
:class:`~pyro_dropout.diagnostics.sampling.Draws` of a fit into one ``xarray.Dataset`` per
group, in the layout of :mod:`pyro_dropout.diagnostics.export` (which also lists the groups);
:func:`guide_info` names the fit's family and configuration.

The middle of the draw -> export -> score path: it reads draws
(:mod:`~pyro_dropout.diagnostics.sampling`) and is read by the exporters
(:mod:`~pyro_dropout.diagnostics.export` for a guide, :mod:`~pyro_dropout.diagnostics.samples`
for MCMC draws and ensembles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import xarray as xr

from .sampling import Draws, PredictiveDraws

__all__ = ["build_groups", "build_prior_groups", "guide_info"]


def guide_info(guide: Any) -> tuple[str, dict]:
    """``(family, config)`` of a guide, with fallbacks for guides of other libraries.

    ``family`` is ``guide.family`` if present, else the class name (a plain function's
    ``__name__``); ``config`` is ``guide.config`` if present, else ``{}``.

    Example:
        >>> from pyro.infer.autoguide import AutoNormal
        >>> guide_info(AutoNormal(lambda: None))
        ('AutoNormal', {})
    """
    family: Any = getattr(guide, "family", None)  # any attribute a guide may carry
    if not isinstance(family, str) or not family:
        family = type(guide).__name__
        if family == "function":
            family = getattr(guide, "__name__", family)
    config = getattr(guide, "config", None)
    return family, dict(config) if isinstance(config, Mapping) else {}


def _default_dims(name: str, ndim: int) -> list[str]:
    if ndim == 1:
        return [f"{name}_dim_0"]
    if ndim == 2:
        return [f"{name}_out", f"{name}_in"]
    return [f"{name}_dim_{k}" for k in range(ndim)]


def _site_dims(name: str, shape: tuple[int, ...], dims: Mapping[str, Sequence[str]]) -> list[str]:
    if name in dims:
        d = list(dims[name])
        if len(d) != len(shape):
            raise ValueError(
                f"dims[{name!r}] = {d} has {len(d)} names for a value of shape {shape}"
            )
        return d
    return _default_dims(name, len(shape))


def _dataset(
    arrays: Mapping[str, tuple[list[str], np.ndarray]],
    coords: Mapping[str, Any],
    num_draws: int | None,
    attrs: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Dataset with integer coords for every dim (``coords`` overrides), chain/draw first."""
    data_vars, all_coords = {}, {}
    for var, (dims, values) in arrays.items():
        values = np.asarray(values)
        if num_draws is not None:
            dims = ["chain", "draw", *dims]
            values = values[None]
        data_vars[var] = (dims, values)
        for dim, size in zip(dims, values.shape, strict=True):
            if dim not in all_coords:
                c = np.asarray(coords[dim]) if dim in coords else np.arange(size)
                if len(c) != size:
                    raise ValueError(f"coords[{dim!r}] has length {len(c)}; dimension has {size}")
                all_coords[dim] = c
    return xr.Dataset(data_vars, coords=all_coords, attrs=dict(attrs or {}))


def _tensor_to_numpy(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _predictive_vars(
    pd_: PredictiveDraws, obs_name: str, obs_dims: list[str]
) -> dict[str, tuple[list[str], np.ndarray]]:
    row = f"{obs_name}_id"
    out = {obs_name: ([row, *obs_dims], pd_.y_rep)}
    if pd_.mean is not None:
        out[f"{obs_name}_mean"] = ([row, *obs_dims], pd_.mean)
    if pd_.probs is not None:
        out[f"{obs_name}_probs"] = ([row, f"{obs_name}_class"], pd_.probs)
    return out


def _as_rows(y: np.ndarray, event: tuple[int, ...]) -> np.ndarray:
    return y.reshape((y.shape[0], *event)) if y.size == y.shape[0] * int(np.prod(event)) else y


def _x_vars(x: np.ndarray, obs_name: str) -> dict[str, tuple[list[str], np.ndarray]]:
    return {"x": ([f"{obs_name}_id", *[f"x_dim_{k}" for k in range(x.ndim - 1)]], x)}


def build_groups(
    draws: Draws,
    x: Any,
    y: Any,
    x_test: Any = None,
    y_test: Any = None,
    obs_name: str = "obs",
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Any] | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> dict[str, xr.Dataset]:
    """The ``xarray.Dataset`` of every group (see the module docstring) from :class:`Draws`."""
    dims, coords, attrs = dict(dims or {}), dict(coords or {}), dict(attrs or {})
    s = draws.log_joint.shape[0]
    x_np = _tensor_to_numpy(x)
    # The observation's event shape comes from the model's draws, not from y: a (N,) target
    # observed by a one-output Normal(...).to_event(1) is stored as (N, 1) like its draws.
    event = draws.train.y_rep.shape[2:]
    y_np = _as_rows(_tensor_to_numpy(y), event)
    obs_dims = [f"{obs_name}_dim_{k}" for k in range(len(event))]
    row = f"{obs_name}_id"

    post = {v: (_site_dims(v, a.shape[1:], dims), a) for v, a in draws.latents.items()}
    groups = {
        "posterior": _dataset(post, coords, s, attrs),
        "posterior_predictive": _dataset(_predictive_vars(draws.train, obs_name, obs_dims), {}, s),
        # draw_posterior was given y here, so the training rows have their log-likelihood
        "log_likelihood": _dataset(
            {obs_name: ([row], cast(np.ndarray, draws.train.log_lik))}, {}, s
        ),
        "sample_stats": _dataset({"lp": ([], draws.log_joint), "lq": ([], draws.log_q)}, {}, s),
        "observed_data": _dataset({obs_name: ([row, *obs_dims], y_np)}, {}, None),
        "constant_data": _dataset(_x_vars(x_np, obs_name), {}, None),
    }
    groups["sample_stats"]["lp"].attrs["description"] = "log p(theta_s, D): model log joint"
    groups["sample_stats"]["lq"].attrs["description"] = "log q(theta_s): guide log density"
    if draws.test is not None:
        xt = _tensor_to_numpy(x_test)
        groups["predictions"] = _dataset(_predictive_vars(draws.test, obs_name, obs_dims), {}, s)
        groups["predictions_constant_data"] = _dataset(_x_vars(xt, obs_name), {}, None)
        if draws.test.log_lik is not None:
            yt = _as_rows(_tensor_to_numpy(y_test), event)
            groups["predictions_observed_data"] = _dataset(
                {obs_name: ([row, *obs_dims], yt)}, {}, None
            )
            groups["predictions_log_likelihood"] = _dataset(
                {obs_name: ([row], draws.test.log_lik)}, {}, s
            )
    return groups


def build_prior_groups(
    draws: Draws,
    obs_name: str = "obs",
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Any] | None = None,
) -> dict[str, xr.Dataset]:
    """The ``prior`` and ``prior_predictive`` groups from prior :class:`Draws`
    (:func:`~pyro_dropout.diagnostics.sampling.draw_prior`), in the layout of ``posterior``
    and ``posterior_predictive``: the same variables, dims and coordinates."""
    dims, coords = dict(dims or {}), dict(coords or {})
    s = draws.log_joint.shape[0]
    event = draws.train.y_rep.shape[2:]
    obs_dims = [f"{obs_name}_dim_{k}" for k in range(len(event))]
    prior = {v: (_site_dims(v, a.shape[1:], dims), a) for v, a in draws.latents.items()}
    return {
        "prior": _dataset(prior, coords, s),
        "prior_predictive": _dataset(_predictive_vars(draws.train, obs_name, obs_dims), {}, s),
    }
