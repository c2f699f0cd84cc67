"""How close is an approximate posterior to a reference posterior, in function space?

Scores of the NeurIPS 2021 approximate-inference competition (Wilson, Izmailov, Hoffman, Gal,
Li, Pradier, Vikram, Foong, Lotfi & Farquhar 2022, "Evaluating approximate inference in
Bayesian deep learning", PMLR 176, 113-124; scoring code ``metrics.py`` of the competition's
starter kit) and of Izmailov, Vikram, Hoffman & Wilson (2021), "What are Bayesian neural network
posteriors really like?", ICML, computed between the predictive distributions of a fit and of
a reference (e.g. HMC from :func:`~pyro_dropout.diagnostics.reference_posterior`) at the same
test inputs :math:`x_1, \\dots, x_M`.

Classification, from the Bayesian-model-average class probabilities
:math:`\\hat p(k \\mid x_j) = \\frac1S \\sum_s p(k \\mid x_j, \\theta_s)` of the fit and
:math:`p^{\\mathrm{ref}}` of the reference:

* **agreement** :math:`= \\frac1M \\sum_j \\mathbb 1[\\arg\\max_k \\hat p(k\\mid x_j) =
  \\arg\\max_k p^{\\mathrm{ref}}(k\\mid x_j)]` (1 = same top class everywhere);
* **total variation** :math:`= \\frac1M \\sum_j \\frac12 \\sum_k |\\hat p(k\\mid x_j) -
  p^{\\mathrm{ref}}(k\\mid x_j)|` (0 = identical predictive distributions).

Regression, from predictive draws :math:`\\tilde y_{sj}` (noise included) of both:

* **W1** :math:`= \\frac1M \\sum_j W_1(\\hat P_j, P^{\\mathrm{ref}}_j)`, the 1-D Wasserstein
  distance between the empirical predictive distributions at each test point, averaged (the
  competition's regression score; there ``scipy.stats.wasserstein_distance``), computed as
  :math:`W_1 = \\int |\\hat F_j(t) - F^{\\mathrm{ref}}_j(t)|\\,dt` over the pooled sorted
  draws, so the two fits may have different numbers of draws. In the units of ``y``.
* **sd ratio** :math:`= \\frac1M \\sum_j \\hat\\sigma_j / \\sigma^{\\mathrm{ref}}_j`, predictive
  standard deviations (1 = the same spread; < 1 over-confident). Not a competition score.
* **reference-interval coverage** ``ref_cov50``, ``ref_cov90``: the fraction of the fit's
  predictive draws that fall inside the reference's central :math:`100p\\,\\%` interval
  :math:`[q^{\\mathrm{ref}}_{(1-p)/2}, q^{\\mathrm{ref}}_{(1+p)/2}]`, averaged over test
  points. The reference itself scores :math:`p`; a fit that is too narrow scores more, one
  that is too wide or shifted scores less. The competition and Izmailov et al. define no
  such score; it is this library's, chosen because it reads like the coverage columns of
  :func:`~pyro_dropout.diagnostics.held_out_scores` with the reference in place of the data.

All scores are Monte Carlo estimates: even a fit drawn from the reference itself scores a
small positive W1 and TV that shrink as both have more draws.

**Noise floor.** :func:`reference_noise_floor` computes every score between two halves of the
reference's own chains (chains ``0 .. C/2 - 1`` against the rest; the first against the second
half of the draws when there is one chain). It is what the scores read when both sides are
the same posterior, up to Monte Carlo error and disagreement between chains: a difference
between two fits' ``ref_w1`` smaller than ``ref_w1_floor`` does not rank them.
:func:`~pyro_dropout.diagnostics.compare` adds it as ``<score>_floor`` columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _arviz_compat as compat
from . import _reader as rd

__all__ = [
    "FIDELITY_COLUMNS",
    "agreement",
    "fidelity_scores",
    "reference_interval_coverage",
    "reference_noise_floor",
    "sd_ratio",
    "total_variation",
    "wasserstein_1d",
]

#: Column names per task, in the order :func:`fidelity_scores` returns them (regression with
#: the default intervals).
FIDELITY_COLUMNS = {
    "regression": ["ref_w1", "ref_sd_ratio", "ref_cov50", "ref_cov90"],
    "classification": ["ref_agreement", "ref_tv"],
}


def _per_point(a: Any, name: str) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] < 1:
        raise ValueError(f"{name} must be draws x points, shape (S, M); got {a.shape}")
    return a


def _pair(fit: Any, ref: Any) -> tuple[np.ndarray, np.ndarray]:
    fit, ref = _per_point(fit, "fit draws"), _per_point(ref, "reference draws")
    if fit.shape[1] != ref.shape[1]:
        raise ValueError(
            f"the fit has {fit.shape[1]} test points and the reference {ref.shape[1]}; score "
            "both on the same test inputs"
        )
    return fit, ref


def wasserstein_1d(fit_draws: Any, ref_draws: Any) -> np.ndarray:
    """Per-point 1-D Wasserstein-1 distance between two sets of draws, shape ``(M,)``.

    ``fit_draws`` ``(S1, M)`` and ``ref_draws`` ``(S2, M)`` (a 1-D array is one point):
    :math:`W_1 = \\int |F(t) - G(t)|\\,dt` of the empirical CDFs, as
    ``scipy.stats.wasserstein_distance`` (checked against it in the tests).

    Example:
        >>> wasserstein_1d([[0.0], [1.0]], [[1.0], [2.0]])
        array([1.])
    """
    fit, ref = _pair(fit_draws, ref_draws)
    out = np.empty(fit.shape[1])
    for j in range(fit.shape[1]):
        u, v = np.sort(fit[:, j]), np.sort(ref[:, j])
        grid = np.sort(np.concatenate([u, v]))
        widths = np.diff(grid)
        cdf_u = np.searchsorted(u, grid[:-1], side="right") / u.size
        cdf_v = np.searchsorted(v, grid[:-1], side="right") / v.size
        out[j] = np.sum(np.abs(cdf_u - cdf_v) * widths)
    return out


def sd_ratio(fit_draws: Any, ref_draws: Any) -> np.ndarray:
    """Per-point ratio of predictive standard deviations fit / reference, shape ``(M,)``
    (``ddof = 1``; ``inf`` where the reference's spread is 0 and the fit's is not).

    Example:
        >>> sd_ratio([[0.0], [2.0]], [[0.0], [1.0]])
        array([2.])
    """
    fit, ref = _pair(fit_draws, ref_draws)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.std(fit, axis=0, ddof=1) / np.std(ref, axis=0, ddof=1)


def reference_interval_coverage(fit_draws: Any, ref_draws: Any, prob: float) -> np.ndarray:
    """Per point, the fraction of the fit's draws inside the reference's central ``prob``
    interval (its ``(1 - prob) / 2`` and ``(1 + prob) / 2`` quantiles, numpy's default
    linear interpolation), shape ``(M,)``.

    Example:
        >>> ref = np.arange(101.0)[:, None]                # quantiles 25 and 75
        >>> reference_interval_coverage([[0.0], [50.0], [60.0], [80.0]], ref, 0.5)
        array([0.5])
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must be in (0, 1); got {prob}")
    fit, ref = _pair(fit_draws, ref_draws)
    lo, hi = np.quantile(ref, [(1 - prob) / 2, (1 + prob) / 2], axis=0)
    return np.mean((fit >= lo) & (fit <= hi), axis=0)


def _probs(p: Any, name: str) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if p.ndim == 1:
        p = p[None]
    if p.ndim != 2:
        raise ValueError(f"{name} must be points x classes, shape (M, K); got {p.shape}")
    return p


def agreement(fit_probs: Any, ref_probs: Any) -> float:
    """Fraction of points whose most probable class is the same (competition's ``agreement``).

    ``fit_probs`` and ``ref_probs``: predictive class probabilities ``(M, K)`` (averaged over
    draws). Ties go to the lowest class index (``argmax``), as in the competition's code.

    Example:
        >>> agreement([[0.6, 0.4], [0.2, 0.8]], [[0.9, 0.1], [0.7, 0.3]])
        0.5
    """
    p, q = _probs(fit_probs, "fit_probs"), _probs(ref_probs, "ref_probs")
    if p.shape != q.shape:
        raise ValueError(f"probabilities differ in shape: {p.shape} vs {q.shape}")
    return float(np.mean(p.argmax(-1) == q.argmax(-1)))


def total_variation(fit_probs: Any, ref_probs: Any) -> float:
    """Mean total-variation distance :math:`\\frac12\\sum_k |p_k - q_k|` between predictive
    class probabilities (competition's ``total_variation_distance``).

    Example:
        >>> total_variation([[0.6, 0.4], [0.2, 0.8]], [[0.9, 0.1], [0.7, 0.3]])
        0.4
    """
    p, q = _probs(fit_probs, "fit_probs"), _probs(ref_probs, "ref_probs")
    if p.shape != q.shape:
        raise ValueError(f"probabilities differ in shape: {p.shape} vs {q.shape}")
    return float(np.mean(0.5 * np.abs(p - q).sum(-1)))


def _coverage_column(prob: float) -> str:
    return f"ref_cov{round(100 * prob):d}"


def _group_pair(fit: Any, reference: Any) -> tuple[str, str]:
    """The group both are scored on: ``predictions`` (test inputs) if both have it, else the
    training inputs (``posterior_predictive``); the inputs must be the same."""
    if compat.has_group(fit, "predictions") and compat.has_group(reference, "predictions"):
        group, data = "predictions", "predictions_constant_data"
    elif compat.has_group(fit, "predictions") or compat.has_group(reference, "predictions"):
        raise ValueError(
            "only one of the fit and the reference has test predictions: export both with the "
            "same x_test"
        )
    else:
        group, data = "posterior_predictive", "constant_data"
    if compat.has_group(fit, data) and compat.has_group(reference, data):
        xf, xr_ = rd.values(fit, data, "x"), rd.values(reference, data, "x")
        if xf.shape != xr_.shape or not np.allclose(xf, xr_, rtol=1e-5, atol=1e-8):
            raise ValueError(
                f"the fit and the reference were exported on different inputs ({data}.x): "
                "fidelity scores compare predictions at the same points"
            )
    return group, data


def _class_probs(data: Any, group: str, obs: str) -> np.ndarray:
    if rd.has_var(data, group, f"{obs}_probs"):
        return rd.draws(data, group, f"{obs}_probs").mean(axis=0)
    raise ValueError(
        f"{group} has no {obs}_probs: fidelity scores for classification need the per-draw "
        "class probabilities that to_inference_data records for a Categorical likelihood"
    )


def fidelity_scores(
    fit: Any, reference: Any, intervals: Sequence[float] = (0.5, 0.9)
) -> dict[str, float]:
    """Function-space fidelity of one exported fit to a reference export (module docs).

    Both are objects of :func:`~pyro_dropout.diagnostics.to_inference_data` (or
    :func:`~pyro_dropout.diagnostics.reference_posterior`, ...) on the same test inputs
    (``predictions`` group; the training inputs when neither has test predictions).

    Returns:
        regression: ``ref_w1`` (mean per-point W1 of the predictive draws), ``ref_sd_ratio``
        (mean per-point ratio of predictive sds), ``ref_cov50``, ``ref_cov90`` (one per
        ``intervals``: mean fraction of the fit's draws inside the reference's central
        interval); classification: ``ref_agreement``, ``ref_tv``.

    Raises:
        ValueError: different tasks, observed sites, inputs or output shapes.

    Example:
        >>> fidelity_scores(idata_mcd, ref)  # doctest: +SKIP
        {'ref_w1': 0.12, 'ref_sd_ratio': 0.8, 'ref_cov50': 0.6, 'ref_cov90': 0.95}
    """
    obs = rd.obs_name(fit)
    if rd.obs_name(reference) != obs:
        raise ValueError(
            f"the fit observes {obs!r} and the reference {rd.obs_name(reference)!r}: "
            "fidelity needs the same model"
        )
    task = rd.task(fit)
    if rd.task(reference) != task:
        raise ValueError(f"the fit is {task} and the reference {rd.task(reference)}")
    group, _ = _group_pair(fit, reference)
    if task == "classification":
        return _class_scores(_class_probs(fit, group, obs), _class_probs(reference, group, obs))
    return _regression_scores(rd.draws(fit, group, obs), rd.draws(reference, group, obs), intervals)


def _class_scores(p: np.ndarray, q: np.ndarray) -> dict[str, float]:
    return {"ref_agreement": agreement(p, q), "ref_tv": total_variation(p, q)}


def _regression_scores(
    yf: np.ndarray, yr: np.ndarray, intervals: Sequence[float]
) -> dict[str, float]:
    if yf.shape[1:] != yr.shape[1:]:
        raise ValueError(f"predictive draws differ in shape: {yf.shape[1:]} vs {yr.shape[1:]}")
    # one column per (point, output): every output of a multi-output model counts as a point
    yf, yr = yf.reshape(yf.shape[0], -1), yr.reshape(yr.shape[0], -1)
    out = {
        "ref_w1": float(np.mean(wasserstein_1d(yf, yr))),
        "ref_sd_ratio": float(np.mean(sd_ratio(yf, yr))),
    }
    for prob in intervals:
        out[_coverage_column(prob)] = float(np.mean(reference_interval_coverage(yf, yr, prob)))
    return out


def _halves(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """Split ``(chain, draw, ...)`` into two halves of chains (of draws for one chain), each
    with chain and draw merged."""
    n_chains, n_draws = values.shape[:2]
    if n_chains >= 2:
        half = n_chains // 2
        a, b = values[:half], values[half:]
        how = f"chains 0-{half - 1} against {half}-{n_chains - 1}"
    else:
        if n_draws < 4:
            raise ValueError(
                f"the reference has one chain of {n_draws} draws: the noise floor splits it "
                "in two halves and needs at least 4 draws"
            )
        half = n_draws // 2
        a, b = values[:, :half], values[:, half:]
        how = f"draws 0-{half - 1} against {half}-{n_draws - 1} of its one chain"
    return a.reshape((-1, *a.shape[2:])), b.reshape((-1, *b.shape[2:])), how


def reference_noise_floor(
    reference: Any, intervals: Sequence[float] = (0.5, 0.9), group: str | None = None
) -> dict[str, Any]:
    """The fidelity scores between two halves of the reference's own chains (module docs).

    Args:
        reference: an export with several chains (e.g. from
            :func:`~pyro_dropout.diagnostics.reference_posterior`).
        intervals: as for :func:`fidelity_scores`.
        group: ``"predictions"`` (the test inputs; default when present) or
            ``"posterior_predictive"``.

    Returns:
        ``{"<score>_floor": value, ..., "split": "chains 0-1 against 2-3"}``, one entry per
        score of :func:`fidelity_scores` for the reference's task.

    Example:
        >>> reference_noise_floor(ref)["ref_w1_floor"]  # doctest: +SKIP
        0.018
    """
    obs = rd.obs_name(reference)
    if group is None:
        group = (
            "predictions"
            if compat.has_group(reference, "predictions")
            else ("posterior_predictive")
        )
    ds = compat.get_group(reference, group)
    if rd.task(reference) == "classification":
        var = f"{obs}_probs"
        if var not in ds:
            _class_probs(reference, group, obs)  # raises, saying what is missing
        a, b, how = _halves(np.asarray(ds[var].transpose("chain", "draw", ...).values))
        scores = _class_scores(a.mean(axis=0), b.mean(axis=0))
    else:
        a, b, how = _halves(np.asarray(ds[obs].transpose("chain", "draw", ...).values))
        scores = _regression_scores(a, b, intervals)
    return {**{f"{k}_floor": v for k, v in scores.items()}, "split": how}
