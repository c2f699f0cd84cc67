"""``AutoVariationalDropout``: α parameterisations, clipping and sparsification."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    AutoVariationalDropout,
    BayesianMLP,
    ImproperLogUniform,
    fit,
)
from pyro_dropout.guides import LOG_ALPHA_CLIP

W0, W1 = "net.layers.0.weight", "net.layers.1.weight"


def _data(n=16):
    torch.manual_seed(0)
    x = torch.randn(n, 3)
    return x, x[:, 0]


def _weight_dist(guide, name, *args):
    return poutine.trace(guide).get_trace(*args).nodes[name]["fn"].base_dist


def test_log_alpha_clip_is_molchanovs():
    assert LOG_ALPHA_CLIP == (-8.0, 8.0)


#: parameter group and its shape for the 6x3 first-layer weight, per alpha mode
ALPHA_PARAMS = {
    "weight": ("log_sigma2", (6, 3)),  # additive parameterisation: log σ² per weight
    "unit": ("log_alphas", (1, 3)),  # one log α per input unit (column), shared by the rows
    "layer": ("log_alphas", (1, 1)),  # one log α for the whole weight
}


def _param(guide, group):
    return pyro.get_param_store()[f"{guide._pyro_name}.{group}.{W0}"]


@pytest.mark.parametrize("alpha", sorted(ALPHA_PARAMS))
def test_alpha_modes_parameter_shapes(alpha):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=1.0)
    guide = AutoVariationalDropout(model, alpha=alpha, init_log_alpha=-3.0)
    guide(x, y)
    group, shape = ALPHA_PARAMS[alpha]
    assert _param(guide, group).shape == shape
    other = {"log_sigma2", "log_alphas"} - {group}
    assert not any(f".{o}." in k for o in other for k in pyro.get_param_store())
    la = guide.log_alpha(W0)
    assert la.shape == (6, 3)
    torch.testing.assert_close(la, torch.full((6, 3), -3.0), atol=1e-4, rtol=0)
    # the emitted variance is θ² α
    base = _weight_dist(guide, W0, x, y)
    torch.testing.assert_close(base.variance, base.loc**2 * la.exp())


@pytest.mark.parametrize("alpha", ["unit", "layer"])
def test_shared_log_alpha_is_shared_along_the_right_dims(alpha):
    """alpha="unit": column j of the (out, in) weight has one α_j for every output row (an
    implementation per output row would fail here); alpha="layer": one α for all."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=1.0)
    guide = AutoVariationalDropout(model, alpha=alpha)
    guide(x, y)
    param = _param(guide, "log_alphas")
    values = torch.tensor([[-2.0, 0.5, 3.0]]) if alpha == "unit" else torch.tensor([[1.5]])
    with torch.no_grad():
        param.copy_(values)
    la = guide.log_alpha(W0)
    torch.testing.assert_close(la, values.expand(6, 3))
    base = _weight_dist(guide, W0, x, y)
    torch.testing.assert_close(base.variance, base.loc**2 * values.expand(6, 3).exp())


@pytest.mark.parametrize("alpha", sorted(ALPHA_PARAMS))
def test_the_emitted_variance_is_exactly_sigma2_unclipped(alpha):
    """No clip between the parameters and the noise: for alpha="weight" the variance is
    exp(log σ²) to float rounding even for θ = 1e-5 and σ² = 1e-8 (a 1e-8 floor on θ² in log α
    against the dtype's tiny in the distribution once made it 100x too small), and log α of
    ±50 is used as it is."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=1.0)
    guide = AutoVariationalDropout(model, alpha=alpha)
    guide(x, y)
    group, _ = ALPHA_PARAMS[alpha]
    theta = _param(guide, "locs")
    with torch.no_grad():
        theta.fill_(1e-5)
    cases = (-50.0, 50.0) if alpha != "weight" else (math.log(1e-8), math.log(1e-30), 0.0)
    for value in cases:
        with torch.no_grad():
            _param(guide, group).fill_(value)
        base = _weight_dist(guide, W0, x, y)
        expected = math.exp(value) if alpha == "weight" else 1e-10 * math.exp(value)
        torch.testing.assert_close(base.variance, torch.full((6, 3), expected), rtol=1e-5, atol=0)
        la = guide.log_alpha(W0)
        expected_la = value - math.log(1e-10) if alpha == "weight" else value
        torch.testing.assert_close(la, torch.full((6, 3), expected_la), rtol=1e-5, atol=1e-4)


def test_sparsity_before_fitting_raises():
    guide = AutoVariationalDropout(BayesianMLP(3, 1, tau=1.0))
    with pytest.raises(RuntimeError, match="fit or call the guide first"):
        guide.sparsity()


def test_sparsity_report_matches_log_alpha():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=1.0)
    guide = AutoVariationalDropout(model, alpha="weight")
    guide(x, y)
    with torch.no_grad():
        theta = _param(guide, "locs")
        target = torch.tensor([[4.0, -1.0, 3.5]]).expand(6, 3)
        _param(guide, "log_sigma2").copy_(torch.log(theta**2) + target)
    torch.testing.assert_close(guide.log_alpha(W0), target, atol=1e-4, rtol=0)
    report = guide.sparsity(threshold=3.0)
    assert set(report.masks) == {W0, W1}
    assert report.masks[W0].dtype == torch.bool and report.masks[W0].shape == (6, 3)
    assert torch.equal(report.masks[W0], torch.tensor([[False, True, False]]).expand(6, 3))
    assert torch.equal(report.masks[W1], torch.ones(1, 6, dtype=torch.bool))
    assert report.per_site == {W0: pytest.approx(2 / 3), W1: 0.0}
    assert report.fraction == pytest.approx(12 / 24)
    assert guide.sparsity(threshold=3.9).fraction == pytest.approx(6 / 24)


def test_log_uniform_prior_sparsifies_irrelevant_inputs():
    """Sparse VD (Molchanov et al. 2017) on y = x0 - x1 with 8 irrelevant inputs: a short fit
    drives log α of the weights up, most of all on the irrelevant inputs."""
    pyro.set_rng_seed(0)
    x = torch.randn(200, 10)
    y = x[:, 0] - x[:, 1] + 0.1 * torch.randn(200)
    model = BayesianMLP(10, 1, hidden=(16,), tau=100.0, prior=ImproperLogUniform())
    guide = AutoVariationalDropout(model, alpha="weight")
    guide(x, y)
    before = guide.sparsity(threshold=3.0)
    assert before.fraction == 0.0
    fit(model, guide, x, y, num_steps=200, lr=0.05, progress=False, seed=0)
    after = guide.sparsity(threshold=3.0)
    assert after.fraction > 0.15
    la = guide.log_alpha(W0).detach()
    relevant, irrelevant = la[:, :2].mean(), la[:, 2:].mean()
    assert irrelevant > relevant + 1.5, (relevant, irrelevant)
    assert after.per_site[W0] > 0.2


def test_initial_variance_is_alpha_times_theta_squared_plus_floor():
    # The docstring's promise: σ² starts at (θ² + 1e-8)·α, so log α = init_log_alpha for
    # |θ| ≫ 1e-4 and a weight initialised at 0 still starts with some variance.
    theta = torch.tensor([[1.0, 0.1, 1e-3], [1e-5, 0.0, -2.0]])

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
        with pyro.plate("d", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w.T, 1.0).to_event(1), obs=y)

    pyro.clear_param_store()
    guide = AutoVariationalDropout(
        model, init_log_alpha=-4.0, init_loc_fn=lambda s: theta if s["name"] == "w" else None
    )
    guide(torch.randn(4, 3), torch.randn(4, 2))
    q = guide.get_distributions()["w"]
    expected = (theta**2 + 1e-8) * math.exp(-4.0)
    torch.testing.assert_close(q.variance, expected, rtol=1e-5, atol=0.0)
    big = theta.abs() >= 1e-2
    torch.testing.assert_close(guide.log_alpha("w")[big], torch.full((3,), -4.0))


@pytest.mark.parametrize("sigma2", [5.0, 1e4])
def test_variance_and_draws_stay_finite_at_theta_zero_in_float32(sigma2):
    """θ = 0 with σ² ≥ 5 (alpha="weight"): log α = log σ² + 87.3 overflowed exp in float32
    and the guide emitted an infinite variance and infinite draws; the loss was inf."""
    from pyro_dropout import local_reparameterization
    from pyro_dropout.infer import MeanFieldELBO

    pyro.set_rng_seed(0)
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=1.0)
    guide = AutoVariationalDropout(model, alpha="weight")
    guide(x, y)
    with torch.no_grad():
        _param(guide, "locs").zero_()
        _param(guide, "log_sigma2").fill_(math.log(sigma2))
    base = _weight_dist(guide, W0, x, y)
    assert base.variance.dtype == torch.float32
    torch.testing.assert_close(base.variance, torch.full((6, 3), sigma2), rtol=1e-5, atol=0)
    assert torch.isfinite(base.rsample()).all()
    assert math.isfinite(MeanFieldELBO().loss(model, guide, x, y))
    with local_reparameterization():
        assert math.isfinite(MeanFieldELBO().loss(model, guide, x, y))
