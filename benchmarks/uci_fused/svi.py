"""One SVI step on the fused loss."""

from __future__ import annotations

import pyro

from .gradients import ManualGradients
from .inputs import RNG
from .loss import fused_loss
from .support import unsupported_reason


class FusedSVI:
    """``SVI.step`` with :func:`~.loss.fused_loss`: the loss, its gradients and one step of
    ``optim`` (a :class:`pyro.optim.PyroOptim`) over every parameter in Pyro's store.
    The gradients come from :class:`~.gradients.ManualGradients` (no autograd graph) where it
    applies (every guide of the benchmark; VD with one log σ² per weight and Molchanov's KL,
    Concrete dropout with one rate per layer), else from autograd of the fused loss.

    Why not ``pyro.infer.SVI(model, guide, optim, loss=fused_loss)``: SVI finds the
    parameters to step by tracing ``pyro.param`` calls, and a ``PyroModule`` makes them only
    inside its own ``__call__``; this loss reads the parameters without running the modules.
    All parameters take part in every step here, so the first step runs the guide once (which
    registers the guide's and the model's parameters) and every step updates them all."""

    def __init__(self, model, guide, optim, rng="kernel", manual=True):
        reason = unsupported_reason(model, guide)
        if reason is not None:
            raise ValueError(f"FusedSVI cannot train this model: {reason}")
        if rng not in RNG:
            raise ValueError(f"rng must be 'kernel' or 'torch', got {rng!r}")
        self.model, self.guide, self.optim, self.rng = model, guide, optim, rng
        self.manual = manual and ManualGradients.applies(model, guide)
        self._params = None
        self._grads = None

    def step(self, x, y, num_data=None):
        if self._params is None:
            self.guide(x, y, num_data=num_data)
            self._params = [p for _, p in pyro.get_param_store().named_parameters()]
            if self.manual:
                try:
                    self._grads = ManualGradients(self.model, self.guide)
                except ValueError:  # a prior the hand-written gradients do not cover
                    self.manual = False
        if self.manual:
            loss, grads = self._grads(x, y, num_data, self.rng)
            for p in self._params:
                p.grad = grads.get(p)
        else:
            loss = fused_loss(self.model, self.guide, x, y, num_data, self.rng)
            loss.backward()
            loss = loss.item()
        self.optim(self._params)
        for p in self._params:
            p.grad = None
        return loss
