"""The run: :func:`run_draws` draws from the guide and replays the model on every data set,
the first draw alone, then vectorised chunks in the draw plate, falling back to one draw per
pass where the model does not broadcast."""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
import warnings

import pyro
import torch
from pyro import poutine

from ...handlers import local_reparameterization, weight_draws
from .accumulate import DrawRun, _Accumulator, _collect
from .modes import module_mode as _module_mode
from .plates import (
    _DRAW_PLATE,
    NotVectorizable,
    SubsampleIndices,
    VectorizationWarning,
    _Data,
    _plate_nesting,
    _subsampled_plates,
)
from .sites import _is_observable, _latent_names, choose_obs_site, is_improper
from .verify import needs_check, stacked_trace, verify_vectorized

#: Elements of the widest layer output per vectorised pass when no chunk size is given. On a
#: CPU cache-sized passes are fastest (T = 100 on 1,000 points of an 8-50-1 MLP: one pass of
#: all 100 samples took 2.2x a plain dropout loop, chunks of 1M elements 1.2x); a GPU wants
#: large passes.
CHUNK_ELEMENTS = {"cpu": 2**20, "other": 2**26}


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
    module_mode=None,
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
        broadcast or gives other results vectorised, with one :class:`VectorizationWarning`
        per run at the caller's line, naming the exception or the difference; after a failed
        first pass the generator is rewound, so the draws are those of ``False``),
        ``True`` (vectorised or :class:`NotVectorizable`) or ``False``. Before the first
        vectorised pass the first draw, taken alone, is replayed twice in one vectorised pass
        and must give its own results (:mod:`~pyro_dropout.infer.draws.verify`): a model
        whose result depends on the input's rank (``BatchNorm1d`` on ``(draws, N, H)`` with
        ``N == H`` sees the draws as rows) is caught there. Models made of the library's
        modules skip the check (:func:`~pyro_dropout.infer.draws.verify.needs_check`).
    :param chunk_size: draws per vectorised pass; by default sized from the first draw.
    :param str module_mode: the modules of the model and guide run in ``"eval"`` or
        ``"train"`` mode; None (default): the mode of an enclosing
        :func:`~pyro_dropout.infer.draws.modes.module_mode` (an entry point's), else
        ``"eval"``. Their modes and buffers are restored afterwards.
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
    with _module_mode(model, guide, mode=module_mode), messenger:
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
        first = _collect(data, g_tr, m_trs, 1, None, nesting, opts)
        acc.add(first)
        probe = (g_tr, first)  # the first draw, taken alone: the check's reference
        if chunk_size is None:
            device = data[0].device
            budget = CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "other"]
            widest = max(messenger.widest_output, *(_widest(tr) for c in m_trs for _, tr in c))
            chunk_size = max(2, budget // max(1, widest))
        vectorized = vectorize is not False
        per_pass = min(int(chunk_size), num_draws - 1)  # draws per vectorised pass (messages)
        checked = vectorize is False or not needs_check(model)
        done = 1
        while done < num_draws:
            c = min(int(chunk_size), num_draws - done) if vectorized else 1
            if c > 1 and not checked:
                checked = True
                devices = [d.device for d in data if d.device.type == "cuda"]
                try:
                    # on a forked RNG: the run's draws are those of vectorize=False
                    with torch.random.fork_rng(devices=devices), _checking():
                        problem = _check(model, guide, data, probe, estimator, nesting, opts)
                except Exception as e:  # noqa: BLE001 - whatever the model's code raises
                    if vectorize is True:
                        raise NotVectorizable(_not_vectorizable(e), _no_broadcast(e)) from e
                    warn_fallback(_no_broadcast_message(e, per_pass), model)
                    vectorized = False
                    continue
                if problem is not None:
                    if vectorize is True:
                        raise NotVectorizable(problem, _differs(problem))
                    warn_fallback(_fallback_message(problem, per_pass), model)
                    vectorized = False
                    continue
            if c > 1:
                draw_dim = -(nesting + 1)
                rng = _rng_state(data)
                try:
                    g_tr, m_trs = _draw(model, guide, data, (c, draw_dim))
                    part = _collect(data, g_tr, m_trs, c, draw_dim, nesting, opts)
                except Exception as e:  # noqa: BLE001 - whatever the model's code raises
                    if vectorize is True:
                        raise NotVectorizable(_not_vectorizable(e), _no_broadcast(e)) from e
                    # the failed pass's draws are discarded: rewinding the generator makes
                    # the draws that replace them those of vectorize=False
                    _set_rng_state(data, rng)
                    # vectorized = False ends the vectorised passes: one warning per run
                    warn_fallback(_no_broadcast_message(e, per_pass), model)
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
        f"Predictive(parallel=True) needs): {type(e).__name__}: {_first_part(e)}. Use "
        "vectorize='auto' (one draw per pass when vectorising fails) or vectorize=False."
    )


def _rng_state(data):
    """Torch's generator states (CPU and each CUDA device of the data)."""
    devices = sorted({d.device.index or 0 for d in data if d.device.type == "cuda"})
    return torch.get_rng_state(), {i: torch.cuda.get_rng_state(i) for i in devices}


def _set_rng_state(data, state):
    cpu, cuda = state
    torch.set_rng_state(cpu)
    for i, s in cuda.items():
        torch.cuda.set_rng_state(s, i)


def _no_broadcast(e):
    return (
        "the model does not broadcast over a leading draw dimension: a vectorised pass of "
        f"draws raised {type(e).__name__}: {_first_part(e)}"
    )


def _first_part(e):
    """The exception's message without the trace shapes Pyro appends to an error raised in a
    traced model (empty tables here, which only lengthen the warning)."""
    return re.split(r"\n\s*Trace Shapes:", str(e))[0].rstrip()


def _no_broadcast_message(e, chunk_size):
    return (
        f"{_no_broadcast(e)}. Drawing one draw per pass instead: the same distribution, one "
        f"model run per draw instead of one per {chunk_size} draws. "
        "vectorize=False skips the vectorised pass and this warning; a model whose ops "
        "broadcast over leading dimensions (x @ w.transpose(-1, -2), not a Python loop over "
        "rows or x.view(N, -1)) runs vectorised."
    )


def _differs(problem):
    return (
        "the model's results on a vectorised pass of draws differ from its results one draw "
        f"at a time: {problem}"
    )


_CHECKING = contextvars.ContextVar("pyro_dropout_checking", default=False)


def checking():
    """True while :func:`run_draws` checks a vectorised pass: the check's draws are discarded
    (its generator is forked), so a guide that hands out stored draws in order
    (:class:`~pyro_dropout.diagnostics.samples.SamplesGuide`) must not use one up."""
    return _CHECKING.get()


@contextlib.contextmanager
def _checking():
    token = _CHECKING.set(True)
    try:
        yield
    finally:
        _CHECKING.reset(token)


#: the models whose fallback has warned in the enclosing :func:`one_warning_per_model` (an
#: entry point that runs a model several times, e.g. the export's posterior and prior runs)
_WARNED: contextvars.ContextVar[set | None] = contextvars.ContextVar(
    "pyro_dropout_vectorization_warned", default=None
)


@contextlib.contextmanager
def one_warning_per_model():
    """Inside it each model's :class:`VectorizationWarning` is raised once, however many runs
    fall back (nested blocks share the outer one's record)."""
    if _WARNED.get() is not None:
        yield
        return
    token = _WARNED.set(set())
    try:
        yield
    finally:
        _WARNED.reset(token)


def warn_fallback(message, model):
    """Never silent: the fallback's :class:`VectorizationWarning`, at the user's line. Called
    once per run at most (the run stays sequential afterwards)."""
    warned = _WARNED.get()
    if warned is not None:
        if id(model) in warned:
            return
        warned.add(id(model))
    warnings.warn(message, VectorizationWarning, stacklevel=_user_level())


def _check(model, guide, data, probe, estimator, nesting, opts):
    """The first draw replayed twice in one vectorised pass with a second draw, each compared
    with its results alone (:mod:`~pyro_dropout.infer.draws.verify`): a message saying what
    differs, or None."""
    obs, value_sites, _, _, latent_names, pointwise = opts
    g_tr, part = probe
    rebuilt = obs is not None and all(p is not None for p in part["obs"])
    if estimator == "weights" and (rebuilt or pointwise):
        check_opts = (obs, value_sites, False, False, latent_names, pointwise)
        ref = part
    else:
        # the run sampled pre-activations, or recorded nothing deterministic of the observed
        # site: replay the drawn weights alone, recording the site's mean and log density
        check_opts = (obs, value_sites, False, False, latent_names, obs is not None)
        tr = stacked_trace([g_tr], None)
        _, m_trs = _draw(model, None, data, None, fixed=tr)
        ref = _collect(data, tr, m_trs, 1, None, nesting, check_opts)
    # A second, different draw goes third: a model that gives every draw of a pass the first
    # draw's weights (torch.lstm reads only W[0, 0] of a stacked weight, without an error)
    # agrees with itself on the two copies and is caught only against another draw alone.
    g_other, _ = _draw(model, guide, data, None)
    tr_other = stacked_trace([g_other], None)
    _, m_other = _draw(model, None, data, None, fixed=tr_other)
    other = _collect(data, tr_other, m_other, 1, None, nesting, check_opts)
    tr = stacked_trace([g_tr, g_tr, g_other], nesting)
    if tr is None:
        return "the guide's draw has more batch dimensions than the model has plates"
    _, m_trs = _draw(model, None, data, (3, -(nesting + 1)), fixed=tr)
    vec = _collect(data, tr, m_trs, 3, -(nesting + 1), nesting, check_opts)
    return verify_vectorized(ref, vec, other)


def _fallback_message(problem, chunk_size):
    return (
        f"{_differs(problem)}. A module whose result depends on the input's rank sees the "
        "draws as rows (BatchNorm1d on a (draws, N, H) input with N equal to its width; an op "
        "on dim 0 or 1 of the hidden activations); a model drawing its own "
        "random numbers (nn.Dropout in train mode) cannot be checked. Drawing one draw per "
        f"pass instead: the same distribution, one model run per draw instead of one per "
        f"{chunk_size} draws. vectorize=False skips this check and this warning."
    )


#: frames a warning skips on its way to the user's line: this package's, and the wrappers of
#: decorators on its entry points (``@torch.no_grad()`` on ``predict`` adds a frame of
#: ``torch.utils._contextlib``, which the warning named before)
_NOT_USER = ("pyro_dropout", "torch.utils._contextlib", "contextlib", "functools")


def _user_level():
    """The stack level of the first frame outside this package (for warnings)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and _is_library(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
        level += 1
    return level


def _is_library(module):
    return any(module == m or module.startswith(m + ".") for m in _NOT_USER)


def _widest(trace):
    sizes = [s["value"].numel() for s in trace.nodes.values() if torch.is_tensor(s.get("value"))]
    return max(sizes, default=1)


def _draw(model, guide, data, vector, probe=False, fixed=None):
    """One guide run (``c`` draws in a plate when ``vector = (c, dim)``) and the model replayed
    on every data set, in row passes for a subsampled plate: ``(guide_trace, [[(key, trace)]])``
    with ``key = (plate, keep)`` per pass (None without subsampling). With ``fixed`` (a guide
    trace) the guide does not run: the model replays ``fixed`` under its own
    :func:`weight_draws`, which sees the replayed weights as fresh draws (so ``F.linear`` on
    them broadcasts over the draws, as in a run)."""
    plate = (
        pyro.plate(_DRAW_PLATE, vector[0], dim=vector[1]) if vector else contextlib.nullcontext()
    )
    with plate:
        if fixed is None:
            first_idx = data[0].row_chunks()[0][1]
            with SubsampleIndices(first_idx):
                g_tr = poutine.trace(guide).get_trace(*data[0].args, **data[0].kwargs)
            replayed = poutine.replay(model, trace=g_tr)
        else:
            g_tr = fixed
            # replay outside weight_draws: the values are set after it saw the sites unset
            replayed = poutine.replay(weight_draws(model), trace=fixed)
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
