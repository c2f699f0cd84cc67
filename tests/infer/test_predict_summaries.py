"""``Prediction.mean``, ``.variance`` and ``.log_likelihood`` for every likelihood: Gaussian,
heteroscedastic, Bernoulli, Categorical, Poisson, StudentT and a user's own distribution
(issue 39, item 3). Numbers against closed forms and Monte Carlo.

The functional models have one Gaussian weight vector ``w ~ q = N(MU, SD²)`` (a fixed guide),
so ``f = x·w`` is Gaussian per row with mean ``x·MU`` and variance ``x²·SD²``."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.distributions import constraints

from pyro_dropout import AutoDropout, BayesianMLP, predict

MU = torch.tensor([0.5, -0.3])
SD = torch.tensor([0.3, 0.2])
N, T = 7, 4000


def _x():
    g = torch.Generator().manual_seed(0)
    return torch.rand(N, 2, generator=g) * 2 - 1


def guide(x, y=None):
    pyro.sample("w", dist.Normal(MU, SD).to_event(1))


def _model(family):
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", family(x @ w), obs=y)

    return model


class ShiftedExponential(dist.TorchDistribution):
    """A user's family: ``shift + Exponential(rate)``; mean ``shift + 1/rate``, variance
    ``1/rate²``."""

    arg_constraints = {"rate": constraints.positive, "shift": constraints.real}
    support = constraints.real
    has_rsample = True

    def __init__(self, rate, shift, validate_args=None):
        self.rate, self.shift = torch.broadcast_tensors(torch.as_tensor(rate), shift)
        super().__init__(self.rate.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return ShiftedExponential(self.rate.expand(batch_shape), self.shift.expand(batch_shape))

    @property
    def mean(self):
        return self.shift + 1 / self.rate

    @property
    def variance(self):
        return self.rate.pow(-2)

    def rsample(self, sample_shape=torch.Size()):
        e = torch.empty(self._extended_shape(sample_shape)).exponential_()
        return self.shift + e / self.rate

    def log_prob(self, value):
        z = value - self.shift
        lp = self.rate.log() - self.rate * z
        return torch.where(z >= 0, lp, torch.full_like(lp, -math.inf))


class NoMoments(ShiftedExponential):
    """A family that defines neither mean nor variance (torch's default raises)."""

    mean = dist.TorchDistribution.mean
    variance = dist.TorchDistribution.variance

    def expand(self, batch_shape, _instance=None):
        return NoMoments(self.rate.expand(batch_shape), self.shift.expand(batch_shape))


class OtherNames(ShiftedExponential):
    """A family whose constructor does not take its ``arg_constraints`` names."""

    def __init__(self, params, validate_args=None):
        super().__init__(params[0], params[1], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return OtherNames((self.rate.expand(batch_shape), self.shift.expand(batch_shape)))


def _lognormal_rate(x):
    """Per row, ``exp(f)`` with ``f ~ N(m, s²)``: its mean and variance (log-normal)."""
    m, s2 = x @ MU, (x**2) @ SD**2
    mean = torch.exp(m + s2 / 2)
    return mean, (torch.exp(s2) - 1) * mean**2


def _mc_check(pred, expected, what, z=5.0):
    """``pred``'s value within ``z`` Monte-Carlo standard errors of ``expected`` (T draws)."""
    y = pred.draws.dist().sample()  # one y per θ draw: a draw of the predictive
    if what == "mean":
        est, se = pred.mean, y.std(0) / math.sqrt(T)
    else:  # the sample variance: se² ≈ (m4 - σ⁴) / T
        c = y - y.mean(0)
        est, se = pred.variance, ((c**4).mean(0) - c.var(0) ** 2).clamp_min(0).sqrt() / math.sqrt(T)
    assert torch.all((est - expected).abs() <= z * se + 1e-6), (est, expected, se)
    return y


def test_poisson_moments_by_the_law_of_total_variance():
    """Poisson(exp(x·w)): E[y] = E[rate]; Var[y] = E[rate] + Var[rate] (log-normal rate)."""
    x = _x()
    pred = predict(_model(lambda f: dist.Poisson(f.exp())), guide, x, num_samples=T, seed=0)
    rate = pred.draws.params["rate"]
    # the identity, exactly: aleatoric E_t[rate_t], epistemic Var_t[rate_t]
    torch.testing.assert_close(pred.aleatoric_variance, rate.mean(0))
    torch.testing.assert_close(pred.epistemic_variance, rate.var(0, unbiased=False))
    torch.testing.assert_close(pred.variance, rate.mean(0) + rate.var(0, unbiased=False))
    # the closed form (log-normal rate), to Monte-Carlo error: z = 5 of T = 4000 draws
    mean, var_rate = _lognormal_rate(x)
    se_mean = var_rate.sqrt() / math.sqrt(T)
    assert torch.all((pred.mean - mean).abs() <= 5 * se_mean)
    total = mean + var_rate
    assert torch.all((pred.variance - total).abs() <= 0.15 * total)
    # and Monte Carlo through the predictive itself
    y = _mc_check(pred, pred.variance.detach(), "variance")
    torch.testing.assert_close(
        pred.log_likelihood(y[0]),
        torch.logsumexp(dist.Poisson(rate).log_prob(y[0]), 0) - math.log(T),
    )


def test_studentt_moments_and_log_likelihood():
    """StudentT(ν=5, f, 0.5): Var[y] = 0.25 ν/(ν-2) + Var[f]; E[y] = x·MU."""
    x = _x()
    pred = predict(_model(lambda f: dist.StudentT(5.0, f, 0.5)), guide, x, num_samples=T, seed=0)
    assert pred.kind == "regression"
    var_f = (x**2) @ SD**2
    torch.testing.assert_close(
        pred.aleatoric_variance, torch.full((N,), 0.25 * 5 / 3), rtol=1e-6, atol=0
    )
    assert torch.all((pred.epistemic_variance - var_f).abs() <= 0.1 * var_f + 1e-4)
    assert torch.all((pred.mean - x @ MU).abs() <= 5 * var_f.sqrt() / math.sqrt(T))
    y = _mc_check(pred, 0.25 * 5 / 3 + var_f, "variance")
    loc = pred.draws.params["loc"]
    expected = torch.logsumexp(dist.StudentT(5.0, loc, 0.5).log_prob(y[0]), 0) - math.log(T)
    torch.testing.assert_close(pred.log_likelihood(y[0]), expected)


def test_bernoulli_summaries():
    """Bernoulli(logits=f): probs (N, 2), column 1 the predictive P(y=1) = E_t σ(f_t)."""
    x = _x()
    pred = predict(_model(lambda f: dist.Bernoulli(logits=f)), guide, x, num_samples=T, seed=0)
    assert pred.kind == "classification"
    p1 = torch.sigmoid(pred.draws.params["logits"]).mean(0)
    torch.testing.assert_close(pred.mean[:, 1], p1)
    torch.testing.assert_close(pred.mean.sum(-1), torch.ones(N))
    torch.testing.assert_close(pred.variance[:, 1], p1 * (1 - p1))
    y = (x[:, 0] > 0).float()
    torch.testing.assert_close(pred.log_likelihood(y), torch.where(y > 0, p1, 1 - p1).log())
    with pytest.raises(AttributeError, match="mutual_information"):
        _ = pred.epistemic_variance


def test_categorical_library_model_summaries():
    torch.manual_seed(0)
    model = BayesianMLP(2, 3, hidden=(5,), likelihood="classification")
    guide_ = AutoDropout(model, dropout_rate=0.3)
    x, y = _x(), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    guide_(x, y)
    pred = predict(model, guide_, x, num_samples=200, seed=0)
    probs = torch.softmax(pred.samples, -1)
    torch.testing.assert_close(pred.mean, probs.mean(0))
    torch.testing.assert_close(pred.variance, pred.mean * (1 - pred.mean))
    torch.testing.assert_close(pred.log_likelihood(y), probs.mean(0)[torch.arange(N), y].log())


@pytest.mark.parametrize("likelihood", ["regression", "heteroscedastic"])
def test_gaussian_library_models_total_variance(likelihood):
    """Var = E_t[σ_t²] + Var_t[μ_t], checked against one predictive draw per θ draw."""
    torch.manual_seed(0)
    tau = 4.0 if likelihood == "regression" else None
    model = BayesianMLP(2, 1, hidden=(5,), likelihood=likelihood, tau=tau)
    guide_ = AutoDropout(model, dropout_rate=0.3)
    x = _x()
    guide_(x, x[:, :1])
    pred = predict(model, guide_, x, num_samples=T, seed=0)
    d = pred.draws.dist()
    torch.testing.assert_close(pred.variance, d.variance.mean(0) + d.mean.var(0, unbiased=False))
    _mc_check(pred, pred.variance.detach(), "variance")
    _mc_check(pred, pred.mean.detach(), "mean")


def test_users_own_distribution():
    """``shift + Exponential(rate)`` with rate 2 and shift f: Var = 1/4 + Var[f]."""
    x = _x()
    pred = predict(_model(lambda f: ShiftedExponential(2.0, f)), guide, x, num_samples=T, seed=0)
    var_f = (x**2) @ SD**2
    torch.testing.assert_close(pred.aleatoric_variance, torch.full((N,), 0.25))
    assert torch.all((pred.mean - (x @ MU + 0.5)).abs() <= 5 * var_f.sqrt() / math.sqrt(T))
    y = _mc_check(pred, 0.25 + var_f, "variance")
    shift = pred.draws.params["shift"]
    expected = torch.logsumexp(ShiftedExponential(2.0, shift).log_prob(y[0]), 0) - math.log(T)
    torch.testing.assert_close(pred.log_likelihood(y[0]), expected)


def test_a_family_without_moments_says_what_to_use():
    pred = predict(_model(lambda f: NoMoments(2.0, f)), guide, _x(), num_samples=10, seed=0)
    for what in ("mean", "variance", "epistemic_variance", "aleatoric_variance"):
        with pytest.raises(AttributeError, match=r"NoMoments does not define its .*sample\(\)"):
            _ = getattr(pred, what)
    assert pred.log_likelihood(torch.ones(N)).shape == (N,)


def test_a_family_that_cannot_be_rebuilt_keeps_predictive_draws():
    x = _x()
    pred = predict(_model(lambda f: OtherNames((2.0, f))), guide, x, num_samples=T, seed=0)
    assert pred.draws is None and pred.samples.shape == (T, N)
    var_f = (x**2) @ SD**2
    assert torch.all((pred.mean - (x @ MU + 0.5)).abs() <= 5 * (0.25 + var_f).sqrt() / T**0.5)
    assert torch.all((pred.variance - (0.25 + var_f)).abs() <= 0.15 * (0.25 + var_f))
    with pytest.raises(AttributeError, match=r"OtherNames\) cannot be rebuilt"):
        pred.log_likelihood(torch.ones(N))
