"""Draw weights from a guide and replay the model on them (the Pyro half of the export).

For each draw :math:`\\theta_s \\sim q` (one run of the guide) the model is replayed on the
training data with :func:`pyro.poutine.replay` under :func:`pyro.poutine.trace`, which gives

* the pointwise log-likelihood :math:`\\log p(y_i \\mid \\theta_s)` (``site["fn"].log_prob``
  of the observed site, unscaled: every row of a subsampled plate is visited);
* a posterior-predictive draw :math:`\\tilde y_s \\sim p(y \\mid \\theta_s)` and, per draw, the
  conditional mean (regression) or class probabilities (classification);
* :math:`\\log p(\\theta_s, D) = \\log p(\\theta_s) + \\sum_i \\log p(y_i \\mid \\theta_s)` (the
  latent sites' priors plus the pointwise log-likelihood) and :math:`\\log q(\\theta_s)` (the
  guide trace's log density), which the VI diagnostic of Yao et al. (2018) needs.

Draws are weight draws, also inside an enclosing ``local_reparameterization()`` block.

The prior is drawn the same way (:func:`draw_prior`): :func:`prior_guide` turns the model
into a "guide" that runs the model itself with its observations hidden, so every latent site
is drawn from the prior as written in the model (this library's layers, ``pyro.sample`` sites
of the user's own) and the model replayed on those draws gives the prior predictive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from ..handlers import weight_draws
from ..infer.conform import check_guide_matches, conform_data
from ..infer.draws import run_draws

__all__ = [
    "Draws",
    "PredictiveDraws",
    "draw_posterior",
    "draw_prior",
    "find_obs_site",
    "prior_guide",
]


@dataclass
class PredictiveDraws:
    """Per-draw quantities of the observed site on one data set (``S`` draws, ``N`` rows)."""

    y_rep: np.ndarray  # (S, N, *event)
    log_lik: np.ndarray | None = None  # (S, N); None when y was not given
    mean: np.ndarray | None = None  # (S, N, *event): E[y | theta_s, x] (regression)
    probs: np.ndarray | None = None  # (S, N, K): p(y = k | theta_s, x) (classification)


@dataclass
class Draws:
    """Everything :func:`draw_posterior` extracts, as numpy arrays with draws first."""

    latents: dict[str, np.ndarray]  # site -> (S, *site_shape)
    train: PredictiveDraws
    log_joint: np.ndarray  # (S,) log p(theta_s, D)
    log_q: np.ndarray  # (S,) log q(theta_s)
    task: str  # "regression" or "classification"
    test: PredictiveDraws | None = None
    latent_names: list[str] = field(default_factory=list)
    obs_name: str = "obs"  # the observed site
    improper_prior_sites: list[str] = field(default_factory=list)


def _num_rows(a: Any, name: str) -> int:
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(f"{name} must be an array with one row per observation; got {type(a)}")
    return int(shape[0])


def check_inputs(x: Any, y: Any, x_test: Any, y_test: Any, num_samples: Any) -> None:
    """Raise ``ValueError`` on bad sizes (see :func:`draw_posterior`)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
        raise ValueError(f"num_samples must be an integer >= 1; got {num_samples!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    if y is None:
        raise ValueError("y (the training targets) is required to compute log-likelihoods")
    if _num_rows(x, "x") != _num_rows(y, "y"):
        raise ValueError(
            f"x and y must have the same number of rows; got {x.shape[0]} and {y.shape[0]}"
        )
    if y_test is not None and x_test is None:
        raise ValueError("y_test was given without x_test")
    if x_test is not None and y_test is not None:
        if _num_rows(x_test, "x_test") != _num_rows(y_test, "y_test"):
            raise ValueError(
                "x_test and y_test must have the same number of rows; got "
                f"{x_test.shape[0]} and {y_test.shape[0]}"
            )


@torch.no_grad()
def draw_posterior(
    model: Any,
    guide: Any,
    x: Any,
    y: Any,
    num_samples: int,
    x_test: Any = None,
    y_test: Any = None,
    var_names: Sequence[str] | None = None,
    obs_name: str | None = None,
    parallel: bool | str = "auto",
) -> Draws:
    """Run ``guide(x, y)`` ``num_samples`` times and replay ``model`` on each draw.

    Weight draws throughout: an enclosing ``local_reparameterization()`` block is blocked
    (:func:`~pyro_dropout.weight_draws`), so every recorded θ, its log densities and the
    predictive quantities belong together. Works on any Pyro model (see
    :func:`pyro_dropout.infer.draws.run_draws`): vectorised where the model broadcasts, one
    draw per pass otherwise, every row of a subsampled plate.

    Args:
        model: Pyro model ``model(x, y=None)`` with an observed site in a data plate.
        guide: any Pyro guide callable as ``guide(x, y)``.
        x, y: training inputs and targets (torch tensors or numpy arrays, rows = observations;
            floating values are cast to the model's dtype).
        num_samples: number of guide draws ``S >= 1``.
        x_test, y_test: optional held-out inputs (and targets).
        var_names: model sites to record (default: every latent site; deterministic sites
            may be named too).
        obs_name: the observed site; by default the one sample site the guide does not draw.
        parallel: ``"auto"`` (vectorised where the model broadcasts), ``True`` (vectorised
            or an error), ``False`` (one draw per pass).

    Example:
        >>> d = draw_posterior(model, guide, x, y, num_samples=100)  # doctest: +SKIP
        >>> d.train.log_lik.shape  # (100, N)  # doctest: +SKIP
    """
    check_inputs(x, y, x_test, y_test, num_samples)
    if getattr(guide, "prototype_trace", True) is None:
        raise RuntimeError(
            "to_inference_data: the guide has not been fitted (its prototype trace is empty); "
            "call fit() or run the guide once with the training data (x, y) first"
        )
    # The rule of every entry point (pyro_dropout.infer.conform): rows and finite values
    # checked, a (N, 1) target of a (N,) site reshaped, integer labels cast.
    x, y, probe, _ = conform_data(model, x, y, who="to_inference_data", obs_name=obs_name)
    check_guide_matches(probe.trace, guide, "to_inference_data")
    if x_test is not None:
        x_test, y_test, _, _ = conform_data(
            model,
            x_test,
            y_test,
            who="to_inference_data",
            x_name="x_test",
            y_name="y_test",
            obs_name=obs_name,
            finite=y_test is not None,
        )
    det = _deterministic_sites(model, guide, x, y) if var_names is not None else []
    datasets: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((x, y), {})]
    if x_test is not None:
        datasets.append(((x_test,) if y_test is None else (x_test, y_test), {}))
    run = run_draws(
        model,
        guide,
        datasets,
        int(num_samples),
        obs_name=obs_name,
        value_sites=[v for v in (var_names or ()) if v in det],
        latents=True,
        log_densities=True,
        pointwise=True,
        estimator="weights",
        vectorize=parallel,
    )
    obs = run.obs_name
    train = _predictive(run.values[0], observed=True)
    if train.log_lik is None:
        raise ValueError(f"site {obs!r} is not observed when the model is given y")
    names = _recorded_names(run, var_names, det)
    values = {**run.latents, **run.values[0]}
    latents = {v: values[v].detach().cpu().numpy() for v in names}
    log_lik_sum = train.log_lik.reshape(train.log_lik.shape[0], -1).sum(-1)
    log_joint = run.log_prior.numpy() + log_lik_sum
    task = "classification" if train.probs is not None else "regression"
    test = None
    if x_test is not None:
        test = _predictive(run.values[1], observed=y_test is not None)
    return Draws(
        latents=latents,
        train=train,
        log_joint=log_joint,
        log_q=run.log_q.numpy(),
        task=task,
        test=test,
        latent_names=list(run.latent_names),
        obs_name=obs,
        improper_prior_sites=list(run.improper_prior_sites),
    )


def _predictive(values: dict, observed: bool) -> PredictiveDraws:
    def arr(key):
        v = values.get(key)
        return None if v is None else v.detach().cpu().to(torch.float64).numpy()

    y_rep = values["_y_rep"].detach().cpu().numpy()
    log_lik = arr("_log_lik") if observed else None
    if log_lik is not None and log_lik.ndim > 2:  # several terms per row: their sum
        log_lik = log_lik.reshape(log_lik.shape[:2] + (-1,)).sum(-1)
    return PredictiveDraws(
        y_rep=y_rep,
        log_lik=log_lik,
        mean=arr("_mean"),
        probs=arr("_probs"),
    )


def _recorded_names(run, var_names, det):
    """The sites to record: every latent site by default, else ``var_names`` (latent or
    deterministic)."""
    if var_names is None:
        return list(run.latent_names)
    names = list(var_names)
    unknown = [v for v in names if v not in run.latent_names and v not in det]
    if unknown:
        raise ValueError(
            f"unknown var_names {unknown}; the model's sites are {run.latent_names + det}"
        )
    return names


def _deterministic_sites(model, guide, x, y):
    """Names of the model's ``pyro.deterministic`` sites (one weight draw, hidden)."""
    with poutine.block(), weight_draws():
        g_tr = poutine.trace(guide).get_trace(x, y)
        m_tr = poutine.trace(poutine.replay(model, trace=g_tr)).get_trace(x, y)
    return [
        n
        for n, s in m_tr.nodes.items()
        if s["type"] == "sample" and s["infer"].get("_deterministic", False)
    ]


def prior_guide(model: Any, obs_name: str | None = None) -> Any:
    """A guide that draws every latent site of ``model`` from its prior.

    It runs ``model`` itself with its observed sites (and ``obs_name``, the likelihood site
    when the model is called without targets) hidden from the trace, so a latent site's
    "guide" distribution is its prior, as written in the model. Any Pyro model works; a latent
    site with an improper prior (e.g. the log-uniform prior of variational dropout) cannot be
    drawn and raises ``ValueError``.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> def model(x, y=None):
        ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", len(x)):
        ...         return pyro.sample("obs", dist.Normal(w * x, 1.0), obs=y)
        >>> tr = pyro.poutine.trace(prior_guide(model)).get_trace(torch.ones(3), torch.ones(3))
        >>> [n for n, s in tr.nodes.items() if s["type"] == "sample"]
        ['w']
    """

    def hide(msg: dict) -> bool:
        # the model's plates stay the model's: their subsample sites are hidden too (a replay
        # on another data set, e.g. test inputs, must not get the training plate's size)
        return msg["type"] == "sample" and (
            msg["is_observed"] or msg["name"] == obs_name or site_is_subsample(msg)
        )

    def guide(*args: Any, **kwargs: Any) -> None:
        try:
            poutine.block(model, hide_fn=hide)(*args, **kwargs)
        except NotImplementedError as e:
            raise ValueError(
                "the model's prior cannot be drawn from (an improper prior, e.g. "
                f"ImproperLogUniform, has no samples): {e}. Give the model a proper prior to "
                "draw its prior predictive"
            ) from e

    guide.__name__ = "prior"
    return guide


@torch.no_grad()
def find_obs_site(model: Any, x: Any) -> str:
    """The likelihood site of ``model(x, y)``: the sample site that ``y`` observes.

    ``model(x)`` is run once without targets; each of its unobserved sample sites (last
    first) is passed back as ``y``, and the first that ``model(x, y)`` then observes is the one.

    Raises:
        ValueError: no site is observed through ``y``.
    """
    with poutine.block(), weight_draws():
        tr = poutine.trace(model).get_trace(x)
        names = [
            n
            for n, s in tr.nodes.items()
            if s["type"] == "sample" and not s["is_observed"] and not n.startswith("_")
        ]
        for name in reversed(names):
            try:
                tr2 = poutine.trace(model).get_trace(x, tr.nodes[name]["value"])
            except Exception:  # noqa: BLE001 - not the observed site (shape, type): try the next
                continue
            site = tr2.nodes.get(name)
            if site is not None and site["is_observed"]:
                return name
    raise ValueError(
        "no sample site of model(x, y) observes y; pass obs_name= (the likelihood site)"
    )


@torch.no_grad()
def draw_prior(
    model: Any,
    x: Any,
    y: Any,
    num_samples: int,
    obs_name: str | None = None,
    parallel: bool | str = "auto",
    var_names: Sequence[str] | None = None,
) -> Draws:
    """Draws from the prior of ``model`` and its prior predictive on ``x``, as :class:`Draws`.

    :func:`draw_posterior` with :func:`prior_guide` as the guide: ``latents`` are prior draws,
    ``train`` the prior predictive on ``x`` (``y_rep``; ``mean`` or ``probs``, the function
    values of each prior draw; ``log_lik`` of ``y`` under each prior draw), ``log_q`` the
    prior log density.

    Example:
        >>> d = draw_prior(model, x, y, num_samples=200)  # doctest: +SKIP
        >>> d.train.mean.shape  # (200, N, 1): prior function draws at x  # doctest: +SKIP
    """
    return draw_posterior(
        model,
        prior_guide(model, obs_name),
        x,
        y,
        num_samples,
        var_names=var_names,
        obs_name=obs_name,
        parallel=parallel,
    )
