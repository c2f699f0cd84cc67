"""The heteroscedastic Gaussian likelihood (issue 24, item 1): a network that predicts its own
noise scale per input, with every guide, prediction's variance decomposition, the mixture
log-likelihood, the ArviZ export, ``compare`` and the NUTS reference."""

import math
import warnings

import numpy as np
import pytest
import torch

import pyro_dropout as pd
from pyro_dropout.nn import HeteroscedasticGaussianLikelihood

from ._guides import GUIDES


def _noisy_data(n=400, seed=0):
    """y = sin(2x) + σ(x) ε with σ(x) = 0.1 + 0.4 |x|, x uniform on [-2, 2]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    sigma = 0.1 + 0.4 * x.abs()
    y = torch.sin(2 * x) + sigma * torch.randn(n, 1, generator=g)
    return x, y.squeeze(-1)


# ----------------------------------------------------------------------- the likelihood
def test_scale_is_softplus_with_a_floor_and_init_scale_at_zero_output():
    lik = HeteroscedasticGaussianLikelihood(min_scale=0.01, init_scale=0.5)
    f = torch.tensor([[1.0, 0.0], [2.0, -1e4], [3.0, 50.0]])
    loc, scale = lik.split(f)
    torch.testing.assert_close(loc, f[:, :1])
    torch.testing.assert_close(scale[0, 0], torch.tensor(0.5))  # h = 0 -> init_scale
    torch.testing.assert_close(scale[1, 0], torch.tensor(0.01))  # the floor
    shift = math.log(math.expm1(0.49))
    torch.testing.assert_close(scale[2, 0], torch.tensor(0.01 + 50.0 + shift))  # softplus ~ id
    d = lik.distribution(f)
    assert d.event_shape == (1,) and d.batch_shape == (3,)


def test_targets_and_bad_settings_are_checked():
    lik = HeteroscedasticGaussianLikelihood()
    f = torch.zeros(5, 4)  # two targets
    assert lik.check_target(torch.zeros(5, 2), f).shape == (5, 2)
    with pytest.raises(ValueError, match=r"expected \(N, 2\)"):
        lik.check_target(torch.zeros(5), f)
    with pytest.raises(ValueError, match="2 network outputs per target"):
        lik.distribution(torch.zeros(5, 3))
    with pytest.raises(ValueError, match="must exceed min_scale"):
        HeteroscedasticGaussianLikelihood(min_scale=1.0, init_scale=0.5)
    with pytest.raises(ValueError, match="predicts its noise scale"):
        pd.BayesianMLP(2, 1, likelihood="heteroscedastic", tau=1.0)


def test_mlp_last_layer_has_mean_and_scale_outputs():
    model = pd.BayesianMLP(3, 2, hidden=(7,), likelihood="heteroscedastic")
    assert isinstance(model.likelihood, HeteroscedasticGaussianLikelihood)
    assert model.net.layers[-1].out_features == 4
    f = model(torch.randn(6, 3), torch.randn(6, 2))
    assert f.shape == (6, 4)


# -------------------------------------------------------------- every guide, prediction
@pytest.mark.parametrize("name", sorted(GUIDES))
def test_every_guide_fits_with_local_reparameterization_and_predicts(name):
    x, y = _noisy_data(n=64)
    model = pd.BayesianMLP(1, 1, hidden=(8,), likelihood="heteroscedastic")
    guide = GUIDES[name](model)
    losses = pd.fit(model, guide, x, y, num_epochs=5, batch_size=32, progress=False)
    assert all(math.isfinite(v) for v in losses)
    pred = pd.predict(model, guide, x[:10], num_samples=20, seed=0)
    assert pred.mean.shape == (10, 1)
    assert (pred.aleatoric_variance > 0).all() and (pred.epistemic_variance >= 0).all()
    assert torch.isfinite(pred.log_likelihood(y[:10])).all()


def test_variance_decomposition_and_mixture_log_likelihood_by_hand():
    """Against the network outputs of the same draws (site ``_RETURN``, same seed):
    aleatoric = E_t σ_t², epistemic = Var_t μ_t, total = their sum, and the log-likelihood is
    logsumexp_t log N(y; μ_t, σ_t) − log T."""
    x, y = _noisy_data(n=50)
    model = pd.BayesianMLP(1, 1, hidden=(8,), likelihood="heteroscedastic")
    guide = pd.AutoMeanField(model, init_scale=0.1)
    pd.fit(model, guide, x, y, num_epochs=3, batch_size=25, progress=False)
    pred = pd.predict(model, guide, x, num_samples=30, seed=5)
    raw = pd.predict(model, guide, x, num_samples=30, seed=5, site="_RETURN").samples
    assert raw.shape == (30, 50, 2)
    mu, sigma = model.likelihood.split(raw)
    torch.testing.assert_close(pred.aleatoric_variance, (sigma**2).mean(0))
    torch.testing.assert_close(pred.epistemic_variance, mu.var(0, unbiased=False))
    torch.testing.assert_close(pred.variance, (sigma**2).mean(0) + mu.var(0, unbiased=False))
    log_n = (
        -0.5 * ((y.unsqueeze(-1) - mu) / sigma) ** 2 - sigma.log() - 0.5 * math.log(2 * math.pi)
    ).squeeze(-1)
    expected = torch.logsumexp(log_n, 0) - math.log(30)
    torch.testing.assert_close(pred.log_likelihood(y), expected)
    # the scales differ across draws and inputs: a real mixture, not one Gaussian
    assert float(sigma.std(0).mean()) > 0


def test_recovers_a_known_noise_function():
    """σ(x) = 0.1 + 0.4|x| on 2,000 points. Tolerance: near x, about 100 points fall within
    ±0.1 of it (density 500 per unit); a scale estimated from n Gaussian residuals has a
    relative SE of 1/sqrt(2n) ≈ 7 %, the smoothing of a 1-hidden-layer net over ±0.25 shifts it
    by at most 0.4·0.25 = 0.1 where σ is linear and the kink at 0 is rounded; so |σ̂ − σ| <
    0.1 + 20 % of σ, and the ratio σ(1.5)/σ(0) (7 for the truth, 1 for a homoscedastic fit)
    must exceed 3. Measured (seed 0): σ̂ = 0.67, 0.35, 0.15, 0.38, 0.68 at x = −1.5 … 1.5."""
    x, y = _noisy_data(n=2000, seed=0)
    model = pd.BayesianMLP(1, 1, hidden=(50,), likelihood="heteroscedastic")
    guide = pd.AutoMeanField(model)
    pd.fit(model, guide, x, y, num_epochs=200, batch_size=128, lr=0.01, progress=False)
    xt = torch.tensor([[-1.5], [-0.75], [0.0], [0.75], [1.5]])
    pred = pd.predict(model, guide, xt, num_samples=200, seed=1)
    fitted = pred.aleatoric_variance.sqrt().squeeze(-1)
    truth = (0.1 + 0.4 * xt.abs()).squeeze(-1)
    assert ((fitted - truth).abs() < 0.1 + 0.2 * truth).all(), (fitted, truth)
    assert fitted[-1] / fitted[2] > 3.0
    # the epistemic part is small against the noise with 2,000 points
    assert (pred.epistemic_variance < pred.aleatoric_variance).all()


# ------------------------------------------------------------ export, compare, reference
@pytest.fixture
def float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


def test_export_and_compare_unchanged(float64):
    from pyro_dropout.diagnostics import _reader as rd
    from pyro_dropout.diagnostics import compare, to_inference_data

    x, y = _noisy_data(n=60)
    x, y = x.double(), y.double()
    xt, yt = _noisy_data(n=30, seed=1)
    xt, yt = xt.double(), yt.double()
    homo = pd.BayesianMLP(1, 1, hidden=(8,))
    hetero = pd.BayesianMLP(1, 1, hidden=(8,), likelihood="heteroscedastic")
    fits = {}
    for name, model in (("homo", homo), ("hetero", hetero)):
        guide = pd.AutoMeanField(model, name=name)  # two live fits: a param-store name each
        pd.fit(model, guide, x, y, num_epochs=20, batch_size=30, progress=False)
        fits[name] = (model, guide)
    idata = to_inference_data(*fits["hetero"], x=x, y=y, x_test=xt, y_test=yt, num_samples=40)
    ll = rd.draws(idata, "log_likelihood", rd.obs_name(idata))
    assert ll.shape == (40, 60) and np.isfinite(ll).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's Pareto-k warnings on 40 draws
        table = compare(fits, x=x, y=y, x_test=xt, y_test=yt, num_samples=40)
    assert set(table.index) == {"homo", "hetero"}
    assert np.isfinite(table.loc["hetero", "test_lpd"])


def test_reference_posterior_runs_on_a_heteroscedastic_model(float64):
    from pyro_dropout.diagnostics import _reader as rd
    from pyro_dropout.diagnostics import reference_posterior

    x, y = _noisy_data(n=20)
    x, y = x.double(), y.double()
    model = pd.BayesianMLP(1, 1, hidden=(3,), likelihood="heteroscedastic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of a 30-draw chain
        ref = reference_posterior(
            model, x, y, num_chains=1, num_warmup=30, num_samples=30, processes=1, seed=0
        )
    ll = rd.draws(ref, "log_likelihood", rd.obs_name(ref))
    assert ll.shape == (30, 20) and np.isfinite(ll).all()


# ------------------------------------------------- every guide recovers the noise (issue 39)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["dropout", "concrete", "mean_field", "vd"])
def test_every_guide_recovers_the_noise_function(name):
    """σ(x) = 0.05 + 0.3|x| on 600 points of [−3, 3], y = sin x + σ(x) ε, each guide with its
    defaults, 3,000 steps at lr 1e-2. Before AutoDropout kept the model's inputs
    (``input_dropout_rate=0``), 10 % of its draws dropped the one input and predicted as if
    x = 0, so the scale at 0 had to cover every target: aleatoric variance 0.30 at x = 0
    against 0.0025, Spearman 0.72 over the grid. Tolerances: Spearman ≥ 0.9 over 59 grid
    points, and the aleatoric variance within 2× of the truth at |x| = 0.5 (variance 0.04)
    and |x| = 2.5 (0.64): about 50 points fall within ±0.25 of each, so a variance from
    their residuals has a relative SE of sqrt(2/50) = 20 %, and 2× is 3.5 SE away.
    Measured (seed 0): Spearman 0.99–1.00, ratios 0.78–1.24 at those four points. The kink
    at x = 0 (σ = 0.05) is smoothed by every guide alike (ratios 3.8–7.5) and is not tested."""
    from scipy.stats import spearmanr

    factory = {
        "dropout": pd.AutoDropout,
        "concrete": pd.AutoConcreteDropout,
        "mean_field": pd.AutoMeanField,
        "vd": pd.AutoVariationalDropout,
    }[name]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(600, 1, generator=g) * 6 - 3
    y = (torch.sin(x) + (0.05 + 0.3 * x.abs()) * torch.randn(600, 1, generator=g)).squeeze(-1)
    model = pd.BayesianMLP(1, 1, hidden=(50,), likelihood="heteroscedastic")
    guide = factory(model)
    pd.fit(model, guide, x, y, num_steps=3000, lr=1e-2, progress=False, seed=0)
    grid = torch.linspace(-2.9, 2.9, 59).unsqueeze(-1)
    fitted = pd.predict(model, guide, grid, num_samples=300, seed=1).aleatoric_variance
    truth = (0.05 + 0.3 * grid.abs()) ** 2
    assert spearmanr(fitted.squeeze(-1), truth.squeeze(-1)).statistic >= 0.9
    points = torch.tensor([[-2.5], [-0.5], [0.5], [2.5]])
    ratio = (
        pd.predict(model, guide, points, num_samples=300, seed=1).aleatoric_variance
        / (0.05 + 0.3 * points.abs()) ** 2
    )
    assert ((ratio > 0.5) & (ratio < 2.0)).all(), ratio
