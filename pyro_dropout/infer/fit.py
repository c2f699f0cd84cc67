"""Fitting a model and guide with plain ``pyro.infer.SVI``."""

import contextlib
import inspect
import math

import pyro
import torch
from pyro.infer import SVI
from pyro.infer.util import is_validation_enabled
from tqdm import tqdm  # text bar: tqdm.auto warns in Jupyter without ipywidgets

from ..handlers import local_reparameterization as _lrt
from .elbo import JitMeanFieldELBO, MeanFieldELBO
from .optim import fused_adam

__all__ = ["fit"]


def _accepts_num_data(model):
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return "num_data" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def fit(
    model,
    guide,
    x,
    y,
    num_steps=None,
    num_epochs=None,
    batch_size=None,
    optim=None,
    lr=1e-3,
    local_reparameterization=True,
    jit=False,
    validate="first",
    num_particles=1,
    vectorize_particles=False,
    progress=True,
    callback=None,
    seed=None,
):
    r"""Fit ``guide`` to ``model`` on ``(x, y)`` with ``pyro.infer.SVI`` and
    :class:`~pyro_dropout.infer.MeanFieldELBO` (Pyro's ``TraceMeanField_ELBO`` estimator:
    analytic KLs where registered, without computing the log densities those make unused).

    :param num_steps: number of gradient steps, or
    :param num_epochs: number of passes over the data (``ceil(N / batch_size)`` steps each).
    :param batch_size: minibatch size; ``None`` uses all data each step. Minibatches are drawn
        without replacement each epoch and the model is called with ``num_data=N`` so the
        likelihood is scaled by ``N/B`` (one full KL per pass over the data).
    :param optim: a Pyro optimiser; default ``fused_adam({"lr": lr})`` (the same Adam update
        as ``pyro.optim.Adam({"lr": lr})``, one multi-tensor optimiser for all parameters:
        :class:`~pyro_dropout.infer.FusedOptim`).
    :param bool local_reparameterization: sample pre-activations instead of weights
        (:func:`~pyro_dropout.local_reparameterization`).
    :param bool jit: compile the loss with Pyro's JIT
        (:class:`~pyro_dropout.infer.JitMeanFieldELBO`): about 2× faster steps on small
        networks, for models whose structure is static (one trace per minibatch shape).
    :param validate: argument and shape checks (Pyro's and torch's validation, when enabled
        globally, as by default): ``"first"`` runs them on the first step of each minibatch
        shape and skips them afterwards (they cost ~20 % of a small network's step and
        the inputs' shapes no longer change); ``"always"`` on every step; ``"never"`` not at
        all. A non-finite loss stops the fit in every mode.
    :param callback: called as ``callback(step, loss)`` after each step; returning ``True`` stops.
    :param seed: if given, ``pyro.set_rng_seed(seed)`` first.

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
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"x has {n} rows but y has {y.shape[0]}")
    if batch_size is not None and not 1 <= batch_size:
        raise ValueError(f"batch_size must be a positive int, got {batch_size}")
    minibatch = batch_size is not None and batch_size < n
    if minibatch and not _accepts_num_data(model):
        raise ValueError(
            "minibatch training needs a model that accepts num_data=N (to scale the "
            "likelihood by N/B); pyro_dropout's models do, or pass batch_size=None"
        )
    steps_per_epoch = math.ceil(n / batch_size) if minibatch else 1
    total = num_steps if num_steps is not None else num_epochs * steps_per_epoch
    if total < 1:
        raise ValueError("num_steps/num_epochs must be at least 1")
    if seed is not None:
        pyro.set_rng_seed(seed)
    optim = optim if optim is not None else fused_adam({"lr": lr})
    elbo = (JitMeanFieldELBO if jit else MeanFieldELBO)(
        num_particles=num_particles,
        vectorize_particles=vectorize_particles,
        max_plate_nesting=getattr(model, "max_plate_nesting", float("inf")),
    )
    svi = SVI(model, guide, optim, elbo)
    if validate not in ("first", "always", "never"):
        raise ValueError(f"validate must be 'first', 'always' or 'never', got {validate!r}")
    validating = validate != "never" and is_validation_enabled()
    checked_shapes = set()
    losses = []
    ctx = _lrt() if local_reparameterization else contextlib.nullcontext()
    bar = tqdm(total=total, disable=not progress, desc=f"fit {type(guide).__name__}")
    order = None
    with ctx, bar:
        for step in range(total):
            if minibatch:
                k = step % steps_per_epoch
                if k == 0:
                    order = torch.randperm(n, device=x.device)
                idx = order[k * batch_size : (k + 1) * batch_size]
                args, kwargs = (x[idx], y[idx]), {"num_data": n}
            else:
                args, kwargs = (x, y), {}
            checked = args[0].shape in checked_shapes
            with pyro.validation_enabled(validating and not (checked and validate == "first")):
                loss = svi.step(*args, **kwargs)
            checked_shapes.add(args[0].shape)
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
