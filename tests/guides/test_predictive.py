"""The guides with ``pyro.infer.Predictive`` (sequential and ``parallel=True``), vectorised
particles, and the error for Pyro's Delta-site autoguides under local reparameterisation."""

import pytest
import torch
from pyro.infer import SVI, Predictive, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal
from pyro.optim import Adam

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianConvNet,
    BayesianMLP,
    fit,
    local_reparameterization,
)
from pyro_dropout.handlers import LocalReparameterizationWarning

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.3),
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.05),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
    "concrete_dropout": lambda m: AutoConcreteDropout(m, init_rate=0.3),
}
S, N = 6, 12


def _fitted(make_guide, likelihood="regression"):
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    if likelihood == "regression":
        model = BayesianMLP(3, 2, hidden=(5,), tau=20.0)
        y = torch.stack([x[:, 0], x[:, 1]], -1)
    else:
        model = BayesianMLP(3, 4, hidden=(5,), likelihood="classification")
        y = torch.randint(0, 4, (N,))
    guide = make_guide(model)
    fit(model, guide, x, y, num_steps=5, lr=0.01, progress=False, seed=0)
    return model, guide, x, y


@pytest.mark.parametrize("lrt", [False, True], ids=["weights", "lrt"])
@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_predictive_return_shapes(make_guide, parallel, lrt):
    model, guide, x, _ = _fitted(make_guide)
    predictive = Predictive(
        model, guide=guide, num_samples=S, parallel=parallel, return_sites=["_RETURN", "obs"]
    )
    if lrt:
        predictive = local_reparameterization(predictive)
    out = predictive(x)
    f = out["_RETURN"]
    assert f.shape == (S, N, 2)
    assert out["obs"].shape[0] == S and out["obs"].shape[-2:] == (N, 2)
    assert torch.isfinite(f).all()
    # draws differ between samples
    assert not torch.allclose(f[0], f[1])


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_predictive_weight_samples_have_a_sample_dim(make_guide, parallel):
    model, guide, x, _ = _fitted(make_guide)
    predictive = Predictive(model, guide=guide, num_samples=S, parallel=parallel)
    samples = predictive(x)
    w = samples["net.layers.0.weight"]
    assert w.shape[0] == S and w.shape[-2:] == (5, 3)
    assert w.numel() == S * 5 * 3


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_predictive_classification(make_guide, parallel):
    model, guide, x, _ = _fitted(make_guide, likelihood="classification")
    out = Predictive(
        model, guide=guide, num_samples=S, parallel=parallel, return_sites=["_RETURN", "obs"]
    )(x)
    assert out["_RETURN"].shape == (S, N, 4)
    assert out["obs"].shape[0] == S and out["obs"].shape[-1] == N
    assert ((out["obs"] >= 0) & (out["obs"] < 4)).all()


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_predictive_parallel_convnet(make_guide):
    torch.manual_seed(0)
    model = BayesianConvNet(1, 3, image_size=10, channels=(2, 2), hidden=4, kernel_size=3)
    x, y = torch.randn(N, 1, 10, 10), torch.randint(0, 3, (N,))
    guide = make_guide(model)
    fit(model, guide, x, y, num_steps=2, progress=False, seed=0)
    out = local_reparameterization(
        Predictive(model, guide=guide, num_samples=S, parallel=True, return_sites=["_RETURN"])
    )(x)
    assert out["_RETURN"].shape == (S, N, 3)


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_vectorized_particles(make_guide):
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    y = x[:, 0]
    model = BayesianMLP(3, 1, hidden=(5,), tau=20.0)
    guide = make_guide(model)
    for lrt in (True, False):
        losses = fit(
            model,
            guide,
            x,
            y,
            num_steps=3,
            num_particles=4,
            vectorize_particles=True,
            local_reparameterization=lrt,
            progress=False,
            seed=0,
        )
        assert len(losses) == 3 and all(map(torch.isfinite, torch.tensor(losses)))


# --------------------------------------------------------------------------------------------
# Pyro's autoguides put a Delta at the site
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDelta])
def test_pyro_delta_autoguides_under_lrt_warn_naming_auto_mean_field(autoguide):
    """A Delta has no variance to reparameterise: the weights are used as drawn, with one
    warning per site naming the site and the fix; strict=True raises instead."""
    torch.manual_seed(0)
    x, y = torch.randn(N, 3), torch.randn(N)
    model = BayesianMLP(3, 1, hidden=(5,), tau=1.0)
    guide = autoguide(model)
    svi = SVI(model, guide, Adam({"lr": 0.01}), TraceMeanField_ELBO())
    with pytest.raises(NotImplementedError, match="AutoMeanField") as info:
        with local_reparameterization(strict=True):
            svi.step(x, y)
    assert "Delta" in str(info.value) and "net.layers.0.weight" in str(info.value)
    with pytest.warns(LocalReparameterizationWarning, match="AutoMeanField") as record:
        with local_reparameterization():
            for _ in range(3):
                svi.step(x, y)
    sites = sorted(str(w.message).split("'")[1] for w in record)
    assert sites == ["net.layers.0.weight", "net.layers.1.weight"]  # once per site
    # fit() defaults to local reparameterisation: the same warning; without it, silence
    with pytest.warns(LocalReparameterizationWarning, match="Delta"):
        fit(model, guide, x, y, num_steps=1, progress=False)
    losses = fit(model, guide, x, y, num_steps=2, local_reparameterization=False, progress=False)
    assert len(losses) == 2


NEAR_POINT = {  # guides whose draws are (nearly) their means: the output is a known function
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.0, scale=1e-6),
    "mean_field": lambda m: AutoMeanField(m, init_scale=1e-6),
    "variational_dropout": lambda m: AutoVariationalDropout(
        m, init_log_alpha=-8.0, init_scale=1e-6
    ),
    "concrete_dropout": lambda m: AutoConcreteDropout(m, init_rate=1e-7, scale=1e-6),
}


@pytest.mark.parametrize("lrt", [False, True], ids=["weights", "lrt"])
@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("name", sorted(NEAR_POINT))
def test_predictive_values_are_the_network_at_the_guide_means(name, parallel, lrt):
    """Values, not only shapes: with (nearly) point-mass guides every Predictive draw of
    ``_RETURN`` is the network evaluated at the guide's means, in every mode."""
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    model = BayesianMLP(3, 2, hidden=(5,), tau=20.0)
    guide = NEAR_POINT[name](model)
    guide(x, torch.zeros(N, 2))
    if name == "variational_dropout":  # σ² = e^-8 θ² is not tiny: make it so
        with torch.no_grad():
            for p in guide.log_sigma2.parameters():
                p.fill_(-40.0)
    med = guide.median()
    h = torch.relu(x @ med["net.layers.0.weight"].T + med["net.layers.0.bias"])
    expected = h @ med["net.layers.1.weight"].T + med["net.layers.1.bias"]
    predictive = Predictive(model, guide=guide, num_samples=S, parallel=parallel)
    predictive.return_sites = ["_RETURN"]
    if lrt:
        predictive = local_reparameterization(predictive)
    f = predictive(x)["_RETURN"]
    torch.testing.assert_close(f, expected.expand(S, N, 2), atol=1e-3, rtol=0)
