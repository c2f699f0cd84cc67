r"""Run a guide and replay a model on one or more data sets, draw by draw or vectorised: the
engine behind :func:`~pyro_dropout.predict`, the ArviZ export and ``compare``.

For each posterior draw :math:`\theta_s \sim q` the guide runs once and the model is replayed
on every data set (training and test inputs see the same :math:`\theta_s`). It works on any
Pyro model:

* **Vectorised when the model broadcasts.** Draws are taken in chunks inside a ``pyro.plate``
  left of the model's plates (as ``Predictive(parallel=True)``). The first draw runs alone and
  gives the per-draw shapes; a chunk whose results do not have them, or that raises (e.g. a
  ``MaxPool2d`` seeing a 5-D input), switches the run to one draw per pass, which gives the
  same distribution. ``vectorize=True`` makes that an error instead.
* **Every row, never a subsample.** A subsampled ``pyro.plate`` (``subsample_size=B``) is given
  every index in passes of exactly ``B`` indices (the last pass is completed with indices from
  the start, whose results are dropped), all replaying the same guide draw.
* **The observed site is found**: the one sample site of the model that the guide does not
  draw (deterministic and subsample sites aside). A model with several must name it.

The observed site's distribution is kept as its parameters (:class:`DistDraws`, shaped
``(S, N, ...)``), so ``log p(y_i | θ_s)`` and other quantities can be computed later for any
``y``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import Independent

from ..handlers import local_reparameterization, weight_draws

__all__ = [
    "CHUNK_ELEMENTS",
    "DistDraws",
    "DrawRun",
    "NotVectorizable",
    "OBS_SAMPLE",
    "RETURN_SITE",
    "SubsampleIndices",
    "choose_obs_site",
    "run_draws",
]

#: Name of the model's return value, as in ``pyro.infer.Predictive``.
RETURN_SITE = "_RETURN"
#: Key of the observed site's predictive draws when its distribution cannot be rebuilt.
OBS_SAMPLE = "_obs_sample"
_DRAW_PLATE = "_pyro_dropout_draws"
#: Elements of the widest layer output per vectorised pass when no chunk size is given. On a
#: CPU cache-sized passes are fastest (T = 100 on 1,000 points of an 8-50-1 MLP: one pass of
#: all 100 samples took 2.2x a plain dropout loop, chunks of 1M elements 1.2x); a GPU wants
#: large passes.
CHUNK_ELEMENTS = {"cpu": 2**20, "other": 2**26}


class NotVectorizable(RuntimeError):
    """The model does not broadcast over a leading sample dimension."""


class SubsampleIndices(Messenger):
    """Set the indices of subsampled plates, ``{plate name: LongTensor}``.

    Pyro draws a subsampled plate's indices at a sample site named after the plate; setting its
    value here (outside ``poutine.replay``, so it wins over a replayed guide) chooses the rows.
    """

    def __init__(self, indices):
        super().__init__()
        self.indices = indices

    def _pyro_sample(self, msg):
        if site_is_subsample(msg) and msg["name"] in self.indices:
            msg["value"] = self.indices[msg["name"]]


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


# -- sites -----------------------------------------------------------------------------------


def _is_deterministic(site):
    return site["infer"].get("_deterministic", False)


def _model_sample_sites(trace):
    return [
        (name, site)
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site_is_subsample(site)
    ]


def choose_obs_site(model_trace, guide_trace, obs_name=None):
    """The observed site: ``obs_name`` if given (it must be a sample site that the guide does
    not draw), else the one sample site of the model that the guide does not draw
    (deterministic sites aside)."""
    if obs_name is not None:
        if obs_name not in model_trace.nodes or model_trace.nodes[obs_name]["type"] != "sample":
            names = [n for n, _ in _model_sample_sites(model_trace)]
            raise ValueError(
                f"the model has no sample site {obs_name!r}; its sample sites: {names}"
            )
        if obs_name in guide_trace.nodes:
            raise ValueError(
                f"site {obs_name!r} is drawn by the guide (a latent site), not observed"
            )
        return obs_name
    candidates = [
        name
        for name, site in _model_sample_sites(model_trace)
        if not _is_deterministic(site) and name not in guide_trace.nodes
    ]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(
            "the model has no observed (likelihood) site: the guide draws every sample site; "
            "name the site to record with obs_name=... (predict: site=...)"
        )
    raise ValueError(
        f"the model has several sample sites that the guide does not draw: {candidates}; name "
        "the observed one with obs_name=... (predict: site=...)"
    )


def _is_observable(model_trace, guide_trace, name):
    site = model_trace.nodes.get(name)
    return (
        site is not None
        and site["type"] == "sample"
        and not site_is_subsample(site)
        and name not in guide_trace.nodes
    )


def is_improper(fn):
    """Whether a distribution (through its wrappers) is flagged ``improper``."""
    while fn is not None:
        if getattr(fn, "improper", False):
            return True
        fn = getattr(fn, "base_dist", None)
    return False


def _latent_names(model_trace, guide_trace):
    return [
        name
        for name, site in _model_sample_sites(model_trace)
        if not _is_deterministic(site)
        and name in guide_trace.nodes
        and not guide_trace.nodes[name]["infer"].get("is_auxiliary", False)
    ]


def _plate_nesting(traces):
    dims = [
        -frame.dim
        for tr in traces
        for site in tr.nodes.values()
        if site["type"] == "sample"
        for frame in site["cond_indep_stack"]
        if frame.vectorized and frame.dim is not None and frame.name != _DRAW_PLATE
    ]
    return max(dims, default=0)


def _subsampled_plates(trace):
    """``{name: (size, subsample_size)}`` of the plates that see a strict subsample."""
    out = {}
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and site_is_subsample(site):
            fn = site["fn"]
            if fn.subsample_size is not None and fn.subsample_size < fn.size:
                out[name] = (int(fn.size), int(fn.subsample_size))
    return out


def _site_plate_batch(site):
    """The batch a site gets from its own plates (not the draw plate), e.g. ``(M, 1)``."""
    frames = [f for f in site["cond_indep_stack"] if f.vectorized and f.name != _DRAW_PLATE]
    if not frames:
        return ()
    shape = [1] * max(-f.dim for f in frames)
    for f in frames:
        shape[f.dim] = f.size
    return tuple(shape)


# -- the observed site's distribution as parameters ------------------------------------------


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


# -- reshaping a vectorised chunk ------------------------------------------------------------


def _to_draws(t, c, nesting, batch, tail):
    """``t`` of a vectorised chunk, laid out ``(c, *pad, *batch, *tail)`` with the draw plate
    at ``-(nesting + 1)`` of the batch, as ``(c, *batch, *tail)``; raises
    :class:`NotVectorizable` when it does not fit. Returns ``(tensor, varies)``: whether ``t``
    really has the draw dimension."""
    pad = nesting - len(batch)
    target = (c,) + (1,) * pad + tuple(batch)
    lead = t.dim() - len(tail)
    if lead > len(target) or tuple(t.shape[lead:]) != tuple(tail):
        raise NotVectorizable(f"a value of shape {tuple(t.shape)} does not fit {target + tail}")
    full = (1,) * (len(target) - lead) + tuple(t.shape[:lead])
    try:
        t = t.expand(target + tuple(tail))
    except RuntimeError as e:
        raise NotVectorizable(str(e)) from None
    return t.reshape((c,) + tuple(batch) + tuple(tail)), full[0] == c


class _Data:
    """One data set of a run and what the first draw taught about it."""

    def __init__(self, args, kwargs):
        self.args, self.kwargs = args, kwargs
        self.device = _device(args, kwargs)
        self.plates = {}  # subsampled plates: {name: (size, subsample_size)}
        self.obs = None  # (cls, reinterpreted, batch, {param: tail}) or "samples"
        self.shapes = {}  # site -> per-draw shape of a recorded value
        self.event = None  # the observed site's event shape

    def row_chunks(self):
        """``[(indices, {plate: idx}, keep)]``: every row in passes of the subsample size."""
        if not self.plates:
            return [(None, {}, None)]
        if len(self.plates) > 1:
            raise ValueError(
                f"the model subsamples several plates {sorted(self.plates)}; prediction over all "
                "rows supports one subsampled plate"
            )
        ((name, (size, b)),) = self.plates.items()
        idx = torch.arange(size, device=self.device)
        out = []
        for start in range(0, size, b):
            part = idx[start : start + b]
            keep = part.numel()
            if keep < b:
                part = torch.cat([part, idx[: b - keep]])
            out.append((part, {name: part}, keep))
        return out


def _device(args, kwargs):
    for a in (*args, *kwargs.values()):
        if torch.is_tensor(a):
            return a.device
    return torch.device("cpu")


# -- the run ---------------------------------------------------------------------------------


def run_draws(
    model,
    guide,
    datasets,
    num_draws,
    *,
    obs_name=None,
    find_obs=True,
    obs_optional=False,
    value_sites=(),
    latents=False,
    log_densities=False,
    pointwise=False,
    estimator="weights",
    vectorize="auto",
    chunk_size=None,
):
    """Draw ``num_draws`` times from ``guide`` and replay ``model`` on each data set.

    :param datasets: list of ``(args, kwargs)``; the guide runs on the first.
    :param obs_name: the observed site; found when None and ``find_obs`` (module docs). With
        ``obs_optional`` a named site that is not observable (a latent, the return value)
        records no distribution instead of raising.
    :param value_sites: other sites to record per data set (``"_RETURN"`` for the model's
        return value), shaped ``(S, *shape)`` with the shape of one draw.
    :param bool latents: record the values of the latent sites (first data set).
    :param bool log_densities: record ``log p(theta)`` (the latent sites' priors) and
        ``log q(theta)`` (every guide site) per draw, unscaled.
    :param bool pointwise: record, per data set, the observed site's pointwise quantities from
        the traces: ``"_log_lik"`` ``log p(y_i | θ_s)`` (when observed), ``"_y_rep"`` a
        predictive draw, ``"_mean"`` its mean (real-valued sites) and ``"_probs"`` the
        probability of each value (discrete sites with enumerable support).
    :param str estimator: ``"weights"`` (weight draws; blocks an enclosing
        ``local_reparameterization()``) or an estimator of
        :func:`~pyro_dropout.local_reparameterization` (``"auto"``, ``"lrt"``, ...).
    :param vectorize: ``"auto"`` (vectorised passes, one draw per pass when the model does not
        broadcast), ``True`` (vectorised or :class:`NotVectorizable`) or ``False``.
    :param chunk_size: draws per vectorised pass; by default sized from the first draw.
    """
    if vectorize not in ("auto", True, False):
        raise ValueError(f"vectorize must be 'auto', True or False; got {vectorize!r}")
    num_draws = int(num_draws)
    data = [_Data(a, k) for a, k in datasets]
    if estimator == "weights":
        messenger = weight_draws()
    else:
        messenger = local_reparameterization(estimator=estimator)
    acc = _Accumulator(len(data))
    run = DrawRun(obs_name=obs_name, obs=[None] * len(data), values=[{} for _ in data])
    with messenger:
        # The first draw, alone: shapes, plates and the observed site.
        g_tr, m_trs = _draw(model, guide, data, None, probe=True)
        m_tr0 = m_trs[0][0][1]
        if obs_optional and obs_name is not None:
            run.obs_name = obs_name if _is_observable(m_tr0, g_tr, obs_name) else None
        elif find_obs or obs_name is not None:
            run.obs_name = choose_obs_site(m_tr0, g_tr, obs_name)
        run.latent_names = _latent_names(m_tr0, g_tr)
        run.improper_prior_sites = [
            n for n in run.latent_names if is_improper(m_tr0.nodes[n]["fn"])
        ]
        nesting = _plate_nesting([g_tr] + [tr for chunks in m_trs for _, tr in chunks])
        opts = (
            run.obs_name,
            tuple(value_sites),
            latents,
            log_densities,
            run.latent_names,
            pointwise,
        )
        acc.add(_collect(data, g_tr, m_trs, 1, None, nesting, opts))
        if chunk_size is None:
            device = data[0].device
            budget = CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "other"]
            widest = max(messenger.widest_output, *(_widest(tr) for c in m_trs for _, tr in c))
            chunk_size = max(2, budget // max(1, widest))
        vectorized = vectorize is not False
        done = 1
        while done < num_draws:
            c = min(int(chunk_size), num_draws - done) if vectorized else 1
            if c > 1:
                draw_dim = -(nesting + 1)
                try:
                    g_tr, m_trs = _draw(model, guide, data, (c, draw_dim))
                    part = _collect(data, g_tr, m_trs, c, draw_dim, nesting, opts)
                except Exception as e:  # noqa: BLE001 - whatever the model's code raises
                    if vectorize is True:
                        raise NotVectorizable(_not_vectorizable(e)) from e
                    vectorized = False
                    continue
                run.vectorized = True
            else:
                g_tr, m_trs = _draw(model, guide, data, None)
                part = _collect(data, g_tr, m_trs, 1, None, nesting, opts)
            acc.add(part)
            done += c
    acc.finish(run, data)
    return run


def _not_vectorizable(e):
    return (
        "the model does not broadcast over a leading sample dimension (as "
        f"Predictive(parallel=True) needs): {type(e).__name__}: {e}. Use vectorize='auto' (one "
        "draw per pass when vectorising fails) or vectorize=False."
    )


def _widest(trace):
    sizes = [s["value"].numel() for s in trace.nodes.values() if torch.is_tensor(s.get("value"))]
    return max(sizes, default=1)


def _draw(model, guide, data, vector, probe=False):
    """One guide run (``c`` draws in a plate when ``vector = (c, dim)``) and the model replayed
    on every data set, in row passes for a subsampled plate: ``(guide_trace, [[(key, trace)]])``
    with ``key = (plate, keep)`` per pass (None without subsampling)."""
    plate = (
        pyro.plate(_DRAW_PLATE, vector[0], dim=vector[1]) if vector else contextlib.nullcontext()
    )
    with plate:
        first_idx = data[0].row_chunks()[0][1]
        with SubsampleIndices(first_idx):
            g_tr = poutine.trace(guide).get_trace(*data[0].args, **data[0].kwargs)
        replayed = poutine.replay(model, trace=g_tr)
        out = []
        for d in data:
            if probe:
                m_tr = poutine.trace(replayed).get_trace(*d.args, **d.kwargs)
                d.plates = _subsampled_plates(m_tr)
                if not d.plates:
                    out.append([(None, m_tr)])
                    continue
                # the probe saw a random subsample: run the row passes instead
            passes = []
            for _, indices, keep in d.row_chunks():
                with SubsampleIndices(indices):
                    m_tr = poutine.trace(replayed).get_trace(*d.args, **d.kwargs)
                passes.append((None if keep is None else keep, m_tr))
            out.append(passes)
    return g_tr, out


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


def _join_rows(pieces, d, name=None):
    """Join the row passes of a subsampled plate (rows = first dim after the draws), dropping
    the completion of the last pass; a value without a row dim is taken from the first pass."""
    keep0, first = pieces[0]
    if keep0 is None:
        return first
    b = next(iter(d.plates.values()))[1]

    def join(parts):
        if parts[0].dim() < 2 or parts[0].shape[1] != b:
            return parts[0]  # not one value per row
        return torch.cat([t[:, :k] for k, t in zip([k for k, _ in pieces], parts, strict=True)], 1)

    if isinstance(first, dict):
        return {k: join([p[k] for _, p in pieces]) for k in first}
    return join([p for _, p in pieces])


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
