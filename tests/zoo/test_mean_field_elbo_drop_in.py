"""``MeanFieldELBO`` is documented as a drop-in for Pyro's ``TraceMeanField_ELBO`` in a user's own
loop (README, getting started): on every model of the zoo (written as Pyro's tutorials write
them, not for this library) and with all four guides, the loss and its gradients equal Pyro's
under local reparameterisation, on the same draws."""

import warnings

import pyro
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    local_reparameterization,
)
from pyro_dropout.infer import MeanFieldELBO

from ._models import ZOO

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.2),
    "concrete": lambda m: AutoConcreteDropout(m),
    "mean_field": lambda m: AutoMeanField(m),
    "variational_dropout": lambda m: AutoVariationalDropout(m),
}


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
@pytest.mark.parametrize("model_name", sorted(ZOO))
def test_same_loss_and_gradients_as_pyro(model_name, guide_name):
    build, data, _ = ZOO[model_name]
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = build()
    x, y = data(24, 0)
    guide = GUIDES[guide_name](model)
    with warnings.catch_warnings():
        # (a model's own layout warnings are the subject of other tests)
        warnings.simplefilter("ignore")
        with local_reparameterization():
            guide(x, y)
        params = [p for _, p in guide.named_parameters()]
        results = []
        for elbo in (TraceMeanField_ELBO(max_plate_nesting=1), MeanFieldELBO(max_plate_nesting=1)):
            pyro.set_rng_seed(7)  # the same draws for both estimators
            with local_reparameterization():
                loss = elbo.differentiable_loss(model, guide, x, y)
            results.append((loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)))
    (l0, g0), (l1, g1) = results
    assert torch.isfinite(l0)
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-4)
    assert len(g0) == len(g1) > 0
    for a, b in zip(g0, g1, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
