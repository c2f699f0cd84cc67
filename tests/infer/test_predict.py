"""``predict`` and ``Prediction``: shapes, chunking, predictive moments and scores."""

import math
import sys

import numpy as np
import pyro
import pytest
import torch
from scipy.special import logsumexp

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    Prediction,
    fit,
    predict,
)
from pyro_dropout.nn import CategoricalLikelihood

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.2),
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.05),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
}
N = 10


def _regression(make_guide=GUIDES["dropout"], out=1, tau=25.0, steps=20):
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    y = torch.stack([x[:, 0] - x[:, 1], x[:, 2]], -1)[:, :out]
    model = BayesianMLP(3, out, hidden=(8,), tau=tau)
    guide = make_guide(model)
    fit(model, guide, x, y, num_steps=steps, lr=0.02, progress=False, seed=0)
    return model, guide, x, y


def _classification(make_guide=GUIDES["dropout"]):
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    model = BayesianMLP(3, 3, hidden=(8,), likelihood="classification")
    guide = make_guide(model)
    fit(model, guide, x, y, num_steps=20, lr=0.02, progress=False, seed=0)
    return model, guide, x, y


# --------------------------------------------------------------------------------------------
# shapes and chunking
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
@pytest.mark.parametrize("num_samples", [1, 2, 17])
def test_sample_shapes(make_guide, num_samples):
    model, guide, x, _ = _regression(make_guide, out=2)
    pred = predict(model, guide, x, num_samples=num_samples, seed=0)
    assert isinstance(pred, Prediction)
    assert pred.samples.shape == (num_samples, N, 2)
    assert pred.mean.shape == pred.variance.shape == pred.stddev.shape == (N, 2)
    assert pred.kind == "regression"
    assert pred.likelihood is model.likelihood


@pytest.mark.parametrize("lrt", [True, False], ids=["lrt", "weights"])
@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_chunking_gives_same_shapes_and_close_statistics(make_guide, lrt):
    model, guide, x, _ = _regression(make_guide)
    T = 400
    whole = predict(model, guide, x, num_samples=T, local_reparameterization=lrt, seed=1)
    chunked = predict(
        model, guide, x, num_samples=T, chunk_size=7, local_reparameterization=lrt, seed=1
    )
    assert whole.samples.shape == chunked.samples.shape == (T, N, 1)
    # means agree within Monte-Carlo error (4.5 standard errors of the difference)
    se = torch.sqrt(whole.epistemic_variance / T + chunked.epistemic_variance / T)
    assert ((whole.mean - chunked.mean).abs() <= 4.5 * se + 1e-6).all()
    ratio = chunked.epistemic_variance / whole.epistemic_variance
    assert ((ratio > 0.6) & (ratio < 1.6)).all()


def _counting(guide, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return guide(*args, **kwargs)

    return counted


def test_default_chunks_follow_the_widest_layer(monkeypatch):
    """A one-sample pass measures the widest layer output (N x 8 hidden units here), then
    passes hold CHUNK_ELEMENTS of it."""
    predict_module = sys.modules["pyro_dropout.infer.predict"]  # the package exports the function
    model, guide, x, _ = _regression()  # hidden width 8 (see _regression)
    widest = N * 8
    calls = []
    monkeypatch.setitem(predict_module.CHUNK_ELEMENTS, "cpu", 3 * widest)
    pred = predict(model, _counting(guide, calls), x, num_samples=10, seed=5)
    assert pred.samples.shape == (10, N, 1)
    assert len(calls) == 1 + 3  # the probe, then 9 samples in passes of 3
    calls.clear()
    monkeypatch.setitem(predict_module.CHUNK_ELEMENTS, "cpu", 2**20)
    predict(model, _counting(guide, calls), x, num_samples=10, seed=5)
    assert len(calls) == 2  # the probe, then the other nine in one pass


def test_chunk_size_must_be_positive():
    model, guide, x, _ = _regression()
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        predict(model, guide, x, num_samples=4, chunk_size=0)


def test_seed_makes_predictions_reproducible():
    model, guide, x, _ = _regression()
    a = predict(model, guide, x, num_samples=6, chunk_size=4, seed=2)
    b = predict(model, guide, x, num_samples=6, chunk_size=4, seed=2)
    c = predict(model, guide, x, num_samples=6, chunk_size=4, seed=3)
    assert torch.equal(a.samples, b.samples)
    assert not torch.equal(a.samples, c.samples)


def test_samples_vary_between_and_within_chunks():
    model, guide, x, _ = _regression()
    s = predict(model, guide, x, num_samples=8, chunk_size=4, seed=0).samples
    assert torch.unique(s[:, 0, 0]).numel() == 8


def test_predict_before_fitting_raises():
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    guide = AutoMeanField(model)
    with pytest.raises(RuntimeError, match="has not been fitted"):
        predict(model, guide, torch.randn(N, 3))


def test_predict_needs_at_least_one_sample():
    model, guide, x, _ = _regression()
    with pytest.raises(ValueError, match="num_samples"):
        predict(model, guide, x, num_samples=0)


# --------------------------------------------------------------------------------------------
# predictive moments
# --------------------------------------------------------------------------------------------


def test_variance_is_epistemic_plus_inverse_tau_for_fixed_tau():
    model, guide, x, _ = _regression(tau=25.0)
    pred = predict(model, guide, x, num_samples=50, seed=0)
    s = pred.samples.double().numpy()
    np.testing.assert_allclose(pred.mean.numpy(), s.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pred.epistemic_variance.numpy(), s.var(0), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(pred.aleatoric_variance, torch.full((N, 1), 1 / 25.0))
    torch.testing.assert_close(pred.variance, pred.epistemic_variance + 1 / 25.0)
    torch.testing.assert_close(pred.stddev, pred.variance.sqrt())


def test_variance_uses_the_guides_noise_draws():
    """A learned noise is a latent site: the aleatoric variance is E_q[s²], which for the
    guide's LogNormal q(s) = exp(N(μ, σ²)) is exp(2μ + 2σ²)."""
    model, guide, x, _ = _regression(tau=None, steps=30)
    mu = guide.locs.likelihood.noise_scale.detach()
    sd = guide.scales.likelihood.noise_scale.detach()
    assert mu.item() != pytest.approx(0.0, abs=1e-3)  # it was learned
    pred = predict(model, guide, x, num_samples=4000, seed=0)
    expected = torch.exp(2 * mu + 2 * sd**2)
    s2 = pred.draws.params["scale"][:, 0, 0] ** 2
    tol = 4 * s2.std() / math.sqrt(s2.numel()) + 1e-6
    assert torch.allclose(pred.aleatoric_variance, expected.expand(N, 1), atol=float(tol))
    torch.testing.assert_close(pred.variance, pred.epistemic_variance + pred.aleatoric_variance)


# --------------------------------------------------------------------------------------------
# test log-likelihood: Gal & Ghahramani's formula, by hand
# --------------------------------------------------------------------------------------------


def _gal_log_likelihood(samples, y, tau):
    """logsumexp_t(-τ/2 ||y - ŷ_t||²) - log T - D/2 log 2π + D/2 log τ, in float64 numpy."""
    samples = np.asarray(samples, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(samples.shape[1:])
    T, D = samples.shape[0], samples.shape[-1]
    sq = ((y[None] - samples) ** 2).sum(-1)
    return (
        logsumexp(-0.5 * tau * sq, axis=0)
        - math.log(T)
        - 0.5 * D * math.log(2 * math.pi)
        + 0.5 * D * math.log(tau)
    )


@pytest.mark.parametrize("out", [1, 2])
def test_log_likelihood_is_gals_formula(out):
    model, guide, x, y = _regression(out=out, tau=25.0)
    pred = predict(model, guide, x, num_samples=30, seed=0)
    precision = model.likelihood.precision()
    expected = _gal_log_likelihood(pred.samples.numpy(), y.numpy(), precision)
    y_arg = y.squeeze(-1) if out == 1 else y  # (N,) is accepted for one output
    ll = pred.log_likelihood(y_arg)
    assert ll.shape == (N,)
    np.testing.assert_allclose(ll.numpy(), expected, rtol=1e-5, atol=1e-5)
    # exactly (to float64 rounding) when the samples are float64
    ll64 = Prediction(pred.samples.double(), model.likelihood).log_likelihood(y_arg.double())
    np.testing.assert_allclose(ll64.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("out", [1, 2])
def test_log_likelihood_with_a_latent_noise_mixes_over_the_noise_draws(out):
    """log (1/T) Σ_t Π_d N(y_d; f_td, s_t²), by hand from the per-draw means and scales."""
    model, guide, x, y = _regression(out=out, tau=None)
    pred = predict(model, guide, x, num_samples=30, seed=0)
    f = pred.samples.double().numpy()  # (T, N, out)
    s = pred.draws.params["scale"].double().numpy()  # (T, N, out), one value per draw
    assert np.allclose(s, s[:, :1, :1])
    per_draw = (
        -0.5 * ((y.double().numpy() - f) / s) ** 2 - np.log(s) - 0.5 * math.log(2 * math.pi)
    ).sum(-1)
    expected = logsumexp(per_draw, axis=0) - math.log(f.shape[0])
    ll = pred.log_likelihood(y.squeeze(-1) if out == 1 else y)
    np.testing.assert_allclose(ll.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_log_likelihood_of_a_point_mass_is_the_gaussian_density():
    model, _, _, y = _regression(tau=4.0)
    samples = torch.zeros(5, N, 1, dtype=torch.float64)
    ll = Prediction(samples, model.likelihood).log_likelihood(y.double().squeeze(-1))
    expected = -0.5 * 4.0 * y.double().squeeze(-1) ** 2 - 0.5 * math.log(2 * math.pi / 4.0)
    torch.testing.assert_close(ll, expected)


def test_log_likelihood_checks_the_target_shape():
    model, guide, x, _ = _regression(out=2)
    pred = predict(model, guide, x, num_samples=3, seed=0)
    with pytest.raises(ValueError, match="y has shape"):
        pred.log_likelihood(torch.zeros(N))


# --------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_classification_probabilities_and_uncertainties(make_guide):
    model, guide, x, y = _classification(make_guide)
    pred = predict(model, guide, x, num_samples=40, seed=0)
    assert pred.kind == "classification"
    assert pred.samples.shape == (40, N, 3)
    probs = pred.probs
    assert probs.shape == (N, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(N))
    assert (probs >= 0).all()
    torch.testing.assert_close(pred.mean, probs)
    torch.testing.assert_close(probs, torch.softmax(pred.samples, -1).mean(0))
    entropy, mi = pred.entropy, pred.mutual_information
    assert entropy.shape == mi.shape == (N,)
    assert (mi >= -1e-6).all()
    assert (entropy >= mi - 1e-6).all()
    assert (entropy <= math.log(3) + 1e-6).all()
    # the log-likelihood is log of the MC-averaged probability of the label
    ll = pred.log_likelihood(y)
    p = torch.softmax(pred.samples.double(), -1).numpy()
    expected = np.log(p[:, np.arange(N), y.numpy()].mean(0))
    np.testing.assert_allclose(ll.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_mutual_information_is_zero_without_epistemic_spread():
    logits = torch.randn(N, 3).expand(6, N, 3)
    pred = Prediction(logits, CategoricalLikelihood())
    torch.testing.assert_close(pred.mutual_information, torch.zeros(N), atol=1e-6, rtol=0)
    p = torch.softmax(logits[0], -1)
    torch.testing.assert_close(pred.entropy, -(p * p.log()).sum(-1))


def test_kind_specific_properties_raise_for_the_other_kind():
    model, guide, x, _ = _regression()
    reg = predict(model, guide, x, num_samples=3, seed=0)
    with pytest.raises(AttributeError, match="classification"):
        _ = reg.probs
    pyro.clear_param_store()  # the next AutoDropout would reuse this one's parameters
    model, guide, x, _ = _classification()
    cls = predict(model, guide, x, num_samples=3, seed=0)
    with pytest.raises(AttributeError, match="regression"):
        _ = cls.epistemic_variance
    with pytest.raises(AttributeError, match="regression"):
        _ = cls.aleatoric_variance
    torch.testing.assert_close(cls.variance, cls.probs * (1 - cls.probs))


def test_prediction_without_likelihood():
    samples = torch.randn(4, N, 2)
    pred = Prediction(samples)
    assert pred.kind is None
    torch.testing.assert_close(pred.mean, samples.mean(0))
    torch.testing.assert_close(pred.variance, samples.var(0, unbiased=False))
    with pytest.raises(AttributeError, match="likelihood"):
        pred.log_likelihood(torch.zeros(N, 2))
