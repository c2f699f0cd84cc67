"""Prediction leaves the model as it found it: :func:`module_mode` runs the model and the guide
in eval mode (or the mode asked for) and restores every module's mode and buffers afterwards.

Why: ``torch.nn`` modules that behave differently in training (``BatchNorm*`` normalises with
the batch's statistics and moves its running statistics; ``nn.Dropout`` drops units) would
otherwise predict with whatever mode the last training step left, and a prediction would
change the model (``num_batches_tracked``, ``running_mean``). Every entry point that runs a
fitted model to predict or score it (:func:`~pyro_dropout.predict`, the ArviZ export,
``compare``, the NUTS reference) runs inside this context.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

__all__ = ["MODULE_MODES", "module_mode", "modules_of"]

#: ``"eval"`` (the default of the prediction functions) or ``"train"``.
MODULE_MODES = ("eval", "train")

#: The mode of the innermost enclosing :func:`module_mode` (inherited by ``mode=None``).
_ACTIVE = contextvars.ContextVar("pyro_dropout_module_mode", default=None)


def modules_of(*objects):
    """The ``torch.nn.Module`` objects reachable from ``objects`` (each module's submodules
    included, each once): a module itself, the instance of a bound method
    (``net.model``), a ``functools.partial``'s function and arguments (Pyro's handlers wrap a
    model in such partials: an AutoGuide's model is found), and the modules a
    function closes over. A module only reachable through a global name is not found."""
    found, seen, ids = [], set(), set()

    def visit(obj, depth=0):
        if obj is None or depth > 8 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            for m in obj.modules():
                if id(m) not in ids:
                    ids.add(id(m))
                    found.append(m)
            # AutoGuides keep their model out of their submodules (in a tuple): visit it.
            for attr in ("_model", "model"):
                inner = obj.__dict__.get(attr)
                if isinstance(inner, tuple):
                    for o in inner:
                        visit(o, depth + 1)
            return
        if isinstance(obj, functools.partial):
            visit(obj.func, depth + 1)
            for a in (*obj.args, *obj.keywords.values()):
                visit(a, depth + 1)
            return
        visit(getattr(obj, "__self__", None), depth + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                visit(cell.cell_contents, depth + 1)

    for obj in objects:
        visit(obj)
    return found


@contextlib.contextmanager
def module_mode(*objects, mode=None):
    """Run the modules of ``objects`` (found by :func:`modules_of`) in ``mode`` and restore,
    on exit (also on an exception), every module's ``training`` flag and every buffer's
    value: buffers are snapshotted on entry and copied back, so even ``mode="train"`` leaves
    ``BatchNorm`` running statistics and ``num_batches_tracked`` as they were.

    :param str mode: ``"eval"`` (``module.eval()`` on every module) or ``"train"``; None: the
        mode of an enclosing ``module_mode`` (so an entry point's choice reaches the engine
        it calls), ``"eval"`` outside one.
    """
    if mode is None:
        mode = _ACTIVE.get() or "eval"
    if mode not in MODULE_MODES:
        raise ValueError(f"module_mode must be 'eval' or 'train'; got {mode!r}")
    modules = modules_of(*objects)
    flags = [(m, m.training) for m in modules]
    buffers = []
    for m in modules:
        for name, b in m._buffers.items():
            if b is not None:
                buffers.append((m, name, b, b.detach().clone()))
    token = _ACTIVE.set(mode)
    try:
        for m in modules:
            m.train(mode == "train")  # through train(): a user's override is honoured
        yield modules
    finally:
        _ACTIVE.reset(token)
        for m, training in flags:
            m.training = training  # the flag itself: train() would recurse into children
        with torch.no_grad():
            for m, name, b, saved in buffers:
                if m._buffers.get(name) is not b:  # replaced rather than updated in place
                    m._buffers[name] = b
                if b.shape == saved.shape:
                    b.copy_(saved)
                else:  # resized in place: back to the saved tensor's shape and values
                    b.set_(saved)
