"""Observation models for Bayesian networks: Gaussian regression and categorical classification.

A likelihood module builds the observed site's distribution from the network output ``f``
(:meth:`distribution`, called *outside* the data plate, so that a latent noise scale is one
global site) and checks the targets (:meth:`check_target`).
"""

import math

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch.distributions import Distribution

from .._checks import positive_number

__all__ = [
    "GaussianLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "CategoricalLikelihood",
    "NOISE_PRIOR_LOG_SD",
]

#: Log-scale standard deviation of the default LogNormal prior on a learned noise scale: a
#: weak prior, 95 % of its mass within a factor e^±3.9 ≈ 50 of its median.
NOISE_PRIOR_LOG_SD = 2.0


class _NoisePrior:
    """The latent noise scale's prior as :class:`~pyro.nn.PyroSample` calls it
    (``prior(likelihood)``): an instance of a module-level class, so that the model pickles. (A
    lambda is a local object pickle cannot name, and PyroSample renames a plain function's
    ``__name__`` in place, so that pickle no longer finds it either.)"""

    def __call__(self, likelihood):
        return likelihood._noise_prior()


class GaussianLikelihood(PyroModule):
    r"""``y ~ Normal(f(x), s)`` per output, with a fixed precision τ = 1/s² or a latent noise
    scale.

    :param float tau: fixed noise precision τ (Gal & Ghahramani's "model precision"). If
        ``None`` the noise scale ``s`` is a latent sample site (``"<prefix>noise_scale"``,
        e.g. ``"likelihood.noise_scale"`` in :class:`~pyro_dropout.BayesianMLP`) with prior
        ``LogNormal(log init_noise_scale, 2)``. Each guide then infers it with its own
        parameters (a mean-field Normal on ``log s`` in this library's guides), so several
        guides fitted on one model object do not share a learned noise: each fit is
        self-contained.
    :param float init_noise_scale: the prior median of ``s`` (and the guides' initial value).
    """

    kind = "regression"

    def __init__(self, tau: float | None = None, init_noise_scale: float = 1.0) -> None:
        super().__init__()
        self.tau = None if tau is None else positive_number(tau, "tau (noise precision)")
        self.init_noise_scale = positive_number(init_noise_scale, "init_noise_scale")
        # Empty buffer: follows .to(device/dtype) so the prior is built where the model lives.
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)
        if self.tau is None:
            # a picklable callable, not a lambda: the model must pickle (torch.save)
            self.noise_scale = PyroSample(_NoisePrior())

    def _noise_prior(self):
        loc = torch.tensor(
            math.log(self.init_noise_scale), dtype=self._anchor.dtype, device=self._anchor.device
        )
        return dist.LogNormal(loc, torch.full_like(loc, NOISE_PRIOR_LOG_SD))

    def scale(self, like: torch.Tensor) -> torch.Tensor:
        """The noise scale: fixed, or a draw of the latent site (inside a model run)."""
        if self.tau is not None:
            return torch.tensor(self.tau**-0.5, dtype=like.dtype, device=like.device)
        return self.noise_scale

    def precision(self) -> float:
        """The fixed noise precision τ as a float (``tau`` models only)."""
        if self.tau is None:
            raise AttributeError(
                "the noise scale is a latent site inferred by each guide; read it from a fit, "
                "e.g. predict(model, guide, x).aleatoric_variance"
            )
        return float(self.tau)

    def check_target(self, y: torch.Tensor | None, f: torch.Tensor) -> torch.Tensor | None:
        if y is None:
            return None
        if not torch.is_floating_point(y):
            y = y.to(f.dtype)
        if y.dim() == 1 and f.shape[-1] == 1:
            y = y.unsqueeze(-1)
        if y.dim() < 2 or y.shape[-1] != f.shape[-1] or y.shape[-2] != f.shape[-2]:
            raise ValueError(
                f"y has shape {tuple(y.shape)} but the network output has shape "
                f"{tuple(f.shape)}: expected (N, {f.shape[-1]})"
                + (" or (N,)" if f.shape[-1] == 1 else "")
            )
        return y

    def distribution(self, f: torch.Tensor) -> Distribution:
        """``Normal(f, s).to_event(1)`` (one event per row); samples a latent ``s``."""
        s = self.scale(f)
        if s.dim():
            # A latent s drawn under a leading sample plate (vectorised particles, parallel
            # prediction) has a global site's batch shape, e.g. (S, 1): the sample dim, then the
            # data plate's (size 1). The network's output carries the sample dims before its
            # rows and outputs, (S, 1, N, K) or (S, N, K) depending on how the weights were
            # drawn: s goes in front of (N, K), with its trailing size-1 dims dropped to match.
            lead = f.dim() - 2
            while s.dim() > lead and s.shape[-1] == 1:
                s = s.squeeze(-1)
            s = s.reshape(s.shape + (1, 1))
        return dist.Normal(f, s).to_event(1)

    def predictive_distribution(self, f: torch.Tensor) -> Distribution | None:
        """The distribution for given outputs without sampling anything (fixed τ only)."""
        return self.distribution(f) if self.tau is not None else None


class HeteroscedasticGaussianLikelihood(PyroModule):
    r"""``y ~ Normal(μ(x), σ(x))`` per output, the network predicting both: its outputs are
    ``2 K`` columns for ``K`` targets, ``f = [g, h]``, with

    .. math::

        μ = g, \qquad σ = σ_{\min} + \mathrm{softplus}(h + c),
        \qquad c = \mathrm{softplus}^{-1}(σ_0 - σ_{\min}),

    so an output ``h = 0`` gives the scale ``σ_0`` (``init_scale``) and the floor
    :math:`σ_{\min}` keeps the likelihood bounded where the data pin the mean exactly. The
    scale head is simply part of the last layer's outputs, so it is as Bayesian as the rest
    of the network: every guide and local reparameterisation treat it alike, and the
    predictive is a mixture over weight draws of Gaussians with input-dependent scales
    (:attr:`~pyro_dropout.infer.Prediction.aleatoric_variance` = the mean over draws of
    :math:`σ^2(x)`, :attr:`~pyro_dropout.infer.Prediction.epistemic_variance` = the variance
    over draws of :math:`μ(x)`, :meth:`~pyro_dropout.infer.Prediction.log_likelihood` the
    mixture's log density).

    A model of one's own calls it as :class:`~pyro_dropout.BayesianModel` does::

        f = net(x)                                  # (..., N, 2 K)
        fn = likelihood.distribution(f)             # Normal(μ, σ).to_event(1)
        y = likelihood.check_target(y, f)
        with pyro.plate("data", N):
            pyro.sample("obs", fn, obs=y)

    **A known failure of learned variances**: a row given a large σ stops pulling the mean (its
    gradient on μ is scaled by 1/σ²), so a fit can settle on explaining part of the data as
    noise rather than fitting it (Seitzer et al. 2022, "On the pitfalls of heteroscedastic
    uncertainty estimation with probabilistic neural networks"). Measured here: on protein
    (UCI), 3 of 5 ``AutoVariationalDropout`` fits left 21-35 % of their training rows more
    than 5 target SDs off and predicted a noise SD of 23-71 target SDs on exactly those rows;
    on naval, 1 of 20 ``AutoDropout`` fits, 10 % of its rows (``docs/benchmarks/uci.md``). Compare the training error with a homoscedastic fit's before
    trusting one.

    :param float min_scale: the floor :math:`σ_{\min}` (in the units of ``y``).
    :param float init_scale: :math:`σ_0`, the scale at ``h = 0`` (above ``min_scale``).
    """

    kind = "regression"
    #: Network outputs per target (mean and scale).
    outputs_per_target = 2

    def __init__(self, min_scale: float = 1e-3, init_scale: float = 1.0) -> None:
        super().__init__()
        self.min_scale = positive_number(min_scale, "min_scale")
        self.init_scale = positive_number(init_scale, "init_scale")
        if not self.init_scale > self.min_scale:
            raise ValueError(f"init_scale ({init_scale}) must exceed min_scale ({min_scale})")
        gap = self.init_scale - self.min_scale
        self._shift = gap + math.log(-math.expm1(-gap))  # softplus^{-1}(gap)

    def _targets(self, f):
        k2 = f.shape[-1]
        if k2 % 2:
            raise ValueError(
                f"a heteroscedastic likelihood needs 2 network outputs per target (mean, "
                f"scale); got {k2} outputs"
            )
        return k2 // 2

    def split(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, σ)`` from network outputs ``f`` of shape ``(..., 2 K)``."""
        k = self._targets(f)
        loc, raw = f[..., :k], f[..., k:]
        return loc, self.min_scale + torch.nn.functional.softplus(raw + self._shift)

    def scale(self, f: torch.Tensor) -> torch.Tensor:
        """The input-dependent noise scale σ(x) for network outputs ``f``."""
        return self.split(f)[1]

    def check_target(self, y: torch.Tensor | None, f: torch.Tensor) -> torch.Tensor | None:
        if y is None:
            return None
        k = self._targets(f)
        if not torch.is_floating_point(y):
            y = y.to(f.dtype)
        if y.dim() == 1 and k == 1:
            y = y.unsqueeze(-1)
        if y.dim() < 2 or y.shape[-1] != k or y.shape[-2] != f.shape[-2]:
            raise ValueError(
                f"y has shape {tuple(y.shape)} but the network output has shape "
                f"{tuple(f.shape)} (mean and scale of {k} target(s)): expected (N, {k})"
                + (" or (N,)" if k == 1 else "")
            )
        return y

    def distribution(self, f: torch.Tensor) -> Distribution:
        """``Normal(μ(x), σ(x)).to_event(1)`` (one event per row)."""
        loc, scale = self.split(f)
        return dist.Normal(loc, scale).to_event(1)

    def predictive_distribution(self, f: torch.Tensor) -> Distribution:
        """The distribution for given network outputs (nothing is sampled)."""
        return self.distribution(f)


class CategoricalLikelihood(PyroModule):
    """``y ~ Categorical(logits=f(x))`` for classification with integer labels of shape (N,)."""

    kind = "classification"

    def check_target(self, y: torch.Tensor | None, f: torch.Tensor) -> torch.Tensor | None:
        if y is None:
            return None
        if y.shape != f.shape[-2:-1]:
            raise ValueError(
                f"y must hold integer class labels of shape ({f.shape[-2]},), got {tuple(y.shape)}"
            )
        return y.long()

    def distribution(self, f: torch.Tensor) -> Distribution:
        return dist.Categorical(logits=f)

    def predictive_distribution(self, f: torch.Tensor) -> Distribution:
        return self.distribution(f)
