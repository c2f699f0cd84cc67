"""What a run collects from its traces, draw chunk by draw chunk: the observed site's
distribution kept as its parameters (:class:`DistDraws`), recorded values, pointwise
quantities, latent values and log densities, joined into one :class:`DrawRun`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from pyro.poutine.util import site_is_subsample
from torch.distributions import Independent

from .plates import NotVectorizable, _join_rows, _site_plate_batch, _to_draws

#: Key of the observed site's predictive draws when its distribution cannot be rebuilt.
OBS_SAMPLE = "_obs_sample"


@dataclass
class DistDraws:
    """A distribution over ``S`` draws, kept as its parameters.

    ``params[k]`` has shape ``(S,) + batch_shape + param_event``; :meth:`dist` rebuilds
    ``cls(**params)`` with ``reinterpreted`` batch dims moved to the event (``.to_event``).
    """

    cls: type
    params: dict[str, torch.Tensor]
    reinterpreted: int

    def dist(self, select=None):
        """The distribution, with batch shape ``(S,) + batch_shape`` (or the draws ``select``)."""
        params = self.params if select is None else {k: v[select] for k, v in self.params.items()}
        d = self.cls(**params, validate_args=False)
        return d.to_event(self.reinterpreted) if self.reinterpreted else d

    @property
    def num_draws(self):
        return next(iter(self.params.values())).shape[0]

    def to(self, *args, **kwargs):
        params = {k: v.to(*args, **kwargs) for k, v in self.params.items()}
        return DistDraws(self.cls, params, self.reinterpreted)


@dataclass
class DrawRun:
    """What :func:`run_draws` collects, draws first."""

    obs_name: str | None
    #: per data set: the observed site's distribution, or None when it cannot be rebuilt
    obs: list
    #: per data set: ``{site: (S, ...)}`` of the requested sites (and ``"_obs_sample"``, a draw
    #: of the observed site, when its distribution cannot be rebuilt)
    values: list
    latents: dict = field(default_factory=dict)  # site -> (S, *shape)
    log_prior: torch.Tensor | None = None  # (S,) log p(theta_s), the latent sites' priors
    log_q: torch.Tensor | None = None  # (S,) log q(theta_s)
    vectorized: bool = False
    latent_names: list = field(default_factory=list)
    #: latent sites whose prior is improper (flag ``improper``), e.g. ImproperLogUniform
    improper_prior_sites: list = field(default_factory=list)
    obs_event_shape: list = field(default_factory=list)  # per data set
    #: per data set: the class name of the observed site's distribution
    obs_family: list = field(default_factory=list)


def _unwrapped(fn):
    """The family behind ``Independent``, mask and expansion wrappers."""
    while isinstance(fn, Independent) or type(fn).__name__ in (
        "MaskedDistribution",
        "ExpandedDistribution",
    ):
        fn = fn.base_dist
    return fn


def _dist_params(fn):
    """``(cls, {name: tensor}, reinterpreted)`` of a distribution, its parameters expanded to
    its batch shape; None when it cannot be rebuilt from them. Masks (training devices) and
    expansions are unwrapped."""
    depth = 0
    while isinstance(fn, Independent):
        depth += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    batch = fn.batch_shape
    while type(fn).__name__ in ("MaskedDistribution", "ExpandedDistribution"):
        fn = fn.base_dist
    cls = type(fn)
    names = [k for k in cls.arg_constraints if k not in ("probs", "logits")]
    for k in ("logits", "probs"):  # the one the distribution was built with
        if k in cls.arg_constraints and k in vars(fn):
            names.append(k)
            break
    try:
        params = {}
        for k in names:
            v = torch.as_tensor(getattr(fn, k))
            tail = v.shape[len(fn.batch_shape) :] if v.dim() > len(fn.batch_shape) else ()
            params[k] = v.expand(batch + tail)
        rebuilt = cls(**params, validate_args=False)
    except Exception:  # noqa: BLE001 - a family whose constructor takes other names
        return None
    if rebuilt.batch_shape != batch or rebuilt.event_shape != fn.event_shape:
        return None
    return cls, params, depth


class _Accumulator:
    def __init__(self, n):
        self.obs = [[] for _ in range(n)]
        self.values = [{} for _ in range(n)]
        self.latents = {}
        self.lp, self.lq = [], []

    def add(self, part):
        for i, p in enumerate(part["obs"]):
            if p is not None:
                self.obs[i].append(p)
        for i, dct in enumerate(part["values"]):
            for k, v in dct.items():
                self.values[i].setdefault(k, []).append(v)
        for k, v in part["latents"].items():
            self.latents.setdefault(k, []).append(v)
        if part["lp"] is not None:
            self.lp.append(part["lp"])
            self.lq.append(part["lq"])

    def finish(self, run, data):
        for i, d in enumerate(data):
            if self.obs[i] and d.obs != "samples":
                cls, depth, _, tails = d.obs
                params = {k: torch.cat([p[k] for p in self.obs[i]], 0) for k in tails}
                run.obs[i] = DistDraws(cls, params, depth)
            for k, lst in self.values[i].items():
                run.values[i][k] = torch.cat(lst, 0)
            run.obs_event_shape.append(d.event)
            run.obs_family.append(d.family)
        run.latents = {k: torch.cat(v, 0) for k, v in self.latents.items()}
        if self.lp:
            run.log_prior = torch.cat(self.lp, 0)
            run.log_q = torch.cat(self.lq, 0)


def _collect(data, g_tr, m_trs, c, draw_dim, nesting, opts):
    obs, value_sites, latents, log_densities, latent_names, pointwise = opts
    part = {"obs": [], "values": [], "latents": {}, "lp": None, "lq": None}
    with torch.no_grad():
        for d, passes in zip(data, m_trs, strict=True):
            pieces_obs, pieces_val = [], {}
            for keep, tr in passes:
                if obs is not None:
                    if obs not in tr.nodes:
                        raise ValueError(f"the model has no site {obs!r} on these inputs")
                    fn = tr.nodes[obs]["fn"]
                    if pointwise:
                        for key, v in _pointwise(tr.nodes[obs]).items():
                            v = _value(d, key, v, c, draw_dim, nesting)
                            pieces_val.setdefault(key, []).append((keep, v))
                    params = _obs_params(d, fn, c, draw_dim, nesting)
                    if params is None:  # not rebuildable: keep a predictive draw instead
                        v = _value(d, OBS_SAMPLE, fn.sample(), c, draw_dim, nesting)
                        pieces_val.setdefault(OBS_SAMPLE, []).append((keep, v))
                    else:
                        pieces_obs.append((keep, params))
                for name in value_sites:
                    v = _site_value(tr, name)
                    pieces_val.setdefault(name, []).append(
                        (keep, _value(d, name, v, c, draw_dim, nesting))
                    )
            part["obs"].append(_join_rows(pieces_obs, d) if pieces_obs else None)
            part["values"].append({k: _join_rows(v, d, name=k) for k, v in pieces_val.items()})
        first = m_trs[0][0][1]
        if latents:
            for name in latent_names:
                site = first.nodes[name]
                v = site["value"]
                if draw_dim is None:
                    v = v.unsqueeze(0)
                else:
                    v, _ = _to_draws(v, c, nesting, _site_plate_batch(site), site["fn"].event_shape)
                part["latents"][name] = v.detach().clone()
        if log_densities:
            part["lp"] = _per_draw_sum(
                [(first.nodes[n]["fn"], first.nodes[n]["value"]) for n in latent_names], c, draw_dim
            )
            part["lq"] = _per_draw_sum(
                [
                    (s["fn"], s["value"])
                    for s in g_tr.nodes.values()
                    if s["type"] == "sample" and not site_is_subsample(s)
                ],
                c,
                draw_dim,
            )
    return part


def _pointwise(site):
    """Per-row quantities of an observed site, read from its distribution in the trace."""
    fn = site["fn"]
    shape = fn.batch_shape + fn.event_shape
    out = {"_y_rep": fn.sample()}
    if site["is_observed"]:
        out["_log_lik"] = fn.log_prob(site["value"])
    if fn.has_enumerate_support and fn.event_shape == ():
        support = fn.enumerate_support(expand=False)  # (K, 1, ..., 1)
        out["_probs"] = fn.log_prob(support).exp().movedim(0, -1)
    elif not fn.support.is_discrete:
        try:
            mean = fn.mean
        except NotImplementedError:
            mean = None
        if mean is not None and bool(torch.isfinite(mean).all()):
            out["_mean"] = mean.expand(shape)
    return out


def _obs_params(d, fn, c, draw_dim, nesting):
    info = _dist_params(fn)
    if d.obs is None:  # the first draw fixes the layout
        d.event = tuple(fn.event_shape)
        d.family = type(_unwrapped(fn)).__name__
        if info is None:
            d.obs = "samples"
        else:
            cls, params, depth = info
            batch = tuple(fn.batch_shape)
            d.obs = (
                cls,
                depth,
                batch,
                {k: tuple(v.shape[len(batch) :]) for k, v in params.items()},
            )
    if d.obs == "samples":
        return None
    cls, depth, batch, tails = d.obs
    if info is None or info[0] is not cls:
        raise NotVectorizable(f"the observed site's distribution is not a {cls.__name__} here")
    params = info[1]
    if draw_dim is None:
        out = {}
        for k, v in params.items():
            if tuple(v.shape) != batch + tails[k]:
                raise ValueError(
                    f"the observed site's parameter {k!r} has shape {tuple(v.shape)} in one draw "
                    f"and {batch + tails[k]} in another"
                )
            out[k] = v.unsqueeze(0)
        return out
    out, varies = {}, False
    for k, v in params.items():
        out[k], vk = _to_draws(v, c, nesting, batch, tails[k])
        varies = varies or vk
    if c > 1 and not varies:
        raise NotVectorizable("the observed site's parameters do not vary over the draws")
    return out


def _site_value(tr, name):
    if name not in tr.nodes:
        sites = [n for n, s in tr.nodes.items() if s["type"] in ("sample", "return")]
        raise ValueError(f"the model has no site {name!r}; its sites: {sites}")
    v = tr.nodes[name]["value"]
    if not torch.is_tensor(v):
        raise ValueError(f"site {name!r} holds a {type(v).__name__}, not a tensor")
    return v


def _value(d, name, v, c, draw_dim, nesting):
    if draw_dim is None:
        shape = d.shapes.setdefault(name, tuple(v.shape))
        if tuple(v.shape) != shape:
            raise ValueError(
                f"site {name!r} has shape {tuple(v.shape)} in one draw, {shape} in another"
            )
        return v.unsqueeze(0)
    shape = d.shapes[name]
    lead = v.dim() - len(shape)
    if lead < 0 or tuple(v.shape[lead:]) != shape or math.prod(v.shape[:lead]) != c:
        raise NotVectorizable(
            f"site {name!r} has shape {tuple(v.shape)} for {c} draws of shape {shape}"
        )
    return v.reshape((c,) + shape)


def _per_draw_sum(sites, c, draw_dim):
    total = torch.zeros(c, dtype=torch.float64)
    for fn, value in sites:
        lp = torch.as_tensor(fn.log_prob(value)).detach().to("cpu", torch.float64)
        if draw_dim is None:
            total = total + lp.sum()
            continue
        while lp.dim() < -draw_dim:
            lp = lp.unsqueeze(0)
        lp = lp.movedim(lp.dim() + draw_dim, 0)
        total = total + lp.reshape(lp.shape[0], -1).sum(-1).expand(c)
    return total
