"""Turning a user's prior specification into a distribution over a whole weight tensor."""

import numbers

import torch
from pyro.distributions import Normal
from torch.distributions import Distribution

__all__ = ["make_prior"]


def make_prior(prior, shape, device=None, dtype=None):
    """Build the prior over a parameter tensor of ``shape`` as one event.

    :param prior: ``None`` (``Normal(0, 1)``), a positive number ``s`` (``Normal(0, s)``), a
        scalar distribution (expanded elementwise, e.g. ``ImproperLogUniform()`` or
        ``Normal(0., 0.1)``), a distribution whose ``batch_shape + event_shape`` already equals
        ``shape``, or a callable ``shape -> distribution``.
    :returns: a distribution with ``batch_shape == ()`` and ``event_shape == shape``.
    """
    shape = torch.Size(shape)
    if callable(prior) and not isinstance(prior, Distribution):
        prior = prior(shape)
    if prior is None:
        prior = 1.0
    if isinstance(prior, numbers.Real) and not isinstance(prior, bool):
        if prior <= 0:
            raise ValueError(f"prior scale must be positive, got {prior}")
        zero = torch.zeros((), device=device, dtype=dtype or torch.get_default_dtype())
        return Normal(zero, zero + prior).expand(shape).to_event(len(shape))
    if not isinstance(prior, Distribution):
        raise TypeError(
            "prior must be None, a positive number (the scale of a zero-mean Normal), a "
            f"distribution or a callable returning one; got {type(prior).__name__}"
        )
    full = prior.batch_shape + prior.event_shape
    if full == shape:
        return prior.to_event(len(prior.batch_shape)) if prior.batch_shape else prior
    if prior.event_shape == () and prior.batch_shape == ():
        return prior.expand(shape).to_event(len(shape))
    raise ValueError(
        f"prior has batch_shape {tuple(prior.batch_shape)} and event_shape "
        f"{tuple(prior.event_shape)}; expected a scalar distribution or one of total shape "
        f"{tuple(shape)}"
    )
