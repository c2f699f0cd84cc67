"""The batched regression network: a ``D – H – 1`` (or ``D – H – … – H – 1``) Bayesian MLP
replicated over ``M`` members."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch.distributions import constraints

from pyro_dropout import BayesianLinear
from pyro_dropout.nn import HeteroscedasticGaussianLikelihood

from .priors import HETERO_MIN_SCALE, INIT_NOISE_SD


def _member_normal(scale, shape):
    """``Normal(0, scale_m)`` over a parameter of ``shape``, batched as ``(M, 1)``."""
    scale = scale.reshape((-1, 1) + (1,) * len(shape))
    m = scale.shape[0]
    return dist.Normal(torch.zeros_like(scale), scale).expand((m, 1) + shape).to_event(len(shape))


class BatchedRegressionMLP(PyroModule):
    r"""``D – H (ReLU) – 1`` Bayesian MLP replicated over ``M`` members (plate at dim -2); with
    ``hidden_layers = L``, ``D – H – … – H – 1`` (L ReLU layers of H units, ``layers.0`` …
    ``layers.L``).

    ``forward(x, y=None, num_data=None)`` takes ``x`` of shape ``(M, B, D)`` and ``y`` of shape
    ``(M, B)`` (member ``m`` sees its own rows), observes
    ``y ~ Normal(f, noise_sd_m)`` inside ``pyro.plate("data", num_data, dim=-1)`` (scaled by
    ``num_data / B`` for minibatches) and returns ``f`` of shape ``(..., M, B)``.

    :param noise_sd: ``(M,)`` fixed noise SDs on the standardised scale; NaN marks a member
        whose noise SD is learned (a point estimate maximising its ELBO). Ignored when
        ``heteroscedastic``.
    :param weight_prior, bias_prior: per-layer prior as for :class:`BayesianLinear` (e.g.
        ``"learned"``: one empirical-Bayes scale per layer and member), or a ``(M,)`` tensor
        of Normal prior scales (one per member).
    :param bool heteroscedastic: the last layer has two outputs, the mean and the noise scale
        ``σ(x) = HETERO_MIN_SCALE + softplus(h + c)`` (``h = 0`` gives ``INIT_NOISE_SD``), as
        :class:`~pyro_dropout.nn.HeteroscedasticGaussianLikelihood`; ``forward`` then returns
        ``(..., M, B, 2)``: the mean and σ of every row (standardised scale).
    :param int hidden_layers: number of hidden layers (1: the sites ``layers.0.*`` and
        ``layers.1.*`` of the one-layer protocol; 2: Gal & Ghahramani 2016's second protocol).
    """

    max_plate_nesting = 2

    def __init__(
        self,
        d_in,
        n_hidden,
        noise_sd,
        weight_prior,
        bias_prior,
        heteroscedastic=False,
        hidden_layers=1,
    ):
        super().__init__()
        if int(hidden_layers) != hidden_layers or hidden_layers < 1:
            raise ValueError(f"hidden_layers must be a positive integer, got {hidden_layers!r}")
        self.hidden_layers = int(hidden_layers)
        noise_sd = torch.as_tensor(noise_sd, dtype=torch.get_default_dtype()).reshape(-1, 1)
        self.members = noise_sd.shape[0]
        self.heteroscedastic = bool(heteroscedastic)
        if self.heteroscedastic:
            noise_sd = torch.ones_like(noise_sd)  # unused
            self.likelihood = HeteroscedasticGaussianLikelihood(
                min_scale=HETERO_MIN_SCALE, init_scale=INIT_NOISE_SD
            )
        out = 2 if self.heteroscedastic else 1
        widths = [(d_in, n_hidden)] + [(n_hidden, n_hidden)] * (self.hidden_layers - 1)
        widths.append((n_hidden, out))
        layers = []
        for a, b in widths:
            layer = BayesianLinear(
                a,
                b,
                prior=None if torch.is_tensor(weight_prior) else weight_prior,
                bias_prior=None if torch.is_tensor(bias_prior) else bias_prior,
            )
            if torch.is_tensor(weight_prior):
                layer.weight = PyroSample(_member_normal(weight_prior, torch.Size((b, a))))
            if torch.is_tensor(bias_prior):
                layer.bias = PyroSample(_member_normal(bias_prior, torch.Size((b,))))
            layers.append(layer)
        self.layers = PyroModule[torch.nn.ModuleList](layers)
        learned = torch.isnan(noise_sd)
        self.register_buffer("learned", learned, persistent=False)
        self.register_buffer("fixed_sd", torch.where(learned, 1.0, noise_sd), persistent=False)
        if bool(learned.any()):
            self.learned_sd = PyroParam(
                torch.full_like(noise_sd, INIT_NOISE_SD), constraint=constraints.positive
            )
        else:
            self.learned_sd = None

    def noise_sd(self):
        """``(M, 1)`` noise SDs on the standardised scale (fixed or learned)."""
        if self.learned_sd is None:
            return self.fixed_sd
        return torch.where(self.learned, self.learned_sd, self.fixed_sd)

    def forward(self, x, y=None, num_data=None):
        with pyro.plate("members", self.members, dim=-2):
            h = x
            for i in range(self.hidden_layers):  # indexed: a slice would be a new PyroModule
                h = torch.relu(self.layers[i](h))
            out = self.layers[self.hidden_layers](h)
            if self.heteroscedastic:
                f, scale = self.likelihood.split(out)
                f, scale = f.squeeze(-1), scale.squeeze(-1)
            else:
                f, scale = out.squeeze(-1), self.noise_sd()
            n = f.shape[-1]
            size = n if num_data is None else int(num_data)
            subsample = None if size == n else torch.arange(n)
            with pyro.plate("data", size, subsample=subsample, dim=-1):
                pyro.sample("obs", dist.Normal(f, scale), obs=y)
        if self.heteroscedastic:
            return torch.stack([f, scale.expand_as(f)], -1)
        return f
