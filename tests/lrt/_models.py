"""Small regression problems and guide factories shared by the ELBO-level tests."""

import torch

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
)


def regression_data(n, d=3, out=1, seed=0, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, out, generator=g)
    y = torch.tanh(x @ w) + noise * torch.randn(n, out, generator=g)
    return x, (y.squeeze(-1) if out == 1 else y)


#: name -> guide factory; scales large enough that the estimators are genuinely noisy.
GUIDES = {
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.1),
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.3, input_dropout_rate=0.3, scale=0.05),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
    "concrete_dropout": lambda m: AutoConcreteDropout(m, init_rate=0.3, scale=0.05),
}


def small_mlp(d=3, out=1, hidden=8, tau=4.0, prior=1.0):
    return BayesianMLP(d, out, hidden=(hidden,), tau=tau, prior=prior)


def make_guide(name, model, *args, **kwargs):
    """Build guide ``name`` for ``model`` and set it up with one call on ``args``."""
    guide = GUIDES[name](model)
    guide(*args, **kwargs)
    return guide
