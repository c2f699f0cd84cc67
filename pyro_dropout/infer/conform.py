"""One rule for the data of every entry point (``fit``, ``predict``, the ArviZ export,
``compare``, ``reference_posterior``, the Lightning module): the model is run once on the
first rows (:func:`probe_model`) and what it shows decides how ``x`` and ``y`` are passed.

**Targets.** The observed site's distribution has a shape ``F`` (batch and event shape) for
the rows given; the target ``y`` must fit it:

* a ``y`` of that shape is passed as it is;
* a ``y`` that differs by a **trailing singleton axis** maps unambiguously and is reshaped:
  ``(N, 1)`` for a site of shape ``(N,)`` is passed as ``(N,)``, and ``(N,)`` for a site of
  shape ``(N, 1)`` as ``(N, 1)`` (the numbers are those of the matching shape);
* any other shape is refused with a ``ValueError`` naming the argument, the shape given and
  the shape expected (Pyro would broadcast the log-likelihood to ``(N, N)``, or fail).

Integer labels are cast to the dtype of the site's values: floating for a ``Bernoulli``
(``0``/``1`` as ``0.``/``1.``), integer for a ``Categorical``; a floating ``y`` of a discrete
site must hold whole numbers.

**Inputs.** Floating ``x`` is cast to the model's dtype (:mod:`pyro_dropout.infer.data`). An
integer or boolean ``x`` is passed as it is when the model accepts it (indices of an
embedding or of a lookup table) and cast to the model's floating dtype when the model fails on
integers and runs on the cast (integer-valued features: counts, one-hot columns). When the
model fails on ``x`` either way, the error names ``x``, its shape and dtype, and the number of
inputs the model's first layer takes.
"""

from __future__ import annotations

import contextlib

import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.util import site_is_subsample

from .data import as_model_input, check_rows, model_dtype

__all__ = [
    "DataRule",
    "ModelProbe",
    "apply_map",
    "check_support",
    "check_guide_matches",
    "check_target_shape",
    "conform_data",
    "probe_model",
]

#: Rows of the first probe of a model (the probe runs its forward pass once).
PROBE_ROWS = 512


class ModelProbe:
    """What one run of the model (see :func:`probe_model`) shows: its observed sites
    and the plates it subsamples."""

    def __init__(self, trace, rows):
        self.rows = rows
        self.trace = trace
        self.observed = {
            name: site
            for name, site in trace.nodes.items()
            if site["type"] == "sample"
            and site["is_observed"]
            and not site_is_subsample(site)
            and not site["infer"].get("_deterministic", False)
        }
        #: the model's own learnable parameters (pyro.param / PyroParam)
        self.params = [n for n, s in trace.nodes.items() if s["type"] == "param"]
        self.plates = {}
        for name, site in trace.nodes.items():
            if site["type"] == "sample" and site_is_subsample(site):
                fn = site["fn"]
                if fn.subsample_size is not None and fn.subsample_size < fn.size:
                    self.plates[name] = (int(fn.size), int(fn.subsample_size))


def _init(device):
    from ..guides.init import dist_dtype, init_to_fan_in

    # init_to_fan_in builds CPU tensors; the model's own layers (e.g. after model.to("cuda"))
    # expect them where the data are, in the site's dtype (as the guides place theirs).
    def init(site):
        if site["fn"].support.is_discrete:  # an unobserved likelihood site (no y): a draw
            return site["fn"].sample()
        value = init_to_fan_in(site)
        if torch.is_tensor(value) and value.is_floating_point():
            value = value.to(device=device, dtype=dist_dtype(site["fn"]))
        return value

    return init


def probe_model(model, args, kwargs):
    """Run ``model`` once, hidden from enclosing handlers, with latent sites at
    :func:`~pyro_dropout.guides.init_to_fan_in` (real sites are not sampled: an improper
    prior is fine). On an error, the exception carries the partial trace as ``_pd_trace``."""
    tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
    device = tensors[0].device if tensors else None
    tracer = poutine.trace(InitMessenger(_init(device))(model))
    with poutine.block(), torch.no_grad():
        try:
            return tracer.get_trace(*args, **kwargs)
        except Exception as e:
            e._pd_trace = tracer.trace
            raise


# -- sites inside a subsampled plate ------------------------------------------------------------


def weights_in_subsampled_plate(trace):
    """``(site, plate)`` of the first latent site with event dims sampled inside a subsampled
    plate of ``trace`` (possibly a partial trace), or None."""
    if trace is None:
        return None
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        if site["infer"].get("_deterministic", False):
            continue
        for frame in site["cond_indep_stack"]:
            if frame.vectorized and frame.full_size is not None and frame.full_size != frame.size:
                return name, frame.name
    return None


def plate_message(who, name, plate):
    """The documented refusal of a weight sampled inside a subsampled plate."""
    return (
        f"{who}: latent site {name!r} is sampled inside the subsampled plate {plate!r}, which "
        "makes it a local latent variable (one value per row) and breaks the layers that use "
        "it; these guides handle global latents such as weights. Sample the weights before "
        f"the plate: e.g. read the PyroSample attributes (or call pyro.sample for {name!r}) "
        f"before entering pyro.plate({plate!r}, ...), or use this library's layers "
        "(BayesianLinear, bayesianize), which draw their weights outside subsampled plates."
    )


# -- the inputs ---------------------------------------------------------------------------------


def _input_width(model):
    """The number of inputs the model's first layer takes, when it says (``in_features`` /
    ``in_channels`` of its first submodule that has one), else None."""
    if not isinstance(model, torch.nn.Module):
        return None
    for m in model.modules():
        for attr in ("in_features", "in_channels"):
            v = getattr(m, attr, None)
            if isinstance(v, int):
                return attr, v
    return None


def _describe(t):
    return f"shape {tuple(t.shape)} ({str(t.dtype).replace('torch.', '')})"


def input_error(who, model, x, x_name, y, y_name, error):
    """A ``ValueError`` for a model that raised on ``x`` (names ``x``, shape and dtype)."""
    width = _input_width(model)
    hint = ""
    if width is not None and x.dim() >= 2:
        attr, v = width
        kind = "input features" if attr == "in_features" else "input channels"
        if x.shape[1] != v:
            hint = f" The model's first layer takes {v} {kind}; {x_name} has {x.shape[1]}."
        else:
            hint = f" The model's first layer takes {v} {kind}."
    ys = "" if y is None else f" and {y_name} of {_describe(y)}"
    msg = str(error).split("\n")[0].strip()
    return ValueError(
        f"{who}: the model raised {type(error).__name__} when called with {x_name} of "
        f"{_describe(x)}{ys}: {msg}.{hint} Check that {x_name} has one row per observation "
        "and the columns (and dtype) the model was built for."
    )


def _runs(fn):
    with torch.random.fork_rng(devices=[]):
        try:
            fn()
        except Exception:  # noqa: BLE001 - only whether it runs
            return False
    return True


def target_error(who, x, x_name, y, y_name, error):
    """A ``ValueError`` for a model that raised on ``y`` (and runs without it)."""
    msg = str(error).split("\n")[0].strip()
    return ValueError(
        f"{who}: the model raised {type(error).__name__} when called with {y_name} of "
        f"{_describe(y)} (it runs on {x_name} of {_describe(x)} without {y_name}): {msg}. Pass "
        f"{y_name} with one row per row of {x_name}, shaped as the model's observed site."
    )


# -- the target ---------------------------------------------------------------------------------


def _site_shape(site):
    fn = site["fn"]
    return tuple(fn.batch_shape + fn.event_shape)


def target_map(given, expected, y_name, site_name):
    """How a target of per-call shape ``given`` is passed to a site of shape ``expected``:
    ``None`` (as it is), ``"squeeze"`` or ``"unsqueeze"`` (a trailing singleton axis), or a
    ``ValueError`` naming ``y_name`` with both shapes."""
    given, expected = tuple(given), tuple(expected)
    if given == expected:
        return None
    if len(given) == len(expected) + 1 and given[:-1] == expected and given[-1] == 1:
        return "squeeze"
    if len(expected) == len(given) + 1 and expected[:-1] == given and expected[-1] == 1:
        return "unsqueeze"
    try:
        if tuple(torch.broadcast_shapes(given, expected)) == expected:
            return None  # a value the distribution broadcasts (Pyro's own semantics)
    except RuntimeError:
        pass
    raise ValueError(
        f"{y_name} has shape {given}, but the observed site {site_name!r} has shape "
        f"{expected} for these rows: pass {y_name} with shape {expected} (a trailing axis of "
        "size 1 is added or dropped automatically; any other shape would broadcast the "
        "log-likelihood or fail)"
    )


def apply_map(y, how):
    if y is None or how is None:
        return y
    return y.squeeze(-1) if how == "squeeze" else y.unsqueeze(-1)


def check_target_shape(y, expected, y_name="y", site_name="obs"):
    """``y`` reshaped to ``expected`` by the target rule (module docs), or ValueError."""
    return apply_map(y, target_map(y.shape, expected, y_name, site_name))


def _value_dtype(fn):
    """The dtype of the site's values: integer for a Categorical, floating for a Bernoulli or
    a real-valued site; None when unknown."""
    from ..guides.init import dist_dtype

    if fn.has_enumerate_support:
        try:
            return fn.enumerate_support(expand=False).dtype
        except Exception:  # noqa: BLE001 - a family without a cheap support
            return None
    return dist_dtype(fn)


def _is_integer(t):
    return not torch.is_floating_point(t) and not torch.is_complex(t)


class DataRule:
    """What a probe decided (module docs), applied to every batch of a data source."""

    def __init__(self, x_dtype=None, y_map=None, y_dtype=None, obs_name=None):
        self.x_dtype, self.y_map, self.y_dtype, self.obs_name = x_dtype, y_map, y_dtype, obs_name

    def x(self, x):
        return x if self.x_dtype is None or x is None else x.to(self.x_dtype)

    def y(self, y, y_name="y", mapped=False):
        """``y`` reshaped (unless ``mapped``: done already) and cast to the site's dtype."""
        if y is None:
            return None
        if not mapped:
            y = apply_map(y, self.y_map)
        if self.y_dtype is not None and y.dtype != self.y_dtype:
            if torch.is_floating_point(y) and _is_integer(torch.empty((), dtype=self.y_dtype)):
                bad = y != y.round()
                if bad.any():
                    row = int(bad.reshape(bad.shape[0], -1).any(-1).nonzero()[0, 0])
                    raise ValueError(
                        f"{y_name} must hold whole numbers for the discrete observed site "
                        f"{self.obs_name!r}; row {row} holds {y[row].tolist()}"
                    )
            y = y.to(self.y_dtype)
        return y


def _observed_site(probe, obs_name):
    if obs_name is not None:
        site = probe.observed.get(obs_name)
        return (obs_name, site) if site is not None else None
    if len(probe.observed) == 1:
        return next(iter(probe.observed.items()))
    return None


def conform_data(
    model,
    x,
    y=None,
    *,
    who,
    guide=None,
    x_name="x",
    y_name="y",
    args=(),
    kwargs=None,
    obs_name=None,
    finite=True,
    probe_rows=PROBE_ROWS,
    keep_rng=True,
):
    """``(x, y, probe, rule)``: ``x`` and ``y`` cast and checked (rows, finite values), the
    model probed on the first ``probe_rows`` rows (called as ``model(x, *args, y,
    **kwargs)``), and the rule of the module docs applied. The errors name ``x_name`` /
    ``y_name``.

    :param finite: refuse non-finite values of ``x`` and ``y`` (prediction only counts rows).
    :param keep_rng: probe with torch's random state forked, so that the probe's draws do
        not shift the caller's random stream (``fit`` draws its probe from it, as before).
    """
    kwargs = dict(kwargs or {})
    x = as_model_input(x, model, x_name, guide)
    y = as_model_input(y, model, y_name, guide)
    check_rows(x, y, x_name, y_name, finite=finite)
    n0 = min(x.shape[0], probe_rows)
    rule = DataRule()

    def call_args(xx, yy):
        return (xx, *args) if yy is None else (xx, *args, yy)

    def run(xx, yy, rows):
        ctx = torch.random.fork_rng(devices=[]) if keep_rng else contextlib.nullcontext()
        with ctx:
            return ModelProbe(probe_model(model, call_args(xx, yy), kwargs), rows)

    rng = torch.random.get_rng_state()  # a retry draws what a first success would have
    try:
        try:
            probe = run(x[:n0], None if y is None else y[:n0], n0)
        except Exception:
            if n0 == x.shape[0]:
                raise
            probe = run(x, y, x.shape[0])  # e.g. a subsample_size above the probe's rows
    except Exception as e:  # noqa: BLE001 - whatever the model raises, named below
        found = weights_in_subsampled_plate(getattr(e, "_pd_trace", None))
        if found is not None:
            raise ValueError(plate_message(who, *found)) from e
        if y is not None and _runs(lambda: run(x[:n0], None, n0)):  # the target is the cause
            raise target_error(who, x, x_name, y, y_name, e) from e
        torch.random.set_rng_state(rng)
        if _is_integer(x):  # integer features: the model computes in floating point
            xf = x.to(model_dtype(model, guide))
            try:
                probe = run(xf[:n0], None if y is None else y[:n0], n0)
            except Exception:  # noqa: BLE001 - report the error of x as given
                raise input_error(who, model, x, x_name, y, y_name, e) from e
            x, rule.x_dtype = xf, xf.dtype
        else:
            raise input_error(who, model, x, x_name, y, y_name, e) from e
    if y is not None:
        found = _observed_site(probe, obs_name)
        if found is not None:
            name, site = found
            rule.obs_name = name
            rule.y_map = _map_for_site(site, y[:n0] if probe.rows == n0 else y, y_name, name)
            rule.y_dtype = _value_dtype(site["fn"])
            y = apply_map(y, rule.y_map)
            check_support(y, probe, y_name, site=found)
            y = rule.y(y, y_name, mapped=True)
    return x, y, probe, rule


def _map_for_site(site, y_given, y_name, site_name):
    value = site["value"]
    expected = _site_shape(site)
    if not torch.is_tensor(value):
        return None
    if tuple(value.shape) == tuple(y_given.shape) or (
        value.dim() == y_given.dim() and tuple(value.shape[1:]) == tuple(y_given.shape[1:])
    ):  # the model observes y as given (a subsampled plate: some of its rows)
        # the expected shape for the rows of y: the site's, with y's rows first
        if value.dim() >= 1 and len(expected) >= 1 and value.shape[0] != y_given.shape[0]:
            expected = (y_given.shape[0],) + tuple(expected[1:])
        return target_map(tuple(y_given.shape), expected, y_name, site_name)
    # the model transformed y: check the value it observes
    target_map(tuple(value.shape), expected, f"the value observed at {site_name!r}", site_name)
    return None


def check_support(y, probe, y_name="y", offset=0, site=None):
    """``y`` within the support of the one observed site (class labels in range, counts
    non-negative ...); the error names the first bad row."""
    from torch.distributions import constraints

    if y is None:
        return
    if site is None:
        if len(probe.observed) != 1:
            return
        site = next(iter(probe.observed.items()))
    name, site = site
    support = site["fn"].support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if support is constraints.real or type(support) is type(constraints.real):
        return  # finiteness is checked with the rows
    try:
        ok = support.check(y)
    except (RuntimeError, TypeError):
        return
    if not torch.is_tensor(ok) or ok.shape[:1] != y.shape[:1]:
        return
    bad = ~ok.reshape(ok.shape[0], -1).all(-1)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{y_name} row {row + offset} holds {y[row].tolist()}, outside the support of the "
            f"observed site {name!r} ({type(site['fn']).__name__}: {_describe_support(support)})"
        )


def _describe_support(support):
    from torch.distributions import constraints

    if isinstance(support, constraints.integer_interval):
        return f"integers {support.lower_bound}..{support.upper_bound}"
    return str(support)


# -- the guide ----------------------------------------------------------------------------------


def check_guide_matches(model_trace, guide, who):
    """A guide set up on another model (its sites' shapes differ from this model's): a
    ``ValueError`` naming ``guide`` and the first differing site. Sites inside plates (whose
    shape follows the rows) and guides without a prototype trace are not compared."""
    proto = getattr(guide, "prototype_trace", None)
    if proto is None or model_trace is None:
        return
    model_sites = {
        n: s
        for n, s in model_trace.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)
    }
    for name, site in proto.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        if site["cond_indep_stack"] or name not in model_sites:
            continue
        other = model_sites[name]
        if other["cond_indep_stack"]:
            continue
        if _site_shape(site) != _site_shape(other):
            raise ValueError(
                f"{who}: the guide ({type(guide).__name__}) was built for a model whose site "
                f"{name!r} has shape {_site_shape(site)}; this model's has shape "
                f"{_site_shape(other)}. Build the guide on this model "
                f"({type(guide).__name__}(model, ...)) and fit it."
            )
    missing = [
        n
        for n, s in model_sites.items()
        if not s["cond_indep_stack"]
        and not s["infer"].get("_deterministic", False)
        and n not in proto.nodes
    ]
    if missing and any(
        s["type"] == "sample" and not s["is_observed"] and n not in model_sites
        for n, s in proto.nodes.items()
    ):
        raise ValueError(
            f"{who}: the guide ({type(guide).__name__}) was built for another model: this "
            f"model's latent sites {missing} are not among the guide's. Build the guide on this "
            f"model ({type(guide).__name__}(model, ...)) and fit it."
        )
