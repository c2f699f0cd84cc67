"""The MC-dropout variational family of Gal & Ghahramani (2016) as a Pyro distribution."""

import math
from typing import Self

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints

from .._broadcast import broadcast_shape

__all__ = ["BernoulliMaskedNormal"]


class BernoulliMaskedNormal(TorchDistribution):
    r"""Gal & Ghahramani's Bernoulli variational family over a weight tensor.

    A draw is

    .. math::

        W = z \odot M + \sigma \odot \varepsilon, \qquad
        \varepsilon \sim \mathcal N(0, I), \qquad z \sim \mathrm{Bernoulli}(1 - p),

    where ``loc`` is :math:`M`, ``scale`` is :math:`\sigma` and ``dropout_rate`` is the *drop*
    probability :math:`p` (the convention of :class:`torch.nn.Dropout`). The first event
    dimension indexes output units (PyTorch's ``(out, in)`` for Linear, ``(out, in, kh, kw)``
    for Conv) and **one mask value is shared along it**: ``z`` has shape
    ``batch_shape + (1,) + event_shape[1:]``, so dropping an input unit zeroes the whole column
    of :math:`M`. Per column :math:`c` the density is the two-component mixture

    .. math::

        q(w_c) = (1 - p)\, \mathcal N(w_c; m_c, \sigma_c^2 I) + p\, \mathcal N(w_c; 0, \sigma_c^2 I),

    and :meth:`log_prob` sums the exact per-column mixture log densities (with ``logsumexp``).

    Moments: :math:`\mathbb E[W] = (1-p) M`, :math:`\mathrm{Var}[W] = p(1-p) M^2 + \sigma^2`.

    :meth:`rsample` is differentiable in ``loc`` and ``scale`` (the mask does not depend on
    them); ``dropout_rate`` is a fixed hyper-parameter, not reparameterised.

    Reference: Y. Gal and Z. Ghahramani, *Dropout as a Bayesian approximation: representing
    model uncertainty in deep learning*, ICML 2016 (appendix, section 3).

    :param torch.Tensor loc: the mean weights :math:`M` (no inverted-dropout rescaling).
    :param scale: the slab standard deviation :math:`\sigma > 0`, broadcastable to ``loc``.
    :param dropout_rate: drop probability :math:`p \in [0, 1)`, broadcastable to the mask shape
        ``batch_shape + (1,) + event_shape[1:]`` (a scalar, or one rate per input column).
    :param int event_dim: number of rightmost dimensions of ``loc`` forming one event
        (default ``loc.dim()``); must be at least 1.
    """

    arg_constraints = {
        "loc": constraints.real,
        "scale": constraints.positive,
        "dropout_rate": constraints.half_open_interval(0.0, 1.0),
    }
    has_rsample = True

    def __init__(
        self,
        loc: torch.Tensor,
        scale: torch.Tensor | float,
        dropout_rate: torch.Tensor | float,
        event_dim: int | None = None,
        validate_args: bool | None = None,
    ) -> None:
        loc = torch.as_tensor(loc)
        if not torch.is_floating_point(loc):
            loc = loc.to(torch.get_default_dtype())
        scale = torch.as_tensor(scale, dtype=loc.dtype, device=loc.device)
        dropout_rate = torch.as_tensor(dropout_rate, dtype=loc.dtype, device=loc.device)
        if event_dim is None:
            event_dim = loc.dim()
        if not isinstance(event_dim, int) or event_dim < 1:
            raise ValueError(
                f"BernoulliMaskedNormal: event_dim must be an int >= 1 (the first event dimension "
                f"indexes output units), got {event_dim!r}"
            )
        try:
            shape = broadcast_shape(loc.shape, scale.shape)
        except RuntimeError:
            raise ValueError(
                f"BernoulliMaskedNormal: scale of shape {tuple(scale.shape)} does not broadcast "
                f"with loc of shape {tuple(loc.shape)}"
            ) from None
        if len(shape) < event_dim:
            raise ValueError(
                f"BernoulliMaskedNormal: event_dim={event_dim} exceeds the {len(shape)} dimensions "
                f"of loc (shape {tuple(loc.shape)})"
            )
        batch_shape = shape[: len(shape) - event_dim]
        event_shape = shape[len(shape) - event_dim :]
        mask_shape = batch_shape + (1,) + event_shape[1:]
        try:
            mask_shape = broadcast_shape(mask_shape, dropout_rate.shape)
        except RuntimeError:
            mask_shape = None
        if mask_shape is None or mask_shape != batch_shape + (1,) + event_shape[1:]:
            raise ValueError(
                f"BernoulliMaskedNormal: dropout_rate of shape {tuple(dropout_rate.shape)} must "
                f"broadcast to the mask shape {tuple(batch_shape + (1,) + event_shape[1:])} "
                "(batch_shape + (1,) + event_shape[1:]: one rate per input column at most)"
            )
        self.loc = loc.expand(shape)
        self.scale = scale.expand(shape)
        self.dropout_rate = dropout_rate.expand(mask_shape)
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    @property
    def mask_shape(self) -> torch.Size:
        """Shape of the Bernoulli mask: ``batch_shape + (1,) + event_shape[1:]``."""
        return self.batch_shape + (1,) + self.event_shape[1:]

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, self.event_dim)

    def expand(self, batch_shape: tuple[int, ...], _instance: Self | None = None) -> Self:
        # A native expand keeps the class: Pyro would otherwise wrap us in ExpandedDistribution
        # inside plates and the registered KL would silently stop dispatching.
        new = self._get_checked_instance(BernoulliMaskedNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new.scale = self.scale.expand(batch_shape + self.event_shape)
        new.dropout_rate = self.dropout_rate.expand(batch_shape + (1,) + self.event_shape[1:])
        super(BernoulliMaskedNormal, new).__init__(
            batch_shape, self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    @property
    def keep_prob(self) -> torch.Tensor:
        return 1.0 - self.dropout_rate

    @property
    def mean(self) -> torch.Tensor:
        return self.keep_prob * self.loc

    @property
    def mode(self) -> torch.Tensor:
        # The "on" component's centre is the mode unless the "off" component dominates.
        return torch.where(self.keep_prob >= 0.5, self.loc, torch.zeros_like(self.loc))

    @property
    def variance(self) -> torch.Tensor:
        p = self.dropout_rate
        return p * (1 - p) * self.loc**2 + self.scale**2

    def sample_mask(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        """Draw the Bernoulli(1 - p) mask, of shape ``sample_shape + mask_shape``."""
        shape = self._extended_shape(sample_shape)[: len(sample_shape) + len(self.batch_shape)]
        shape = shape + (1,) + self.event_shape[1:]
        with torch.no_grad():
            u = torch.rand(shape, dtype=self.loc.dtype, device=self.loc.device)
            return (u < self.keep_prob).to(self.loc.dtype)

    def rsample(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        z = self.sample_mask(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return z * self.loc + self.scale * eps

    def _column_log_probs(self, value):
        """Log densities of the "on" and "off" components, summed over each column."""
        # Gaussian log densities, summed along the output dimension (the first event dim).
        out_dim = -self.event_dim
        log_norm = -torch.log(self.scale) - 0.5 * math.log(2 * math.pi)
        on = (log_norm - 0.5 * ((value - self.loc) / self.scale) ** 2).sum(out_dim, keepdim=True)
        off = (log_norm - 0.5 * (value / self.scale) ** 2).sum(out_dim, keepdim=True)
        return on, off

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        on, off = self._column_log_probs(value)
        p = self.dropout_rate
        log_mix = torch.logaddexp(torch.log1p(-p) + on, torch.log(p) + off)
        # Sum the per-column mixture densities over all event dims (the output dim is size 1).
        return log_mix.sum(tuple(range(-self.event_dim, 0)))

    def entropy(self) -> torch.Tensor:
        raise NotImplementedError(
            "BernoulliMaskedNormal has no closed-form entropy; use log_prob on samples"
        )
