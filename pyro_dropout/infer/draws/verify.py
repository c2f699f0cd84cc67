r"""Vectorised draws must not be mistaken for rows: the check :func:`run_draws` makes before its
first vectorised pass.

A vectorised pass puts the draws on a dimension left of the model's plates, so a layer sees a
``(draws, N, H)`` input where one draw gives ``(N, H)``. Most operations broadcast over it;
some read the input's rank: ``BatchNorm1d(H)`` takes a 3-D input as ``(batch, channels,
length)`` and, when ``N == H``, passes its shape check and normalises over the wrong axes. No
list of such modules can be complete (a user's module may reduce over dim 0 or 1), so the run
checks the model itself:
the first draw :math:`\theta_1`, taken alone, is replayed twice in one vectorised pass
together with a second draw :math:`\theta_2`, and every recorded quantity of each must match
what that draw alone gave (the observed
site's parameters, its mean and log density, requested sites; to a tolerance of a few float
rounding errors). A model that mistakes the draws for rows normalises or reduces over the
wrong axis and fails this. A quantity on which the two
copies disagree is random given θ (a predictive draw, the model's own ``torch.rand``) and is
not compared; when nothing else is left, the check cannot vouch for the vectorised pass and
says so.

(The second draw catches an operation that gives every draw of a pass the first draw's
weights: ``torch.lstm`` accepts a stacked weight and reads only its first matrix.)

Cost: one vectorised pass of three draws and one pass of a second draw alone per run (and
one pass of one draw where the run does
not record the observed site's parameters by weight draws): about a third more time for a
small prediction, where a pass costs more than its arithmetic (100 draws on 50 rows). Models
built only from the library's modules and ``torch.nn`` modules whose result does not depend
on the input's rank (:func:`needs_check`: ``BayesianMLP``, ``BayesianConvNet``, a
``Sequential`` of ``BayesianLinear`` layers and activations from ``bayesianize``) are known
to broadcast and skip it.
"""

from __future__ import annotations

import torch
from pyro.nn import PyroModule
from pyro.poutine import Trace
from pyro.poutine.util import site_is_subsample

from ...nn.guided_value import plain
from .accumulate import OBS_SAMPLE

__all__ = ["needs_check", "stacked_trace", "verify_vectorized"]

#: ``torch.nn`` classes whose result does not depend on the input's rank: containers,
#: elementwise activations, ``Dropout``, ``LayerNorm`` (normalises the trailing dims),
#: ``Linear`` (acts on the last dim; with sampled 3-D weights it raises, and the run falls back
#: to one draw per pass). Exact classes: a subclass may override ``forward``.
_RANK_FREE = tuple(
    getattr(torch.nn, name)
    for name in (
        "Sequential", "ModuleList", "ModuleDict", "Identity", "ReLU", "LeakyReLU", "ELU",
        "SELU", "CELU", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Softplus", "Hardtanh",
        "ReLU6", "Dropout", "LayerNorm", "Linear",
    )
)  # fmt: skip

#: Recorded quantities that are random given θ by construction: never compared.
_RANDOM_KEYS = (OBS_SAMPLE, "_y_rep")


def needs_check(model):
    """Whether a run must check its vectorised passes: False only for a ``torch.nn.Module``
    made of this library's modules (written to broadcast over sample dims, and tested so),
    the ``torch.nn`` classes of :data:`_RANK_FREE` and ``PyroModule[...]`` of those; True for
    anything else (a function, a user's module, ``BatchNorm1d``)."""
    if not isinstance(model, torch.nn.Module):
        return True
    for m in model.modules():
        cls = type(m)
        if cls.__module__.startswith("pyro_dropout.") or cls is PyroModule:
            continue
        if cls.__module__ == "pyro.nn.module" and issubclass(cls, PyroModule):
            cls = cls.__mro__[1]  # PyroModule[X] is a subclass of X first
        if cls not in _RANK_FREE:
            return True
    return False


def stacked_trace(traces, nesting):
    """One guide trace holding the sample values of ``traces`` (draws of one guide).

    ``nesting=None`` (one trace): a copy with plain tensor values. Otherwise the values are
    stacked on a new draw dimension at ``-(nesting + 1)`` of each site's batch, as a guide run
    in the draw plate lays them out: ``(len(traces), 1, ..., *batch, *event)``. None when the
    draws' shapes differ or a value has more batch dims than the model has plates."""
    out = Trace()
    for name, site in traces[0].nodes.items():
        site = dict(site)
        if site["type"] == "sample" and not site_is_subsample(site):
            values = [plain(t.nodes[name]["value"]) if name in t.nodes else None for t in traces]
            if any(not torch.is_tensor(v) for v in values):
                return None
            if nesting is not None:
                event_dim = getattr(site["fn"], "event_dim", 0)
                batch_dims = values[0].dim() - event_dim
                if batch_dims > nesting or any(v.shape != values[0].shape for v in values):
                    return None
                pad = (1,) * (nesting - batch_dims)
                values = [v.reshape(pad + tuple(v.shape)) for v in values]
                site["value"] = torch.stack(values, 0)
            else:
                site["value"] = values[0]
        out.add_node(name, **site)
    return out


def _close(a, b):
    """Equal up to float rounding of a differently blocked computation (a relative tolerance
    of ``sqrt(eps)``: 3e-4 in float32), NaN where NaN."""
    if a.shape != b.shape:
        return False
    if not torch.is_floating_point(a):
        return bool(torch.equal(a, b))
    tol = torch.finfo(a.dtype).eps ** 0.5
    finite = torch.isfinite(b)
    scale = float(b[finite].abs().max()) if bool(finite.any()) else 1.0
    return bool(torch.allclose(a, b, rtol=tol, atol=tol * max(1.0, scale), equal_nan=True))


def _quantities(part, i):
    """``{name: (draws, ...)}`` recorded for data set ``i`` in a collected part."""
    out = {}
    obs = part["obs"][i]
    if obs is not None:
        out.update({f"the observed site's {k!r}": v for k, v in obs.items()})
    out.update({f"site {k!r}": v for k, v in part["values"][i].items() if k not in _RANDOM_KEYS})
    return out


def verify_vectorized(ref, vec, other=None):
    """Compare a vectorised part of two copies of one draw (and, third, of another draw) with
    the parts of those draws alone: None when they agree, else a message saying what
    differs."""
    compared, random = 0, []
    for i in range(len(vec["obs"])):
        seq = _quantities(ref, i)
        alt = _quantities(other, i) if other is not None else {}
        for name, v in _quantities(vec, i).items():
            if name not in seq:
                continue
            v, r = v.detach(), seq[name][0].detach()
            if not _close(v[0], v[1]):
                random.append(name)
                continue
            pairs = [(v[0], r)]
            if name in alt and v.shape[0] > 2:
                pairs.append((v[2], alt[name][0].detach()))
            for got, want in pairs:
                if not _close(got, want):
                    diff = (got.double() - want.double()).abs() if got.shape == want.shape else None
                    size = (
                        f"differs by up to {float(diff.nan_to_num(0.0).max()):.3g}"
                        if diff is not None and diff.numel()
                        else f"has shape {tuple(got.shape)} against {tuple(want.shape)}"
                    )
                    where = f" on data set {i}" if len(vec["obs"]) > 1 else ""
                    return f"{name}{where} {size} between the vectorised pass and the draw alone"
            compared += 1
    if random and not compared:
        return (
            f"the quantities recorded ({', '.join(random)}) differ between two copies of the "
            "same draw in one pass, so the vectorised pass cannot be checked"
        )
    return None
