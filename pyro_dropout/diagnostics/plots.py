"""Figures for exported fits. Every function returns the matplotlib Figure; ``path`` saves it.

* :func:`plot_predictive_bands`: predictive mean +/- 2 sd over a 1-D input, one panel per fit,
  training points shown (the style of the Mauna Loa figure of Gal & Ghahramani 2016).
* :func:`plot_calibration`: PIT histogram (regression) or reliability diagram
  (classification) per fit. Drawn with matplotlib on both ArviZ lines: ArviZ's PIT plots
  compare ``posterior_predictive`` with ``observed_data`` only (not held-out predictions) and
  it has no multi-class reliability diagram.
* :func:`plot_compare`: ArviZ's model-comparison plot of the :func:`compare` table.
* :func:`plot_khat`: pointwise PSIS-LOO k-hat per fit (ArviZ's ``plot_khat`` on 0.23, a
  matplotlib equivalent on 1.x), with the VI k-hat of each fit in its title.
* :func:`plot_prior_functions`: the prior predictive check of an export with the prior groups
  (``to_inference_data(..., prior=True)``): function draws and predictive bands over a 1-D
  input, ArviZ's prior predictive plot otherwise.
* :func:`plot_ppc_grid`: ArviZ's own posterior predictive checks (``plot_ppc``,
  ``plot_loo_pit``, ``plot_bpv`` on 0.23; ``plot_ppc_dist`` / ``plot_ppc_rootogram``,
  ``plot_loo_pit``, ``plot_ppc_pit`` on 1.x), one column per fit.

:func:`plot_compare` and :func:`plot_khat` flag what makes a fit's numbers unreliable
(:mod:`pyro_dropout.diagnostics.reliability`): the fit's label or title gets a ``!`` and its
flags, and the figure a footnote saying what each flag means and what to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _arviz_compat as compat
from . import _reader as rd
from . import metrics
from .calibration import loo_pit_ks
from .reliability import fit_flags, footnote
from .vi_diagnostic import vi_diagnostic

__all__ = [
    "plot_calibration",
    "plot_compare",
    "plot_khat",
    "plot_ppc_grid",
    "plot_predictive_bands",
    "plot_prior_functions",
]


def _as_dict(fits: Any) -> dict[str, Any]:
    if compat.is_arviz_object(fits):
        return {rd.family(fits): fits}
    if not isinstance(fits, Mapping) or not fits:
        raise ValueError("fits must be an exported ArviZ object or a non-empty dict of them")
    for name, d in fits.items():
        if not compat.is_arviz_object(d):
            raise ValueError(f"fits[{name!r}] is not an ArviZ object from to_inference_data")
    return dict(fits)


def _panels(n: int, ncols: int | None, panel_size: tuple[float, float]):
    import matplotlib.pyplot as plt

    ncols = min(n, ncols or 3)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(panel_size[0] * ncols, panel_size[1] * nrows),
        squeeze=False,
        layout="constrained",
    )
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    return fig, axes.ravel()[:n]


def _add_footnote(fig: Any, flags: Mapping[str, Any]) -> None:
    text = footnote({k: v for k, v in flags.items() if v})
    if not text:
        return
    # below everything the axes draw (tick labels, x label), in figure coordinates
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
    bottom = min([b.y0 for b in boxes if b is not None] or [0.0]) / fig.bbox.height
    fig.text(
        0.0, min(bottom, 0.0) - 0.02, text, ha="left", va="top", fontsize="x-small", color="C3"
    )


def _finish(fig: Any, path: Any) -> Any:
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig


def _pred_group(data: Any, group: str) -> tuple[str, str]:
    """(predictive group, its constant-data group) for ``group`` in {auto, test, train}."""
    has_test = compat.has_group(data, "predictions")
    if group == "auto":
        group = "test" if has_test else "train"
    if group == "test":
        if not has_test:
            raise ValueError("this fit has no predictions group (export it with x_test)")
        return "predictions", "predictions_constant_data"
    if group == "train":
        return "posterior_predictive", "constant_data"
    raise ValueError(f"group must be 'auto', 'test' or 'train'; got {group!r}")


def _one_d(x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1:
        raise ValueError(f"{what} must be 1-D (or one column) for this plot; got shape {x.shape}")
    return x


def plot_predictive_bands(
    fits: Any,
    *,
    group: str = "auto",
    output: int = 0,
    ncols: int | None = None,
    path: Any = None,
) -> Any:
    """Predictive mean +/- 2 sd over a 1-D input, one panel per fit, training points on top.

    The mean is the average over draws of the per-draw conditional mean (``obs_mean``) when
    stored, else of the predictive draws; the sd is that of the predictive draws (epistemic
    plus noise). ``group="auto"`` uses the ``predictions`` (test inputs, e.g. a grid extending
    beyond the data, as in Gal & Ghahramani 2016, Fig. 1) when present, else the training
    inputs. The training range is marked with dashed lines.

    Args:
        fits: ``{name: exported fit}`` or a single exported fit.
        group: ``"auto"``, ``"test"`` or ``"train"``.
        output: which output column to plot for multi-output regression.
        ncols: panels per row (default up to 3).
        path: save the figure there if given.

    Example:
        >>> fig = plot_predictive_bands({"mc_dropout": idata1, "vd": idata2}, path="bands.png")
        ...  # doctest: +SKIP
    """
    fits = _as_dict(fits)
    fig, axes = _panels(len(fits), ncols, (4.5, 3.2))
    for ax, (name, d) in zip(axes, fits.items(), strict=True):
        if rd.task(d) != "regression":
            raise ValueError(f"fit {name!r} is a classifier; predictive bands need regression")
        obs = rd.obs_name(d)
        pg, cg = _pred_group(d, group)
        xp = _one_d(rd.values(d, cg, "x"), "x")
        r = rd.draws(d, pg, obs)
        y_rep = r.reshape(r.shape[:2] + (-1,))[..., output]
        if rd.has_var(d, pg, f"{obs}_mean"):
            m = rd.draws(d, pg, f"{obs}_mean")
            mean = m.reshape(m.shape[:2] + (-1,))[..., output].mean(axis=0)
        else:
            mean = y_rep.mean(axis=0)
        sd = y_rep.std(axis=0)
        order = np.argsort(xp)
        xs, ms, ss = xp[order], mean[order], sd[order]
        ax.fill_between(xs, ms - 2 * ss, ms + 2 * ss, color="C0", alpha=0.25, label="mean ± 2 sd")
        ax.plot(xs, ms, color="C0", lw=1.5, label="predictive mean")
        xt = _one_d(rd.values(d, "constant_data", "x"), "x")
        yt = rd.values(d, "observed_data", obs).reshape(len(xt), -1)[:, output]
        ax.scatter(xt, yt, s=8, color="k", alpha=0.7, label="training data", zorder=3)
        for edge in (xt.min(), xt.max()):
            ax.axvline(edge, color="0.4", ls="--", lw=0.8)
        ax.set_title(f"{name} ({rd.family(d)})")
        ax.set_xlabel("x")
        ax.set_ylabel(obs)
    # A fixed corner: loc="best" searches over every plotted point, and matplotlib warns
    # ("can be slow") when that search takes over a second, as it does on a loaded machine.
    axes[0].legend(fontsize="small", loc="upper left")
    return _finish(fig, path)


def plot_calibration(
    fits: Any,
    *,
    group: str = "auto",
    n_bins: int = 10,
    ncols: int | None = None,
    path: Any = None,
) -> Any:
    """Calibration per fit: PIT histogram (regression) or reliability diagram (classification).

    Regression: histogram of :func:`metrics.pit` values :math:`u_j = \\Pr(\\tilde y_j \\le
    y_j)` over the test (or training) points, with the uniform density a calibrated model
    gives. Classification: mean accuracy against mean top-class confidence in ``n_bins``
    equal-width bins (:func:`metrics.reliability_curve`; Guo et al. 2017) with the diagonal and
    the ECE in the title.

    Example:
        >>> fig = plot_calibration({"mc_dropout": idata1}, path="calib.png")  # doctest: +SKIP
    """
    fits = _as_dict(fits)
    fig, axes = _panels(len(fits), ncols, (4.0, 3.2))
    for ax, (name, d) in zip(axes, fits.items(), strict=True):
        obs = rd.obs_name(d)
        pg, _ = _pred_group(d, group)
        og = "predictions_observed_data" if pg == "predictions" else "observed_data"
        if not compat.has_group(d, og):
            raise ValueError(f"fit {name!r} has no observed targets for {pg!r} (pass y_test)")
        y = rd.values(d, og, obs)
        if rd.task(d) == "classification":
            probs = rd.draws(d, pg, f"{obs}_probs").mean(axis=0)
            conf, acc, count = metrics.reliability_curve(y, probs, n_bins)
            edges = np.linspace(0, 1, n_bins + 1)
            centers = 0.5 * (edges[1:] + edges[:-1])
            ax.bar(centers, np.nan_to_num(acc), width=1 / n_bins, edgecolor="k", alpha=0.6)
            ax.plot([0, 1], [0, 1], color="C3", ls="--", lw=1)
            ece = metrics.expected_calibration_error(y, probs, n_bins)
            ax.set_xlabel("confidence")
            ax.set_ylabel("accuracy")
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_title(f"{name}: ECE = {ece:.3f}")
        else:
            u = metrics.pit(y, rd.draws(d, pg, obs))
            ax.hist(u, bins=n_bins, range=(0, 1), density=True, edgecolor="k", alpha=0.6)
            ax.axhline(1.0, color="C3", ls="--", lw=1)
            ax.set_xlabel("PIT")
            ax.set_ylabel("density")
            ax.set_title(f"{name}: PIT ({'test' if pg == 'predictions' else 'train'})")
    return _finish(fig, path)


def plot_compare(table_or_fits: Any, *, path: Any = None) -> Any:
    """ArviZ's model-comparison plot (ELPD-LOO differences with standard errors).

    Accepts the table of :func:`pyro_dropout.diagnostics.compare` or a dict of exported fits
    (compared first).

    Example:
        >>> fig = plot_compare(compare({"a": idata1, "b": idata2}), path="cmp.png")
        ...  # doctest: +SKIP
    """
    import pandas as pd

    from .compare import compare

    table = table_or_fits
    if not isinstance(table, pd.DataFrame):
        table = compare(_as_dict(table_or_fits))
    if "error" in table:  # failed fits have no LOO to draw
        table = table[table["error"] == ""]
    fig = compat.plot_compare(table)
    flags = {k: v for k, v in (table.attrs.get("reliability") or {}).items() if k in table.index}
    for ax in fig.axes:
        labels = ax.get_yticklabels()
        if any(t.get_text() in flags for t in labels):  # ArviZ 0.23: fits are y tick labels
            ax.set_yticks(
                ax.get_yticks(),
                [t.get_text() + (" !" if t.get_text() in flags else "") for t in labels],
            )
        for t in ax.texts:  # arviz-plots may write the names as text artists
            if t.get_text() in flags:
                t.set_text(t.get_text() + " !")
    _add_footnote(fig, flags)
    return _finish(fig, path)


def plot_khat(fits: Any, *, ncols: int | None = None, path: Any = None) -> Any:
    """Pointwise PSIS-LOO Pareto k-hat per fit; the title gives the fit's VI k-hat.

    Points above the dotted line (``good_k``) make that observation's LOO estimate unreliable;
    the VI k-hat (Yao et al. 2018) judges the guide as a whole. A flagged fit's title ends in
    ``!`` and its flags (share of points above ``good_k``, infinite k-hat, ``p_loo`` out of
    range, VI k-hat beyond its range); the footnote says what each means.

    Example:
        >>> fig = plot_khat({"mc_dropout": idata1, "bbb": idata2}, path="khat.png")
        ...  # doctest: +SKIP
    """
    from .compare import loo

    fits = _as_dict(fits)
    fig, axes = _panels(len(fits), ncols, (4.5, 3.2))
    all_flags = {}
    for ax, (name, d) in zip(axes, fits.items(), strict=True):
        lr = loo(d)
        all_flags[name] = flags = fit_flags(d)
        compat.plot_khat(lr, ax)
        n_inf = int(np.sum(~np.isfinite(lr.pareto_k)))
        if n_inf:
            ax.text(
                0.5,
                0.5,
                f"{n_inf} of {lr.pareto_k.size} points: k-hat = inf\n(log-likelihood constant "
                "over draws)",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="C3",
            )
        title = f"{name}: VI k-hat = {vi_diagnostic(d)['khat']:.2f}"
        if flags:
            title += "\n! " + "; ".join(short for _, short in flags)
        ax.set_title(title, fontsize="medium", color="C3" if flags else "k")
    _add_footnote(fig, all_flags)
    return _finish(fig, path)


def _is_one_d(x: np.ndarray) -> bool:
    x = np.asarray(x)
    return x.ndim == 1 or (x.ndim == 2 and x.shape[1] == 1)


def plot_prior_functions(
    fits: Any,
    *,
    num_draws: int = 30,
    output: int = 0,
    intervals: tuple[float, ...] = (0.5, 0.9),
    ncols: int | None = None,
    path: Any = None,
    seed: int = 0,
) -> Any:
    """The prior predictive check of exports with the ``prior_predictive`` group
    (``to_inference_data(..., prior=True)`` or :func:`~pyro_dropout.diagnostics.add_prior`),
    one panel per fit.

    Regression on a 1-D input: ``num_draws`` functions drawn from the prior (``obs_mean`` of
    the prior predictive, one line each) and the central ``intervals`` of the prior predictive
    ``obs`` over ``x``, with the observed data on top: do the functions the prior over weights
    implies look like functions the data could come from (their scale, their wiggliness)?
    Otherwise (several inputs, classification): ArviZ's prior predictive plot of the targets
    against the observed ones (``az.plot_ppc(group="prior")`` on 0.23;
    ``plot_ppc_dist`` / ``plot_ppc_rootogram`` with ``group="prior_predictive"`` on 1.x).

    Example:
        >>> idata = to_inference_data(model, guide, x, y, prior=True)  # doctest: +SKIP
        >>> fig = plot_prior_functions(idata, path="prior.png")  # doctest: +SKIP
    """
    fits = _as_dict(fits)
    for name, d in fits.items():
        if not compat.has_group(d, "prior_predictive"):
            raise ValueError(
                f"fit {name!r} has no prior_predictive group: export it with "
                "to_inference_data(..., prior=True) or add_prior(...)"
            )
    fig, axes = _panels(len(fits), ncols, (4.5, 3.2))
    rng = np.random.default_rng(seed)
    for ax, (name, d) in zip(axes, fits.items(), strict=True):
        obs = rd.obs_name(d)
        x = rd.values(d, "constant_data", "x")
        regression = rd.task(d) == "regression"
        if not (regression and _is_one_d(x)):
            compat.plot_predictive_check(d, "ppc", obs, prior=True, discrete=not regression, ax=ax)
            ax.set_title(f"{name}: prior predictive")
            continue
        xs = _one_d(x, "x")
        order = np.argsort(xs)
        r = rd.draws(d, "prior_predictive", obs)
        y_rep = r.reshape(r.shape[:2] + (-1,))[..., output][:, order]
        for k, p in enumerate(sorted(intervals, reverse=True)):
            lo, hi = np.quantile(y_rep, [(1 - p) / 2, (1 + p) / 2], axis=0)
            ax.fill_between(
                xs[order],
                lo,
                hi,
                color="C1",
                alpha=0.15 + 0.1 * k,
                lw=0,
                label=f"{round(100 * p)} % prior predictive",
            )
        if rd.has_var(d, "prior_predictive", f"{obs}_mean"):
            m = rd.draws(d, "prior_predictive", f"{obs}_mean")
            f = m.reshape(m.shape[:2] + (-1,))[..., output][:, order]
            pick = rng.choice(f.shape[0], size=min(num_draws, f.shape[0]), replace=False)
            for j, s in enumerate(pick):
                ax.plot(
                    xs[order],
                    f[s],
                    color="C0",
                    lw=0.8,
                    alpha=0.6,
                    label="prior function draws" if j == 0 else None,
                )
        yt = rd.values(d, "observed_data", obs).reshape(len(xs), -1)[:, output]
        ax.scatter(xs, yt, s=8, color="k", zorder=3, label="observed")
        ax.set_title(f"{name}: prior functions")
        ax.set_xlabel("x")
        ax.set_ylabel(obs)
        ax.legend(fontsize="x-small", loc="upper left")  # fixed corner: see above
    return _finish(fig, path)


def plot_ppc_grid(
    fits: Any,
    *,
    kinds: tuple[str, ...] = ("ppc", "loo_pit", "bpv"),
    panel_size: tuple[float, float] = (4.0, 3.0),
    path: Any = None,
) -> Any:
    """ArviZ's own posterior predictive checks of several fits side by side: one column per
    fit, one row per check in ``kinds``.

    * ``"ppc"``: posterior predictive draws against the observed targets (0.23
      ``az.plot_ppc``; 1.x ``plot_ppc_dist``, or ``plot_ppc_rootogram`` for classification).
    * ``"loo_pit"``: the LOO-PIT (``az.plot_loo_pit``); the title gives
      :func:`~pyro_dropout.diagnostics.calibration.loo_pit_ks`, ``compare``'s ``loo_pit_ks``.
    * ``"bpv"``: marginal Bayesian p-values (0.23 ``az.plot_bpv``; 1.x ``plot_ppc_pit``).

    On 1.x arviz-plots draws a figure per call; each is shown in its panel as an image.

    Example:
        >>> fig = plot_ppc_grid({"mc_dropout": idata1, "bbb": idata2}, path="ppc.png")
        ...  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt

    fits = _as_dict(fits)
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in compat.PREDICTIVE_CHECKS]
    if unknown or not kinds:
        raise ValueError(f"kinds must be among {sorted(compat.PREDICTIVE_CHECKS)}; got {kinds}")
    fig, axes = plt.subplots(
        len(kinds),
        len(fits),
        figsize=(panel_size[0] * len(fits), panel_size[1] * len(kinds)),
        squeeze=False,
        layout="constrained",
    )
    for j, (name, d) in enumerate(fits.items()):
        obs = rd.obs_name(d)
        discrete = rd.task(d) == "classification"
        for i, kind in enumerate(kinds):
            ax = axes[i, j]
            compat.plot_predictive_check(d, kind, obs, discrete=discrete, ax=ax)
            title = f"{name}: {kind}"
            if kind == "loo_pit":
                title += f" (KS {loo_pit_ks(d):.3f})"
            ax.set_title(title, fontsize="medium")
    return _finish(fig, path)
