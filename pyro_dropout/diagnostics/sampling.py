"""Draw weights from a guide and replay the model on them (the Pyro half of the export).

For each draw :math:`\\theta_s \\sim q` (one run of the guide) the model is replayed on the
training data with :func:`pyro.poutine.replay` under :func:`pyro.poutine.trace`, which gives

* the pointwise log-likelihood :math:`\\log p(y_i \\mid \\theta_s)` (``site["fn"].log_prob``
  of the observed site, unscaled: subsampling scales are ignored);
* a posterior-predictive draw :math:`\\tilde y_s \\sim p(y \\mid \\theta_s)` and, per draw, the
  conditional mean (regression) or class probabilities (classification);
* :math:`\\log p(\\theta_s, D)` (the model trace's ``log_prob_sum``) and
  :math:`\\log q(\\theta_s)` (the guide trace's ``log_prob_sum``), which the VI diagnostic of
  Yao et al. (2018) needs.

Draws are weight draws; nothing here uses the local reparameterisation trick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

__all__ = ["Draws", "PredictiveDraws", "draw_posterior"]

_DRAW_PLATE = "_pyro_dropout_draws"


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


def _as_tensor(a: Any) -> Any:
    if a is None or isinstance(a, torch.Tensor):
        return a
    if isinstance(a, np.ndarray):
        return torch.as_tensor(a)
    return a


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


def _latent_sites(trace: poutine.Trace) -> list[str]:
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not site_is_subsample(site)
        and not site["infer"].get("is_auxiliary", False)
    ]


def _recordable_sites(trace: poutine.Trace, obs_name: str) -> list[str]:
    """Latent sites plus ``pyro.deterministic`` sites (observed Delta sites)."""
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and name != obs_name
        and not site_is_subsample(site)
        and (not site["is_observed"] or site["infer"].get("_deterministic", False))
    ]


def _max_plate_nesting(*traces: poutine.Trace) -> int:
    dims = [
        -frame.dim
        for tr in traces
        for site in tr.nodes.values()
        if site["type"] == "sample"
        for frame in site["cond_indep_stack"]
        if frame.dim is not None
    ]
    return max(dims, default=0)


def _per_draw_log_prob(trace: poutine.Trace, num_draws: int, draw_dim: int | None) -> torch.Tensor:
    """Per-draw sum of the scaled, masked log densities of all sample sites of ``trace``."""
    if draw_dim is None:
        return torch.as_tensor(trace.log_prob_sum(), dtype=torch.float64).reshape(1)
    trace.compute_log_prob()
    total = torch.zeros(num_draws, dtype=torch.float64)
    for site in trace.nodes.values():
        if site["type"] != "sample" or "log_prob" not in site or site_is_subsample(site):
            continue
        lp = torch.as_tensor(site["log_prob"], dtype=torch.float64)
        while lp.dim() < -draw_dim:
            lp = lp.unsqueeze(0)
        lp = lp.movedim(lp.dim() + draw_dim, 0)
        total = total + lp.reshape(lp.shape[0], -1).sum(-1).expand(num_draws)
    return total


def _obs_site(trace: poutine.Trace, obs_name: str) -> dict:
    if obs_name not in trace.nodes or trace.nodes[obs_name]["type"] != "sample":
        sites = [n for n, s in trace.nodes.items() if s["type"] == "sample"]
        raise ValueError(f"the model has no sample site {obs_name!r}; its sample sites: {sites}")
    return trace.nodes[obs_name]


def _is_classification(fn: Any) -> bool:
    return bool(getattr(fn, "has_enumerate_support", False)) and tuple(fn.event_shape) == ()


def _predictive(
    trace: poutine.Trace, obs_name: str, n_rows: int, lead: tuple[int, ...], observed: bool
) -> PredictiveDraws:
    """Observed-site quantities from one (sequential, ``lead=()``) or vectorised trace."""
    site = _obs_site(trace, obs_name)
    fn = site["fn"]
    event = tuple(fn.event_shape)
    s = int(np.prod(lead)) if lead else 1

    def _rows(t: torch.Tensor, tail: tuple[int, ...], what: str) -> np.ndarray:
        if t.numel() != s * n_rows * int(np.prod(tail)):
            raise ValueError(
                f"{what} of site {obs_name!r} has shape {tuple(t.shape)}, expected one entry "
                f"per observation ({n_rows} rows, event shape {event}). Build the model without "
                "subsample_size and with the observation plate's batch shape ending in N "
                "(use .to_event() for multi-output likelihoods)."
            )
        return t.detach().reshape((s, n_rows) + tail).cpu().numpy()

    out = PredictiveDraws(y_rep=_rows(fn.sample(), event, "a predictive draw"))
    if observed:
        ll = fn.log_prob(site["value"])
        out.log_lik = _rows(ll.to(torch.float64), (), "the log-likelihood")
    if _is_classification(fn):
        support = fn.enumerate_support(expand=False)  # (K, 1, ..., 1)
        logp = fn.log_prob(support)  # (K, *batch)
        probs = logp.exp().to(torch.float64).movedim(0, -1)  # (*batch, K)
        out.probs = _rows(probs, (support.shape[0],), "the class probabilities")
    else:
        try:
            mean = fn.mean
        except NotImplementedError:
            mean = None
        if mean is not None and torch.isfinite(mean).all():
            out.mean = _rows(mean.expand(fn.batch_shape + fn.event_shape), event, "the mean")
    return out


def _stack(parts: list[PredictiveDraws]) -> PredictiveDraws:
    def cat(name: str) -> np.ndarray | None:
        vals = [getattr(p, name) for p in parts]
        return None if vals[0] is None else np.concatenate(vals, axis=0)

    return PredictiveDraws(
        y_rep=cat("y_rep"), log_lik=cat("log_lik"), mean=cat("mean"), probs=cat("probs")
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
    obs_name: str = "obs",
    parallel: bool = False,
) -> Draws:
    """Run ``guide(x, y)`` ``num_samples`` times and replay ``model`` on each draw.

    Args:
        model: Pyro model ``model(x, y=None)`` with observed site ``obs_name`` in a data plate.
        guide: any Pyro guide callable as ``guide(x, y)``.
        x, y: training inputs and targets (torch tensors or numpy arrays, rows = observations).
        num_samples: number of guide draws ``S >= 1``.
        x_test, y_test: optional held-out inputs (and targets).
        var_names: model sites to record (default: every latent site).
        obs_name: name of the observed sample site.
        parallel: draw all ``S`` at once inside a vectorising ``pyro.plate`` (as
            ``pyro.infer.Predictive(parallel=True)`` does); the model and guide must broadcast
            over a leading sample dimension.

    Example:
        >>> d = draw_posterior(model, guide, x, y, num_samples=100)  # doctest: +SKIP
        >>> d.train.log_lik.shape  # (100, N)  # doctest: +SKIP
    """
    check_inputs(x, y, x_test, y_test, num_samples)
    x, y, x_test, y_test = map(_as_tensor, (x, y, x_test, y_test))
    n, s = _num_rows(x, "x"), int(num_samples)
    n_test = None if x_test is None else _num_rows(x_test, "x_test")

    # One sequential probe gives site shapes, names and the plate nesting.
    probe_g = poutine.trace(guide).get_trace(x, y)
    probe_m = poutine.trace(poutine.replay(model, trace=probe_g)).get_trace(x, y)
    _obs_site(probe_m, obs_name)
    if not probe_m.nodes[obs_name]["is_observed"]:
        raise ValueError(f"site {obs_name!r} is not observed when the model is given y")
    latent_names = _latent_sites(probe_m)
    allowed = _recordable_sites(probe_m, obs_name)
    if var_names is None:
        names = latent_names
    else:
        names = list(var_names)
        unknown = [v for v in names if v not in allowed]
        if unknown:
            raise ValueError(f"unknown var_names {unknown}; the model's sites are {allowed}")
    shapes = {v: tuple(probe_m.nodes[v]["value"].shape) for v in names}
    task = "classification" if _is_classification(probe_m.nodes[obs_name]["fn"]) else "regression"

    if parallel:
        draw_dim = -(_max_plate_nesting(probe_g, probe_m) + 1)
        batches, lead = [None], (s,)
    else:
        draw_dim, batches, lead = None, range(s), ()

    latents: dict[str, list[np.ndarray]] = {v: [] for v in names}
    train, test, log_joint, log_q = [], [], [], []
    for _ in batches:
        if parallel:
            with pyro.plate(_DRAW_PLATE, s, dim=draw_dim):
                g_tr, m_tr, t_tr = _run(model, guide, x, y, x_test, y_test)
        else:
            g_tr, m_tr, t_tr = _run(model, guide, x, y, x_test, y_test)
        for v in names:
            val = m_tr.nodes[v]["value"].detach()
            latents[v].append(val.reshape((s if parallel else 1,) + shapes[v]).cpu().numpy())
        train.append(_predictive(m_tr, obs_name, n, lead, observed=True))
        if t_tr is not None:
            test.append(_predictive(t_tr, obs_name, n_test, lead, observed=y_test is not None))
        log_joint.append(_per_draw_log_prob(m_tr, s, draw_dim).cpu().numpy())
        log_q.append(_per_draw_log_prob(g_tr, s, draw_dim).cpu().numpy())

    return Draws(
        latents={v: np.concatenate(a, axis=0) for v, a in latents.items()},
        train=_stack(train),
        log_joint=np.concatenate(log_joint),
        log_q=np.concatenate(log_q),
        task=task,
        test=_stack(test) if test else None,
        latent_names=latent_names,
    )


def _run(model, guide, x, y, x_test, y_test):
    g_tr = poutine.trace(guide).get_trace(x, y)
    m_tr = poutine.trace(poutine.replay(model, trace=g_tr)).get_trace(x, y)
    t_tr = None
    if x_test is not None:
        t_tr = poutine.trace(poutine.replay(model, trace=g_tr)).get_trace(x_test, y_test)
    return g_tr, m_tr, t_tr
