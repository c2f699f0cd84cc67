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


def test_weights_inside_a_global_plate_are_guided_per_plate_member():
    """A plate over hyper-parameter configurations (dim -2) gives each member its own weights."""
    import pyro
    import pyro.distributions as dist
    from pyro.nn import PyroModule

    from pyro_dropout import AutoVariationalDropout, BayesianLinear, fit

    class Batched(PyroModule):
        max_plate_nesting = 2

        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(3, 1)

        def forward(self, x, y=None, num_data=None):
            tau = torch.tensor([1.0, 10.0, 100.0]).reshape(3, 1)
            with pyro.plate("configs", 3, dim=-2):
                f = self.layer(x)[..., 0]  # (3, N)
                with pyro.plate("data", x.shape[0], dim=-1):
                    pyro.sample("obs", dist.Normal(f, tau**-0.5), obs=y)
            return f

    x, y = torch.randn(20, 3), torch.randn(20)
    model = Batched()
    for guide in (
        AutoMeanField(model),
        AutoDropout(model, input_dropout_rate=0.1),
        AutoVariationalDropout(model),
    ):
        fit(model, guide, x, y, num_steps=3, progress=False)
        locs = guide.median()["layer.weight"]
        assert locs.shape == (3, 1, 1, 3)
        assert not torch.allclose(locs[0], locs[1])  # independent members


def test_dropout_rate_tensor_gives_each_plate_member_its_rate():
    import pyro
    import pyro.distributions as dist
    from pyro.nn import PyroModule

    from pyro_dropout import BayesianLinear

    class Batched(PyroModule):
        def __init__(self):
            super().__init__()
            self.layer = BayesianLinear(3, 1)

        def forward(self, x, y=None):
            with pyro.plate("configs", 2, dim=-2):
                f = self.layer(x)[..., 0]
                with pyro.plate("data", x.shape[0], dim=-1):
                    pyro.sample("obs", dist.Normal(f, 1.0), obs=y)

    x, y = torch.randn(5, 3), torch.randn(5)
    rates = torch.tensor([0.1, 0.4]).reshape(2, 1, 1, 1)
    guide = AutoDropout(Batched(), dropout_rate=rates, input_dropout_rate=rates)
    guide(x, y)
    fn = guide.get_distributions()["layer.weight"]
    assert fn.dropout_rate.shape == (2, 1, 1, 3)
    torch.testing.assert_close(fn.dropout_rate[:, 0, 0, 0], torch.tensor([0.1, 0.4]))
    assert torch.tensor(guide.config["dropout_rate"]).flatten().tolist() == pytest.approx(
        [0.1, 0.4]
    )
    with pytest.raises(ValueError, match="dropout_rate"):
        AutoDropout(Batched(), dropout_rate=torch.tensor([0.1, 1.0]))


def test_init_to_glorot_bound_and_zero_biases():
    import math

    from pyro_dropout import AutoMeanField
    from pyro_dropout.guides import init_to_glorot

    model = BayesianMLP(30, 10, hidden=(50,), tau=1.0)
    guide = AutoMeanField(model, init_loc_fn=init_to_glorot)
    means = guide.median(torch.randn(4, 30), torch.randn(4, 10))
    w = means["net.layers.0.weight"]
    bound = math.sqrt(6.0 / (30 + 50))
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    assert torch.equal(means["net.layers.0.bias"], torch.zeros(50))
