"""Calibration numbers of an exported fit: LOO-PIT and its distance from uniform, and how much
the data contracted the prior in function space.

* :func:`loo_pit`: the leave-one-out probability integral transform of every training target,
  :math:`u_i = \\Pr(\\tilde y_i \\le y_i \\mid y_{-i})`, with the PSIS-LOO weights of ArviZ
  (Gabry et al. 2019, "Visualization in Bayesian workflow", section 5; Vehtari, Gelman & Gabry
  2017). For discrete targets (class labels, counts) the randomised PIT
  :math:`u_i = \\Pr(\\tilde y_i < y_i) + v_i \\Pr(\\tilde y_i = y_i)`, :math:`v_i \\sim U(0, 1)`
  (Czado, Gneiting & Held 2009), which is uniform under a calibrated predictive too.
* :func:`ks_uniform`: the Kolmogorov-Smirnov distance :math:`\\sup_u |F_n(u) - u|` of values
  from the uniform distribution; :func:`loo_pit_ks` of the LOO-PIT values is ``compare``'s
  ``loo_pit_ks`` column.
* :func:`prior_contraction`: :math:`1 - \\mathrm{Var}_{post}(f(x_i)) /
  \\mathrm{Var}_{prior}(f(x_i))` averaged over the training inputs (Schad, Betancourt &
  Vasishth 2021 use it per parameter; weights are not identifiable in a network, functions
  are), from an export with the prior groups; ``compare``'s ``fn_contraction`` column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _arviz_compat as compat
from . import _reader as rd

__all__ = ["ks_uniform", "loo_pit", "loo_pit_ks", "prior_contraction"]


def ks_uniform(u: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance of the values ``u`` (in [0, 1]) from U(0, 1).

    Under uniformity and independence, ``sqrt(n) * D`` is about 1.36 or less 95 % of the time
    (``n`` values), so :math:`D > 1.36 / \\sqrt{n}` is a clear departure.

    Example:
        >>> ks_uniform(np.array([0.25, 0.75]))
        0.25
        >>> ks_uniform(np.array([0.0, 0.0]))
        1.0
    """
    u = np.sort(np.asarray(u, dtype=float).ravel())
    n = u.size
    if n == 0:
        return float("nan")
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - u), np.max(u - (i - 1) / n)))


def _is_discrete(data: Any, y_rep: np.ndarray, y: np.ndarray) -> bool:
    if rd.task(data) == "classification" or np.issubdtype(y_rep.dtype, np.integer):
        return True
    return bool(np.all(y_rep == np.round(y_rep)) and np.all(y == np.round(y)))


def loo_pit(data: Any, seed: int | None = 0) -> np.ndarray:
    """LOO-PIT values of the training targets of an export (flattened: one per target element).

    :math:`u_i = \\sum_s w_{is} 1[\\tilde y_{si} \\le y_i]` with :math:`w_{is}` the
    Pareto-smoothed, normalised importance weights :math:`\\propto 1 / p(y_i \\mid \\theta_s)`
    (:func:`~pyro_dropout.diagnostics._arviz_compat.psis_log_weights`, the same on both
    ArviZ lines) and :math:`\\tilde y_{si}` the posterior predictive draws. Discrete targets get
    the randomised PIT, with ``seed`` for the uniform draws.

    Example:
        >>> u = loo_pit(idata); ks_uniform(u)  # doctest: +SKIP
    """
    obs = rd.obs_name(data)
    log_lik = rd.draws(data, "log_likelihood", obs)
    log_lik = log_lik.reshape(log_lik.shape[0], -1)
    y_rep = rd.draws(data, "posterior_predictive", obs)
    y = rd.values(data, "observed_data", obs).reshape(y_rep.shape[1:])
    lw, _ = compat.psis_log_weights(log_lik)
    w = np.exp(lw).reshape(lw.shape + (1,) * (y_rep.ndim - 2))
    below = np.sum(w * (y_rep < y[None]), axis=0)
    if _is_discrete(data, y_rep, y):
        equal = np.sum(w * (y_rep == y[None]), axis=0)
        v = np.random.default_rng(seed).uniform(size=equal.shape)
        u = below + v * equal
    else:
        u = below + np.sum(w * (y_rep == y[None]), axis=0)
    return np.clip(u, 0.0, 1.0).ravel()


def loo_pit_ks(data: Any, seed: int | None = 0) -> float:
    """:func:`ks_uniform` of the :func:`loo_pit` values: 0 for a calibrated fit, larger when
    the LOO predictive is too narrow (U-shaped PIT), too wide (hump) or biased (skewed).

    Example:
        >>> loo_pit_ks(idata)  # doctest: +SKIP
    """
    return ks_uniform(loo_pit(data, seed))


def _function_draws(data: Any, group: str) -> np.ndarray | None:
    obs = rd.obs_name(data)
    for var in (f"{obs}_mean", f"{obs}_probs"):
        if rd.has_var(data, group, var):
            a = rd.draws(data, group, var)
            return a.reshape(a.shape[0], -1)
    return None


def prior_contraction(data: Any) -> float:
    """Mean over training inputs (and outputs or classes) of
    :math:`1 - \\mathrm{Var}_{q}(f(x_i)) / \\mathrm{Var}_{prior}(f(x_i))`, where :math:`f` is
    the per-draw predictive mean (regression) or class probabilities (classification).

    Near 1: the data determined the function (the posterior is much narrower than the prior);
    near 0: the fit is the prior; below 0: the fit is wider than the prior. NaN when the export
    has no ``prior_predictive`` group (export with ``prior=True``) or no per-draw function
    values.

    Example:
        >>> prior_contraction(to_inference_data(model, guide, x, y, prior=True))
        ...  # doctest: +SKIP
    """
    if not compat.has_group(data, "prior_predictive"):
        return float("nan")
    post, prior = (
        _function_draws(data, "posterior_predictive"),
        _function_draws(data, "prior_predictive"),
    )
    if post is None or prior is None or post.shape[1] != prior.shape[1]:
        return float("nan")
    var_prior = prior.var(axis=0)
    keep = var_prior > 0
    if not np.any(keep):
        return float("nan")
    return float(np.mean(1.0 - post.var(axis=0)[keep] / var_prior[keep]))
