"""1-D weight vectors (``logits = x @ w``, ``w @ x``, ``F.linear`` with a 1-D weight).

Before, the guides decided "weight" by two event dims, so a weight vector was a bias:
AutoDropout and AutoConcreteDropout gave it a fixed Normal (location only) and
AutoVariationalDropout a mean-field Normal. Now the guides' set-up run records which 1-D sites
the model uses as a product's weight, and the families apply to them as to a one-output layer
``W = w[None, :]``: one mask value per input, one α per weight; local reparameterisation
samples ``x · w`` from that layer's rule.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch.distributions import kl_divergence

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BernoulliMaskedNormal,
    fit,
    local_reparameterization,
    predict,
)
from pyro_dropout.distributions.vector_weight import VectorWeight
from pyro_dropout.infer.draws import VectorizationWarning

from ._stats import Z, mean_and_se, var_and_se

D = 4
P = 0.3  # drop rate
SIGMA = 0.05  # slab scale

USES = {
    "x @ w": lambda x, w: x @ w,
    "w @ x.T": lambda x, w: w @ x.T,
    "F.linear": lambda x, w: F.linear(x, w),
    "matmul": lambda x, w: torch.matmul(x, w),
}


def make_model(use="x @ w"):
    op = USES[use]

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(D), 1.0).to_event(1))
        b = pyro.sample("b", dist.Normal(torch.zeros(1), 1.0).to_event(1))
        s = pyro.sample("s", dist.Normal(torch.zeros(D), 1.0).to_event(1))  # elementwise only
        f = pyro.deterministic("f", op(x, w), event_dim=1)
        logits = f + b + 0.0 * (x * s).sum(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Bernoulli(logits=logits), obs=y)

    return model


GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=P, input_dropout_rate=P, scale=SIGMA),
    "concrete": lambda m: AutoConcreteDropout(m, init_rate=P, scale=SIGMA, rate_per="unit"),
    "vd": lambda m: AutoVariationalDropout(m, alpha="weight", init_log_alpha=-1.0),
}

M = torch.tensor([1.0, -2.0, 0.5, 1.5])  # posterior means E_q[w]


def _setup(kind, use="x @ w"):
    model = make_model(use)
    x = torch.randn(16, D)
    y = (torch.rand(16) < 0.5).float()
    guide = GUIDES[kind](model)
    guide(x, y)
    with torch.no_grad():  # AutoDropout stores the family's M, the others E_q[w]
        guide.locs.w.copy_(M / (1 - P) if kind == "dropout" else M)
        if kind == "vd":  # log σ² = log θ² + log α with log α = -1
            guide.log_sigma2.w.copy_(torch.log(M**2) - 1.0)
    return model, guide


def _moments(kind):
    """E_q[w] and Var_q[w] of the one-output layer, elementwise."""
    if kind == "vd":
        return M, M**2 * math.exp(-1.0)
    loc = M / (1 - P)  # the family's M, stored without inverted-dropout rescaling
    return (1 - P) * loc, P * (1 - P) * loc**2 + SIGMA**2


@pytest.mark.parametrize("kind", ["dropout", "concrete", "vd"])
def test_the_guides_treat_a_weight_vector_as_a_one_output_layer(kind):
    _, guide = _setup(kind)
    d = guide.get_distributions()
    assert guide._vector_weights == {"w"}  # not the bias b, not s (used elementwise)
    assert not isinstance(d["b"], VectorWeight) and not isinstance(d["s"], VectorWeight)
    if kind == "vd":
        assert "w" in guide._weights and "s" not in guide._weights
        assert guide.log_alpha("w").shape == (D,)  # one α per weight
        assert torch.allclose(guide.log_alpha("w"), torch.full((D,), -1.0), atol=1e-5)
        assert "w" in guide.sparsity().per_site
        return
    assert isinstance(d["w"], VectorWeight) and d["w"].event_shape == (D,)
    with torch.no_grad():  # hard masks for the Concrete family
        draws = guide.get_distributions()["w"].sample((20000,))
    mean, var = _moments(kind)
    m, m_se = mean_and_se(draws)
    v, v_se = var_and_se(draws)
    assert ((m - mean).abs() / m_se).max() < Z
    assert ((v - var).abs() / v_se).max() < Z
    # one mask value per input: all four dropped together at rate p^4 (not p, as one mask)
    dropped = (draws.abs() < 5 * SIGMA).double()
    assert ((dropped.mean(0) - P).abs() < 5 * math.sqrt(P * (1 - P) / 20000)).all()
    all_dropped = dropped.prod(-1).mean()
    assert abs(all_dropped - P**D) < 5 * math.sqrt(P**D / 20000)


def test_vd_on_a_weight_vector_is_not_mean_field():
    model, _ = _setup("vd")
    vd = AutoVariationalDropout(model, alpha="unit", name="vd_unit")
    mf = AutoMeanField(model)
    x, y = torch.randn(8, D), torch.ones(8)
    vd(x, y), mf(x, y)
    assert "w" in vd._weights and vd.log_alpha("w").shape == (D,)
    assert type(vd.get_distributions()["w"].base_dist).__name__ == "LogAlphaNormal"
    assert type(mf.get_distributions()["w"].base_dist).__name__ == "Normal"


@pytest.mark.parametrize("use", list(USES))
@pytest.mark.parametrize("kind", ["dropout", "concrete", "vd"])
def test_local_reparameterization_of_a_weight_vector_has_the_exact_moments(kind, use):
    """One run, each row repeated R times: under LRT the R pre-activations of a row are
    independent draws of ``x · w`` for ``w ~ q``: mean ``x · E[w]``, variance
    ``Σ x_i² Var[w_i]`` (independent masks and slabs per input)."""
    model, guide = _setup(kind, use)
    rows = torch.tensor([[1.0, 0.5, -1.0, 2.0], [0.3, -1.2, 0.8, 0.0]])
    R = 20000
    x = rows.repeat_interleave(R, 0)
    with local_reparameterization(strict=True), torch.no_grad():
        tr = poutine.trace(guide).get_trace(x, None)
        f = poutine.trace(poutine.replay(model, trace=tr)).get_trace(x, None).nodes["f"]["value"]
    assert f.shape == (2 * R,)
    mean, var = _moments(kind)
    f = f.reshape(2, R).T  # (R, 2): draws per row
    m, m_se = mean_and_se(f)
    v, v_se = var_and_se(f)
    assert ((m - rows @ mean).abs() / m_se).max() < Z
    assert ((v - (rows**2) @ var).abs() / v_se).max() < Z
    # per-example noise (LRT), not one weight draw shared by the rows
    assert f[:, 0].std() > 0.5 * math.sqrt(float(rows[0] ** 2 @ var))


def test_the_kl_is_the_one_output_layer_kl():
    loc = torch.randn(3, D)  # a plate of 3 vectors
    layer = BernoulliMaskedNormal(loc.unsqueeze(-2), SIGMA, P, event_dim=2)
    q = VectorWeight(layer)
    prior = dist.Normal(torch.zeros(3, D), 2.0).to_event(1)
    lifted = dist.Normal(torch.zeros(3, 1, D), 2.0).to_event(2)
    kl = kl_divergence(q, prior)  # analytic: no NotImplementedError
    assert kl.shape == (3,)
    assert torch.allclose(kl, kl_divergence(layer, lifted))
    scalar_prior = dist.Normal(0.0, 2.0).expand([D]).to_event(1)
    assert torch.allclose(kl_divergence(q, scalar_prior), kl)
    value = q.sample()
    assert value.shape == (3, D)
    assert torch.allclose(q.log_prob(value), layer.log_prob(value.unsqueeze(-2)))
    assert q.expand((2, 3)).sample().shape == (2, 3, D)


def test_concrete_rates_of_a_weight_vector():
    model = make_model()
    x, y = torch.randn(8, D), torch.ones(8)
    unit = AutoConcreteDropout(model, rate_per="unit", name="unit")
    layer = AutoConcreteDropout(model, rate_per="layer", name="layer")
    unit(x, y), layer(x, y)
    assert unit.dropout_rates()["w"].shape == (D,)
    assert layer.dropout_rates()["w"].shape == ()


@pytest.mark.parametrize("kind", ["dropout", "concrete", "vd"])
def test_fit_and_predict_on_a_logistic_model(kind):
    torch.manual_seed(0)
    model = make_model()
    x = torch.randn(64, D)
    y = (torch.rand(64) < torch.sigmoid(x @ M)).float()
    guide = GUIDES[kind](model)
    fit(model, guide, x, y, num_steps=20, progress=False)
    # the model does not broadcast over draws: its bias of event shape (1,), (draws, 1, 1) in
    # a vectorised pass, added to the (draws, N) logits gives (draws, draws, N); predict
    # draws one per pass and says so
    with pytest.warns(VectorizationWarning, match="does not broadcast over a leading draw"):
        pred = predict(model, guide, x, num_samples=8)
    assert pred.samples.shape[:2] == (8, 64) and torch.isfinite(pred.log_likelihood(y)).all()
