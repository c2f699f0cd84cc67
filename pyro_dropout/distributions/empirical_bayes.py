r"""The flat prior of a prior scale that is fitted to the data (empirical Bayes)."""

from collections.abc import Iterable
from typing import Self

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints

__all__ = ["EmpiricalBayesScale"]


class EmpiricalBayesScale(TorchDistribution):
    r"""The site of a weight prior's scale :math:`s` that is a point estimate maximising the
    ELBO (type-II maximum likelihood, "empirical Bayes").

    The weight prior is :math:`\mathcal N(0, s^2)` per group of weights (a layer, or the
    weights that read one input unit). The ELBO depends on :math:`s` only through
    :math:`\mathrm{KL}(q(w)\,\|\,\mathcal N(0, s^2))`; for the four families' KLs its minimiser
    is closed-form, :math:`s^2 = \text{mean over the group of } \mathbb E_q[w^2]` (exact for
    the Gaussian KLs; for Gal's dropout KL, whose terms in :math:`s` are those of the Gaussian
    KL of each mixture component weighted by :math:`1-p` and :math:`p`, also with
    :math:`\mathbb E_q[w^2] = (1-p)M^2 + σ^2`). The guides of this library recognise this
    site and emit a ``Delta`` at that minimiser, computed from their own parameters (as
    Deterministic VI does, Wu et al. 2019): each guide owns its scale, and it is exact at
    every step (no lag behind the weights).

    As a distribution it is a flat (improper) density on :math:`s > 0`: :meth:`log_prob` is 0,
    so the ELBO is exactly the one at the fitted scale. :meth:`sample` returns ``init_scale``
    (a prior-predictive draw uses the initial scale).

    :param str weight_site: the name of the weight site this scale belongs to.
    :param tuple reduce_dims: the (negative) dimensions of the weight over which a group's
        second moments are averaged (``(-2, -1)`` for one scale per Linear layer, ``(-2,)``
        for one per input unit).
    :param float init_scale: the value of :meth:`sample` (and of the guides' first prototype run).
    """

    arg_constraints: dict[str, constraints.Constraint] = {}
    has_rsample = False

    def __init__(
        self,
        weight_site: str,
        reduce_dims: Iterable[int],
        event_shape: tuple[int, ...] = torch.Size(),
        batch_shape: tuple[int, ...] = torch.Size(),
        init_scale: float = 1.0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        validate_args: bool | None = None,
    ) -> None:
        self.weight_site = str(weight_site)
        self.reduce_dims = tuple(int(d) for d in reduce_dims)
        self.init_scale = float(init_scale)
        self._dtype = dtype or torch.get_default_dtype()
        self._device = device
        super().__init__(
            torch.Size(batch_shape), torch.Size(event_shape), validate_args=validate_args
        )

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.positive, len(self.event_shape))

    def expand(self, batch_shape: tuple[int, ...], _instance: Self | None = None) -> Self:
        new = self._get_checked_instance(EmpiricalBayesScale, _instance)
        new.weight_site, new.reduce_dims, new.init_scale = (
            self.weight_site,
            self.reduce_dims,
            self.init_scale,
        )
        new._dtype, new._device = self._dtype, self._device
        super(EmpiricalBayesScale, new).__init__(
            torch.Size(batch_shape), self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        value = torch.as_tensor(value)
        shape = value.shape[: value.dim() - len(self.event_shape)]
        return value.new_zeros(torch.broadcast_shapes(shape, self.batch_shape))

    def sample(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        return torch.full(shape, self.init_scale, dtype=self._dtype, device=self._device)

    @property
    def mean(self) -> torch.Tensor:
        return torch.full(self.batch_shape + self.event_shape, self.init_scale, dtype=self._dtype)

    @property
    def variance(self) -> torch.Tensor:
        return torch.zeros(self.batch_shape + self.event_shape, dtype=self._dtype)
