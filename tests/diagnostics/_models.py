"""Tiny models with known posteriors for the ArviZ-layer tests (float64 throughout).

Imported relatively by the test modules (this directory is a package, as tests/distributions is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro
import pyro.distributions as dist
import torch

SIGMA = 0.5


def linreg_model(x, y=None):
    """w ~ N(0, I_D); y_i ~ N(x_i . w, SIGMA^2). Broadcasts over a leading draw dim."""
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[-1], dtype=x.dtype), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], dim=-1):
        return pyro.sample("obs", dist.Normal((x * w).sum(-1), SIGMA), obs=y)


def multi_out_model(x, y=None):
    """2-output linear model with a (out, in) weight, a bias, a noise scale, a deterministic
    (sequential draws only: the bias and the scalar scale do not broadcast over draws)."""
    d_in, d_out = x.shape[-1], 2
    W = pyro.sample("W", dist.Normal(torch.zeros(d_out, d_in, dtype=x.dtype), 1.0).to_event(2))
    b = pyro.sample("b", dist.Normal(torch.zeros(d_out, dtype=x.dtype), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(torch.tensor(-1.0, dtype=x.dtype), 0.3))
    pyro.deterministic("W_norm", W.norm())
    with pyro.plate("data", x.shape[0], dim=-1):
        f = x @ W.transpose(-1, -2) + b
        return pyro.sample("obs", dist.Normal(f, s).to_event(1), obs=y)


def categorical_model(x, y=None):
    """Multinomial logistic regression with K = 3 classes (sequential draws only)."""
    W = pyro.sample("W", dist.Normal(torch.zeros(3, x.shape[-1], dtype=x.dtype), 1.0).to_event(2))
    with pyro.plate("data", x.shape[0], dim=-1):
        return pyro.sample("obs", dist.Categorical(logits=x @ W.T), obs=y)


def normal_guide(site: str, loc: torch.Tensor, scale: torch.Tensor, event_dim: int = 1):
    """A guide drawing ``site`` from N(loc, scale^2) (independent)."""

    def guide(x, y=None):
        pyro.sample(site, dist.Normal(loc, scale).to_event(event_dim))

    return guide


@dataclass
class LinReg:
    """Bayesian linear regression with an orthonormal design: exact diagonal posterior."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    post_mean: torch.Tensor
    post_sd: torch.Tensor

    def guide(self, scale_factor: float = 1.0, shift_sd: float = 0.0) -> Any:
        """N(mean + shift_sd * sd, (scale_factor * sd)^2): exact when (1, 0)."""
        loc = self.post_mean + shift_sd * self.post_sd
        return normal_guide("w", loc, scale_factor * self.post_sd)
