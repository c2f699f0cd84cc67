"""Where ``fit``'s minibatches come from, and how each is scaled to the full data.

Four ways, chosen from the model (probed once, see :func:`probe_model`) and the data:

* **whole data** each step (no ``batch_size``, or one at least the data size);
* **the model's own subsampled plate** (``pyro.plate("data", N, subsample_size=B)``): every
  step passes all rows and sets the plate's indices (an epoch is a random permutation in
  chunks of ``B``), so the plate scales the likelihood by ``N / B`` itself;
* **``num_data``**: a model that takes ``num_data`` (this library's models) gets the
  minibatch rows and ``num_data=N`` (its plate then scales by ``N / B``);
* **any other model** gets the minibatch rows and :class:`ScaleObserved` multiplies the log
  density of its observed sites by ``N / B`` (an unbiased estimate of the full-data term,
  exactly what a subsampled plate does). Observed sites are assumed to be one term per row.
"""

from __future__ import annotations

import inspect
import math

import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import constraints

from .data import as_model_input, check_rows
from .draws import SubsampleIndices

__all__ = [
    "ModelProbe",
    "ScaleObserved",
    "accepts_num_data",
    "dataset_size",
    "minibatch_scaling",
    "probe_model",
]

#: Rows of the first probe of a model (the probe runs its forward pass once).
PROBE_ROWS = 512


class ScaleObserved(Messenger):
    """Multiply the log density of every observed site by ``scale`` (e.g. ``N / B``)."""

    def __init__(self, scale):
        super().__init__()
        self.scale = float(scale)

    @property
    def jit_key(self):  # a compiled loss bakes the scale in
        return (type(self), self.scale)

    def _pyro_sample(self, msg):
        if (
            msg["is_observed"]
            and not site_is_subsample(msg)
            and not msg["infer"].get("_deterministic", False)
        ):
            msg["scale"] = msg["scale"] * self.scale


def accepts_num_data(model):
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return "num_data" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class ModelProbe:
    """What one run of the model (see :func:`probe_model`) shows: its observed sites
    and the plates it subsamples."""

    def __init__(self, trace, rows):
        self.rows = rows
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


def probe_model(model, args, kwargs):
    """Run ``model`` once, hidden from enclosing handlers, with latent sites at
    :func:`~pyro_dropout.guides.init_to_fan_in` (real sites are not sampled: an improper
    prior is fine)."""
    from ..guides.init import dist_dtype, init_to_fan_in

    # init_to_fan_in builds CPU tensors; the model's own layers (e.g. after model.to("cuda"))
    # expect them where the data are, in the site's dtype (as the guides place theirs).
    tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
    device = tensors[0].device if tensors else None

    def init(site):
        value = init_to_fan_in(site)
        if torch.is_tensor(value) and value.is_floating_point():
            value = value.to(device=device, dtype=dist_dtype(site["fn"]))
        return value

    with poutine.block(), torch.no_grad():
        tr = poutine.trace(InitMessenger(init)(model)).get_trace(*args, **kwargs)
    return tr


def check_support(y, probe, y_name="y", offset=0):
    """``y`` within the support of the one observed site (class labels in range, counts
    non-negative ...); the error names the first bad row."""
    if y is None or len(probe.observed) != 1:
        return
    ((name, site),) = probe.observed.items()
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
            f"observed site {name!r} ({type(site['fn']).__name__}: {_describe(support)})"
        )


def _describe(support):
    if isinstance(support, constraints.integer_interval):
        return f"integers {support.lower_bound}..{support.upper_bound}"
    return str(support)


class InMemoryBatches:
    """Minibatches of in-memory tensors (module docs)."""

    def __init__(self, model, x, y, batch_size, jit):
        self.x, self.y = x, y
        self.n = x.shape[0]
        check_rows(x, y)
        n0 = min(self.n, PROBE_ROWS)
        args = (x[:n0],) if y is None else (x[:n0], y[:n0])
        try:
            probe = ModelProbe(probe_model(model, args, {}), n0)
        except Exception:  # noqa: BLE001 - e.g. subsample_size > n0: probe all rows
            probe = ModelProbe(probe_model(model, self._args(x, y), {}), self.n)
        self.probe = probe
        check_support(y, probe)
        self.plate = None
        #: Why the loss of this source cannot be compiled (None: it can).
        self.jit_blocker = None
        if probe.plates:
            if len(probe.plates) > 1:
                raise ValueError(
                    f"fit: the model subsamples several plates {sorted(probe.plates)}; fit drives "
                    "one subsampled data plate"
                )
            ((name, (size, b)),) = probe.plates.items()
            size = self.n if size == probe.rows else size  # a plate over the rows given
            if batch_size is not None and batch_size != b:
                raise ValueError(
                    f"fit: batch_size={batch_size} but the model's plate {name!r} subsamples "
                    f"{b} rows (subsample_size={b}); pass batch_size=None (or {b})"
                )
            if jit is True:
                raise ValueError(
                    f"fit: jit=True cannot be used with the subsampled plate {name!r}: the "
                    "compiled loss would keep the first minibatch's indices. Use jit=False, or "
                    "give the model num_data and let fit pass minibatches"
                )
            self.jit_blocker = (
                f"the model subsamples its own plate {name!r}: a compiled loss would keep the "
                "first minibatch's indices; give the model num_data to compile it"
            )
            self.plate = (name, size, b)
            self.mode = "plate"
            self.batch_size = b
            self.steps_per_epoch = math.ceil(size / b)
        elif batch_size is None or batch_size >= self.n:
            self.mode, self.batch_size, self.steps_per_epoch = "full", self.n, 1
        else:
            self.mode = "num_data" if accepts_num_data(model) else "scale"
            self.batch_size = batch_size
            self.steps_per_epoch = math.ceil(self.n / batch_size)
        self._order = None

    @staticmethod
    def _args(x, y):
        return (x,) if y is None else (x, y)

    def step(self, step):
        """``(args, kwargs, messenger or None)`` of step ``step``."""
        k = step % self.steps_per_epoch
        if self.mode == "full":
            return self._args(self.x, self.y), {}, None
        if k == 0:
            size = self.plate[1] if self.mode == "plate" else self.n
            self._order = torch.randperm(size, device=self.x.device)
        b = self.batch_size
        idx = self._order[k * b : (k + 1) * b]
        if self.mode == "plate":
            if idx.numel() < b:  # complete the last chunk: a random subset of distinct rows
                idx = torch.cat([idx, self._order[: b - idx.numel()]])
            return self._args(self.x, self.y), {}, SubsampleIndices({self.plate[0]: idx})
        args = self._args(self.x[idx], None if self.y is None else self.y[idx])
        if self.mode == "num_data":
            return args, {"num_data": self.n}, None
        return args, {}, ScaleObserved(self.n / idx.numel())


def dataset_size(loader, num_data=None, who="fit"):
    """The full-data size ``N`` for a loader's minibatch scale: ``num_data`` when given, else
    the length of the loader's dataset (the whole data set, also under a
    ``DistributedSampler``, which only picks each rank's rows)."""
    if num_data is not None:
        return int(num_data)
    try:
        return len(loader.dataset)
    except TypeError:
        raise ValueError(
            f"{who}: the DataLoader's dataset has no length (an IterableDataset or a stream), "
            "so the full data size that scales the likelihood is unknown: pass num_data=N (the "
            "number of rows one pass over the data yields)"
        ) from None


def check_loader_probe(probe, who="fit"):
    """A loader makes the minibatches: the model must not subsample a plate itself."""
    if probe.plates:
        raise ValueError(
            f"{who}: the model subsamples the plate(s) {sorted(probe.plates)} itself; with a "
            "DataLoader the loader makes the minibatches: give the plate no subsample_size (and "
            "the model a num_data argument, or none)"
        )


def minibatch_scaling(takes_num_data, num_data, rows):
    r"""``(kwargs, messenger or None)`` that scale a minibatch of ``rows`` rows to the full
    data size ``N = num_data``: ``{"num_data": N}`` for a model that takes it (its data plate
    then scales the likelihood by ``N / rows``), else :class:`ScaleObserved` ``(N / rows)``."""
    if takes_num_data:
        return {"num_data": num_data}, None
    return {}, ScaleObserved(num_data / rows)


def loader_batch(batch, model, guide=None, who="fit"):
    """``(x, y or None)`` from one DataLoader batch (a tensor ``x`` or a pair ``(x, y)``), with
    floating values cast to the model's dtype."""
    if torch.is_tensor(batch):
        batch = (batch,)
    if not isinstance(batch, (tuple, list)) or not 1 <= len(batch) <= 2:
        raise TypeError(
            f"{who}: a DataLoader batch must be a tensor x or a pair (x, y); got "
            f"{type(batch).__name__}"
        )
    x = as_model_input(batch[0], model, "x", guide)
    y = as_model_input(batch[1], model, "y", guide) if len(batch) == 2 else None
    return x, y


class LoaderBatches:
    """Minibatches streamed from a ``torch.utils.data.DataLoader`` (module docs).

    A loader without a length (over an ``IterableDataset``) needs ``num_data`` and is
    restarted whenever it is exhausted (``steps_per_epoch`` is then ``None``)."""

    def __init__(self, model, loader, guide=None, num_data=None):
        self.loader = loader
        self.model = model
        self.guide = guide
        self.n = dataset_size(loader, num_data)
        try:
            self.steps_per_epoch = len(loader)
        except TypeError:
            self.steps_per_epoch = None  # a stream: an epoch ends when the iterator does
        if self.steps_per_epoch == 0:
            raise ValueError("fit: the DataLoader yields no batches")
        self.num_data = accepts_num_data(model)
        self.jit_blocker = None  # a loader's model may not subsample its own plate
        self._it = None
        self._seen = 0
        self._first_epoch = True
        self.probe = None

    def _batch(self, batch):
        return loader_batch(batch, self.model, self.guide)

    def _next(self, step):
        if self._it is None or (
            self.steps_per_epoch is not None and step % self.steps_per_epoch == 0
        ):
            return self._restart(step)
        try:
            return next(self._it)
        except StopIteration:
            if self.steps_per_epoch is not None:
                raise
            return self._restart(step)

    def _restart(self, step):
        if self._it is not None:
            self._first_epoch = False
        self._it = iter(self.loader)
        self._seen = 0
        try:
            return next(self._it)
        except StopIteration:
            raise ValueError(f"fit: the DataLoader yielded no batches (step {step})") from None

    def step(self, step):
        x, y = self._batch(self._next(step))
        args = (x,) if y is None else (x, y)
        if self.probe is None:
            self.probe = ModelProbe(probe_model(self.model, args, {}), x.shape[0])
            check_loader_probe(self.probe)
        if self._first_epoch:  # checked as the batches stream by, once
            check_rows(x, y, offset=self._seen)
            check_support(y, self.probe, offset=self._seen)
        self._seen += x.shape[0]
        kwargs, scaling = minibatch_scaling(self.num_data, self.n, x.shape[0])
        return args, kwargs, scaling
