"""The ELBO that :func:`~pyro_dropout.infer.fit` and
:class:`~pyro_dropout.lightning.BayesianModule` train with: :func:`make_elbo` picks
:class:`~pyro_dropout.infer.MeanFieldELBO` (:mod:`pyro_dropout.infer.mean_field_elbo`) or its
compiled form :class:`~pyro_dropout.infer.JitMeanFieldELBO`
(:mod:`pyro_dropout.infer.compiled`)."""

import sys
import warnings

import torch

from ..handlers.lrt_messenger import _user_stacklevel
from .compile_warning import CompilationWarning
from .compiled import JitMeanFieldELBO
from .mean_field_elbo import MeanFieldELBO

__all__ = ["JitMeanFieldELBO", "MeanFieldELBO", "make_elbo", "running_stat_modules"]


def running_stat_modules(model):
    """Names of the modules of ``model`` that update buffers while training: normalisation
    layers in train mode that track running statistics (``BatchNorm*``, ``InstanceNorm*`` with
    ``track_running_stats=True``). A compiled step replays a recorded graph, which does not
    carry those in-place updates from step to step (measured: a BatchNorm1d fitted for 260
    compiled steps had ``num_batches_tracked`` 10, against 262 eagerly), so eval-mode
    predictions would use statistics of the first few minibatches."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [
        name or type(m).__name__
        for name, m in model.named_modules()
        if m.training
        and getattr(m, "track_running_stats", False)
        and getattr(m, "running_mean", None) is not None
    ]


def make_elbo(model, jit="auto", num_particles=1, vectorize_particles=False):
    """The ELBO ``fit`` trains with: :class:`MeanFieldELBO`, compiled
    (:class:`JitMeanFieldELBO`) unless ``jit=False``, eager with a warning where it cannot be
    compiled if ``jit="auto"``; with the model's ``max_plate_nesting`` when it declares one
    (Pyro guesses it otherwise)."""
    kwargs = dict(
        num_particles=num_particles,
        vectorize_particles=vectorize_particles,
        max_plate_nesting=getattr(model, "max_plate_nesting", float("inf")),
    )
    stateful = running_stat_modules(model) if jit else []
    if stateful:
        reason = (
            f"the model's {', '.join(stateful)} update running statistics in train mode, which "
            "a compiled step would not carry from step to step"
        )
        if jit is not True:
            warnings.warn(
                f"pyro_dropout: the loss is not compiled ({reason}); training eagerly: the same "
                "loss, slower steps. Pass jit=False to train eagerly without this warning.",
                CompilationWarning,
                stacklevel=_user_stacklevel(sys._getframe()),
            )
            jit = False
        else:
            raise ValueError(f"jit=True: {reason}; use jit='auto' or jit=False")
    if not jit:
        return MeanFieldELBO(**kwargs)
    return JitMeanFieldELBO(fallback=jit == "auto", **kwargs)
