r"""A Normal parameterised by its mean and dropout log-odds, for variational dropout."""

from collections.abc import Sequence
from typing import Self

import pyro.distributions as dist
import torch

__all__ = ["LogAlphaNormal"]


class LogAlphaNormal(dist.Normal):
    r""":math:`\mathcal N(θ, α θ^2)` given θ and :math:`\log α` (Kingma et al. 2015's Gaussian
    dropout posterior): a :class:`pyro.distributions.Normal` whose variance is
    :math:`(θ^2 + \epsilon)\, α` (:math:`\epsilon` = the dtype's tiny, so σ > 0 at θ = 0) and which
    keeps ``log_alpha``.

    Why a subclass: the variational-dropout KL is a function of log α and local
    reparameterisation needs the variance; from a plain ``Normal(θ, σ)`` both would be recomputed
    through ``log σ``, ``log θ²`` and a square of a square root (about eight extra passes over
    every weight per step). :func:`~pyro_dropout.distributions.kl_normal_log_uniform` uses
    ``log_alpha`` directly and the local-reparameterisation rule uses :attr:`variance`; everything
    else sees an ordinary Normal with ``scale = sqrt(variance)``.

    The variance is computed as :math:`\exp(\log α + \log(θ^2 + \epsilon))`, not as
    :math:`(θ^2 + \epsilon) \cdot \exp(\log α)`: at θ = 0 variational dropout's
    :math:`\log α = \log σ^2 - \log \epsilon` exceeds 88.7 in float32 for :math:`σ^2 \ge 5`
    (``log tiny`` = −87.3), so ``exp(log α)`` overflows to ``inf`` and the variance and the draw
    with it, although :math:`σ^2` itself is finite. In log space the sum is :math:`\log σ^2`.

    :param loc: θ. :param log_alpha: log α, broadcastable with ``loc``.
    """

    # Set in __init__ / from_log_variance / expand; ``None`` where computed when first read.
    _scale: torch.Tensor | None
    _log_alpha: torch.Tensor | None
    _log_variance: torch.Tensor
    _variance: torch.Tensor

    def __init__(
        self,
        loc: torch.Tensor,
        log_alpha: torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        loc, log_alpha = torch.broadcast_tensors(loc, log_alpha)
        log_variance = log_alpha + torch.log(loc * loc + torch.finfo(loc.dtype).tiny)
        variance = torch.exp(log_variance)
        super().__init__(loc, variance.sqrt(), validate_args=validate_args)
        self._log_alpha = log_alpha
        self._variance = variance
        self._log_variance = log_variance

    @classmethod
    def from_log_variance(
        cls,
        loc: torch.Tensor,
        log_variance: torch.Tensor,
        validate_args: bool | None = None,
    ) -> Self:
        r"""The same family given θ and :math:`\log σ^2` (sparse variational dropout's
        additive parameterisation, Molchanov et al. 2017, which
        :class:`~pyro_dropout.AutoVariationalDropout` learns): :math:`σ^2 = \exp(\log σ^2)`
        and :math:`\log α = \log σ^2 - \log(θ^2 + \epsilon)`.

        Why: built from log α, the variance is :math:`\exp(\log α + \log(θ^2 + \epsilon))`,
        and log α itself is :math:`\log σ^2 - \log(θ^2 + \epsilon)`: eight passes over every
        weight per step to recover :math:`\exp(\log σ^2)`. Here :attr:`log_alpha` and
        :attr:`scale` are computed when first read, so a compiled loss whose KL does not read
        them (a Gaussian prior: :func:`~pyro_dropout.distributions.kl_normal_normal` reads
        :attr:`variance` and :attr:`log_variance`) has neither.
        """
        if loc.shape != log_variance.shape:  # (an op in every compiled step where it is not)
            loc, log_variance = torch.broadcast_tensors(loc, log_variance)
        new = cls.__new__(cls)
        new.loc = loc
        new._scale = None
        new._log_alpha = None
        new._log_variance = log_variance
        new._variance = torch.exp(log_variance)
        # torch's Distribution.__init__ (Normal's own would need the scale): it checks loc and
        # scale against arg_constraints where validation is on. (The ignore: mypy reads Pyro as
        # Any, so it cannot see that this class derives from torch's Normal.)
        super(torch.distributions.Normal, new).__init__(  # type: ignore[misc]
            loc.shape, validate_args=validate_args
        )
        return new

    @property
    def scale(self) -> torch.Tensor:
        if self._scale is None:
            self._scale = self._variance.sqrt()
        return self._scale

    @scale.setter
    def scale(self, value: torch.Tensor) -> None:  # torch's Normal.__init__ sets it
        self._scale = value

    @property
    def log_alpha(self) -> torch.Tensor:
        """log α, of the shape of ``loc``."""
        if self._log_alpha is None:
            tiny = torch.finfo(self.loc.dtype).tiny
            self._log_alpha = self._log_variance - torch.log(self.loc * self.loc + tiny)
        return self._log_alpha

    @property
    def log_variance(self) -> torch.Tensor:
        r""":math:`\log σ^2` (given, or :math:`\log α + \log(θ^2 + \epsilon)`): what a KL reads
        for :math:`\log σ`. Why not ``log(scale)``: at θ = 0 the variance is
        :math:`α\epsilon`, below float32's normal range, and the gradient of ``log(scale)``
        through ``sqrt`` overflowed to ``inf`` (and ``nan`` for θ), measured on a functional
        model whose ``x @ w`` weight vector starts at zero."""
        return self._log_variance

    @property
    def variance(self) -> torch.Tensor:
        return self._variance

    def expand(
        self,
        batch_shape: torch.Size | Sequence[int],
        _instance: "LogAlphaNormal | None" = None,
    ) -> "LogAlphaNormal":
        new = self._get_checked_instance(LogAlphaNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new._variance = self._variance.expand(batch_shape)
        for name in ("_scale", "_log_alpha", "_log_variance"):
            value = getattr(self, name)
            setattr(new, name, None if value is None else value.expand(batch_shape))
        # torch's Distribution.__init__, as in from_log_variance (and the same ignore).
        super(torch.distributions.Normal, new).__init__(  # type: ignore[misc]
            batch_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new
