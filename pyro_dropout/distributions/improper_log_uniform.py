"""The scale-invariant log-uniform prior of variational dropout."""

from typing import Self

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints

__all__ = ["ImproperLogUniform"]


class ImproperLogUniform(TorchDistribution):
    r"""Improper log-uniform prior :math:`p(\log|w|) \propto \text{const}`, i.e.
    :math:`p(w) \propto 1/|w|`.

    This is the scale-invariant prior under which Gaussian dropout is variational inference
    (Kingma, Salimans & Welling, *Variational dropout and the local reparameterization trick*,
    NeurIPS 2015) and whose KL drives sparsification (Molchanov, Ashukha & Vetrov, *Variational
    dropout sparsifies deep neural networks*, ICML 2017).

    :meth:`log_prob` is the **unnormalised** :math:`-\log|w|` (finite at 0: |w| is floored at
    the dtype's smallest normal number); the distribution cannot be
    sampled. Use it as a prior with a Gaussian guide: ``KL(Normal(θ, σ) ‖ ImproperLogUniform)``
    is registered (see :func:`pyro_dropout.distributions.kl.kl_normal_log_uniform`) and depends
    only on :math:`\alpha = \sigma^2 / \theta^2`. Because the prior is improper, that term is a
    regulariser, not a true KL divergence (Hron, Matthews & Ghahramani, *Variational Bayesian
    dropout: pitfalls and fixes*, ICML 2018).

    :param batch_shape: the batch shape (use :meth:`expand` or ``.expand(shape).to_event(k)``
        to match a weight tensor).
    """

    arg_constraints: dict[str, constraints.Constraint] = {}
    support = constraints.real
    has_rsample = False
    #: Its density does not integrate to one (nor to anything finite): code that needs a
    #: normalised prior (e.g. the VI k-hat of an export) checks this flag.
    improper = True

    def __init__(
        self, batch_shape: tuple[int, ...] = torch.Size(), validate_args: bool | None = None
    ) -> None:
        super().__init__(torch.Size(batch_shape), torch.Size(), validate_args=validate_args)

    def expand(self, batch_shape: tuple[int, ...], _instance: Self | None = None) -> Self:
        # Native expand: keeps the class so the registered KL still dispatches inside plates.
        new = self._get_checked_instance(ImproperLogUniform, _instance)
        super(ImproperLogUniform, new).__init__(
            torch.Size(batch_shape), torch.Size(), validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = torch.as_tensor(value)
        # |w| is floored at the dtype's tiny so an exact 0 gives a large finite value, not +inf.
        tiny = torch.finfo(value.dtype).tiny if value.is_floating_point() else 1e-38
        return (-torch.log(value.abs().clamp_min(tiny))).expand(
            torch.broadcast_shapes(value.shape, self.batch_shape)
        )

    def sample(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        raise NotImplementedError(
            "ImproperLogUniform is an improper prior and cannot be sampled. Use it as the prior "
            "of a Bayesian layer and fit a guide (AutoMeanField or AutoVariationalDropout); to "
            "draw prior-predictive samples use a proper prior such as Normal."
        )

    rsample = sample

    @property
    def mean(self) -> torch.Tensor:
        return torch.full(self.batch_shape, float("nan"))

    @property
    def variance(self) -> torch.Tensor:
        return torch.full(self.batch_shape, float("nan"))
