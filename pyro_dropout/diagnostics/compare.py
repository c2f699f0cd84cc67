"""One table comparing several variational fits: PSIS-LOO, held-out scores and the VI k-hat."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from . import _arviz_compat as compat
from . import _reader as rd
from . import metrics
from .export import to_inference_data
from .fidelity import fidelity_scores
from .samples import ensemble_inference_data
from .vi_diagnostic import vi_diagnostic

__all__ = ["compare", "held_out_scores", "loo"]


def loo(data: Any) -> compat.LooResult:
    """PSIS-LOO of one exported fit via ArviZ's ``az.loo`` (``reff = 1``, pointwise).

    Example:
        >>> loo(idata).elpd  # doctest: +SKIP
    """
    return compat.loo(data, var_name=rd.obs_name(data))


def _coverage_column(prob: float) -> str:
    return f"test_cov{round(100 * prob):d}"


def held_out_scores(
    data: Any, intervals: Sequence[float] = (0.5, 0.9, 0.95), n_bins: int = 10
) -> dict[str, float]:
    """Held-out scores of an exported fit with test targets (empty dict without them).

    * ``test_lpd``: mean over test points of :math:`\\log \\frac1S \\sum_s p(y_j\\mid\\theta_s)`
      (:func:`metrics.mean_lpd`, from ``predictions_log_likelihood``).
    * regression: ``test_rmse`` of the predictive mean, ``test_cov50`` ... central-interval
      coverage of the predictive draws (:func:`metrics.interval_coverage`).
    * classification: ``test_accuracy``, ``test_ece`` (:func:`metrics.expected_calibration_error`
      with ``n_bins`` bins) and ``test_brier`` (:func:`metrics.brier_score`) of the predictive
      class probabilities averaged over draws.

    Example:
        >>> held_out_scores(idata)["test_lpd"]  # doctest: +SKIP
    """
    obs = rd.obs_name(data)
    if not rd.has_var(data, "predictions_log_likelihood", obs):
        return {}
    out = {"test_lpd": metrics.mean_lpd(rd.draws(data, "predictions_log_likelihood", obs))}
    y = rd.values(data, "predictions_observed_data", obs)
    if rd.task(data) == "classification":
        if rd.has_var(data, "predictions", f"{obs}_probs"):
            probs = rd.draws(data, "predictions", f"{obs}_probs").mean(axis=0)
        else:  # frequencies of the sampled labels
            labels = rd.draws(data, "predictions", obs).astype(int)
            k = int(max(labels.max(), np.asarray(y).max())) + 1
            probs = np.eye(k)[labels].mean(axis=0)
        out["test_accuracy"] = metrics.accuracy(y, probs)
        out["test_ece"] = metrics.expected_calibration_error(y, probs, n_bins)
        out["test_brier"] = metrics.brier_score(y, probs)
    else:
        y_rep = rd.draws(data, "predictions", obs)
        if rd.has_var(data, "predictions", f"{obs}_mean"):
            mean = rd.draws(data, "predictions", f"{obs}_mean").mean(axis=0)
        else:
            mean = y_rep.mean(axis=0)
        out["test_rmse"] = metrics.rmse(y, mean)
        for p, cov in metrics.coverage_table(y, y_rep, intervals).items():
            out[_coverage_column(p)] = cov
    return out


def _is_samples(obj: Any) -> bool:
    """A ``pyro.infer.MCMC`` object or a dict of posterior draws."""
    return hasattr(obj, "get_samples") or isinstance(obj, Mapping)


def _is_pair(fit: Any) -> bool:
    return (
        isinstance(fit, tuple)
        and len(fit) == 2
        and callable(fit[0])
        and (callable(fit[1]) or _is_samples(fit[1]))
    )


def _is_ensemble(fit: Any) -> bool:
    return isinstance(fit, list) and len(fit) >= 2 and all(_is_pair(m) for m in fit)


def _as_fits(fits: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    if not isinstance(fits, Mapping) or len(fits) == 0:
        raise ValueError("fits must be a non-empty dict {name: ArviZ object or (model, guide)}")
    kinds = {}
    for name, fit in fits.items():
        if compat.is_arviz_object(fit):
            kinds[name] = "arviz"
        elif _is_pair(fit) or _is_ensemble(fit):
            kinds[name] = "pair"
        else:
            raise ValueError(
                f"fits[{name!r}] is a {type(fit).__name__}; expected an ArviZ object from "
                "to_inference_data, a (model, guide) tuple, a (model, MCMC or samples dict) "
                "tuple or a list of (model, guide) tuples (an ensemble)"
            )
    if len(set(kinds.values())) > 1:
        raise ValueError(
            "fits mixes ArviZ objects and (model, guide) pairs: "
            f"{kinds}; pass one kind (export the pairs with to_inference_data first)"
        )
    if next(iter(kinds.values())) == "arviz":
        return dict(fits)
    if kwargs["x"] is None or kwargs["y"] is None:
        raise ValueError("(model, guide) pairs need the training data: pass x= and y=")
    out = {}
    for name, fit in fits.items():
        if isinstance(fit, list):
            out[name] = ensemble_inference_data(fit, **kwargs)
        else:
            out[name] = to_inference_data(*fit, **kwargs)
    return out


def compare(
    fits: Mapping[str, Any],
    *,
    x: Any = None,
    y: Any = None,
    x_test: Any = None,
    y_test: Any = None,
    num_samples: int = 500,
    obs_name: str | None = None,
    parallel: bool | str = "auto",
    method: str = "stacking",
    intervals: Sequence[float] = (0.5, 0.9, 0.95),
    n_bins: int = 10,
    sort_by: str = "elpd_loo",
    reference: Any = None,
    reference_intervals: Sequence[float] = (0.5, 0.9),
) -> pd.DataFrame:
    """Compare variational fits in one table, one row per fit.

    ``fits`` maps names to either ArviZ objects (from :func:`to_inference_data`,
    :func:`~pyro_dropout.diagnostics.reference_posterior`,
    :func:`~pyro_dropout.diagnostics.samples_inference_data`,
    :func:`~pyro_dropout.diagnostics.ensemble_inference_data`) or to fits to export first
    with ``x, y, x_test, y_test, num_samples, obs_name, parallel`` (not both kinds at once):
    ``(model, guide)`` pairs (any Pyro guide: this library's, ``AutoNormal``,
    ``AutoLowRankMultivariateNormal``, ``AutoDelta`` (MAP), ``AutoLaplaceApproximation``),
    ``(model, mcmc)`` pairs (a ``pyro.infer.MCMC`` after ``run``, or a dict of its draws: all
    draws are used) and lists of ``(model, guide)`` pairs (an ensemble, e.g. a deep ensemble
    of MAP fits; ``num_samples`` draws split across the members).

    Columns:

    * ``rank, elpd_loo, se, p_loo, elpd_diff, dse, weight``: ArviZ's ``az.compare`` on
      PSIS-LOO (Vehtari, Gelman & Gabry 2017; weights by ``method``, default stacking, Yao et
      al. 2018b). ``loo_warning, loo_max_k, loo_n_high_k, loo_good_k``: ArviZ's Pareto-k
      warning per fit, the largest pointwise k-hat and how many exceed ``good_k``
      (``min(1 - 1/log10(S), 0.7)``).
    * ``vi_khat, vi_diagnosis``: Pareto k-hat of ``log p(theta, D) - log q(theta)`` over the
      guide draws (Yao et al. 2018, "Yes, but did it work?"): < 0.5 good, < 0.7 usable,
      >= 0.7 unreliable; ``inf`` for a point-mass guide.
    * with test targets: ``test_lpd`` (mean log predictive density per test point), and
      ``test_rmse, test_cov50, test_cov90, test_cov95`` (regression) or
      ``test_accuracy, test_ece, test_brier`` (classification); see :func:`held_out_scores`.
    * with ``reference`` (an export of a reference posterior on the same test inputs, e.g.
      :func:`~pyro_dropout.diagnostics.reference_posterior`): the fidelity scores of
      :func:`~pyro_dropout.diagnostics.fidelity.fidelity_scores`, ``ref_w1, ref_sd_ratio,
      ref_cov50, ref_cov90`` (regression; one coverage per ``reference_intervals``) or
      ``ref_agreement, ref_tv`` (classification). Izmailov et al. (2021); Wilson et al.
      (2022), the NeurIPS 2021 approximate-inference competition.
    * ``family, num_samples``: from the export's attributes.

    Fits without a density ``q`` (MCMC, ensembles) get ``vi_khat`` NaN and a
    ``vi_diagnosis`` that says why.

    Caveats: PSIS-LOO treats the guide draws as if they were posterior draws. For a point-mass
    guide (``AutoDelta``, MAP) every draw is the same, LOO collapses to the training
    log-likelihood (``p_loo`` = 0) and looks optimistic; ``vi_khat = inf`` flags it. There is
    one chain, so R-hat is undefined (NaN in ``az.summary``), which is not a pass.

    Args:
        sort_by: ``"elpd_loo"`` (ArviZ's rank) or ``"test_lpd"`` (best held-out density first).
        reference: an ArviZ export of the reference posterior, or None (no fidelity columns).
        reference_intervals: central intervals of the reference for ``ref_cov*``.

    Raises:
        ValueError: empty or mixed ``fits``, pairs without ``x``/``y``, unknown ``sort_by``.

    Example:
        >>> table = compare({"mc_dropout": idata_mcd, "bbb": idata_mf, "vd": idata_vd})
        ...  # doctest: +SKIP
        >>> table[["elpd_loo", "test_lpd", "vi_khat", "vi_diagnosis"]]  # doctest: +SKIP
    """
    if reference is not None and not compat.is_arviz_object(reference):
        raise ValueError(
            f"reference must be an ArviZ object (e.g. from reference_posterior); got "
            f"{type(reference).__name__}"
        )
    if sort_by not in ("elpd_loo", "test_lpd"):
        raise ValueError(f"sort_by must be 'elpd_loo' or 'test_lpd'; got {sort_by!r}")
    fits = _as_fits(
        fits,
        x=x,
        y=y,
        x_test=x_test,
        y_test=y_test,
        num_samples=num_samples,
        obs_name=obs_name,
        parallel=parallel,
    )
    loos = {name: loo(d) for name, d in fits.items()}
    table = compat.compare_loo(loos, method=method)

    rows = {}
    for name, d in fits.items():
        lr, vi = loos[name], vi_diagnostic(d)
        rows[name] = {
            "loo_warning": lr.warning,
            "loo_max_k": float(np.max(lr.pareto_k)),
            "loo_n_high_k": int(np.sum(lr.pareto_k > lr.good_k)),
            "loo_good_k": lr.good_k,
            "vi_khat": vi["khat"],
            "vi_diagnosis": vi["diagnosis"],
            **held_out_scores(d, intervals, n_bins),
            **(fidelity_scores(d, reference, reference_intervals) if reference is not None else {}),
            "family": rd.family(d),
            "num_samples": lr.n_samples,
        }
    extra = pd.DataFrame.from_dict(rows, orient="index")
    table = table.join(extra)
    test_cols = ["test_lpd", "test_rmse", *map(_coverage_column, intervals)]
    test_cols += ["test_accuracy", "test_ece", "test_brier"]
    test_cols += [
        "ref_w1",
        "ref_sd_ratio",
        *(f"ref_cov{round(100 * p):d}" for p in reference_intervals),
    ]
    test_cols += ["ref_agreement", "ref_tv"]
    head = [c for c in table.columns if c not in test_cols + ["family", "num_samples"]]
    table = table[head + [c for c in test_cols if c in table] + ["family", "num_samples"]]
    if sort_by == "test_lpd":
        if "test_lpd" not in table or table["test_lpd"].isna().all():
            raise ValueError("sort_by='test_lpd' needs fits exported with x_test and y_test")
        table = table.sort_values("test_lpd", ascending=False)
    table.attrs["arviz_version"] = compat.ARVIZ_VERSION
    table.attrs["method"] = method
    return table
