"""Regression tests for rough edges found by the API test suite."""

import numpy as np
import pytest
import torch

from pyro_dropout import AutoDropout, AutoMeanField, BayesianMLP, init_to_module


def test_guide_first_called_without_y_names_the_fix():
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    with pytest.raises(NotImplementedError, match=r"'obs'.*call it \(or fit\) with \(x, y\)"):
        AutoMeanField(model)(torch.randn(5, 3))


@pytest.mark.parametrize("rate", [np.float32(0.1), torch.tensor(0.1), 0])
def test_dropout_rate_accepts_numeric_scalars(rate):
    assert AutoDropout(BayesianMLP(3, 1, tau=1.0), dropout_rate=rate).dropout_rate == float(rate)


def test_init_to_module_unmatched_site_raises_without_fallback():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)  # layers.1 vs the module's "2.weight"
    guide = AutoMeanField(model, init_loc_fn=init_to_module(net))
    with pytest.raises(ValueError, match="no parameter of the module matches site"):
        guide(torch.randn(5, 3), torch.randn(5))
