"""Regression tests for bugs found by the API test suite."""

import pytest
import torch
import torch.nn.functional as F

from pyro_dropout import bayesianize
from pyro_dropout.nn import LinearSpec


def test_linear_unbatched_weight_with_batched_bias():
    x, w, b = torch.randn(5, 4), torch.randn(3, 4), torch.randn(2, 1, 3)
    out = LinearSpec()(x, w, b)
    torch.testing.assert_close(out, F.linear(x, w) + b)


class MyLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize(
    "module", [MyLinear(3, 2), torch.nn.Sequential(torch.nn.Linear(3, 3), MyLinear(3, 2))]
)
def test_bayesianize_rejects_subclasses_of_convertible_layers(module):
    with pytest.raises(TypeError, match="MyLinear"):
        bayesianize(module)
