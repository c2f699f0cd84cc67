"""Export fits that are not one guide: MCMC draws (``pyro.infer.MCMC`` or a samples dict) and
ensembles of fits (deep ensembles of MAP fits), in the layout of
:func:`~pyro_dropout.diagnostics.to_inference_data`.

Both reuse the guide machinery (:func:`~pyro_dropout.diagnostics.sampling.draw_posterior`):

* **MCMC draws** are fed to the model through a guide that emits the stored draws in order
  (:class:`SamplesGuide`, a ``Delta`` per latent site), so the pointwise log-likelihood, the
  predictive draws and means and ``log p(theta, D)`` are computed exactly as for a variational
  fit. Chains are kept as the ``chain`` dimension.
* **Ensembles** are exported member by member (draws split as evenly as possible) and
  concatenated into one chain; ``sample_stats.member`` records which member each draw came from.

Neither has a density ``q(theta)``: ``sample_stats.lq`` is NaN and the attribute
``q_density`` says why, so :func:`~pyro_dropout.diagnostics.vi_diagnostic` reports the VI
k-hat as NaN with that reason instead of a number that would mean nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pyro
import pyro.distributions as dist
import torch
import xarray as xr
from pyro import poutine
from pyro.poutine.runtime import get_plates
from pyro.poutine.util import site_is_subsample

from .._version import __version__
from ..handlers import weight_draws
from ..infer.data import as_model_input
from ..infer.draws import _DRAW_PLATE, NotVectorizable
from ..infer.draws.run import checking, one_warning_per_model, warn_fallback
from . import _arviz_compat as compat
from .groups import build_groups, guide_info
from .sampling import Draws, PredictiveDraws, check_inputs, draw_posterior

__all__ = [
    "SamplesGuide",
    "ensemble_inference_data",
    "mcmc_samples",
    "samples_inference_data",
]

#: ``q_density`` attribute of MCMC exports.
MCMC_NO_Q = "none: MCMC draws have no density q(theta); the VI k-hat does not apply"
#: ``q_density`` attribute of ensemble exports.
ENSEMBLE_NO_Q = (
    "none: an ensemble is a mixture of its members' fits (point masses for MAP members); "
    "no density q(theta) is computed, the VI k-hat does not apply"
)


class SamplesGuide:
    """A guide that replays stored draws, one per call (or ``c`` per call inside the draw
    plate of :func:`~pyro_dropout.infer.draws.run_draws`), in order.

    Each latent site is emitted as ``Delta(value, event_dim=...)`` with the event dimension
    the site has in the model, so a vectorised pass lays the draws out as the model's own
    plates expect. ``cursor`` counts the draws handed out; the exporter checks that every
    draw was used exactly once.

    :param samples: ``{site: tensor of shape (S, *value_shape)}`` (constrained values, as
        ``MCMC.get_samples()`` returns them).
    :param event_dims: ``{site: event_dim in the model}``.
    """

    def __init__(self, samples: Mapping[str, torch.Tensor], event_dims: Mapping[str, int]):
        self.samples = dict(samples)
        self.event_dims = dict(event_dims)
        self.num_draws = int(next(iter(self.samples.values())).shape[0])
        self.cursor = 0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        frame = next((f for f in get_plates() if f.name == _DRAW_PLATE), None)
        c = 1 if frame is None else frame.size
        if self.cursor + c > self.num_draws:
            raise RuntimeError(f"SamplesGuide asked for draw {self.cursor + c} of {self.num_draws}")
        for name, values in self.samples.items():
            event_dim = self.event_dims[name]
            if frame is None:
                value = values[self.cursor]
            else:
                # (c, *shape) -> (c, 1, ..., 1, *shape) with c at the draw plate's dim
                chunk = values[self.cursor : self.cursor + c]
                batch_ndim = chunk.dim() - 1 - event_dim
                pad = -frame.dim - 1 - batch_ndim
                value = chunk.reshape((c,) + (1,) * pad + tuple(chunk.shape[1:]))
            pyro.sample(name, dist.Delta(value, event_dim=event_dim))
        if not checking():  # the vectorisation check's draw is discarded: not used up
            self.cursor += c


def mcmc_samples(mcmc: Any) -> tuple[dict[str, torch.Tensor], int]:
    """``({site: (C * D, ...)}, C)`` from a ``pyro.infer.MCMC`` object after ``run``, chains
    concatenated in order (chain 0's draws first)."""
    grouped = mcmc.get_samples(group_by_chain=True)
    if not grouped:
        raise ValueError("the MCMC object has no samples: call mcmc.run(...) first")
    num_chains = int(next(iter(grouped.values())).shape[0])
    return {k: v.reshape((-1, *v.shape[2:])) for k, v in grouped.items()}, num_chains


def _event_dims(model: Any, samples: Mapping[str, torch.Tensor], x: Any, y: Any) -> dict:
    """Event dimension of each sampled site in the model (one conditioned, hidden run)."""
    first = {k: v[0] for k, v in samples.items()}
    with poutine.block(), weight_draws(), torch.no_grad():
        tr = poutine.trace(poutine.condition(model, data=first)).get_trace(x, y)
    missing = [k for k in samples if k not in tr.nodes or tr.nodes[k]["type"] != "sample"]
    if missing:
        sites = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
        raise ValueError(f"samples name sites {missing} that the model lacks; its sites: {sites}")
    latent = [
        n
        for n, s in tr.nodes.items()
        if s["type"] == "sample"
        and not s["is_observed"]
        and not s["infer"].get("_deterministic", False)
        and not site_is_subsample(s)
        and n not in samples
    ]
    if latent:
        raise ValueError(
            f"the samples lack the model's latent sites {latent}: pass draws of every latent site"
        )
    return {k: int(tr.nodes[k]["fn"].event_dim) for k in samples}


def _as_sample_dict(samples: Any, num_chains: int | None) -> tuple[dict, int]:
    if hasattr(samples, "get_samples"):  # pyro.infer.MCMC
        if num_chains is not None:
            raise ValueError("num_chains is read from the MCMC object; do not pass it")
        return mcmc_samples(samples)
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError(
            "samples must be a pyro.infer.MCMC object or a non-empty dict {site: draws}; got "
            f"{type(samples).__name__}"
        )
    out = {
        k: torch.as_tensor(np.asarray(v)) if not torch.is_tensor(v) else v
        for k, v in samples.items()
    }
    sizes = {k: int(v.shape[0]) for k, v in out.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every site needs the same number of draws; got {sizes}")
    num_chains = 1 if num_chains is None else int(num_chains)
    total = next(iter(sizes.values()))
    if num_chains < 1 or total % num_chains:
        raise ValueError(f"{total} draws cannot be split into num_chains={num_chains} chains")
    return out, num_chains


def _split_chains(ds: xr.Dataset, num_chains: int) -> xr.Dataset:
    """A group of one chain of ``C * D`` draws as ``C`` chains of ``D`` draws."""
    if "chain" not in ds.dims or num_chains == 1:
        return ds
    d = ds.sizes["draw"] // num_chains
    data_vars = {}
    for name, da in ds.data_vars.items():
        v = da.values.reshape((num_chains, d, *da.shape[2:]))
        data_vars[name] = (da.dims, v, da.attrs)
    coords = {k: v for k, v in ds.coords.items() if k not in ("chain", "draw")}
    coords.update(chain=np.arange(num_chains), draw=np.arange(d))
    return xr.Dataset(data_vars, coords=coords, attrs=ds.attrs)


def _base_attrs(model: Any, family: str, config: dict, obs_name: str, task: str, n: int) -> dict:
    return {
        "guide_family": family,
        "guide_config": json.dumps(config, sort_keys=True, default=str),
        "model_name": getattr(model, "__name__", type(model).__name__),
        "obs_name": obs_name,
        "task": task,
        "num_samples": int(n),
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(),
        "inference_library": "pyro",
        "inference_library_version": pyro.__version__,
        "pyro_dropout_version": __version__,
        "arviz_version": compat.ARVIZ_VERSION,
    }


@one_warning_per_model()
def samples_inference_data(
    model: Any,
    samples: Any,
    x: Any,
    y: Any,
    x_test: Any = None,
    y_test: Any = None,
    *,
    num_chains: int | None = None,
    obs_name: str | None = None,
    family: str = "NUTS",
    config: Mapping[str, Any] | None = None,
    sample_stats: Mapping[str, np.ndarray] | None = None,
    attrs: Mapping[str, Any] | None = None,
    parallel: bool | str = "auto",
    seed: int | None = None,
) -> Any:
    """Export posterior draws (e.g. from ``pyro.infer.MCMC``) in the layout of
    :func:`~pyro_dropout.diagnostics.to_inference_data`, with one ``chain`` per MCMC chain.

    The model is replayed on every draw (a :class:`SamplesGuide` emits them), so the groups are
    computed by the same code as for a variational fit: pointwise log-likelihood, predictive
    draws and per-draw means (regression) or class probabilities (classification), on the
    training data and on ``x_test``. ``sample_stats.lq`` is NaN (no density ``q``) and the
    attribute ``q_density`` says so; the VI k-hat is then reported as NaN with that reason.

    Args:
        model: the Pyro model the draws belong to, ``model(x, y=None)``.
        samples: a ``pyro.infer.MCMC`` object after ``run`` (chains read from it) or a dict
            ``{site: draws}`` of shape ``(C * D, *value_shape)``, chains one after the other,
            covering every latent site of the model (constrained values).
        x, y, x_test, y_test: as in :func:`~pyro_dropout.diagnostics.to_inference_data`.
        num_chains: ``C`` for a samples dict (default 1).
        obs_name: the observed site (found when omitted).
        family, config: recorded as ``guide_family`` / ``guide_config``.
        sample_stats: extra per-draw arrays of shape ``(C, D)`` (e.g. ``diverging``).
        attrs: extra root attributes.
        parallel: ``"auto"`` (vectorised where the model broadcasts), ``True`` or ``False``.
        seed: if given, ``pyro.set_rng_seed(seed)`` first (the predictive draws are random).

    Example:
        >>> mcmc = MCMC(NUTS(model), num_samples=200, warmup_steps=200, num_chains=2)
        ...  # doctest: +SKIP
        >>> mcmc.run(x, y)  # doctest: +SKIP
        >>> idata = samples_inference_data(model, mcmc, x, y, x_test=xt, y_test=yt)
        ...  # doctest: +SKIP
    """
    if seed is not None:
        pyro.set_rng_seed(seed)
    draws_dict, num_chains = _as_sample_dict(samples, num_chains)
    total = int(next(iter(draws_dict.values())).shape[0])
    check_inputs(x, y, x_test, y_test, total)
    xm, ym = as_model_input(x, model, "x"), as_model_input(y, model, "y")
    draws_dict = {
        k: v.to(xm.dtype) if torch.is_floating_point(v) else v for k, v in draws_dict.items()
    }
    event_dims = _event_dims(model, draws_dict, xm, ym)
    modes = [True, False] if parallel == "auto" else [parallel]
    for mode in modes:
        guide = SamplesGuide(draws_dict, event_dims)
        try:
            draws = draw_posterior(
                model, guide, x, y, total, x_test, y_test, obs_name=obs_name, parallel=mode
            )
        except NotVectorizable as e:
            if mode is True and parallel == "auto":
                # the failed pass used up stored draws: start again, one draw per pass
                warn_fallback(
                    f"{e.reason}. Replaying the draws one per pass instead: the same numbers, "
                    "one model run per draw. parallel=False skips the vectorised pass and "
                    "this warning.",
                    model,
                )
                continue
            raise
        break
    if guide.cursor != total:  # every stored draw used exactly once, in order
        raise RuntimeError(f"{guide.cursor} of {total} draws were replayed; expected all")
    draws.log_q = np.full(total, np.nan)
    attrs = {
        **_base_attrs(model, family, dict(config or {}), draws.obs_name, draws.task, total),
        "num_chains": int(num_chains),
        "q_density": MCMC_NO_Q,
        "improper_prior_sites": json.dumps(draws.improper_prior_sites),
        **dict(attrs or {}),
    }
    groups = build_groups(draws, x, y, x_test, y_test, draws.obs_name, attrs=attrs)
    groups = {k: _split_chains(v, num_chains) for k, v in groups.items()}
    stats = groups["sample_stats"]
    stats["lq"].attrs["description"] = "NaN: MCMC draws have no density q(theta)"
    for name, arr in (sample_stats or {}).items():
        stats[name] = (("chain", "draw"), np.asarray(arr).reshape(num_chains, -1))
    return compat.build(groups, attrs)


def _concat(parts: Sequence[np.ndarray | None]) -> np.ndarray | None:
    return None if parts[0] is None else np.concatenate(cast(Sequence[np.ndarray], parts), axis=0)


def _concat_predictive(parts: Sequence[PredictiveDraws]) -> PredictiveDraws:
    return PredictiveDraws(
        y_rep=np.concatenate([p.y_rep for p in parts], axis=0),
        log_lik=_concat([p.log_lik for p in parts]),
        mean=_concat([p.mean for p in parts]),
        probs=_concat([p.probs for p in parts]),
    )


def _member_counts(num_samples: int, k: int) -> list[int]:
    return [num_samples // k + (i < num_samples % k) for i in range(k)]


def _check_distinct(parts: Sequence[Draws], members: Sequence[tuple[Any, Any]]) -> None:
    """Refuse members that are one fit counted twice: equal first draws, or distinct guide
    objects with one param-store name (``_pyro_name``). That is what
    Pyro's autoguides of one class give on one model (their parameters are named
    ``<ClassName>.<site>`` in the global param store, so every ``AutoDelta(model)`` reads and
    trains the same values)."""
    firsts = [np.concatenate([p.latents[k][0].ravel() for k in sorted(p.latents)]) for p in parts]
    # PyroModule guides draw their parameters from the param store under their own name:
    # equal names are shared parameters (also for stochastic guides, whose draws differ)
    names = [getattr(g, "_pyro_name", None) for _, g in members]
    for i in range(len(parts)):
        for j in range(i):
            shared = (
                names[i] is not None and names[i] == names[j] and members[i][1] is not members[j][1]
            )
            if shared or np.array_equal(firsts[i], firsts[j]):
                raise ValueError(
                    f"ensemble members {j} and {i} are the same fit (identical draws, or guides "
                    f"sharing the param-store name {names[i]!r}). "
                    "Pyro's autoguides of one class on one model share their parameters through "
                    "the param store (names '<ClassName>.<site>'); give each member its own "
                    "class name, e.g. guide = type(f'AutoDelta{k}', (AutoDelta,), {})(model), "
                    f"and fit each. Members: {[guide_info(g)[0] for _, g in members]}"
                )


@one_warning_per_model()
def ensemble_inference_data(
    members: Sequence[tuple[Any, Any]],
    x: Any,
    y: Any,
    num_samples: int = 500,
    x_test: Any = None,
    y_test: Any = None,
    *,
    obs_name: str | None = None,
    parallel: bool | str = "auto",
    family: str = "ensemble",
    seed: int | None = None,
) -> Any:
    """Export an ensemble of fits (e.g. a deep ensemble: ``AutoDelta`` MAP fits from different
    initialisations) as one fit whose draws are split across the members.

    Member ``k`` of ``K`` contributes ``num_samples // K`` draws (the first
    ``num_samples % K`` one more), drawn with
    :func:`~pyro_dropout.diagnostics.sampling.draw_posterior`: the ensemble's predictive
    distribution is the equal-weight mixture of the members' (Lakshminarayanan et al. 2017,
    "Simple and scalable predictive uncertainty estimation using deep ensembles"; read as
    Bayesian model averaging by Wilson & Izmailov 2020). The layout is that of
    :func:`~pyro_dropout.diagnostics.to_inference_data` with one chain;
    ``sample_stats.member`` holds each draw's member index. There is no density ``q``:
    ``sample_stats.lq`` is NaN and the VI k-hat is reported as NaN with the reason.

    Pyro's autoguides are named after their class in the param store, so two
    ``AutoDelta(model)`` share one set of parameters; give each member its own class name
    (``type(f"AutoDelta{k}", (AutoDelta,), {})(model)``). Members whose first draws coincide,
    or whose guides share a param-store name, are refused with that advice.

    Args:
        members: ``[(model, guide), ...]`` (at least two; every member's model must have the
            same latent sites).
        num_samples: total number of draws (at least one per member).
        x, y, x_test, y_test, obs_name, parallel, seed: as in
            :func:`~pyro_dropout.diagnostics.to_inference_data`.
        family: recorded as ``guide_family``.

    Example:
        >>> idata = ensemble_inference_data([(model, g) for g in map_guides], x, y, 500)
        ...  # doctest: +SKIP
    """
    members = list(members)
    if len(members) < 2 or not all(
        isinstance(m, tuple) and len(m) == 2 and all(callable(f) for f in m) for m in members
    ):
        raise ValueError("members must be a list of at least two (model, guide) tuples")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
        raise ValueError(f"num_samples must be an integer; got {num_samples!r}")
    if num_samples < len(members):
        raise ValueError(
            f"num_samples={num_samples} gives some of the {len(members)} members no draw"
        )
    if seed is not None:
        pyro.set_rng_seed(seed)
    counts = _member_counts(int(num_samples), len(members))
    parts = [
        draw_posterior(m, g, x, y, n, x_test, y_test, obs_name=obs_name, parallel=parallel)
        for (m, g), n in zip(members, counts, strict=True)
    ]
    names = [sorted(p.latents) for p in parts]
    if any(n != names[0] for n in names):
        raise ValueError(f"the members' latent sites differ: {names}")
    _check_distinct(parts, members)
    draws = Draws(
        latents={k: np.concatenate([p.latents[k] for p in parts]) for k in parts[0].latents},
        train=_concat_predictive([p.train for p in parts]),
        log_joint=np.concatenate([p.log_joint for p in parts]),
        log_q=np.full(int(num_samples), np.nan),
        task=parts[0].task,
        test=None
        if parts[0].test is None
        else _concat_predictive(cast(list[PredictiveDraws], [p.test for p in parts])),
        latent_names=parts[0].latent_names,
        obs_name=parts[0].obs_name,
        improper_prior_sites=parts[0].improper_prior_sites,
    )
    member_families = [guide_info(g)[0] for _, g in members]
    attrs = {
        **_base_attrs(
            members[0][0],
            family,
            {"members": member_families},
            draws.obs_name,
            draws.task,
            num_samples,
        ),
        "num_members": len(members),
        "q_density": ENSEMBLE_NO_Q,
        "improper_prior_sites": json.dumps(draws.improper_prior_sites),
    }
    groups = build_groups(draws, x, y, x_test, y_test, draws.obs_name, attrs=attrs)
    member = np.repeat(np.arange(len(members)), counts)
    groups["sample_stats"]["member"] = (("chain", "draw"), member[None])
    groups["sample_stats"]["lq"].attrs["description"] = "NaN: an ensemble has no density q"
    return compat.build(groups, attrs)
