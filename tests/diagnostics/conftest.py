"""Fixtures for the ArviZ-layer tests; the models themselves are in _models.py."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot

import pyro  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ._models import SIGMA, LinReg  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_pyro():
    """Clean Pyro state, and float64 as the default dtype: these models are float64
    throughout, and a functional model's dtype is the default one (pyro_dropout.infer.data)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)
    pyro.clear_param_store()


@pytest.fixture
def linreg() -> LinReg:
    g = torch.Generator().manual_seed(1)
    n, d = 60, 3
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=g, dtype=torch.float64))
    x = 4.0 * q  # X^T X = 16 I: posterior precision (1 + 16 / SIGMA^2) I
    w_true = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    y = x @ w_true + SIGMA * torch.randn(n, generator=g, dtype=torch.float64)
    x_test = 0.5 * torch.randn(40, d, generator=g, dtype=torch.float64)
    y_test = x_test @ w_true + SIGMA * torch.randn(40, generator=g, dtype=torch.float64)
    prec = 1.0 + 16.0 / SIGMA**2
    post_mean = (x.T @ y) / SIGMA**2 / prec
    post_sd = torch.full((d,), prec**-0.5, dtype=torch.float64)
    return LinReg(x, y, x_test, y_test, post_mean, post_sd)


@pytest.fixture
def multi_out_data():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(25, 3, generator=g, dtype=torch.float64)
    W = torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    y = x @ W.T + 0.3 * torch.randn(25, 2, generator=g, dtype=torch.float64)
    return x, y


@pytest.fixture
def classif():
    g = torch.Generator().manual_seed(3)
    W = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-2.0, -2.0]], dtype=torch.float64)
    x = torch.randn(80, 2, generator=g, dtype=torch.float64)
    x_test = torch.randn(60, 2, generator=g, dtype=torch.float64)

    def labels(x):
        return torch.multinomial(torch.softmax(x @ W.T, -1), 1, generator=g)[:, 0]

    y, y_test = labels(x), labels(x_test)
    return {"x": x, "y": y, "x_test": x_test, "y_test": y_test, "W": W}
