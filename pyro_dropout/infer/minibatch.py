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
import warnings

import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from .._checks import positive_int
from .conform import ModelProbe, apply_map, check_support, conform_data, probe_model
from .data import as_model_input, check_rows
from .draws import SubsampleIndices

__all__ = [
    "ModelProbe",
    "check_support",
    "ScaleObserved",
    "StreamCheck",
    "accepts_num_data",
    "dataset_size",
    "minibatch_scaling",
    "probe_model",
]


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


class InMemoryBatches:
    """Minibatches of in-memory tensors (module docs).

    ``model_args`` / ``model_kwargs`` are further arguments of the model, which is called as
    ``model(x, *model_args, y, **model_kwargs)``: a tensor with one row per row of ``x`` is
    sliced with each minibatch, anything else is passed whole."""

    def __init__(self, model, x, y, batch_size, jit, guide=None, model_args=(), model_kwargs=None):
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        x, y, probe, self.rule = conform_data(
            model,
            x,
            y,
            who="fit",
            guide=guide,
            args=self.model_args,
            kwargs=self.model_kwargs,
            keep_rng=False,
        )
        self.x, self.y = x, y
        self.n = x.shape[0]
        self.probe = probe
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

    def _call(self, x, y, idx=None):
        """``(args, kwargs)`` of ``model(x, *model_args, y, **model_kwargs)``, per-row extras
        sliced by ``idx``."""

        def part(v):
            if idx is not None and torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == self.n:
                return v[idx]
            return v

        extra = tuple(part(v) for v in self.model_args)
        args = (x, *extra) if y is None else (x, *extra, y)
        return args, {k: part(v) for k, v in self.model_kwargs.items()}

    def step(self, step):
        """``(args, kwargs, messenger or None)`` of step ``step``."""
        k = step % self.steps_per_epoch
        if self.mode == "full":
            return (*self._call(self.x, self.y), None)
        if k == 0:
            size = self.plate[1] if self.mode == "plate" else self.n
            self._order = torch.randperm(size, device=self.x.device)
        b = self.batch_size
        idx = self._order[k * b : (k + 1) * b]
        if self.mode == "plate":
            if idx.numel() < b:  # complete the last chunk: a random subset of distinct rows
                idx = torch.cat([idx, self._order[: b - idx.numel()]])
            return (*self._call(self.x, self.y), SubsampleIndices({self.plate[0]: idx}))
        args, kwargs = self._call(self.x[idx], None if self.y is None else self.y[idx], idx)
        if self.mode == "num_data":
            return args, {**kwargs, "num_data": self.n}, None
        return args, kwargs, ScaleObserved(self.n / idx.numel())


def dataset_size(loader, num_data=None, who="fit"):
    """The full-data size ``N`` for a loader's minibatch scale: ``num_data`` when given, else
    the length of the loader's dataset (the whole data set, also under a
    ``DistributedSampler``, which only picks each rank's rows)."""
    try:
        length = len(loader.dataset)
    except TypeError:
        length = None
    if num_data is not None:
        num_data = positive_int(num_data, "num_data")
        if length is not None and length != num_data:
            warnings.warn(
                f"{who}: num_data={num_data} but the DataLoader's dataset has {length} rows: the "
                f"likelihood is scaled as if the data had {num_data} rows ({num_data / length:.3g}"
                " times the data). Leave num_data out to use the dataset's length (it is needed "
                "only for a dataset without one).",
                UserWarning,
                stacklevel=3,
            )
        return num_data
    if length is None:
        raise ValueError(
            f"{who}: the DataLoader's dataset has no length (an IterableDataset or a stream), "
            "so the full data size that scales the likelihood is unknown: pass num_data=N (the "
            "number of rows one pass over the data yields)"
        )
    return length


def check_num_data_covers(num_data, rows, who="fit"):
    """``num_data`` (the full data size) is at least the rows of one minibatch."""
    if num_data < rows:
        raise ValueError(
            f"{who}: num_data={num_data} is smaller than the {rows} rows of one minibatch: "
            "num_data is the number of rows of the whole data set (one pass over the data), "
            "which scales each minibatch's likelihood by num_data / rows"
        )


class StreamCheck:
    """The data checks of ``fit`` for streamed batches (``fit``'s loader route and
    :class:`~pyro_dropout.infer.lightning_module.BayesianModule`): the first batch probes the
    model and fixes the rule of :mod:`~pyro_dropout.infer.conform` (target shape and dtype,
    integer inputs); every batch is conformed by it; during the first epoch the rows are
    checked (finite values, the observed site's support) with an error naming the row of the
    epoch's stream."""

    def __init__(self, model, guide=None, who="fit"):
        self.model, self.guide, self.who = model, guide, who
        self.probe = None
        self.rule = None
        self.seen = 0  # rows of the current (first) epoch so far

    def __call__(self, batch, check_rows_now):
        """``(x, y)`` of one batch, conformed (and checked when ``check_rows_now``)."""
        x, y = loader_batch(batch, self.model, self.guide, self.who)
        if self.probe is None:
            x, y, self.probe, self.rule = conform_data(
                self.model,
                x,
                y,
                who=self.who,
                guide=self.guide,
                finite=check_rows_now,
                keep_rng=False,
            )
            check_loader_probe(self.probe, self.who)
        else:
            x = self.rule.x(x)
            y = apply_map(y, self.rule.y_map)
            if check_rows_now:
                check_rows(x, y, offset=self.seen)
                check_support(y, self.probe, offset=self.seen)
            y = self.rule.y(y, mapped=True)
        if check_rows_now:
            self.seen += x.shape[0]
        return x, y


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
        self._first_epoch = True
        self._check = StreamCheck(model, guide, "fit")

    @property
    def probe(self):
        return self._check.probe

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
        self._check.seen = 0
        try:
            return next(self._it)
        except StopIteration:
            raise ValueError(f"fit: the DataLoader yielded no batches (step {step})") from None

    def step(self, step):
        # checked as the batches stream by, during the first epoch
        x, y = self._check(self._next(step), self._first_epoch)
        check_num_data_covers(self.n, x.shape[0])
        args = (x,) if y is None else (x, y)
        kwargs, scaling = minibatch_scaling(self.num_data, self.n, x.shape[0])
        return args, kwargs, scaling
