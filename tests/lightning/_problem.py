"""The small problem shared by the DDP worker script and the tests."""

import pyro
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyro_dropout as pd

GUIDES = {
    "dropout": lambda m: pd.AutoDropout(m, dropout_rate=0.1),
    "meanfield": lambda m: pd.AutoMeanField(m),
    "vd": lambda m: pd.AutoVariationalDropout(m),
}


def make_problem(guide_name, n=64, batch_size=8):
    """Float64 (so that sums in another order agree to ~1e-15), seeded."""
    pyro.set_rng_seed(0)
    x = torch.randn(n, 3, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    y = y + 0.1 * torch.randn(n, dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True)
    model = pd.BayesianMLP(3, 1, hidden=(8,), tau=25.0).double()
    guide = GUIDES[guide_name](model)
    return x, y, loader, model, guide


class FixedNoise:
    """Replace ``torch.randn`` (the source of the local-reparameterisation noise) by a fixed,
    non-zero pattern that depends only on the position in the last dimension, so that a
    minibatch's noise does not depend on which process draws it."""

    def __enter__(self):
        self._randn = torch.randn

        def randn(*size, dtype=None, device=None, **_):
            shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
            shape = torch.Size(shape)
            last = shape[-1] if len(shape) else 1
            pattern = torch.linspace(-1.5, 1.5, last, dtype=dtype, device=device)
            return pattern.expand(shape).clone()

        torch.randn = randn
        return self

    def __exit__(self, *exc):
        torch.randn = self._randn
