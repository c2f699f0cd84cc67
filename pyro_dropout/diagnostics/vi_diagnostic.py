"""Did the variational approximation work? Pareto k-hat of the importance ratios (Yao et al. 2018).

For draws :math:`\\theta_s \\sim q` the importance ratios towards the posterior are

.. math:: \\log r_s = \\log p(\\theta_s, D) - \\log q(\\theta_s)

(the normalising constant :math:`p(D)` does not matter). PSIS (Vehtari et al. 2024, "Pareto
smoothed importance sampling", JMLR 25(72)) fits a generalised Pareto distribution to the
largest ratios; its shape :math:`\\hat k` estimates how heavy the tail of :math:`r` is, i.e. how
badly :math:`q` under-covers the posterior. Yao, Vehtari, Simpson & Gelman (2018), "Yes, but Did
It Work?: Evaluating Variational Inference", ICML, read it as:

* :math:`\\hat k < 0.5`: the approximation is close to the posterior; importance-sampling
  corrections are reliable.
* :math:`0.5 \\le \\hat k < 0.7`: usable, but the approximation is rough; PSIS can still correct
  posterior expectations.
* :math:`\\hat k \\ge 0.7`: the guide is far from the posterior (typically too narrow); its
  expectations, and PSIS corrections of them, are unreliable.

PSIS itself is ArviZ's (``az.psislw`` / ``arviz_stats``), called through the compat module.

A guide whose draws are all identical (a point mass, e.g. ``AutoDelta`` or MAP) has no density
with respect to the posterior: the ratios are undefined and this module reports
:math:`\\hat k = +\\infty`. This matters because PSIS-LOO on such a fit silently collapses to the
training log-likelihood (every draw is the same), so ``elpd_loo`` looks optimistic while
nothing flags it except this k-hat.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np

from . import _arviz_compat as compat
from . import _reader

__all__ = [
    "FLAT_RTOL",
    "KHAT_GOOD",
    "KHAT_OK",
    "MIN_DRAWS",
    "interpret_vi_khat",
    "vi_diagnostic",
    "vi_khat",
]

#: Below this k-hat the approximation is good (Yao et al. 2018).
KHAT_GOOD = 0.5
#: Below this k-hat the approximation is usable; at or above it, unreliable.
KHAT_OK = 0.7
#: Fewest draws for which the PSIS tail fit is attempted (shorter tails fail in ArviZ 1.x).
MIN_DRAWS = 30
#: Log-ratios spanning at most this fraction of the log densities' magnitude count as constant
#: (float32 rounding of a sum of N terms stays well below it).
FLAT_RTOL = 1e-6


def vi_khat(log_p: np.ndarray, log_q: np.ndarray) -> float:
    """Pareto k-hat of the importance ratios ``log_p - log_q`` (one value per guide draw).

    Returns NaN with fewer than :data:`MIN_DRAWS` draws or when every ratio is ``-inf``;
    ``+inf`` when some ratio is NaN or ``+inf`` (the guide puts mass where the model has none, or
    has no density); ``-inf`` when all ratios are equal to working precision (their range is at
    most :data:`FLAT_RTOL` times the largest ``|log p|`` or ``|log q|``): ``q`` is proportional
    to the posterior and the importance weights are uniform, as for an exact guide, whose
    ratios differ only by rounding noise on which a tail fit is meaningless (ArviZ 1.x returns
    NaN there). A point mass also gives equal ratios; :func:`vi_diagnostic` separates the two
    by looking at the draws.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> th = rng.normal(size=2000)                      # q = N(0, 1)
        >>> log_p = -0.5 * th**2 / 4                        # p = N(0, 2^2), unnormalised
        >>> 0.6 < vi_khat(log_p, -0.5 * th**2) < 0.9        # theory: 1 - 1/4 = 0.75
        True
    """
    log_p = np.asarray(log_p, dtype=float).ravel()
    log_q = np.asarray(log_q, dtype=float).ravel()
    if log_p.shape != log_q.shape:
        raise ValueError(f"log_p and log_q differ in shape: {log_p.shape} vs {log_q.shape}")
    r = log_p - log_q
    if r.size < MIN_DRAWS:
        return float("nan")
    if np.any(np.isnan(r)) or np.any(r == np.inf):
        return float("inf")
    finite = r[np.isfinite(r)]
    if finite.size == 0:
        return float("nan")
    scale = max(1.0, float(np.max(np.abs(log_p))), float(np.max(np.abs(log_q))))
    if finite.size == r.size and np.ptp(finite) <= FLAT_RTOL * scale:
        return float("-inf")
    return compat.psis_khat(r)


def interpret_vi_khat(khat: float, point_mass: bool = False) -> str:
    """One-line reading of a VI k-hat (thresholds of Yao et al. 2018).

    Example:
        >>> interpret_vi_khat(0.3)
        'good (k < 0.5): q is close to the posterior'
    """
    if point_mass:
        return "point mass (k = inf): no density, VI diagnostic and PSIS-LOO not meaningful"
    if np.isnan(khat):
        return f"undefined (need >= {MIN_DRAWS} draws with finite log ratios)"
    if khat < KHAT_GOOD:
        return "good (k < 0.5): q is close to the posterior"
    if khat < KHAT_OK:
        return "usable (0.5 <= k < 0.7): rough approximation, PSIS can correct"
    return "unreliable (k >= 0.7): q is far from the posterior"


def _is_point_mass(posterior: Any) -> bool:
    values = [np.asarray(posterior[v].values) for v in posterior.data_vars]
    if not values or values[0].shape[0] * values[0].shape[1] < 2:
        return False
    return all(
        np.all(v.reshape(-1, *v.shape[2:]) == v.reshape(-1, *v.shape[2:])[:1]) for v in values
    )


def _improper_sites(data: Any) -> list[str]:
    raw = _reader.attrs(data).get("improper_prior_sites", "[]")
    try:
        return list(json.loads(raw))
    except (TypeError, ValueError):
        return []


def vi_diagnostic(data: Any) -> dict[str, Any]:
    """VI k-hat of a fit exported by :func:`pyro_dropout.diagnostics.to_inference_data`.

    Reads ``sample_stats.lp`` (log p(theta, D)) and ``sample_stats.lq`` (log q(theta)) and the
    posterior draws (to detect a point-mass guide).

    **No density q.** Exports of MCMC draws and of ensembles
    (:mod:`pyro_dropout.diagnostics.samples`) carry the attribute ``q_density = "none: ..."``;
    the k-hat is then NaN and the diagnosis gives that reason.

    **Improper priors.** When the export records latent sites with an improper prior (e.g.
    :class:`~pyro_dropout.ImproperLogUniform`, attribute ``improper_prior_sites``), ``lp``
    uses an unnormalised log density that is not integrable: ``p(theta, D) / q(theta)`` is
    then not an importance ratio towards any posterior and its tail index says nothing about
    q. The k-hat is reported as NaN, with a ``UserWarning`` that names the sites; refit with a
    proper prior (e.g. ``Normal``) to diagnose the approximation.

    Returns:
        ``{"khat": float, "diagnosis": str, "point_mass": bool, "num_draws": int}``.

    Example:
        >>> vi_diagnostic(idata)["khat"]  # doctest: +SKIP
        0.31
    """
    stats = compat.get_group(data, "sample_stats")
    for var in ("lp", "lq"):
        if var not in stats:
            raise ValueError(
                f"sample_stats has no {var!r}; export the fit with to_inference_data first"
            )
    log_p = np.asarray(stats["lp"].values).ravel()
    log_q = np.asarray(stats["lq"].values).ravel()
    no_q = str(_reader.attrs(data).get("q_density", ""))
    if no_q.startswith("none"):
        # MCMC draws, ensembles: no q(theta) to form p/q with (samples_inference_data)
        return {
            "khat": float("nan"),
            "diagnosis": f"undefined: {no_q.removeprefix('none: ')}",
            "point_mass": False,
            "num_draws": int(log_p.size),
        }
    # identical recorded draws and a constant log q: a point mass (AutoDelta, MAP), not merely
    # a selection of var_names that happens to be constant
    point_mass = (
        log_q.size > 1
        and np.ptp(log_q) == 0
        and compat.has_group(data, "posterior")
        and _is_point_mass(compat.get_group(data, "posterior"))
    )
    improper = _improper_sites(data)
    if improper:
        warnings.warn(
            f"VI k-hat not computed: the prior of {', '.join(improper)} is improper, so "
            "log p(theta, D) is unnormalised and p/q is not an importance ratio; refit with a "
            "proper prior (e.g. Normal) to diagnose the approximation.",
            UserWarning,
            stacklevel=2,
        )
        return {
            "khat": float("nan"),
            "diagnosis": f"undefined: improper prior on {', '.join(improper)}",
            "point_mass": bool(point_mass),
            "num_draws": int(log_p.size),
        }
    khat = float("inf") if point_mass else vi_khat(log_p, log_q)
    return {
        "khat": khat,
        "diagnosis": interpret_vi_khat(khat, point_mass),
        "point_mass": bool(point_mass),
        "num_draws": int(log_p.size),
    }
