"""The default initialisations follow the site's dtype: a float64 model gets float64 initial
weights (uniform) and biases (zeros), a float32 model float32 ones."""

import pyro.distributions as dist
import pytest
import torch

from pyro_dropout.guides import init_to_fan_in, init_to_glorot


def _site(name, shape, dtype):
    fn = dist.Normal(torch.zeros((), dtype=dtype), 1.0).expand(shape).to_event(len(shape))
    return {"name": name, "fn": fn}


@pytest.mark.parametrize("init", [init_to_fan_in, init_to_glorot])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_initial_weights_and_biases_have_the_sites_dtype(init, dtype):
    weight = init(_site("layer.weight", (3, 4), dtype))
    bias = init(_site("layer.bias", (3,), dtype))
    assert weight.dtype == dtype and weight.shape == (3, 4)
    assert bias.dtype == dtype and bias.shape == (3,)
    assert torch.all(bias == 0) and weight.abs().max() > 0
