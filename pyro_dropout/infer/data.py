"""Inputs as users have them: numpy arrays, float64 tensors, data loaders; checked up front.

The dtype rule (used by :func:`~pyro_dropout.fit`, :func:`~pyro_dropout.predict` and the
ArviZ export): floating-point inputs (numpy ``float64`` from scikit-learn, a float64 tensor)
are cast to the **model's dtype**: the dtype of its floating parameters or buffers when it is
a ``torch.nn.Module`` that has any (this library's models do; ``model.double()`` makes them
float64); else that of the guide's parameters, once it has any; else torch's default dtype
(float32 unless changed with ``torch.set_default_dtype``, which is also what a Pyro model's
``dist.Normal(0., 1.)`` priors use). Integer and boolean arrays (class labels, counts) keep
their dtype here; the entry points then apply :mod:`pyro_dropout.infer.conform`: an integer
``x`` is cast to the model's dtype when the model fails on integers and runs on the cast,
integer labels are cast to the observed site's dtype. To fit a functional model in float64,
set the default dtype.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["as_model_input", "check_rows", "check_labels", "model_dtype"]


def _module_dtype(module):
    if isinstance(module, torch.nn.Module):
        for t in (*module.parameters(), *module.buffers()):
            if torch.is_floating_point(t):
                return t.dtype
    return None


def model_dtype(model, guide=None):
    """The model's dtype (module docs): its floating parameters' or buffers', else the
    guide's, else torch's default dtype."""
    return _module_dtype(model) or _module_dtype(guide) or torch.get_default_dtype()


def as_tensor(value, name):
    """``value`` as a tensor (numpy arrays and lists of numbers converted, dtype kept); a
    ``TypeError`` naming ``name`` for anything else."""
    if torch.is_tensor(value):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(
            f"{name} must be a tensor or an array of numbers; got {type(value).__name__} ({e})"
        ) from None


def as_model_input(value, model, name, guide=None):
    """``value`` as a tensor; floating values cast to :func:`model_dtype` (module docs)."""
    if value is None:
        return None
    value = as_tensor(value, name)
    if torch.is_floating_point(value):
        dtype = model_dtype(model, guide)
        if value.dtype != dtype:
            value = value.to(dtype)
    return value


def _first_bad_row(bad):
    """Index of the first row with a True entry of ``bad`` (rows = dim 0)."""
    rows = bad.reshape(bad.shape[0], -1).any(-1) if bad.dim() > 1 else bad
    return int(rows.nonzero()[0, 0])


def check_rows(x, y, x_name="x", y_name="y", offset=0, finite=True):
    """Same number of rows, at least one row, finite floating values (when ``finite``); the
    error names the argument and the first bad row (``offset`` is added, e.g. for a
    minibatch)."""
    if x.dim() == 0:
        raise ValueError(f"{x_name} must have one row per observation; got a scalar")
    n = x.shape[0]
    if n == 0:
        raise ValueError(f"{x_name} has no rows (shape {tuple(x.shape)}): pass at least one row")
    if y is not None:
        if y.dim() == 0:
            raise ValueError(f"{y_name} must have one row per observation; got a scalar")
        if y.shape[0] != n:
            raise ValueError(f"{x_name} has {n} rows but {y_name} has {y.shape[0]}")
    if not finite:
        return
    for t, name in ((x, x_name), (y, y_name)):
        if t is not None and torch.is_floating_point(t):
            bad = ~torch.isfinite(t)
            if bad.any():
                row = _first_bad_row(bad) + offset
                raise ValueError(
                    f"{name} has a non-finite value (NaN or inf) in row {row}: remove or impute "
                    "it before fitting"
                )


def check_labels(y, num_classes, y_name="y", offset=0):
    """Class labels: integers in ``[0, num_classes)``; the error names the first bad row."""
    if torch.is_floating_point(y):
        bad = y != y.round()
        if bad.any():
            row = _first_bad_row(bad) + offset
            raise ValueError(
                f"{y_name} must hold integer class labels; row {row} holds {y[row].tolist()}"
            )
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        row = _first_bad_row(bad) + offset
        raise ValueError(
            f"{y_name} must hold class labels in [0, {num_classes}) for a model with "
            f"{num_classes} classes; row {row} holds {y[row - offset].tolist()}"
        )
