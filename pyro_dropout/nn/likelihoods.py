"""Observation models for Bayesian networks: Gaussian regression and categorical classification."""

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam
from torch.distributions import constraints

__all__ = ["GaussianLikelihood", "CategoricalLikelihood"]


class GaussianLikelihood(PyroModule):
    r"""``y ~ Normal(f(x), τ^{-1/2})`` per output, with a fixed precision τ or a learned scale.

    :param float tau: fixed noise precision τ (Gal & Ghahramani's "model precision"). If
        ``None`` the noise scale is a learned point estimate (a :class:`~pyro.nn.PyroParam`,
        type-II maximum likelihood), initialised at ``init_noise_scale``.
    """

    kind = "regression"

    def __init__(self, tau=None, init_noise_scale=1.0):
        super().__init__()
        if tau is not None and not tau > 0:
            raise ValueError(f"tau (noise precision) must be positive, got {tau}")
        if not init_noise_scale > 0:
            raise ValueError(f"init_noise_scale must be positive, got {init_noise_scale}")
        self.tau = tau
        if tau is None:
            self.noise_scale = PyroParam(
                torch.tensor(float(init_noise_scale)), constraint=constraints.positive
            )

    def scale(self, like):
        if self.tau is not None:
            return torch.tensor(self.tau**-0.5, dtype=like.dtype, device=like.device)
        return self.noise_scale

    def precision(self):
        """The noise precision τ as a float."""
        if self.tau is not None:
            return float(self.tau)
        return float(self.noise_scale.detach()) ** -2

    def check_target(self, y, f):
        if y is None:
            return None
        if not torch.is_floating_point(y):
            y = y.to(f.dtype)
        if y.dim() == 1 and f.shape[-1] == 1:
            y = y.unsqueeze(-1)
        if y.shape[-1] != f.shape[-1] or y.shape[-2] != f.shape[-2]:
            raise ValueError(
                f"y has shape {tuple(y.shape)} but the network output has shape "
                f"{tuple(f.shape)}: expected (N, {f.shape[-1]})"
                + (" or (N,)" if f.shape[-1] == 1 else "")
            )
        return y

    def forward(self, f, y=None):
        y = self.check_target(y, f)
        return pyro.sample("obs", dist.Normal(f, self.scale(f)).to_event(1), obs=y)

    def log_likelihood(self, samples, y):
        r"""Per-point predictive log density of ``y`` under the MC mixture (Gal's formula):
        :math:`\operatorname{logsumexp}_t(-\tfrac{τ}{2}\|y - \hat y_t\|^2) - \log T
        - \tfrac{D}{2}\log 2π + \tfrac{D}{2}\log τ`."""
        y = self.check_target(y, samples)
        tau = self.precision()
        sq = ((y - samples) ** 2).sum(-1)
        d = samples.shape[-1]
        return (
            torch.logsumexp(-0.5 * tau * sq, 0)
            - math.log(samples.shape[0])
            - 0.5 * d * math.log(2 * math.pi)
            + 0.5 * d * math.log(tau)
        )


class CategoricalLikelihood(PyroModule):
    """``y ~ Categorical(logits=f(x))`` for classification with integer labels of shape (N,)."""

    kind = "classification"

    def check_target(self, y, f):
        if y is None:
            return None
        if y.shape != f.shape[-2:-1]:
            raise ValueError(
                f"y must hold integer class labels of shape ({f.shape[-2]},), got {tuple(y.shape)}"
            )
        return y.long()

    def forward(self, f, y=None):
        y = self.check_target(y, f)
        return pyro.sample("obs", dist.Categorical(logits=f), obs=y)

    def log_likelihood(self, samples, y):
        """Per-point log of the MC-averaged class probability of the true label."""
        y = self.check_target(y, samples)
        log_p = torch.log_softmax(samples, -1)
        log_p_y = log_p.gather(-1, y.expand(log_p.shape[:-1]).unsqueeze(-1)).squeeze(-1)
        return torch.logsumexp(log_p_y, 0) - math.log(samples.shape[0])
