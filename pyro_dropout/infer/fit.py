"""Fitting a model and guide with plain ``pyro.infer.SVI``."""

import contextlib
import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pyro
import torch
from pyro.infer.util import is_validation_enabled
from pyro.optim import PyroOptim
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from tqdm import tqdm  # text bar: tqdm.auto warns in Jupyter without ipywidgets

from .._checks import positive_int
from ..handlers import local_reparameterization as _lrt
from .compiled import CompilationWarning
from .compiled_svi import CompiledSVI
from .conform import check_guide_matches, conform_data
from .data import as_model_input
from .elbo import make_elbo
from .minibatch import InMemoryBatches, LoaderBatches
from .optim import fused_adam

__all__ = ["fit"]


def fit(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor | np.ndarray | Dataset | DataLoader,
    y: torch.Tensor | np.ndarray | None = None,
    num_steps: int | None = None,
    num_epochs: int | None = None,
    batch_size: int | None = None,
    optim: PyroOptim | None = None,
    lr: float = 1e-2,
    local_reparameterization: bool = True,
    estimator: str = "auto",
    jit: bool | Literal["auto"] = "auto",
    cuda_graph: bool = False,
    validate: Literal["first", "always", "never"] = "first",
    num_particles: int = 1,
    vectorize_particles: bool = False,
    progress: bool = True,
    callback: Callable[[int, float], bool | None] | None = None,
    seed: int | None = None,
    num_data: int | None = None,
    devices: int | None = None,
    model_args: tuple = (),
    model_kwargs: dict[str, Any] | None = None,
) -> list[float]:
    r"""Fit ``guide`` to ``model`` on ``(x, y)`` with ``pyro.infer.SVI`` and
    :class:`~pyro_dropout.infer.MeanFieldELBO` (Pyro's ``TraceMeanField_ELBO`` estimator:
    analytic KLs where registered, without computing the log densities those make unused).

    Any Pyro model called as ``model(x, y)`` works: this library's models, ``PyroModule``
    networks, functional models; a model with further arguments is called as
    ``model(x, *model_args, y, **model_kwargs)``.

    :param x: inputs, one row per observation: a tensor or numpy array (floating values are
        cast to the model's dtype, see :mod:`pyro_dropout.infer.data`), a
        ``torch.utils.data.Dataset`` of ``(x, y)`` pairs (shuffled each epoch; an
        ``IterableDataset`` is read in its own order and needs ``num_data`` and
        ``num_steps``), or a ``DataLoader`` yielding ``(x, y)`` batches (then no ``y`` and no
        ``batch_size``). The full data size ``N`` of the minibatch scale is the dataset's
        length (``num_data`` for a stream), also under a ``DistributedSampler``.
    :param y: targets, one row per row of ``x`` (None for a Dataset or DataLoader). All rows
        are checked before the first step: finite values and, for a discrete observed site,
        values in its support (e.g. class labels below the number of classes); the error
        names the argument and the first bad row. Streamed batches are checked during the
        first epoch (also on the Lightning route). The shape must be the observed site's, up
        to a trailing axis of size 1 (``(N, 1)`` for a site of shape ``(N,)`` and the reverse
        are reshaped; any other shape is refused); integer labels are cast to the site's dtype
        (see :mod:`pyro_dropout.infer.conform`).
    :param num_steps: number of gradient steps, or
    :param num_epochs: number of passes over the data (``ceil(N / batch_size)`` steps each).
    :param batch_size: minibatch size; ``None`` uses all data each step. Minibatches are drawn
        without replacement each epoch and the likelihood is scaled by ``N/B`` (one full KL per
        pass over the data): through ``num_data=N`` for models that take it (this library's),
        by scaling the observed sites otherwise, and through the indices of the model's own
        subsampled plate when it has one (``batch_size`` is then its ``subsample_size``); see
        :mod:`pyro_dropout.infer.minibatch`.
    :param optim: a Pyro optimiser; default ``fused_adam({"lr": lr})`` (the same Adam update
        as ``pyro.optim.Adam({"lr": lr})``, one Adam on a flat buffer of all parameters:
        :class:`~pyro_dropout.infer.FusedOptim`).
    :param float lr: Adam's learning rate (default 1e-2: on small regression sets with ~1,000
        steps, 1e-3 under-fitted, e.g. yacht's test log-likelihood 0.9 nats per point lower;
        ``tools/small_data_defaults.py``, ``docs/guides/concrete-dropout.md``).
    :param bool local_reparameterization: sample pre-activations instead of weights
        (:func:`~pyro_dropout.local_reparameterization`).
    :param estimator: with local reparameterisation, how each layer is sampled per example:
        ``"auto"`` (exact LRT for Linear layers; Flipout, or one weight per example for MC
        dropout, for convolutions), ``"lrt"``, ``"flipout"`` or ``"per_example"``.
    :param jit: compile the loss (:class:`~pyro_dropout.infer.JitMeanFieldELBO`: one checked
        capture per minibatch shape, replayed as a ``torch.fx`` graph; several times faster
        steps on small networks, see ``docs/benchmarks/speed.md``; the graphs are freed with
        the fit). ``"auto"`` (default): compile, and where the model cannot be compiled (a
        capture fails or does not replay its call, the captured graph changes with the data, a
        model that subsamples its own plate, more than 16 minibatch shapes) train eagerly with
        one :class:`~pyro_dropout.infer.CompilationWarning` that says why; ``True``: compile or
        raise; ``False``: eager (Pyro's Python effect handling at every step; use it for a
        model with Python side effects a capture cannot see, or to step through it in a
        debugger).
    :param bool cuda_graph: on a GPU, record each compiled step (the loss graph, its
        backward, the flat Adam update) as a CUDA graph after three warm-up steps and replay
        it: one launch per step instead of one per kernel, for small networks whose steps are
        bound by kernel launches (see :mod:`~pyro_dropout.infer.cuda_graph` and the CUDA rows
        of ``docs/benchmarks/speed.md``). Needs ``jit``; the random draws then come from the
        graph's replays (the same distribution; measured, the same numbers). A step that
        cannot be graphed (CPU tensors, an optimiser other than the default Adam) runs without
        a graph, with one :class:`~pyro_dropout.infer.CompilationWarning` that says why; a
        recording that fails inside CUDA (e.g. an operation that synchronises with the CPU)
        and breaks torch's CUDA generator is a ``RuntimeError`` that says to use
        ``cuda_graph=False``.
    :param validate: argument and shape checks (Pyro's and torch's validation, when enabled
        globally, as by default): ``"first"`` runs them on the first step of each minibatch
        shape and skips them afterwards (they cost ~20 % of a small network's step and
        the inputs' shapes no longer change); ``"always"`` on every step; ``"never"`` not at
        all. A non-finite loss stops the fit in every mode.
    :param callback: called as ``callback(step, loss)`` after each step; returning ``True`` stops.
    :param seed: if given, ``pyro.set_rng_seed(seed)`` first.
    :param int num_data: the full data size ``N`` for a streamed source whose dataset has no
        length (an ``IterableDataset``: then pass ``num_steps``, as an epoch's length is
        unknown); by default the length of the Dataset or of the DataLoader's dataset. A
        positive integer, at least the rows of one minibatch; a value that differs from the
        dataset's length is used, with a warning. For in-memory tensors ``N`` is their number
        of rows (a different ``num_data`` is refused).
    :param int devices: train with PyTorch Lightning (extra ``lightning``) on this many
        devices instead of plain SVI: ``1`` for one process, ``K > 1`` for
        ``strategy="ddp"`` on ``K`` CPU processes or GPUs (Lightning's launcher re-runs the
        script for the other ranks: run it as a script). The same ELBO, scale and Adam update
        (:class:`pyro_dropout.lightning.BayesianModule`; ``optim`` is not accepted); the
        returned losses are this process's. See ``docs/scaling-out.md``.
    :param tuple model_args: further positional arguments of the model (and guide), passed
        after ``x`` and before ``y``.
    :param dict model_kwargs: further keyword arguments of the model (and guide), as
        ``predict(..., **model_kwargs)`` passes them. With in-memory ``x``, a tensor (in
        either) with one row per row of ``x`` is sliced with each minibatch; anything else
        (a tensor of another length, a number, a string) is passed whole. Floating arrays are
        cast to the model's dtype. Not accepted with a Dataset, a DataLoader or ``devices``
        (put per-row tensors in the dataset).

    ``model.max_plate_nesting`` is passed to the ELBO when the model has it (the library's
    models do); for a wrapped model (e.g. ``poutine.block(model)``) Pyro guesses it.
    :returns: the list of per-step losses (the ELBO loss, i.e. the negative ELBO estimate per
        minibatch, on the full-data scale).

    This is a convenience: ``SVI(model, guide, optim, TraceMeanField_ELBO()).step(x, y)`` under
    ``local_reparameterization()`` computes the same loss.

    Example::

        model = BayesianMLP(x.shape[1], 1, hidden=(50,), tau=10.0)
        guide = AutoDropout(model, dropout_rate=0.05)
        losses = fit(model, guide, x, y, num_epochs=200, batch_size=128)
    """
    if (num_steps is None) == (num_epochs is None):
        raise ValueError("pass exactly one of num_steps and num_epochs")
    total_arg = num_steps if num_steps is not None else num_epochs
    name = "num_steps" if num_steps is not None else "num_epochs"
    positive_int(total_arg, name)
    if batch_size is not None:
        positive_int(batch_size, "batch_size")
    positive_int(num_particles, "num_particles")
    if validate not in ("first", "always", "never"):
        raise ValueError(f"validate must be 'first', 'always' or 'never', got {validate!r}")
    if seed is not None:
        pyro.set_rng_seed(seed)
    if num_data is not None:
        positive_int(num_data, "num_data")
    model_args, model_kwargs = _model_extras(model, guide, model_args, model_kwargs, x, devices)
    if jit not in (True, False, "auto"):
        raise ValueError(f"jit must be True, False or 'auto', got {jit!r}")
    if cuda_graph not in (True, False):
        raise ValueError(f"cuda_graph must be True or False, got {cuda_graph!r}")
    if cuda_graph and jit is False:
        raise ValueError(
            "fit: cuda_graph=True records the compiled step; it needs jit=True or 'auto'"
        )
    if devices is not None:
        if cuda_graph:
            raise ValueError(
                "fit(devices=...) trains with Lightning, without CUDA graphs: drop cuda_graph"
            )
        return _fit_on_devices(**locals())
    batches = _batches(model, guide, x, y, batch_size, jit, num_data, model_args, model_kwargs)
    if num_steps is None and batches.steps_per_epoch is None:
        raise ValueError(
            "fit: the data are a stream without a length (IterableDataset), so an epoch has "
            "no known number of steps: pass num_steps instead of num_epochs"
        )
    total = num_steps if num_steps is not None else num_epochs * batches.steps_per_epoch
    optim = optim if optim is not None else fused_adam({"lr": lr})
    if jit == "auto" and batches.jit_blocker is not None:
        warnings.warn(
            f"fit: the loss is not compiled ({batches.jit_blocker}); training eagerly: the same "
            "loss, slower steps. Pass jit=False to train eagerly without this warning.",
            CompilationWarning,
            stacklevel=2,
        )
        jit = False
    elbo = make_elbo(model, jit, num_particles, vectorize_particles)
    svi = CompiledSVI(model, guide, optim, elbo, cuda_graph=cuda_graph)
    validating = validate != "never" and is_validation_enabled()
    checked_shapes = set()
    losses = []
    ctx = _lrt(estimator=estimator) if local_reparameterization else contextlib.nullcontext()
    bar = tqdm(total=total, disable=not progress, desc=f"fit {type(guide).__name__}")
    with ctx, bar:
        for step in range(total):
            args, kwargs, scaling = batches.step(step)
            if step == 0:  # the model has been probed by now
                check_guide_matches(batches.probe.trace, guide, "fit")
                _warn_if_model_params_are_shared(model, guide, batches.probe.params)
            shape = tuple(args[0].shape)
            checked = shape in checked_shapes
            with (
                pyro.validation_enabled(validating and not (checked and validate == "first")),
                scaling if scaling is not None else contextlib.nullcontext(),
            ):
                loss = svi.step(*args, **kwargs)
            checked_shapes.add(shape)
            losses.append(loss)
            if not math.isfinite(loss):
                bar.close()
                raise FloatingPointError(
                    f"fit: the loss became {loss} at step {step}; lower the learning rate, "
                    "or check the data scale and the prior/noise settings"
                )
            if step % max(1, total // 100) == 0 or step == total - 1:
                bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
            bar.update()
            if callback is not None and callback(step, loss):
                break
    return losses


_FITTED: weakref.WeakKeyDictionary = (
    weakref.WeakKeyDictionary()
)  # model -> weak set of the guides fitted on it


def _warn_if_model_params_are_shared(model, guide, params):
    """Never silent: a model's own learnable parameters are shared by every guide fitted on
    that model object (Pyro's param store is global)."""
    try:
        seen = _FITTED.setdefault(model, weakref.WeakSet())
    except TypeError:  # not weak-referenceable: nothing to track
        return
    others = [g for g in seen if g is not guide]
    seen.add(guide)
    if params and others:
        warnings.warn(
            f"fit: the model has learnable parameters of its own ({', '.join(params)}) and was "
            f"fitted before with another guide ({type(others[0]).__name__}). Model parameters "
            "are shared: this fit continues from them and changes what the earlier fit "
            "predicts. Make them latent sites (each guide then infers its own, as "
            "BayesianMLP does with its noise scale) or build one model per guide.",
            UserWarning,
            stacklevel=3,
        )


def _fit_on_devices(*, model, guide, x, y, batch_size, optim, devices, **kw):
    """``fit(..., devices=K)``: the same fit on a Lightning Trainer (see the docstring)."""
    positive_int(devices, "devices")
    if optim is not None:
        raise ValueError(
            "fit(devices=...) trains with torch.optim.Adam(lr=lr); for another optimiser use "
            "pyro_dropout.lightning.BayesianModule(model, guide, optimizer=...) with a Trainer"
        )
    from .lightning_module import fit_on_devices  # lazy: Lightning is an optional extra

    if isinstance(x, (DataLoader, Dataset)):  # the checks and the loader of the SVI route
        loader = _batches(model, guide, x, y, batch_size, False, kw["num_data"]).loader
    else:
        x, y, probe, _ = conform_data(model, x, y, who="fit", guide=guide)
        _check_in_memory_num_data(kw["num_data"], x.shape[0])
        check_guide_matches(probe.trace, guide, "fit")
        data = TensorDataset(x) if y is None else TensorDataset(x, y)
        loader = DataLoader(data, batch_size=batch_size or x.shape[0], shuffle=True)
    keys = (
        "num_steps", "num_epochs", "num_data", "lr", "local_reparameterization", "estimator",
        "jit", "num_particles", "vectorize_particles", "validate", "progress", "callback", "seed",
    )  # fmt: skip
    return fit_on_devices(model, guide, loader, devices=devices, **{k: kw[k] for k in keys})


def _model_extras(model, guide, model_args, model_kwargs, x, devices):
    """``model_args`` as a tuple and ``model_kwargs`` as a dict, arrays cast as ``x``."""
    if isinstance(model_args, (str, bytes, dict)) or not isinstance(model_args, (tuple, list)):
        raise TypeError(
            f"model_args must be a tuple of further positional arguments of the model; got "
            f"{type(model_args).__name__} (for one argument z pass model_args=(z,))"
        )
    if model_kwargs is None:
        model_kwargs = {}
    if not isinstance(model_kwargs, dict) or not all(isinstance(k, str) for k in model_kwargs):
        raise TypeError(
            f"model_kwargs must be a dict of keyword arguments of the model; got "
            f"{type(model_kwargs).__name__}"
        )
    if "num_data" in model_kwargs:
        raise ValueError(
            "model_kwargs: pass num_data to fit itself (fit passes num_data=N to a model that "
            "takes it, with minibatches)"
        )
    if (model_args or model_kwargs) and (
        devices is not None or isinstance(x, (Dataset, DataLoader))
    ):
        raise ValueError(
            "model_args / model_kwargs are supported with in-memory x only (not with a Dataset, "
            "a DataLoader or devices): put per-row tensors into the dataset's x"
        )

    def cast(v, name):
        if torch.is_tensor(v) or isinstance(v, np.ndarray):
            return as_model_input(v, model, name, guide)
        return v

    args = tuple(cast(v, f"model_args[{i}]") for i, v in enumerate(model_args))
    kwargs = {k: cast(v, f"model_kwargs[{k!r}]") for k, v in model_kwargs.items()}
    return args, kwargs


def _check_in_memory_num_data(num_data, n):
    if num_data is not None and num_data != n:
        raise ValueError(
            f"fit: num_data={num_data} but x has {n} rows: with in-memory data N is the number "
            "of rows of x; leave num_data out (it is for streamed data without a length)"
        )


def _batches(model, guide, x, y, batch_size, jit, num_data=None, model_args=(), model_kwargs=None):
    """The minibatch source for ``fit``'s data (see :mod:`pyro_dropout.infer.minibatch`)."""
    if isinstance(x, DataLoader):
        if y is not None or batch_size is not None:
            raise ValueError(
                "fit: with a DataLoader pass neither y nor batch_size (the loader yields (x, y) "
                "batches of its own size)"
            )
        return LoaderBatches(model, x, guide, num_data)
    if isinstance(x, IterableDataset):
        if y is not None:
            raise ValueError("fit: with a Dataset (yielding (x, y) pairs) pass no y")
        if batch_size is None:
            raise ValueError(
                "fit: an IterableDataset has no length to make one full batch of: pass "
                "batch_size (or a DataLoader over it)"
            )
        loader = DataLoader(x, batch_size=batch_size)  # a stream is read in its own order
        return LoaderBatches(model, loader, guide, num_data)
    if isinstance(x, Dataset):
        if y is not None:
            raise ValueError("fit: with a Dataset (yielding (x, y) pairs) pass no y")
        size = len(x) if batch_size is None else batch_size
        loader = DataLoader(x, batch_size=size, shuffle=True)
        return LoaderBatches(model, loader, guide, num_data)
    _check_in_memory_num_data(num_data, _rows(x))
    return InMemoryBatches(model, x, y, batch_size, jit, guide, model_args, model_kwargs)


def _rows(x):
    shape = getattr(x, "shape", None)
    if shape is None:
        try:
            shape = np.shape(x)
        except Exception:  # noqa: BLE001 - not an array: as_model_input says so
            return None
    return shape[0] if len(shape) else None
