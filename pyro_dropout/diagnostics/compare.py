"""One table comparing several variational fits: PSIS-LOO, held-out scores and the VI k-hat."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..infer.draws.modes import module_mode as _module_mode
from ..infer.draws.run import one_warning_per_model
from . import _arviz_compat as compat
from . import _reader as rd
from . import metrics
from .calibration import loo_pit_ks, prior_contraction
from .export import add_prior, to_inference_data
from .fidelity import fidelity_scores, reference_noise_floor
from .reliability import CompareTable, as_compare_table, loo_flags, n_params, vi_flags
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


def _fit_objects(fits: Any) -> list:
    """The models and guides of ``(model, guide)`` pairs and ensembles (for their modules)."""
    if not isinstance(fits, Mapping):
        return []
    out: list[Any] = []
    for fit in fits.values():
        for pair in fit if isinstance(fit, list) else [fit]:
            if isinstance(pair, tuple):
                out.extend(pair)
    return out


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
        if kwargs.get("prior"):
            raise ValueError(
                "prior=True draws the prior of (model, guide) pairs; these fits are already "
                "exported: export them with to_inference_data(..., prior=True) (their prior "
                "groups are then used)"
            )
        return dict(fits)
    if kwargs["x"] is None or kwargs["y"] is None:
        raise ValueError("(model, guide) pairs need the training data: pass x= and y=")
    return {name: (lambda fit=fit: _export(fit, **kwargs)) for name, fit in fits.items()}


def _export(fit: Any, **kwargs: Any) -> Any:
    if isinstance(fit, list):
        prior = kwargs.pop("prior", False)
        data = ensemble_inference_data(fit, **kwargs)
        if prior:
            add_prior(
                data,
                fit[0][0],
                kwargs["x"],
                kwargs["y"],
                kwargs["num_samples"],
                obs_name=kwargs["obs_name"],
                parallel=kwargs["parallel"],
            )
        return data
    return to_inference_data(*fit, **kwargs)


def _reference_info(reference: Any, intervals: Sequence[float]) -> tuple[dict, str, bool]:
    """The reference's R-hat / ESS and noise-floor columns, its one-line note, and whether its
    R-hat is above its threshold."""
    from .reference import RHAT_THRESHOLD

    attrs = rd.attrs(reference)
    cols = {
        "ref_rhat": float(attrs.get("fn_rhat_max", np.nan)),
        "ref_ess_bulk": float(attrs.get("fn_ess_bulk_min", np.nan)),
        "ref_ess_tail": float(attrs.get("fn_ess_tail_min", np.nan)),
    }
    floor = reference_noise_floor(reference, intervals)
    split = floor.pop("split")
    cols.update(floor)
    what = attrs.get("fn_convergence_variable", "the predictions")
    rhat = cols["ref_rhat"]
    if np.isnan(rhat):
        conv = f"R-hat not available ({what})"
    else:
        conv = (
            f"function-space R-hat max {rhat:.3f} (threshold {RHAT_THRESHOLD}), "
            f"bulk ESS min {cols['ref_ess_bulk']:.0f}, tail ESS min {cols['ref_ess_tail']:.0f}"
        )
    floors = ", ".join(f"{k.removesuffix('_floor')} {v:.3g}" for k, v in floor.items())
    note = (
        f"{rd.family(reference)} reference: {conv}. Noise floor ({split}): {floors}; "
        "ref_* differences smaller than the floor (columns *_floor) do not rank fits."
    )
    return cols, note, bool(rhat > RHAT_THRESHOLD)


@one_warning_per_model()
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
    on_error: str = "row",
    prior: bool = False,
) -> CompareTable:
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

    The ``torch.nn`` modules of the pairs' models and guides run in eval mode while they are
    exported; their modes and buffers are restored afterwards
    (:func:`~pyro_dropout.infer.draws.modes.module_mode`).

    Columns:

    * ``rank, elpd_loo, se, p_loo, elpd_diff, dse, weight``: ArviZ's ``az.compare`` on
      PSIS-LOO (Vehtari, Gelman & Gabry 2017; weights by ``method``, default stacking, Yao et
      al. 2018b). ``loo_warning, loo_max_k, loo_n_high_k, loo_good_k``: ArviZ's Pareto-k
      warning per fit, the largest pointwise k-hat and how many exceed ``good_k``
      (``min(1 - 1/log10(S), 0.7)``).
    * ``vi_khat, vi_diagnosis``: Pareto k-hat of ``log p(theta, D) - log q(theta)`` over the
      guide draws (Yao et al. 2018, "Yes, but did it work?"): < 0.5 good, < 0.7 usable,
      >= 0.7 unreliable; ``inf`` for a point-mass guide.
    * ``loo_pit_ks``: calibration of the leave-one-out predictive on the training data, the
      Kolmogorov-Smirnov distance of the LOO-PIT values from uniform
      (:func:`~pyro_dropout.diagnostics.calibration.loo_pit_ks`; randomised PIT for discrete
      targets): 0 when calibrated; with ``N`` points, above about ``1.36 / sqrt(N)`` the
      predictive is clearly too narrow, too wide or biased (``az.plot_loo_pit`` shows which).
      The PSIS weights are as reliable as ``loo_max_k`` says.
    * ``fn_contraction`` (exports with the prior groups: ``prior=True``): how much the data
      narrowed the prior in function space,
      :func:`~pyro_dropout.diagnostics.calibration.prior_contraction` (1: the data decided
      the function; 0: the fit is the prior; < 0: wider than the prior).
    * with test targets: ``test_lpd`` (mean log predictive density per test point), and
      ``test_rmse, test_cov50, test_cov90, test_cov95`` (regression) or
      ``test_accuracy, test_ece, test_brier`` (classification); see :func:`held_out_scores`.
    * with ``reference`` (an export of a reference posterior on the same test inputs, e.g.
      :func:`~pyro_dropout.diagnostics.reference_posterior`): the fidelity scores of
      :func:`~pyro_dropout.diagnostics.fidelity.fidelity_scores`, ``ref_w1, ref_sd_ratio,
      ref_cov50, ref_cov90`` (regression; one coverage per ``reference_intervals``) or
      ``ref_agreement, ref_tv`` (classification). Izmailov et al. (2021); Wilson et al.
      (2022), the NeurIPS 2021 approximate-inference competition.
      With ``reference``, also ``ref_rhat, ref_ess_bulk, ref_ess_tail`` (the reference's
      largest function-space R-hat and smallest ESS, the same in every row) and the noise
      floor of each score, ``ref_w1_floor, ...``: the same score between two halves of the
      reference's own chains (:func:`~pyro_dropout.diagnostics.fidelity.reference_noise_floor`);
      differences between fits smaller than it do not rank them.
    * ``flags``: what makes this row's numbers unreliable, short (empty when nothing does):
      ``k>0.70 at 76 of 200 (38%)`` (count and share of points whose PSIS-LOO k-hat exceeds ``good_k``),
      ``k=inf at 60/398``, ``p_loo>N=...`` / ``p_loo>p=...`` (``p_loo`` above the number of
      points or of parameters: loo package glossary), ``VI k=21.3 beyond range`` (VI k-hat
      >= 0.7), ``failed``, ``ref R-hat ...``. See :mod:`pyro_dropout.diagnostics.reliability`.
    * ``family, num_samples``: from the export's attributes; ``error`` (only when a fit
      failed): why.

    The table is a :class:`~pyro_dropout.diagnostics.reliability.CompareTable`, a
    ``DataFrame`` whose printed and HTML forms mark the flagged numbers with ``!`` and add one
    line per kind of flag saying what it means and what to use instead (held-out scores, the
    reference), and a line on the reference; ``table.attrs["reliability"]`` holds the flags.

    **A fit that fails** (e.g. ``AutoLaplaceApproximation`` whose Hessian is not positive
    definite, a fit with too few draws for PSIS) gets a row of NaN with the reason in
    ``error`` and a ``UserWarning`` (``on_error="raise"`` raises instead); when every fit
    fails, the first error is raised.

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
        on_error: ``"row"`` (a failing fit gets a row with the reason, and a warning) or
            ``"raise"``.
        prior: with ``(model, guide)`` pairs, also export the model's prior and prior
            predictive (``to_inference_data(..., prior=True)``), which gives the
            ``fn_contraction`` column.

    Raises:
        ValueError: empty or mixed ``fits``, pairs without ``x``/``y``, unknown ``sort_by``
            or ``on_error``; the first fit's error when every fit fails.

    Example:
        >>> table = compare({"mc_dropout": idata_mcd, "bbb": idata_mf, "vd": idata_vd})
        ...  # doctest: +SKIP
        >>> table[["elpd_loo", "test_lpd", "vi_khat", "vi_diagnosis"]]  # doctest: +SKIP
    """
    with _module_mode(*_fit_objects(fits), mode="eval"):
        if reference is not None and not compat.is_arviz_object(reference):
            raise ValueError(
                f"reference must be an ArviZ object (e.g. from reference_posterior); got "
                f"{type(reference).__name__}"
            )
        if sort_by not in ("elpd_loo", "test_lpd"):
            raise ValueError(f"sort_by must be 'elpd_loo' or 'test_lpd'; got {sort_by!r}")
        if on_error not in ("row", "raise"):
            raise ValueError(f"on_error must be 'row' or 'raise'; got {on_error!r}")
        fits = _as_fits(
            fits,
            x=x,
            y=y,
            x_test=x_test,
            y_test=y_test,
            num_samples=num_samples,
            obs_name=obs_name,
            parallel=parallel,
            prior=prior,
        )
        ref_cols: dict[str, Any] = {}
        ref_note, ref_unconverged = None, False
        if reference is not None:
            ref_cols, ref_note, ref_unconverged = _reference_info(reference, reference_intervals)

        loos, rows, flags, errors, first_error = {}, {}, {}, {}, None
        for name, fit in fits.items():
            try:
                d = fit() if callable(fit) and not compat.is_arviz_object(fit) else fit
                lr, vi = loo(d), vi_diagnostic(d)
                row = {
                    "loo_warning": lr.warning,
                    "loo_max_k": float(np.max(lr.pareto_k)),
                    "loo_n_high_k": int(np.sum(lr.pareto_k > lr.good_k)),
                    "loo_good_k": lr.good_k,
                    "vi_khat": vi["khat"],
                    "vi_diagnosis": vi["diagnosis"],
                    **held_out_scores(d, intervals, n_bins),
                    "loo_pit_ks": loo_pit_ks(d),
                    **(
                        {"fn_contraction": prior_contraction(d)}
                        if compat.has_group(d, "prior_predictive")
                        else {}
                    ),
                    **(
                        fidelity_scores(d, reference, reference_intervals)
                        if reference is not None
                        else {}
                    ),
                    **ref_cols,
                    "family": rd.family(d),
                    "num_samples": lr.n_samples,
                }
            except Exception as e:  # noqa: BLE001 - reported in the row, or re-raised below
                if on_error == "raise":
                    raise
                first_error = first_error or e
                errors[name] = f"{type(e).__name__}: {e}"  # in full in the warning below
                flags[name] = [("failed", "failed")]
                continue
            loos[name], rows[name] = lr, row
            flags[name] = [
                *loo_flags(lr.pareto_k, lr.good_k, lr.p, n_params(d)),
                *vi_flags(vi["khat"], vi["point_mass"]),
                *(
                    [("ref_rhat", f"ref R-hat {ref_cols['ref_rhat']:.3f}")]
                    if ref_unconverged
                    else []
                ),
            ]
        if not loos:  # every fit failed: nothing to compare, the first error is the answer
            assert first_error is not None  # a fit either added a row or recorded its error
            raise first_error
        for name, reason in errors.items():
            warnings.warn(
                f"compare: fit {name!r} failed and gets an empty row (column 'error'): {reason}",
                UserWarning,
                stacklevel=2,
            )
        table = compat.compare_loo(loos, method=method)
        extra = pd.DataFrame.from_dict(rows, orient="index")
        table = table.join(extra)
        table["flags"] = ["; ".join(short for _, short in flags[name]) for name in table.index]
        if errors:
            failed = pd.DataFrame(index=list(errors))
            failed["flags"] = "failed"
            # the message's first line (Pyro appends the trace's shapes to errors in a model)
            failed["error"] = pd.Series({k: v.splitlines()[0] for k, v in errors.items()})
            table = pd.concat([table, failed])
            table["rank"] = table["rank"].astype("Int64")
            table["error"] = table["error"].fillna("")
        test_cols = ["test_lpd", "test_rmse", *map(_coverage_column, intervals)]
        test_cols += ["loo_pit_ks", "fn_contraction"]
        test_cols += ["test_accuracy", "test_ece", "test_brier"]
        ref_scores = [
            "ref_w1",
            "ref_sd_ratio",
            *(f"ref_cov{round(100 * p):d}" for p in reference_intervals),
        ]
        ref_scores += ["ref_agreement", "ref_tv"]
        test_cols += ref_scores + [f"{c}_floor" for c in ref_scores]
        test_cols += ["ref_rhat", "ref_ess_bulk", "ref_ess_tail"]
        tail = ["family", "num_samples", "error"]
        head = [c for c in table.columns if c not in test_cols + tail]
        table = table[head + [c for c in test_cols if c in table] + [c for c in tail if c in table]]
        if sort_by == "test_lpd":
            if "test_lpd" not in table or table["test_lpd"].isna().all():
                raise ValueError("sort_by='test_lpd' needs fits exported with x_test and y_test")
            table = table.sort_values("test_lpd", ascending=False)
        attrs = {
            "arviz_version": compat.ARVIZ_VERSION,
            "method": method,
            "reliability": {name: fl for name, fl in flags.items() if fl},
            "errors": {k: v.splitlines()[0] for k, v in errors.items()},
        }
        if ref_note:
            attrs["reference_note"] = ref_note
        return as_compare_table(table, attrs)
