"""Export a fitted (model, guide) pair to ArviZ: ``InferenceData`` on 0.23, ``DataTree`` on 1.x.

Layout of the object returned by :func:`to_inference_data` (``obs`` stands for ``obs_name``;
``S`` guide draws in one chain; ``N`` training rows, ``M`` test rows):

=============================  =============================================================
group                          variables (dims after ``chain, draw``)
=============================  =============================================================
``posterior``                  recorded sites; dims ``<site>_dim_0`` (1-D), ``<site>_out,
                               <site>_in`` (2-D, PyTorch ``(out, in)`` weight layout),
                               ``<site>_dim_k`` otherwise (override with ``dims``)
``posterior_predictive``       ``obs`` ``(obs_id, obs_dim_0...)``; ``obs_mean`` per-draw
                               E[y | theta, x] (regression) or ``obs_probs``
                               ``(obs_id, obs_class)`` (classification)
``log_likelihood``             ``obs`` ``(obs_id)``: log p(y_i | theta_s)
``sample_stats``               ``lp`` = log p(theta_s, D), ``lq`` = log q(theta_s)
``observed_data``              ``obs`` (no chain/draw)
``constant_data``              ``x`` ``(obs_id, x_dim_0...)``
``predictions``                as ``posterior_predictive``, on ``x_test`` (``M`` rows)
``predictions_constant_data``  ``x`` = ``x_test``
``predictions_observed_data``  ``obs`` = ``y_test``
``predictions_log_likelihood`` ``obs``: log p(y_test_j | theta_s), for held-out scores
``prior``                      (``prior=True``) draws of the recorded sites from the model's
                               prior, dims as ``posterior``
``prior_predictive``           (``prior=True``) as ``posterior_predictive``, each draw from
                               a prior draw: ``obs_mean`` / ``obs_probs`` are prior function
                               draws at ``x``
=============================  =============================================================

The last two groups are this package's extension of the ArviZ schema (held-out targets and
their pointwise log-likelihood), so that held-out scores can be computed from the object alone.
Root attributes (also copied onto ``posterior``) record ``guide_family``, ``guide_config``
(JSON string), ``guide_class``, ``obs_name``, ``task``, ``num_samples``,
``improper_prior_sites`` (JSON list of the latent sites with an improper prior: then
``sample_stats.lp`` is unnormalised and the VI k-hat is not reported) and library versions.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyro
import torch
from pyro.infer.autoguide import AutoLaplaceApproximation

from .._version import __version__
from ..handlers import weight_draws
from ..infer.data import as_model_input
from ..infer.draws.modes import module_mode as _module_mode
from ..infer.draws.run import one_warning_per_model
from . import _arviz_compat as compat
from .groups import build_groups, build_prior_groups, guide_info
from .samples import samples_inference_data
from .sampling import draw_posterior, draw_prior

__all__ = [
    "add_prior",
    "from_netcdf",
    "guide_info",
    "laplace_guide",
    "to_inference_data",
    "to_netcdf",
]

# guide_info is defined with build_groups (diagnostics.groups, which the MCMC and ensemble
# exports share) and is part of this module's API: its examples run with this module's doctests.
__test__ = {"guide_info": guide_info}


@one_warning_per_model()
def to_inference_data(
    model: Any,
    guide: Any,
    x: Any,
    y: Any,
    num_samples: int = 500,
    x_test: Any = None,
    y_test: Any = None,
    var_names: Sequence[str] | None = None,
    *,
    obs_name: str | None = None,
    parallel: bool | str = "auto",
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Any] | None = None,
    seed: int | None = None,
    prior: bool = False,
    module_mode: str = "eval",
) -> Any:
    """Draw ``num_samples`` weight draws from ``guide`` and export them to ArviZ.

    Each draw :math:`\\theta_s \\sim q` is one run of ``guide(x, y)``; ``model`` is replayed
    on it (:func:`pyro.poutine.replay` under :func:`pyro.poutine.trace`) on the training data
    and, if given, on ``x_test`` (and ``y_test``). The result is the installed ArviZ line's
    container (``InferenceData`` on 0.23.x, ``xarray.DataTree`` on 1.x) with one chain and the
    groups listed in :mod:`pyro_dropout.diagnostics.export`; it passes ``az.loo``,
    ``az.compare`` and ``az.summary`` and round-trips through :func:`to_netcdf` /
    :func:`from_netcdf`.

    ``sample_stats.lp`` (log p(theta, D) on the full training data) and ``sample_stats.lq``
    (log q(theta), the guide trace's log density) feed the Pareto k-hat diagnostic of
    Yao et al. (2018), see :func:`pyro_dropout.diagnostics.vi_diagnostic`.

    Args:
        model: any Pyro model ``model(x, y=None)`` observing ``y`` inside a data plate (a
            subsampled plate is visited in full: every row gets its log-likelihood).
        guide: any Pyro guide callable as ``guide(x, y)``; a fitted
            ``AutoLaplaceApproximation`` is replaced by its Gaussian (:func:`laplace_guide`,
            family still recorded as ``AutoLaplaceApproximation``). ``None`` with
            ``prior=True``: the prior check before any fit, an export with the groups
            ``prior``, ``prior_predictive``, ``observed_data`` and ``constant_data`` only. Also a
            ``pyro.infer.MCMC`` object after ``run`` or a dict of posterior draws: then every
            draw is exported, chains kept, ``num_samples`` only sets the number of prior
            draws (:func:`~pyro_dropout.diagnostics.samples_inference_data`).
        x: training inputs (torch tensor or numpy array; rows = observations).
        y: training targets, one row per row of ``x``.
        num_samples: number of guide draws ``S`` (>= 1; PSIS wants a few hundred).
        x_test: optional held-out inputs.
        y_test: optional held-out targets (may be omitted: predictions only).
        var_names: model sites for the ``posterior`` group (default: all latent sites;
            ``pyro.deterministic`` sites may be named too).
        obs_name: name of the observed site; by default the one sample site of the model that
            the guide does not draw.
        parallel: ``"auto"`` (default: draws vectorised in a ``pyro.plate`` where the model
            broadcasts over them, one draw per pass where it does not, e.g. CNNs with
            ``MaxPool2d``), ``True`` (vectorised, or an error), ``False`` (one per pass).
        dims: ``{site: [dim names]}`` overriding the default posterior dims.
        coords: ``{dim: values}`` coordinates for posterior dims (default ``0..n-1``).
        seed: if given, ``pyro.set_rng_seed(seed)`` first.
        prior: also draw ``num_samples`` times from the model's prior and add the ``prior``
            and ``prior_predictive`` groups (:func:`add_prior`): the prior predictive check
            of ArviZ (``az.plot_ppc(idata, group="prior")`` on 0.23,
            ``plot_ppc_dist(dt, group="prior_predictive")`` on 1.x) and
            :func:`~pyro_dropout.diagnostics.plot_prior_functions` read them.
        module_mode: ``"eval"`` (default): the ``torch.nn`` modules of the model and guide run
            in eval mode (``BatchNorm`` with its running statistics, ``nn.Dropout`` off);
            ``"train"``: in train mode. Their modes and buffers are restored afterwards, also
            after an error (:func:`~pyro_dropout.infer.draws.modes.module_mode`).

    Raises:
        ValueError: ``num_samples < 1``, row-count mismatch between ``x`` and ``y`` (or the test
            pair), unknown ``var_names``, missing observed site, wrong ``dims``.

    Example:
        >>> idata = to_inference_data(model, guide, x, y, num_samples=200,
        ...                           x_test=x_te, y_test=y_te)  # doctest: +SKIP
        >>> import arviz as az; az.loo(idata)  # doctest: +SKIP
    """
    with _module_mode(model, guide, mode=module_mode):
        if guide is None:
            if not prior:
                raise ValueError("guide=None exports the prior only: pass prior=True")
            return _prior_export(
                model, x, y, num_samples, obs_name, parallel, var_names, dims, coords, seed
            )
        if hasattr(guide, "get_samples") or isinstance(guide, Mapping):
            data = _samples_export(
                model,
                guide,
                x,
                y,
                x_test,
                y_test,
                var_names,
                dims,
                coords,
                obs_name,
                parallel,
                seed,
            )
            if prior:
                add_prior(data, model, x, y, num_samples, obs_name=obs_name, parallel=parallel)
            return data
        if seed is not None:
            pyro.set_rng_seed(seed)
        family, config = guide_info(guide)
        if isinstance(guide, AutoLaplaceApproximation):
            guide = laplace_guide(model, guide, x, y)
        draws = draw_posterior(
            model,
            guide,
            x,
            y,
            num_samples,
            x_test=x_test,
            y_test=y_test,
            var_names=var_names,
            obs_name=obs_name,
            parallel=parallel,
        )
        obs_name = draws.obs_name
        attrs = {
            "guide_family": family,
            "guide_config": json.dumps(config, sort_keys=True, default=str),
            "guide_class": f"{type(guide).__module__}.{type(guide).__qualname__}",
            "model_name": getattr(model, "__name__", type(model).__name__),
            "obs_name": obs_name,
            "task": draws.task,
            "improper_prior_sites": json.dumps(draws.improper_prior_sites),
            "num_samples": int(num_samples),
            "parallel": str(parallel),
            "created_at": _dt.datetime.now(_dt.UTC).isoformat(),
            "inference_library": "pyro",
            "inference_library_version": pyro.__version__,
            "pyro_dropout_version": __version__,
            "arviz_version": compat.ARVIZ_VERSION,
        }
        groups = build_groups(draws, x, y, x_test, y_test, obs_name, dims, coords, attrs)
        data = compat.build(groups, attrs)
        if prior:
            add_prior(
                data,
                model,
                x,
                y,
                num_samples,
                obs_name=obs_name,
                parallel=parallel,
                var_names=var_names,
                dims=dims,
                coords=coords,
            )
        return data


def _prior_export(model, x, y, num_samples, obs_name, parallel, var_names, dims, coords, seed):
    """The prior alone: prior, prior_predictive, observed_data and constant_data."""
    if seed is not None:
        pyro.set_rng_seed(seed)
    draws = draw_prior(
        model, x, y, num_samples, obs_name=obs_name, parallel=parallel, var_names=var_names
    )
    obs = draws.obs_name
    attrs = {
        "guide_family": "prior",
        "guide_config": "{}",
        "model_name": getattr(model, "__name__", type(model).__name__),
        "obs_name": obs,
        "task": draws.task,
        "num_samples": int(num_samples),
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(),
        "inference_library": "pyro",
        "inference_library_version": pyro.__version__,
        "pyro_dropout_version": __version__,
        "arviz_version": compat.ARVIZ_VERSION,
    }
    groups = build_groups(draws, x, y, None, None, obs, dims, coords, attrs)
    keep = {k: groups[k] for k in ("observed_data", "constant_data")}
    keep.update(build_prior_groups(draws, obs, dims, coords))
    keep["prior"].attrs.update(attrs)
    return compat.build(keep, attrs)


@one_warning_per_model()
def add_prior(
    data: Any,
    model: Any,
    x: Any,
    y: Any,
    num_samples: int = 500,
    *,
    obs_name: str | None = None,
    parallel: bool | str = "auto",
    var_names: Sequence[str] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> Any:
    """Add the ``prior`` and ``prior_predictive`` groups of ``model`` on ``x`` to ``data``.

    Each of the ``num_samples`` draws runs the model as written without the guide (its
    observed sites hidden: :func:`~pyro_dropout.diagnostics.sampling.prior_guide`), so every
    latent site is drawn from the prior the model gives it (this library's weight priors, any
    ``pyro.sample`` site of the user's), and the model replayed on the draw gives the prior
    predictive on ``x``: ``obs`` a simulated data set, ``obs_mean`` (regression) or
    ``obs_probs`` (classification) the function the prior draw computes. Works on any export
    (a guide's, MCMC draws, an ensemble) and on both ArviZ lines; returns ``data``, changed in
    place.

    Raises:
        ValueError: a latent site has an improper prior (nothing to draw from).

    Example:
        >>> add_prior(idata, model, x, y, num_samples=200)  # doctest: +SKIP
        >>> import arviz as az; az.plot_ppc(idata, group="prior")  # 0.23  # doctest: +SKIP
    """
    with _module_mode(model):  # eval, or the mode of an enclosing export
        if seed is not None:
            pyro.set_rng_seed(seed)
        draws = draw_prior(
            model, x, y, num_samples, obs_name=obs_name, parallel=parallel, var_names=var_names
        )
        groups = build_prior_groups(draws, draws.obs_name, dims, coords)
        return compat.add_groups(data, groups)


def laplace_guide(model: Any, guide: Any, x: Any, y: Any) -> Any:
    """The Gaussian of a fitted ``AutoLaplaceApproximation``: Pyro's
    ``guide.laplace_approximation(x, y)`` (an ``AutoMultivariateNormal`` centred at the MAP
    with covariance the inverse Hessian of ``-log p(theta, D)`` there), computed with weight
    draws on the training data ``x, y``.

    A fitted ``AutoLaplaceApproximation`` itself draws only its MAP point; export and compare
    call this so that a Laplace fit is scored as the Gaussian it stands for.

    Raises:
        ValueError: the Hessian is not positive definite (no local MAP reached).
    """
    xm, ym = as_model_input(x, model, "x"), as_model_input(y, model, "y")
    try:
        with weight_draws():
            return guide.laplace_approximation(xm, ym)
    except torch.linalg.LinAlgError as e:
        raise ValueError(
            "AutoLaplaceApproximation: the Hessian of -log p(theta, D) at the fitted point is "
            "not positive definite, so there is no Gaussian to draw from: the fit has not "
            "reached a local maximum of the posterior (fit longer, or with a smaller "
            f"learning rate), or the posterior is flat in some direction ({e})"
        ) from e


def _samples_export(model, samples, x, y, x_test, y_test, var_names, dims, coords, obs, par, seed):
    unsupported = {"var_names": var_names, "dims": dims, "coords": coords}
    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} cannot be set for MCMC draws (every sampled site is recorded "
            "with the default dims); leave them out"
        )
    kernel = getattr(samples, "kernel", None)
    family = type(kernel).__name__ if kernel is not None else "MCMC"
    return samples_inference_data(
        model, samples, x, y, x_test, y_test, obs_name=obs, parallel=par, family=family, seed=seed
    )


def to_netcdf(data: Any, path: Any) -> Any:
    """Save an object from :func:`to_inference_data` to netCDF (h5netcdf engine); returns ``path``.

    Example:
        >>> to_netcdf(idata, "fit.nc")  # doctest: +SKIP
    """
    return compat.to_netcdf(data, path)


def from_netcdf(path: Any) -> Any:
    """Load a file written by :func:`to_netcdf` into memory (the file is closed afterwards).

    Example:
        >>> idata = from_netcdf("fit.nc")  # doctest: +SKIP
    """
    return compat.from_netcdf(path)
