"""Every line of code that depends on which ArviZ line is installed lives here.

Two ArviZ lines are supported:

* **0.23.x** (Python 3.11): ``arviz.InferenceData``; ``az.loo`` returns an ``ELPDData`` pandas
  Series with fields ``elpd_loo``, ``p_loo``, ``loo_i``; ``az.psislw(log_weights)`` takes the log
  importance weights themselves.
* **1.x** (Python >= 3.12): an ``xarray.DataTree`` (``arviz_base`` / ``arviz_stats`` /
  ``arviz_plots``); ``az.loo`` returns ``ELPDDataLOO`` with fields ``elpd``, ``p``, ``elpd_i``;
  ``arviz_stats.base.array_stats.psislw(ary)`` smooths the weights ``exp(-ary)`` (it was built
  for ``ary`` = pointwise log-likelihood, LOO weights being ``1 / p(y_i | theta)``), so the log
  importance ratios must be passed negated.

The rest of :mod:`pyro_dropout.diagnostics` only sees plain ``xarray.Dataset`` groups, numpy
arrays, the normalised :class:`LooResult` and pandas tables.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

with warnings.catch_warnings():
    # ArviZ 0.23 announces its 1.0 refactor with a FutureWarning at import time.
    warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
    import arviz as az

ARVIZ_VERSION: str = az.__version__
#: True on the DataTree line (ArviZ >= 1.0).
IS_ARVIZ_1: bool = int(ARVIZ_VERSION.split(".")[0]) >= 1

_PARETO_WARNING = "Estimated shape parameter of Pareto distribution"
#: Fewest draws PSIS-LOO accepts: the tail is min(20 % of S, 3 sqrt(S)) draws and must be >= 5.
MIN_LOO_DRAWS = 25


@contextlib.contextmanager
def _pandas_inplace_ok():
    """Silence one deprecation that only ArviZ 0.23's own code triggers.

    arviz 0.23's ``compare`` and ``plot_compare`` call ``DataFrame.sort_values(inplace=True)``,
    deprecated by pandas >= 3.1 (``Pandas4Warning``, a DeprecationWarning); the caller cannot act
    on it and 0.23 will not be fixed.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The inplace keyword", category=DeprecationWarning
        )
        yield


@contextlib.contextmanager
def _arviz023_internal_deprecations():
    """Also silence matplotlib >= 3.11's deprecation of a dict ``alias_mapping`` in
    ``normalize_kwargs``, which ArviZ 0.23's matplotlib backend passes (plot_khat,
    plot_compare); internal to ArviZ 0.23, nothing the caller can change."""
    with _pandas_inplace_ok(), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Passing a dict or None as alias_mapping", category=DeprecationWarning
        )
        yield


# --------------------------------------------------------------------------------------------
# The ArviZ object: build, inspect, save, load
# --------------------------------------------------------------------------------------------
def build(groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]) -> Any:
    """Assemble named ``xarray.Dataset`` groups into the installed line's ArviZ object.

    Returns an ``az.InferenceData`` on 0.23 and an ``xarray.DataTree`` on 1.x; ``attrs`` become
    the root attributes on both (they must be netCDF-serialisable).
    """
    attrs = dict(attrs)
    if IS_ARVIZ_1:
        tree = xr.DataTree.from_dict(dict(groups))
        tree.attrs.update(attrs)
        return tree
    return az.InferenceData(attrs=attrs, **groups)


def is_arviz_object(obj: Any) -> bool:
    """Whether ``obj`` is the installed line's container (``InferenceData`` / ``DataTree``)."""
    if IS_ARVIZ_1:
        return isinstance(obj, xr.DataTree)
    return isinstance(obj, az.InferenceData)


def group_names(obj: Any) -> list[str]:
    """Names of the groups of an ArviZ object."""
    if IS_ARVIZ_1:
        return list(obj.children)
    return list(obj.groups())


def has_group(obj: Any, name: str) -> bool:
    """Whether the ArviZ object has a group called ``name``."""
    return name in group_names(obj)


def get_group(obj: Any, name: str) -> xr.Dataset:
    """Group ``name`` of an ArviZ object as a plain ``xarray.Dataset``."""
    if not has_group(obj, name):
        raise KeyError(f"the ArviZ object has no group {name!r}; groups: {group_names(obj)}")
    if IS_ARVIZ_1:
        return obj[name].to_dataset()
    return obj[name]


def root_attrs(obj: Any) -> dict[str, Any]:
    """Root (global) attributes of an ArviZ object."""
    if IS_ARVIZ_1:
        return dict(obj.attrs)
    return dict(obj.attrs or {})


def update_root_attrs(obj: Any, attrs: Mapping[str, Any]) -> None:
    """Add ``attrs`` to the root attributes of an ArviZ object, in place."""
    if IS_ARVIZ_1:
        obj.attrs.update(dict(attrs))
    else:
        if obj.attrs is None:
            obj.attrs = {}
        obj.attrs.update(dict(attrs))


def add_groups(obj: Any, groups: Mapping[str, xr.Dataset]) -> Any:
    """Add (or replace) groups of an ArviZ object, in place; returns ``obj``."""
    if IS_ARVIZ_1:
        for name, ds in groups.items():
            obj[name] = xr.DataTree(dataset=ds)
    else:
        for name in groups:
            if name in obj.groups():
                delattr(obj, name)  # InferenceData.__delattr__ drops the group
        obj.add_groups({name: ds for name, ds in groups.items()})
    return obj


def to_netcdf(obj: Any, path: Any) -> Any:
    """Write an ArviZ object to a netCDF4/HDF5 file with the ``h5netcdf`` engine."""
    if IS_ARVIZ_1:
        obj.to_netcdf(path, engine="h5netcdf")
    else:
        obj.to_netcdf(str(path), engine="h5netcdf")
    return path


def from_netcdf(path: Any) -> Any:
    """Read an ArviZ object written by :func:`to_netcdf`, fully loaded and with the file closed."""
    if IS_ARVIZ_1:
        return xr.load_datatree(path, engine="h5netcdf")
    with az.rc_context({"data.load": "eager"}):
        return az.from_netcdf(str(path), engine="h5netcdf")


# --------------------------------------------------------------------------------------------
# LOO, compare, summary, PSIS
# --------------------------------------------------------------------------------------------
@dataclass
class LooResult:
    """PSIS-LOO of one fit, with the same field names on both ArviZ lines.

    ``raw`` is ArviZ's own result object (``ELPDData`` / ``ELPDDataLOO``).
    """

    elpd: float
    se: float
    p: float
    pareto_k: np.ndarray
    good_k: float
    warning: bool
    n_samples: int
    n_data_points: int
    raw: Any


def loo(obj: Any, var_name: str | None = None) -> LooResult:
    """``az.loo(obj, pointwise=True, reff=1)`` on either line, normalised to :class:`LooResult`.

    ``reff = 1`` for one chain (independent guide draws); with several chains (MCMC) ArviZ
    estimates the relative effective sample size itself (``reff=None``). ArviZ's
    "Pareto k greater than ..." warning is not re-emitted: it is recorded in ``warning`` and in
    the per-point ``pareto_k``, which :func:`pyro_dropout.diagnostics.compare` tabulates.
    """
    ll = get_group(obj, "log_likelihood")
    n_draws = int(ll.sizes.get("chain", 1) * ll.sizes.get("draw", 1))
    if n_draws < MIN_LOO_DRAWS:
        # arviz-stats 1.x fails deep inside PSIS ("n_draws_tail must be at least 5"); 0.23
        # returns an estimate from a tail of under 5 draws: refuse on both lines, and say why.
        raise ValueError(
            f"loo: {n_draws} posterior draws; PSIS fits a Pareto tail to the largest 20 % of "
            f"the draws and needs at least {MIN_LOO_DRAWS} draws (a tail of 5): pass "
            f"num_samples >= {MIN_LOO_DRAWS} (a few hundred for stable estimates)"
        )
    kwargs = _v1_constant_point_weights(obj, var_name) if IS_ARVIZ_1 else {}
    reff = 1.0 if ll.sizes.get("chain", 1) == 1 else None
    with warnings.catch_warnings():
        # Recorded in LooResult.warning / pareto_k instead (see docstring).
        warnings.filterwarnings("ignore", message=_PARETO_WARNING, category=UserWarning)
        try:
            res = az.loo(obj, pointwise=True, var_name=var_name, reff=reff, **kwargs)
        except ValueError as e:
            if not (IS_ARVIZ_1 and "All tail values are the same" in str(e)):
                raise
            # A few distinct draws (an ensemble of point masses): some varying points have a
            # flat tail, which arviz-stats 1.x refuses; treat them as constant points are.
            kwargs = _v1_constant_point_weights(obj, var_name, per_point=True)
            res = az.loo(obj, pointwise=True, var_name=var_name, reff=reff, **kwargs)
    if IS_ARVIZ_1:
        elpd, p = float(res.elpd), float(res.p)
    else:
        elpd, p = float(res["elpd_loo"]), float(res["p_loo"])
    k = np.asarray(res.pareto_k.values if hasattr(res.pareto_k, "values") else res.pareto_k)
    return LooResult(
        elpd=elpd,
        se=float(res.se),
        p=p,
        pareto_k=k.astype(float).ravel(),
        good_k=float(res.good_k),
        warning=bool(res.warning),
        n_samples=int(res.n_samples),
        n_data_points=int(res.n_data_points),
        raw=res,
    )


def _v1_constant_point_weights(
    obj: Any, var_name: str | None, per_point: bool = False
) -> dict[str, Any]:
    """PSIS weights for ``az.loo`` on 1.x when some pointwise log-likelihood is constant.

    When an observation's log-likelihood is the same for every draw (always so for a point-mass
    guide), PSIS has nothing to fit: arviz-stats 1.x raises "All tail values are the same",
    whereas 0.23 returns k-hat = inf. To give the same answer on both lines, such points get
    uniform weights (any weighting gives the same elpd_i) and k-hat = inf, and ArviZ's own
    ``psislw`` smooths the others; both are handed to ``az.loo`` (``log_weights``,
    ``pareto_k``). Returns ``{}`` when every point varies (the ordinary path).

    With ``per_point`` each varying point is smoothed on its own, and a point whose Pareto
    tail is flat (few distinct draws, e.g. an ensemble of a few point masses; arviz-stats
    raises "All tail values are the same") gets its raw, self-normalised importance weights
    ``1 / p(y_i | theta_s)`` and k-hat = inf, flagged like a constant point.
    """
    ll = get_group(obj, "log_likelihood")
    if var_name is None:
        var_name = next(iter(ll.data_vars))
    ll = ll[var_name]
    sample_dims = ["chain", "draw"]
    spread = (ll.max(sample_dims) - ll.min(sample_dims)).values
    if np.all(spread > 0) and not per_point:
        return {}
    obs_dims = [d for d in ll.dims if d not in sample_dims]
    if len(obs_dims) != 1:
        raise ValueError(f"expected one observation dimension in log_likelihood; got {obs_dims}")
    axis = ll.dims.index(obs_dims[0])
    n_draws = ll.sizes["chain"] * ll.sizes["draw"]
    lw = np.full(ll.shape, -np.log(n_draws))
    khat = np.full(spread.shape, np.inf)
    idx = np.flatnonzero(spread > 0)
    if idx.size and not per_point:
        lw_sub, k_sub = ll.isel({obs_dims[0]: idx}).azstats.psislw(r_eff=1.0, dim=sample_dims)
        lw[(slice(None),) * axis + (idx,)] = lw_sub.transpose(*ll.dims).values
        khat[idx] = k_sub.values
    for i in idx if per_point else ():
        point = ll.isel({obs_dims[0]: [i]})
        sel = (slice(None),) * axis + ([i],)
        try:
            lw_i, k_i = point.azstats.psislw(r_eff=1.0, dim=sample_dims)
            lw[sel], khat[i] = lw_i.transpose(*ll.dims).values, float(k_i.values[0])
        except ValueError:  # flat tail: raw importance weights, flagged
            raw = -np.asarray(point.transpose(*ll.dims).values, dtype=np.float64)
            top = raw.max()  # log-sum-exp over every draw (np.logaddexp.reduce, typed)
            lw[sel] = raw - (top + np.log(np.exp(raw - top).sum()))
    return {
        "log_weights": ll.copy(data=lw),
        "pareto_k": ll.isel(chain=0, draw=0, drop=True).copy(data=khat),
    }


def rhat_ess(values: xr.DataArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ArviZ's rank-normalised split R-hat, bulk ESS and tail ESS (Vehtari et al. 2021) of a
    ``(chain, draw, ...)`` array, one value per remaining element (same call on both lines)."""
    ds = xr.Dataset({"v": values})
    rhat = az.rhat(ds)["v"].values
    bulk = az.ess(ds, method="bulk")["v"].values
    tail = az.ess(ds, method="tail")["v"].values
    return np.asarray(rhat), np.asarray(bulk), np.asarray(tail)


#: Columns of :func:`compare_loo`'s table, in order.
COMPARE_COLUMNS = ["rank", "elpd_loo", "se", "p_loo", "elpd_diff", "dse", "weight"]


def compare_loo(loos: Mapping[str, LooResult], method: str = "stacking") -> pd.DataFrame:
    """``az.compare`` on precomputed LOO results, with the same columns on both lines.

    Returns a DataFrame indexed by fit name, sorted best first, with columns
    :data:`COMPARE_COLUMNS` (``elpd_loo``: PSIS-LOO elpd; ``p_loo``: effective number of
    parameters; ``elpd_diff``/``dse``: difference to the best fit and its standard error;
    ``weight``: model weights by ``method``), unrounded. ``elpd_diff`` follows ArviZ 1.x:
    this fit's elpd minus the best fit's (<= 0); 0.23's positive differences are negated.
    """
    raw = {name: r.raw for name, r in loos.items()}
    if len(raw) == 1:
        ((name, r),) = loos.items()
        return pd.DataFrame(
            [[0, r.elpd, r.se, r.p, 0.0, 0.0, 1.0]], index=[name], columns=COMPARE_COLUMNS
        )
    if IS_ARVIZ_1:
        df = az.compare(raw, method=method, round_to="none")
        df = df.rename(columns={"elpd": "elpd_loo", "p": "p_loo"})
    else:
        with _pandas_inplace_ok():
            df = az.compare(raw, method=method)
        df["elpd_diff"] = 0.0 - df["elpd_diff"]  # 1.x convention: this fit minus the best (<= 0)
    df = df[COMPARE_COLUMNS].copy()
    df["rank"] = df["rank"].astype(int)
    for col in COMPARE_COLUMNS[1:]:
        df[col] = df[col].astype(float)
    return df


def summary(obj: Any, var_names: list[str] | None = None) -> pd.DataFrame:
    """``az.summary`` of the posterior group, unrounded.

    With a single chain of guide draws R-hat is undefined and ArviZ reports NaN on both lines;
    that NaN means "not assessable", not "converged".

    Example:
        >>> summary(idata, ["w"])[["mean", "sd", "ess_bulk"]]  # doctest: +SKIP
    """
    return az.summary(obj, var_names=var_names, round_to="none")


def psis_khat(log_ratios: np.ndarray) -> float:
    """Pareto k-hat of PSIS applied to the importance log-ratios ``log_ratios`` (shape ``(S,)``).

    0.23: ``az.psislw(log_ratios)`` smooths ``exp(log_ratios)``; 1.x:
    ``array_stats.psislw(ary)`` smooths ``exp(-ary)``, so it gets ``-log_ratios``. Checked on a
    known case (q = N(0, 1), p = N(0, 2^2): theory k = 1 - 1/4 = 0.75) in the tests.
    """
    log_ratios = np.asarray(log_ratios, dtype=float).ravel()
    if IS_ARVIZ_1:
        from arviz_stats.base import array_stats

        _, khat = array_stats.psislw(-log_ratios)
    else:
        _, khat = az.psislw(log_ratios)
    return float(np.asarray(khat))


def psis_log_weights(log_lik: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PSIS-LOO log weights of ``log_lik`` (``(S, N)`` pointwise log-likelihoods, one chain).

    The weights of draw ``s`` for leaving out point ``i`` are ``1 / p(y_i | theta_s)``,
    Pareto-smoothed (``reff = 1``) and normalised over draws. Returns ``(log_weights (S, N),
    pareto_k (N,))``; 0.23: ``az.psislw(-log_lik)``, 1.x: ``array_stats.psislw(log_lik)``
    (which smooths ``exp(-ary)``). A point whose log-likelihood is the same for every draw
    gets uniform weights and k-hat = inf.
    """
    ll = np.asarray(log_lik, dtype=float)
    s, n = ll.shape
    lw = np.full((s, n), -np.log(s))
    khat = np.full(n, np.inf)
    idx = np.flatnonzero(np.ptp(ll, axis=0) > 0)
    if idx.size:
        try:
            w, k = _psislw(ll[:, idx].T)  # (points, draws)
        except ValueError:
            # arviz-stats 1.x: "All tail values are the same" (a few distinct draws, e.g. an
            # ensemble of point masses); smooth point by point, and a point with a flat tail
            # gets its raw self-normalised weights and k-hat = inf (as loo does)
            w, k = np.empty((idx.size, s)), np.full(idx.size, np.inf)
            for j, i in enumerate(idx):
                try:
                    wj, kj = _psislw(ll[:, [i]].T)
                    w[j], k[j] = wj[0], float(np.ravel(kj)[0])
                except ValueError:
                    w[j] = -ll[:, i]
        lw[:, idx] = (w - np.logaddexp.reduce(w, axis=-1, keepdims=True)).T
        khat[idx] = k
    return lw, khat


def _psislw(ll_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PSIS of the LOO weights ``1 / p(y_i | theta_s)`` of ``ll_t`` (points, draws)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PARETO_WARNING, category=UserWarning)
        if IS_ARVIZ_1:
            from arviz_stats.base import array_stats

            w, k = array_stats.psislw(ll_t, r_eff=1.0, axis=-1)
        else:
            w, k = az.psislw(-ll_t, reff=1.0)
    return np.asarray(w, dtype=float).reshape(ll_t.shape), np.asarray(k, dtype=float).ravel()


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------
#: The predictive checks of :func:`plot_predictive_check`, and the function of each line.
PREDICTIVE_CHECKS = {
    # kind: (0.23 function, 1.x function for regression, 1.x function for classification)
    "ppc": ("plot_ppc", "plot_ppc_dist", "plot_ppc_rootogram"),
    "loo_pit": ("plot_loo_pit", "plot_loo_pit", "plot_loo_pit"),
    "bpv": ("plot_bpv", "plot_ppc_pit", "plot_ppc_pit"),
}


def _loo_pit_arrays(obj: Any, var_name: str) -> dict[str, np.ndarray]:
    """``y``, ``y_hat`` and ``log_weights`` for 0.23's ``plot_loo_pit`` when each observation
    has several elements (a network's output dimension, even of size 1): 0.23 wants one value
    per observation, so the elements are flattened and each gets its row's PSIS weights."""
    ll = get_group(obj, "log_likelihood")[var_name]
    ll = ll.stack(__sample__=("chain", "draw")).transpose("__sample__", ...).values
    rep = get_group(obj, "posterior_predictive")[var_name]
    rep = rep.stack(__sample__=("chain", "draw")).transpose("__sample__", ...).values
    s, n = ll.shape
    lw, _ = psis_log_weights(ll.reshape(s, -1))
    per_row = rep[0].size // n
    y = get_group(obj, "observed_data")[var_name].values.reshape(-1)
    return {
        "y": y,
        "y_hat": rep.reshape(s, -1).T,
        "log_weights": np.repeat(lw, per_row, axis=1).T,
    }


def _flat_obs_tree(obj: Any, var_name: str) -> Any:
    """For arviz-stats 1.x, whose ``loo_pit`` and ``ppc_pit`` want one value per observation:
    a DataTree whose ``var_name`` has one dimension of observation elements (rows times
    outputs) in the predictive and observed groups, each element carrying its row's
    log-likelihood (so its row's PSIS weights); the posterior is kept (ArviZ reads the draw
    dimensions from it)."""
    elem = f"{var_name}_elem"

    def flat(group: str) -> xr.Dataset:
        da = get_group(obj, group)[var_name].transpose("chain", "draw", ...)
        c, d = da.shape[:2]
        return xr.Dataset({var_name: (("chain", "draw", elem), da.values.reshape(c, d, -1))})

    groups = {g: flat(g) for g in ("posterior_predictive", "prior_predictive") if has_group(obj, g)}
    per_row = int(np.prod(get_group(obj, "observed_data")[var_name].shape[1:]))
    ll = get_group(obj, "log_likelihood")[var_name].transpose("chain", "draw", ...)
    c, d = ll.shape[:2]
    ll_rep = np.repeat(ll.values.reshape(c, d, -1), per_row, axis=2)
    groups["log_likelihood"] = xr.Dataset({var_name: (("chain", "draw", elem), ll_rep)})
    y = get_group(obj, "observed_data")[var_name].values.reshape(-1)
    groups["observed_data"] = xr.Dataset({var_name: ((elem,), y)})
    if has_group(obj, "posterior"):
        groups["posterior"] = get_group(obj, "posterior")
    return build(groups, root_attrs(obj))


@contextlib.contextmanager
def _arviz1_internal_warnings():
    """Silence a warning that arviz-stats 1.x raises on its own intermediate arrays:
    ``plot_ppc_rootogram`` builds a (class, ...) array that ``dict_to_dataset`` mistakes for
    (chain, draw) and warns that the chain dimension is longer than the draw dimension."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Found chain dimension to be longer", category=UserWarning
        )
        yield


def plot_predictive_check(
    obj: Any,
    kind: str,
    var_name: str,
    *,
    prior: bool = False,
    discrete: bool = False,
    ax: Any = None,
    **kwargs: Any,
) -> Any:
    """One of ArviZ's predictive checks of variable ``var_name``; returns the Figure.

    ``kind``:

    * ``"ppc"``: predictive draws against the observed data. 0.23: ``az.plot_ppc`` (with
      ``prior``: ``group="prior"``, the ``prior_predictive`` group); 1.x:
      ``arviz_plots.plot_ppc_dist`` (continuous) or ``plot_ppc_rootogram`` (``discrete``),
      ``group="prior_predictive"`` with ``prior`` (the observed data drawn too).
    * ``"loo_pit"``: LOO-PIT, ``az.plot_loo_pit`` on both lines (0.23: KDE of the LOO-PIT
      values; 1.x: their Delta-ECDF with a simultaneous envelope). 0.23 accepts one value per
      observation only: with an output dimension (this library's networks store ``(obs_id,
      obs_dim_0)``), the values are flattened and passed as arrays with the PSIS weights. On
      1.x every check (``plot_loo_pit`` and ``plot_ppc_pit`` fail on such arrays) gets the
      data with one dimension of observation elements, each with its row's log-likelihood.
    * ``"bpv"``: Bayesian p-values of the marginal predictive distributions. 0.23:
      ``az.plot_bpv`` (``kind="u_value"``); 1.x: ``arviz_plots.plot_ppc_pit`` (the same PIT
      values, as a Delta-ECDF).

    0.23 draws into ``ax`` (a new one if None). arviz-plots 1.x builds its own figure; with
    ``ax`` given, that figure is rendered and shown in ``ax`` as an image (so that several fits
    share one figure). ``kwargs`` go to the ArviZ function.
    """
    import matplotlib.pyplot as plt

    if kind not in PREDICTIVE_CHECKS:
        raise ValueError(f"kind must be one of {sorted(PREDICTIVE_CHECKS)}; got {kind!r}")
    if prior and kind != "ppc":
        raise ValueError(f"kind={kind!r} checks the posterior; only 'ppc' has a prior version")
    f023, f1_cont, f1_disc = PREDICTIVE_CHECKS[kind]
    if not IS_ARVIZ_1:
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        args: dict[str, Any] = {"y": var_name} if kind == "loo_pit" else {"var_names": [var_name]}
        if kind == "loo_pit" and get_group(obj, "posterior_predictive")[var_name].ndim > 3:
            obj, args = None, _loo_pit_arrays(obj, var_name)
        if kind == "ppc":
            args["group"] = "prior" if prior else "posterior"
        with _arviz023_internal_deprecations():
            getattr(az, f023)(obj, ax=ax, show=False, **args, **kwargs)
        if obj is None:  # ArviZ labels the axis with the printed array of y
            ax.set_xlabel(var_name)
        return ax.figure
    func = getattr(az, f1_disc if discrete else f1_cont)
    args = {"var_names": [var_name], "backend": "matplotlib"}
    if kind == "ppc" and not discrete and "num_samples" not in kwargs:
        # plot_ppc_dist draws 50 predictive draws by default and warns when there are fewer
        group = get_group(obj, "prior_predictive" if prior else "posterior_predictive")
        args["num_samples"] = min(50, group.sizes["chain"] * group.sizes["draw"])
    if prior:
        # arviz-plots leaves the observed data out of prior predictive plots unless asked
        observed = "observed_markers" if discrete else "observed_dist"
        args["group"] = "prior_predictive"
        args["visuals"] = {observed: {}, **kwargs.pop("visuals", {})}
    if get_group(obj, "observed_data")[var_name].ndim > 1 and has_group(obj, "log_likelihood"):
        obj = _flat_obs_tree(obj, var_name)
    with _arviz1_internal_warnings():
        pc = func(obj, **args, **kwargs)
    fig = pc.get_viz("figure")
    if ax is None:
        return fig
    fig.canvas.draw()
    ax.imshow(np.asarray(fig.canvas.buffer_rgba()))
    ax.set_axis_off()
    plt.close(fig)
    return ax.figure


def plot_compare(table: pd.DataFrame, ax: Any = None) -> Any:
    """ArviZ's model-comparison plot for a table with ``elpd_loo, se, p_loo, elpd_diff, dse``.

    0.23: ``az.plot_compare`` drawn into ``ax`` (a new one if None). 1.x:
    ``arviz_plots.plot_compare`` with the matplotlib backend (it creates its own figure, so
    ``ax`` is ignored). Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    if IS_ARVIZ_1:
        df = table.rename(columns={"elpd_loo": "elpd", "p_loo": "p"})
        pc = az.plot_compare(df, backend="matplotlib")
        return pc.get_viz("figure")
    df = table.copy()
    df["scale"] = "log"
    df["warning"] = False
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 1.0 + 0.6 * len(df)))
    df["elpd_diff"] = -df["elpd_diff"]  # 0.23 convention: best minus this fit (>= 0)
    with _arviz023_internal_deprecations():
        az.plot_compare(df, ax=ax, show=False)
    return ax.figure


def plot_khat(loo_result: LooResult, ax: Any) -> None:
    """Pointwise PSIS-LOO k-hat of one fit drawn into ``ax``.

    0.23: ``az.plot_khat``. 1.x: ``arviz_plots.plot_khat`` builds its own figure per fit, which
    cannot share a multi-panel figure simply, so a plain matplotlib scatter with the same
    thresholds is drawn instead.
    """
    if not IS_ARVIZ_1:
        with _arviz023_internal_deprecations():
            az.plot_khat(loo_result.raw, ax=ax, show_hlines=True, show=False)
        ax.axhline(loo_result.good_k, color="C3", ls=":", lw=1)
        return
    k = loo_result.pareto_k
    ax.scatter(np.arange(k.size), k, s=12, marker="+", color="C0")
    for level, style in ((0.0, "-"), (loo_result.good_k, ":"), (1.0, "--")):
        ax.axhline(level, color="C3" if level else "0.6", ls=style, lw=1)
    ax.set_xlabel("data point")
    ax.set_ylabel("Pareto k-hat")
