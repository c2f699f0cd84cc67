"""Simulation-based calibration of guides in function space: "did the fit work?" asked of the
whole procedure (model, guide, optimiser, budget) on data sets where the truth is known.

:func:`simulation_based_calibration` repeats, for ``r = 1 ... R``:

1. draw parameters :math:`\\theta^\\star_r` from the prior (the model as written, its
   observations hidden: :func:`~pyro_dropout.diagnostics.sampling.prior_guide`) and simulate a
   training set :math:`y_r \\sim p(y \\mid \\theta^\\star_r, x)`;
2. fit each guide on :math:`(x, y_r)` with :func:`pyro_dropout.fit` (a short budget);
3. rank the true **function values** :math:`f^\\star_{rj} = f(x^{test}_j; \\theta^\\star_r)`
   (the predictive mean for regression, each class probability for classification) among
   ``L`` draws of the fitted guide: :math:`\\mathrm{rank}_{rj} = \\#\\{s : f_{sj} <
   f^\\star_{rj}\\}` (ties split at random), in :math:`0 \\dots L`.

Weights are not identifiable in a network (permutations, sign flips), functions are, hence
ranks of function values. If the guide were the exact posterior, each rank would be uniform on
:math:`0 \\dots L` (Talts, Betancourt, Simpson, Vehtari & Gelman 2018, "Validating Bayesian
inference algorithms with simulation-based calibration"): a U-shaped histogram says the guide
is too narrow (over-confident), a hump too wide, a slope biased. Variational inference is not
exact, so SBC here measures *how* a guide is miscalibrated over the prior, and the VSBC test of
Yao, Vehtari, Simpson & Gelman (2018, "Yes, but did it work?", section 4) asks the weaker
question whether its point estimates are unbiased: the distribution of
:math:`p_{rj} = \\Pr_q(f_j < f^\\star_{rj})` is then symmetric about 1/2.

The statistics of :meth:`SBCResult.table` (per guide):

* ``pvalue``: uniformity of the ranks, a chi-square test over ``bins`` equal rank bins per
  test quantity (the ``R`` replications are independent), the smallest p-value over the
  ``Q`` quantities times ``Q`` (Bonferroni; ranks of different quantities of one replication
  are dependent, so they are not pooled). Small: the ranks are not uniform.
* ``rank_spread``: :math:`\\overline{|u - 1/2|} / (1/4)` with :math:`u = (\\mathrm{rank} +
  1/2)/(L+1)`: 1 for uniform ranks, up to 2 for an over-confident guide, towards 0 for an
  under-confident one.
* ``rank_bias``: :math:`\\bar u - 1/2`; positive: the truth lies above the guide's draws.
* ``vsbc_asymmetry``: the Kolmogorov-Smirnov distance between the empirical distributions of
  :math:`\\{p_{rj}\\}_r` and :math:`\\{1 - p_{rj}\\}_r`, largest over quantities (Yao et al.
  2018 compare the two with a KS two-sample test; as :math:`1 - p` is a function of :math:`p`
  the samples are not independent and that test's p-value is too small: 7.5 % of exact
  posteriors rejected at 1 % in our check), and ``vsbc_pvalue``: a valid test of the same
  symmetry, the Wilcoxon signed-rank test of :math:`p_{rj} - 1/2`, smallest over quantities
  times ``Q``. Small: the guide's function values are biased.

Budget and execution: the default is small (20 replications, 300 SVI steps, 99 draws);
``processes=k`` runs the replications in ``k`` worker processes (spawned: the model, the guide
factories and the data must be picklable, so use module-level functions or
``functools.partial``, not lambdas); with ``folder`` each replication is written there as soon
as it is done (``rep_00000.npz`` ...) and a later call with the same settings skips the ones
present (resumable).

Validation (the tests): on :class:`ConjugateLinearRegression`, the exact posterior
(:class:`ExactPosteriorGuide`) gives uniform ranks and an over-confident one (its scale
shrunk, ``ExactPosteriorGuide(model, scale=0.3)``) U-shaped ranks and a tiny p-value.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyro
import pyro.distributions as dist
import torch

from ..infer.data import as_model_input
from ..infer.draws import run_draws
from ..infer.draws.run import one_warning_per_model
from ..infer.fit import fit
from .groups import guide_info
from .sampling import draw_posterior, find_obs_site, prior_guide

__all__ = [
    "ConjugateLinearRegression",
    "ExactPosteriorGuide",
    "SBCResult",
    "plot_sbc_ranks",
    "simulation_based_calibration",
]


# --------------------------------------------------------------------------------------------
# A model with a known posterior, to validate the procedure
# --------------------------------------------------------------------------------------------
class ConjugateLinearRegression:
    """Bayesian linear regression with a known noise: :math:`w \\sim \\mathcal N(0,
    s_w^2 I_D)`, :math:`y_i \\sim \\mathcal N(x_i^\\top w, \\sigma^2)`; the posterior is Gaussian
    in closed form (:meth:`posterior`). Called as ``model(x, y=None)``; broadcasts over a
    leading draw dimension of ``w``. A model whose SBC answer is known, to check the procedure.

    Example:
        >>> model = ConjugateLinearRegression(2)
        >>> x = torch.eye(2); y = torch.tensor([1.0, -1.0])
        >>> mean, cov = model.posterior(x, y)
        >>> [round(v, 3) for v in mean.tolist()]  # x^T y / sigma^2 / (1 + 1 / sigma^2)
        [0.8, -0.8]
    """

    def __init__(
        self, num_features: int, prior_scale: float = 1.0, noise_scale: float = 0.5
    ) -> None:
        self.num_features = int(num_features)
        self.prior_scale = float(prior_scale)
        self.noise_scale = float(noise_scale)
        self.__name__ = "ConjugateLinearRegression"

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        zeros = torch.zeros(self.num_features, dtype=x.dtype, device=x.device)
        w = pyro.sample("w", dist.Normal(zeros, self.prior_scale).to_event(1))
        with pyro.plate("data", x.shape[0], dim=-1):
            return pyro.sample("obs", dist.Normal((x * w).sum(-1), self.noise_scale), obs=y)

    def posterior(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``(D,)`` and covariance ``(D, D)`` of :math:`p(w \\mid x, y)` (in x's dtype):
        precision :math:`I / s_w^2 + X^\\top X / \\sigma^2`, mean
        :math:`\\Sigma X^\\top y / \\sigma^2`."""
        xd, yd = x.to(torch.float64), y.to(torch.float64).reshape(-1)
        eye = torch.eye(self.num_features, dtype=torch.float64, device=x.device)
        prec = eye / self.prior_scale**2 + xd.T @ xd / self.noise_scale**2
        cov = torch.linalg.inv(prec)
        cov = 0.5 * (cov + cov.T)
        mean = cov @ (xd.T @ yd) / self.noise_scale**2
        return mean.to(x.dtype), cov.to(x.dtype)


class ExactPosteriorGuide:
    """The closed-form posterior of a :class:`ConjugateLinearRegression` as a Pyro guide:
    ``w ~ N(mean + shift * sd, (scale^2) cov)`` with ``sd`` the posterior standard deviations.
    ``scale = 1, shift = 0`` is exact; ``scale < 1`` an over-confident and ``scale > 1`` an
    under-confident approximation, ``shift != 0`` a biased one (SBC's controls). Needs no
    fitting: run :func:`simulation_based_calibration` with ``num_steps=0``.

    Example:
        >>> model = ConjugateLinearRegression(2)
        >>> guide = ExactPosteriorGuide(model, scale=0.3)
        >>> guide.family
        'exact_posterior_x0.3'
    """

    def __init__(
        self, model: ConjugateLinearRegression, scale: float = 1.0, shift: float = 0.0
    ) -> None:
        self.model = model
        self.scale, self.shift = float(scale), float(shift)
        self.family = "exact_posterior"
        if self.scale != 1.0:
            self.family += f"_x{self.scale:g}"
        if self.shift != 0.0:
            self.family += f"_shift{self.shift:+g}"
        self.config = {"scale": self.scale, "shift": self.shift}

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        if y is None:
            raise ValueError("the exact posterior needs the targets: call guide(x, y)")
        mean, cov = self.model.posterior(x, y)
        mean = mean + self.shift * torch.diagonal(cov).sqrt()
        tril = self.scale * torch.linalg.cholesky(cov)
        pyro.sample("w", dist.MultivariateNormal(mean, scale_tril=tril))


# --------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------
def _default_bins(num_replications: int, num_ranks: int) -> int:
    """About 5 replications per bin (the chi-square approximation), 2 to 20 bins."""
    return int(max(2, min(20, num_replications // 5, num_ranks)))


def _bin_counts(ranks: np.ndarray, num_ranks: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts ``(Q, bins)`` of ranks (``(R, Q)`` in ``0 .. num_ranks - 1``) in equal rank bins,
    and each bin's probability under uniform ranks."""
    edges = np.floor(np.linspace(0, num_ranks, bins + 1)).astype(int)
    which = np.searchsorted(edges, ranks, side="right") - 1  # (R, Q)
    counts = np.stack([(which == b).sum(axis=0) for b in range(bins)], axis=-1)
    return counts, np.diff(edges) / num_ranks


def _symmetry_pvalue(d: np.ndarray) -> float:
    """Wilcoxon signed-rank p-value of the symmetry of ``d`` about 0 (zeros dropped; normal
    approximation, which handles the ties of discrete ranks)."""
    from scipy import stats

    d = d[d != 0]
    if d.size < 2:
        return 1.0
    return float(stats.wilcoxon(d, method="approx").pvalue)


@dataclass
class SBCResult:
    """Ranks of the true function values among each guide's draws, per replication.

    ``ranks[name]``: ``(R, Q)`` integers in ``0 .. num_samples`` (``R`` replications, ``Q``
    function values: test inputs times outputs or classes); ``truth``: ``(R, Q)`` the true
    values; ``quantities``: a label per column; ``seconds[name]``: fitting and drawing time per
    replication.
    """

    ranks: dict[str, np.ndarray]
    num_samples: int
    truth: np.ndarray
    quantities: list[str]
    seconds: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_replications(self) -> int:
        return int(self.truth.shape[0])

    def histogram(self, name: str, bins: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rank counts of guide ``name`` over all quantities ``(bins,)`` and their expected
        share under uniform ranks ``(bins,)``."""
        n = self.num_samples + 1
        bins = bins or _default_bins(self.num_replications, n)
        counts, share = _bin_counts(self.ranks[name], n, bins)
        return counts.sum(axis=0), share

    def table(self, bins: int | None = None) -> pd.DataFrame:
        """One row per guide: ``pvalue, rank_spread, rank_bias, vsbc_asymmetry, vsbc_pvalue``
        (see :mod:`pyro_dropout.diagnostics.sbc`), ``replications``, ``bins``, ``seconds``
        (mean per replication)."""
        from scipy import stats

        n = self.num_samples + 1
        r = self.num_replications
        bins = bins or _default_bins(r, n)
        rows = {}
        for name, ranks in self.ranks.items():
            q = ranks.shape[1]
            counts, share = _bin_counts(ranks, n, bins)
            expected = r * share[None, :]
            chi2 = ((counts - expected) ** 2 / expected).sum(axis=1)
            p_chi2 = stats.chi2.sf(chi2, df=bins - 1)
            u = (ranks + 0.5) / n
            ks = [stats.ks_2samp(u[:, j], 1.0 - u[:, j]).statistic for j in range(q)]
            p_sym = [_symmetry_pvalue(u[:, j] - 0.5) for j in range(q)]
            rows[name] = {
                "pvalue": float(min(1.0, q * p_chi2.min())),
                "rank_spread": float(np.mean(np.abs(u - 0.5)) / 0.25),
                "rank_bias": float(np.mean(u) - 0.5),
                "vsbc_asymmetry": float(max(ks)),
                "vsbc_pvalue": float(min(1.0, q * min(p_sym))),
                "replications": r,
                "bins": bins,
                "seconds": float(np.mean(self.seconds[name])) if name in self.seconds else np.nan,
            }
        return pd.DataFrame.from_dict(rows, orient="index")

    def plot(self, bins: int | None = None, path: Any = None) -> Any:
        """:func:`plot_sbc_ranks` of this result."""
        return plot_sbc_ranks(self, bins=bins, path=path)


def plot_sbc_ranks(
    result: SBCResult, *, bins: int | None = None, ncols: int | None = None, path: Any = None
) -> Any:
    """Rank histograms, one panel per guide: counts of the ranks of every quantity in
    ``bins`` equal bins, the count uniform ranks give (line) and its 99 % band for
    independent ranks (grey; ranks of one replication's quantities are dependent, so the
    band is a guide to the eye, the table's ``pvalue`` the test). Returns the Figure.

    Example:
        >>> fig = plot_sbc_ranks(result, path="sbc.png")  # doctest: +SKIP
    """
    from scipy import stats

    from .plots import _finish, _panels

    table = result.table(bins)
    fig, axes = _panels(len(result.ranks), ncols, (4.0, 3.0))
    for ax, name in zip(axes, result.ranks, strict=True):
        counts, share = result.histogram(name, bins)
        total = counts.sum()
        k = np.arange(len(counts))
        lo, hi = stats.binom.ppf([0.005, 0.995], total, share[:, None]).T
        ax.fill_between(
            np.r_[k, k[-1] + 1] - 0.5,
            np.r_[lo, lo[-1]],
            np.r_[hi, hi[-1]],
            step="post",
            color="0.85",
            label="99 % band",
        )
        ax.bar(k, counts, width=0.9, color="C0", alpha=0.8, label="ranks")
        ax.step(
            np.r_[k, k[-1] + 1] - 0.5,
            np.r_[share, share[-1]] * total,
            where="post",
            color="C3",
            lw=1,
            label="uniform",
        )
        row = table.loc[name]
        ax.set_title(
            f"{name}: p = {row['pvalue']:.2g}, spread {row['rank_spread']:.2f}",
            fontsize="medium",
        )
        ax.set_xlabel(f"rank bin (L = {result.num_samples} draws)")
        ax.set_ylabel("count")
    axes[0].legend(fontsize="x-small", loc="upper right")  # fixed: "best" is timed (plots.py)
    return _finish(fig, path)


# --------------------------------------------------------------------------------------------
# The procedure
# --------------------------------------------------------------------------------------------
@dataclass
class _Spec:
    model: Any
    factories: dict[str, Callable[[Any], Any]]
    x: torch.Tensor
    x_test: torch.Tensor
    obs_name: str
    num_samples: int
    num_steps: int
    fit_kwargs: dict[str, Any]
    seed: int
    folder: str | None
    dtype: torch.dtype


def _seed(seed: int, r: int) -> int:
    return int(np.random.SeedSequence([seed, r]).generate_state(1)[0])


def _function_values(values: dict) -> torch.Tensor:
    """The function values of one data set's draws, ``(S, Q)``: the predictive mean, or the
    class probabilities."""
    for key in ("_mean", "_probs"):
        if key in values:
            v = values[key]
            return v.reshape(v.shape[0], -1).to(torch.float64)
    raise ValueError(
        "the observed site has neither a mean (regression) nor enumerable class probabilities; "
        "SBC ranks function values"
    )


def _ranks(draws: np.ndarray, truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    below = (draws < truth[None]).sum(axis=0)
    ties = (draws == truth[None]).sum(axis=0)
    return below + rng.integers(0, ties + 1)


def _replicate(r: int, spec: _Spec) -> dict[str, Any]:
    """One replication: simulate, fit every guide, rank. Writes ``rep_<r>.npz`` to the folder."""
    seed = _seed(spec.seed, r)
    pyro.set_rng_seed(seed)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        sim = run_draws(
            spec.model,
            prior_guide(spec.model, spec.obs_name),
            [((spec.x,), {}), ((spec.x_test,), {})],
            1,
            obs_name=spec.obs_name,
            pointwise=True,
            vectorize=False,
        )
    y = sim.values[0]["_y_rep"][0]
    truth = _function_values(sim.values[1])[0].numpy()
    out: dict[str, Any] = {"truth": truth}
    for name, factory in spec.factories.items():
        start = time.perf_counter()
        with pyro.get_param_store().scope():
            guide = factory(spec.model)
            if spec.num_steps > 0:
                fit(spec.model, guide, spec.x, y, num_steps=spec.num_steps, **spec.fit_kwargs)
            d = draw_posterior(
                spec.model,
                guide,
                spec.x,
                y,
                spec.num_samples,
                x_test=spec.x_test,
                obs_name=spec.obs_name,
            )
        test = d.test
        assert test is not None  # draw_posterior was given x_test
        f = test.mean if test.mean is not None else test.probs
        if f is None:
            raise ValueError("the fitted guide's predictive has no function values to rank")
        f = f.reshape(f.shape[0], -1)
        out[f"ranks/{name}"] = _ranks(f, truth, rng)
        out[f"seconds/{name}"] = time.perf_counter() - start
    if spec.folder is not None:
        path = Path(spec.folder) / f"rep_{r:05d}.npz"
        tmp = path.with_suffix(".tmp.npz")
        arrays = {k.replace("/", "__"): np.asarray(v) for k, v in out.items()}
        np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
        os.replace(tmp, path)
    return out


def _load(path: Path) -> dict[str, Any]:
    with np.load(path) as f:
        return {k.replace("__", "/"): f[k] for k in f.files}


def _worker_init(dtype: torch.dtype) -> None:
    torch.set_num_threads(1)
    torch.set_default_dtype(dtype)


def _config(spec: _Spec, num_replications: int) -> dict[str, Any]:
    digest = hashlib.sha256()
    for a in (spec.x, spec.x_test):
        digest.update(a.detach().cpu().to(torch.float64).numpy().tobytes())
    return {
        "guides": list(spec.factories),
        "num_samples": spec.num_samples,
        "num_steps": spec.num_steps,
        "fit_kwargs": json.dumps(spec.fit_kwargs, sort_keys=True, default=str),
        "seed": spec.seed,
        "obs_name": spec.obs_name,
        "data_sha256": digest.hexdigest(),
        "model": getattr(spec.model, "__name__", type(spec.model).__name__),
    }


@one_warning_per_model()  # every replication refits and redraws the one model
def simulation_based_calibration(
    model: Any,
    guide_factory: Callable[[Any], Any] | Mapping[str, Callable[[Any], Any]],
    x: Any,
    x_test: Any,
    *,
    num_replications: int = 20,
    num_samples: int = 99,
    num_steps: int = 300,
    fit_kwargs: Mapping[str, Any] | None = None,
    obs_name: str | None = None,
    processes: int | None = None,
    folder: Any = None,
    seed: int = 0,
) -> SBCResult:
    """Simulation-based calibration of one or several guides on ``model`` (see
    :mod:`pyro_dropout.diagnostics.sbc`): per replication, parameters drawn from the prior, a
    training set simulated at ``x``, each guide fitted on it and the true function values at
    ``x_test`` ranked among ``num_samples`` draws of the fitted guide.

    Args:
        model: any Pyro model ``model(x, y=None)`` with proper priors (they are sampled).
        guide_factory: ``factory(model) -> guide`` (e.g. ``AutoMeanField``), or a dict
            ``{name: factory}`` fitted on the same simulated data sets. A fresh guide per
            replication, in a parameter store of its own (the caller's is left untouched).
        x: training inputs of every simulated data set.
        x_test: the inputs whose function values are ranked (a handful: the p-value is
            Bonferroni-corrected over them).
        num_replications: ``R``, simulated data sets.
        num_samples: ``L`` guide draws per replication (ranks ``0 .. L``).
        num_steps: SVI steps of :func:`pyro_dropout.fit` per fit; ``0``: no fitting (a guide
            with a closed form, e.g. :class:`ExactPosteriorGuide`).
        fit_kwargs: more arguments of :func:`pyro_dropout.fit` (default ``lr=0.01,
            progress=False``).
        obs_name: the likelihood site (found by
            :func:`~pyro_dropout.diagnostics.sampling.find_obs_site` when None).
        processes: run the replications in this many spawned worker processes (one torch
            thread each); None or 1: in this process.
        folder: write each replication there (``rep_00000.npz`` ..., and ``sbc.json`` with the
            settings) and reuse those already present: an interrupted run resumes. The
            settings must match the folder's.
        seed: replication ``r`` is seeded from ``(seed, r)``.

    Returns:
        :class:`SBCResult`; ``result.table()`` the statistics, ``result.plot()`` the rank
        histograms.

    Raises:
        ValueError: bad sizes, a folder written with other settings, an improper prior.

    Example:
        >>> model = ConjugateLinearRegression(2)
        >>> x = torch.randn(20, 2); x_test = torch.randn(3, 2)
        >>> res = simulation_based_calibration(
        ...     model, {"exact": ExactPosteriorGuide}, x, x_test, num_steps=0,
        ...     num_replications=10, num_samples=19)
        >>> res.ranks["exact"].shape
        (10, 3)
    """
    if int(num_replications) < 1 or int(num_samples) < 1 or int(num_steps) < 0:
        raise ValueError(
            "num_replications and num_samples must be >= 1 and num_steps >= 0; got "
            f"{num_replications}, {num_samples}, {num_steps}"
        )
    if callable(guide_factory) and not isinstance(guide_factory, Mapping):
        factories = {_factory_name(guide_factory, model): guide_factory}
    elif isinstance(guide_factory, Mapping) and guide_factory:
        factories = dict(guide_factory)
    else:
        raise ValueError("guide_factory must be a callable or a non-empty dict of them")
    xm, xt = as_model_input(x, model, "x"), as_model_input(x_test, model, "x_test")
    spec = _Spec(
        model=model,
        factories=factories,
        x=xm,
        x_test=xt,
        obs_name=obs_name or find_obs_site(model, xm),
        num_samples=int(num_samples),
        num_steps=int(num_steps),
        fit_kwargs={"lr": 0.01, "progress": False, **dict(fit_kwargs or {})},
        seed=int(seed),
        folder=None if folder is None else str(folder),
        dtype=torch.get_default_dtype(),
    )
    done: dict[int, dict[str, Any]] = {}
    if folder is not None:
        done = _open_folder(Path(folder), _config(spec, num_replications), num_replications)
    todo = [r for r in range(int(num_replications)) if r not in done]
    if processes is not None and int(processes) > 1 and len(todo) > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=int(processes),
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(spec.dtype,),
        ) as pool:
            results = pool.map(functools.partial(_replicate, spec=spec), todo)
            for r, out in zip(todo, results, strict=True):
                done[r] = out
    else:
        for r in todo:
            done[r] = _replicate(r, spec)
    reps = [done[r] for r in range(int(num_replications))]
    q = reps[0]["truth"].shape[0]
    return SBCResult(
        ranks={n: np.stack([rep[f"ranks/{n}"] for rep in reps]).astype(int) for n in factories},
        num_samples=int(num_samples),
        truth=np.stack([rep["truth"] for rep in reps]),
        quantities=[f"f_{j}" for j in range(q)],
        seconds={n: np.array([float(rep[f"seconds/{n}"]) for rep in reps]) for n in factories},
    )


def _factory_name(factory: Any, model: Any) -> str:
    name = getattr(factory, "__name__", None)
    if isinstance(factory, functools.partial):
        name = getattr(factory.func, "__name__", None)
    return name or guide_info(factory)[0]


def _open_folder(folder: Path, config: dict[str, Any], num_replications: int) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    meta = folder / "sbc.json"
    if meta.exists():
        old = json.loads(meta.read_text())
        if old != config:
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            raise ValueError(
                f"{folder} holds an SBC run with other settings ({', '.join(diff)} differ); "
                "use another folder or the same settings"
            )
    else:
        meta.write_text(json.dumps(config, indent=1, sort_keys=True))
    return {
        r: _load(folder / f"rep_{r:05d}.npz")
        for r in range(num_replications)
        if (folder / f"rep_{r:05d}.npz").exists()
    }
