"""ConcreteMaskedNormal: shapes, the hard/relaxed masks, the KL (Monte Carlo, closed form, the
reference regulariser) and the gradient in the drop rate."""

import math

import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import kl_divergence

from pyro_dropout.distributions import (
    BernoulliMaskedNormal,
    ConcreteMaskedNormal,
    concrete_keep_mask,
    kl_bernoulli_masked_normal_normal,
    kl_concrete_masked_normal_normal,
)

from ._helpers import seeded

# --------------------------------------------------------------------------------------------
# shapes (hypothesis)
# --------------------------------------------------------------------------------------------

_dims = st.integers(1, 3)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.lists(_dims, max_size=2),
    event=st.lists(_dims, min_size=2, max_size=4),
    per_unit=st.booleans(),
    sample=st.lists(_dims, max_size=1),
)
def test_shapes_of_draws_densities_and_kl(batch, event, per_unit, sample):
    seeded(0)
    batch, event, sample = torch.Size(batch), torch.Size(event), torch.Size(sample)
    loc = torch.randn(batch + event)
    rate_shape = batch + (1, event[1] if per_unit else 1) + (1,) * (len(event) - 2)
    rate = torch.rand(rate_shape) * 0.8 + 0.1
    q = ConcreteMaskedNormal(loc, 0.2, rate, event_dim=len(event))
    assert q.batch_shape == batch and q.event_shape == event
    assert q.mask_shape == batch + (1, event[1]) + (1,) * (len(event) - 2)
    for draw in (q.rsample(sample), q.sample(sample)):
        assert draw.shape == sample + batch + event
    assert q.log_prob(q.sample(sample)).shape == sample + batch
    prior = dist.Normal(0.0, 1.0).expand(batch + event).to_event(len(event))
    assert kl_divergence(q, prior).shape == batch
    # expand keeps the class (so the registered KL still dispatches) and the KL per member
    big = q.expand((2,) + batch)
    assert type(big) is ConcreteMaskedNormal
    assert big.temperature == q.temperature and big.relaxed == q.relaxed
    prior2 = dist.Normal(0.0, 1.0).expand((2,) + batch + event).to_event(len(event))
    torch.testing.assert_close(
        kl_divergence(big, prior2), kl_divergence(q, prior).expand(2, *batch)
    )


def test_a_rate_per_kernel_position_is_rejected_naming_the_argument():
    with pytest.raises(ValueError, match="dropout_rate .* mask shape"):
        ConcreteMaskedNormal(torch.zeros(2, 3, 2, 2), 0.1, torch.full((1, 3, 2, 2), 0.1))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"dropout_rate": 0.0}, "dropout_rate"),
        ({"dropout_rate": 1.0}, "dropout_rate"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"event_dim": 1}, "event_dim"),
        ({"scale": -1.0}, "scale"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, name):
    args = {"loc": torch.zeros(2, 3), "scale": 0.1, "dropout_rate": 0.1} | kwargs
    with pytest.raises(ValueError, match=name):
        ConcreteMaskedNormal(**args, validate_args=True)


# --------------------------------------------------------------------------------------------
# masks: hard draws are q's, relaxed ones the Concrete distribution's
# --------------------------------------------------------------------------------------------


def test_sample_is_hard_and_rsample_follows_the_relaxed_flag():
    seeded(0)
    loc = torch.ones(1, 2000)
    q = ConcreteMaskedNormal(loc, 1e-9, 0.3, relaxed=True)
    hard = q.sample()
    assert set(hard.round().unique().tolist()) <= {0.0, 1.0}
    assert abs(1 - hard.mean().item() - 0.3) < 0.03  # drop rate 0.3 (3.3 standard errors)
    relaxed = q.rsample()
    assert ((relaxed > 0.01) & (relaxed < 0.99)).any()  # t = 0.1: some masks in between
    off = ConcreteMaskedNormal(loc, 1e-9, 0.3, relaxed=False).rsample()
    assert set(off.round().unique().tolist()) <= {0.0, 1.0}


def test_relaxed_mask_is_one_minus_a_relaxed_bernoulli_of_the_drop_rate():
    """The drop indicator sigmoid((logit p + log u - log(1-u)) / t) is torch's
    RelaxedBernoulli(t, probs=p): compare the distribution functions at a few points."""
    seeded(1)
    p, t = torch.tensor(0.3), 0.5
    keep = concrete_keep_mask(p, t, (200_000,))
    ref = dist.RelaxedBernoulli(torch.tensor(t), probs=p).sample((200_000,))
    for c in (0.1, 0.3, 0.5, 0.7, 0.9):
        # sd of an empirical CDF difference <= sqrt(2 * 0.25 / 2e5) = 0.0016
        assert abs(((1 - keep) <= c).float().mean() - (ref <= c).float().mean()) < 0.008


def test_channel_masks_are_shared_across_kernel_positions_and_outputs():
    seeded(0)
    q = ConcreteMaskedNormal(torch.ones(4, 6, 3, 3), 1e-9, 0.5, relaxed=False)
    w = q.sample().round()  # the mask itself (slab noise 1e-9)
    assert torch.equal(w, w[:, :, :1, :1].expand_as(w))
    assert torch.equal(w, w[:1].expand_as(w))
    assert 0 < w.sum() < w.numel()


# --------------------------------------------------------------------------------------------
# the KL
# --------------------------------------------------------------------------------------------


def _reference_regulariser(mean_weight, p, l2, n_inputs):
    """The reference code's per-layer regulariser times tau N / 2 (i.e. in KL units):
    l^2/2 * sum W'^2 / (1 - p) + K (p log p + (1 - p) log(1 - p))."""
    return 0.5 * l2 * (mean_weight**2).sum() / (1 - p) + n_inputs * (
        p * math.log(p) + (1 - p) * math.log(1 - p)
    )


@pytest.mark.parametrize("shape", [(7, 5), (4, 3, 3, 3)], ids=["linear", "conv2d"])
def test_kl_equals_the_reference_regulariser_up_to_its_constant(shape):
    seeded(0)
    p, sigma, length = 0.27, 0.05, 1.7  # prior N(0, 1 / l^2)
    mean_weight = torch.randn(shape)
    q = ConcreteMaskedNormal(mean_weight / (1 - p), sigma, p)
    prior = dist.Normal(0.0, 1 / length).expand(shape).to_event(len(shape))
    n = mean_weight.numel()
    const = n * (math.log(1 / (length * sigma)) + 0.5 * (sigma**2 * length**2 - 1))
    kl = kl_divergence(q, prior)
    expected = _reference_regulariser(mean_weight, p, length**2, n_inputs=shape[1]) + const
    torch.testing.assert_close(kl, torch.as_tensor(expected, dtype=kl.dtype))
    # The check can fail: K counted per input element (the weight-space Bernoulli family
    # for a kernel) or the weight term without 1/(1-p) is off by more than the tolerance.
    if len(shape) > 2:
        wrong_k = _reference_regulariser(mean_weight, p, length**2, n_inputs=n // shape[0])
        assert not torch.isclose(kl, torch.as_tensor(wrong_k + const), rtol=1e-3)
    wrong = expected - 0.5 * length**2 * (mean_weight**2).sum() * (1 / (1 - p) - 1)
    assert not torch.isclose(kl, torch.as_tensor(wrong, dtype=kl.dtype), rtol=1e-3)


def test_kl_of_a_linear_weight_is_the_bernoulli_families_kl():
    """For a Linear weight the two families coincide (one mask per input column)."""
    seeded(0)
    loc, rate = torch.randn(6, 4), torch.tensor([[0.1, 0.2, 0.5, 0.9]])
    prior = dist.Normal(0.3, 0.8).expand((6, 4)).to_event(2)
    torch.testing.assert_close(
        kl_concrete_masked_normal_normal(ConcreteMaskedNormal(loc, 0.1, rate), prior),
        kl_bernoulli_masked_normal_normal(BernoulliMaskedNormal(loc, 0.1, rate), prior),
    )


@pytest.mark.parametrize("shape", [(40, 3), (40, 3, 2)], ids=["linear", "conv1d"])
def test_kl_against_monte_carlo(shape):
    """With many outputs per input and a small slab the two mixture components are far apart
    and Gal's approximation is tight: E_q[log q - log p] by Monte Carlo over hard draws of q
    (exact log_prob) agrees within 4 standard errors; a KL that counted one Bernoulli per
    kernel position (the wrong grouping) would not."""
    seeded(3)
    loc = torch.randn(shape)
    rate = torch.tensor([0.15, 0.4, 0.7]).reshape((1, 3) + (1,) * (len(shape) - 2))
    q = ConcreteMaskedNormal(loc, 0.05, rate)
    prior = dist.Normal(0.0, 1.3).expand(shape).to_event(len(shape))
    w = q.sample((20_000,))
    terms = q.log_prob(w) - prior.log_prob(w)
    mc, se = terms.mean(), terms.std() / math.sqrt(terms.numel())
    kl = kl_divergence(q, prior)
    assert abs(kl - mc) < 4 * se + 1e-3, (kl, mc, se)
    if len(shape) > 2:  # per-position Bernoullis: one extra entropy per extra kernel tap
        h = -(torch.xlogy(rate, rate) + torch.xlogy(1 - rate, 1 - rate)).sum()
        assert abs(kl - h * (shape[2] - 1) - mc) > 10 * se


# --------------------------------------------------------------------------------------------
# the gradient in the drop rate
# --------------------------------------------------------------------------------------------


def _relaxed_objective(p, loc, x, y, temperature, seed):
    """Mean squared error of a one-unit linear model with relaxed masks, fixed noise (seed)."""
    torch.manual_seed(seed)
    q = ConcreteMaskedNormal(loc / (1 - p), 1e-3, p, temperature=temperature)
    w = q.rsample((4000,))  # (S, 1, d)
    return ((y - (w * x).sum(-1)) ** 2).mean()


def test_rate_gradient_matches_finite_differences_with_common_random_numbers():
    """With the uniforms fixed the relaxed objective is smooth in p: autograd through the
    relaxed mask equals a central difference (this would fail for hard masks: zero)."""
    loc, x, y = torch.tensor([[0.8, -1.2, 0.5]]), torch.tensor([1.0, 2.0, -1.0]), 0.3
    p = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    args = (loc.double(), x.double(), y, 0.5, 7)
    (grad,) = torch.autograd.grad(_relaxed_objective(p, *args), p)
    h = 1e-5
    fd = (_relaxed_objective(p + h, *args) - _relaxed_objective(p - h, *args)) / (2 * h)
    torch.testing.assert_close(grad, fd.detach(), rtol=1e-4, atol=1e-6)
    assert abs(grad) > 0.1


def test_rate_gradient_matches_a_score_function_estimate():
    r"""d/dp E[f(keep)] for keep = 1 - RelaxedBernoulli(t, p): the pathwise gradient (ours) and
    the score-function estimate E[(f - mean f) d/dp log q_t(drop)] with torch's RelaxedBernoulli
    density agree within 4 combined standard errors (200k draws each)."""
    seeded(11)
    n, t, p0 = 200_000, 0.5, 0.35

    def f(keep):
        return (1.5 - 2.0 * keep) ** 2

    # One copy of p per draw, so autograd returns the per-draw gradients.
    p = torch.full((n,), p0, dtype=torch.float64, requires_grad=True)
    (path,) = torch.autograd.grad(f(concrete_keep_mask(p, t, (n,))).sum(), p)
    p = torch.full((n,), p0, dtype=torch.float64, requires_grad=True)
    relaxed = dist.RelaxedBernoulli(torch.tensor(t, dtype=torch.float64), probs=p)
    drop = relaxed.sample().clamp(1e-12, 1 - 1e-12)
    (score,) = torch.autograd.grad(relaxed.log_prob(drop).sum(), p)
    values = f(1 - drop)
    sf = (values - values.mean()) * score
    se = math.hypot(path.std() / math.sqrt(n), sf.std() / math.sqrt(n))
    assert abs(path.mean() - sf.mean()) < 4 * se, (path.mean(), sf.mean(), se)
    assert abs(path.mean()) > 8 * se  # a non-trivial gradient


# --------------------------------------------------------------------------------------------
# from_mean: the family parameterised by its mean weight (what AutoConcreteDropout builds)
# --------------------------------------------------------------------------------------------


def _prior(kind, shape):
    if kind == "zero":
        return dist.Normal(0.0, 1.3).expand(shape).to_event(len(shape))
    if kind == "shifted":
        return dist.Normal(0.4 * torch.randn(shape), 0.9).to_event(len(shape))
    if kind == "per-weight scale":
        return dist.Normal(0.0, 0.5 + torch.rand(shape)).to_event(len(shape))
    loc0 = torch.zeros(shape, requires_grad=True)  # "learned": zero now, not for good
    return dist.Normal(loc0, 1.1).to_event(len(shape))


def _assert_same_family(a, b, prior, leaves):
    """Two builds of one family: the same relaxed and hard draws (same seed), density, KL
    against ``prior`` and KL gradients in ``leaves``; returns ``b``'s KL."""
    for draw in ("rsample", "sample"):
        torch.manual_seed(5)
        wa = getattr(a, draw)((3,))
        torch.manual_seed(5)
        torch.testing.assert_close(wa, getattr(b, draw)((3,)))
    w = b.sample((2,))
    torch.testing.assert_close(a.log_prob(w), b.log_prob(w))
    kl_a, kl_b = kl_divergence(a, prior), kl_divergence(b, prior)
    torch.testing.assert_close(kl_a, kl_b)
    grads = zip(torch.autograd.grad(kl_a, leaves), torch.autograd.grad(kl_b, leaves), strict=True)
    for ga, gb in grads:
        torch.testing.assert_close(ga, gb)
    return kl_b


@pytest.mark.parametrize("prior_kind", ["zero", "shifted", "per-weight scale", "learned"])
@pytest.mark.parametrize("shape", [(6, 4), (3, 2, 3)], ids=["linear", "conv1d"])
@pytest.mark.parametrize("per_unit", [False, True], ids=["layer rate", "unit rates"])
def test_from_mean_is_the_family_with_loc_mean_over_keep(prior_kind, shape, per_unit):
    """from_mean(m', σ, p) is ConcreteMaskedNormal(m' / (1 - p), σ, p): the same draws, density,
    mean and KL, with the same gradients in m', p and a learned prior mean; for a prior mean that
    is zero the KL skips the prior's mean, otherwise it keeps it (a shifted prior and a learned
    one whose value is zero for now would be wrong without it)."""
    seeded(1)
    mean = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    rate_shape = (1, shape[1] if per_unit else 1) + (1,) * (len(shape) - 2)
    rate = (0.1 + 0.6 * torch.rand(rate_shape, dtype=torch.float64)).requires_grad_()
    prior = _prior(prior_kind, shape)
    prior = dist.Normal(prior.base_dist.loc.double(), prior.base_dist.scale.double()).to_event(
        len(shape)
    )
    a = ConcreteMaskedNormal.from_mean(mean, 0.1, rate, event_dim=len(shape))
    b = ConcreteMaskedNormal(mean / (1 - rate), 0.1, rate, event_dim=len(shape))
    assert a.mean_weight is not None and b.mean_weight is None
    torch.testing.assert_close(a.mean, b.mean)
    torch.testing.assert_close(a.loc, b.loc)
    leaves = [mean, rate] + [t for t in (prior.base_dist.loc,) if t.requires_grad]
    kl_b = _assert_same_family(a, b, prior, leaves)
    big = a.expand((2,))
    assert big.mean_weight.shape == (2,) + tuple(shape)
    torch.testing.assert_close(big.loc, b.loc.expand((2,) + tuple(shape)))
    fresh = ConcreteMaskedNormal.from_mean(mean, 0.1, rate, event_dim=len(shape))
    torch.testing.assert_close(fresh.expand((2,)).loc, b.loc.expand((2,) + tuple(shape)))
    torch.testing.assert_close(kl_divergence(big, prior.expand((2,))), kl_b.expand(2))


def test_a_captured_kl_treats_a_prior_mean_that_is_an_input_as_data():
    """The KL skips a prior mean only where it is a constant of the captured loss: a prior mean
    passed in (zero while capturing) is read at every replay."""
    from pyro_dropout.infer.capture import capture

    seeded(2)
    mean, rate = torch.randn(5, 3), torch.tensor([[0.3]])

    def kl(mean, loc0):
        q = ConcreteMaskedNormal.from_mean(mean, 0.1, rate)
        return kl_divergence(q, dist.Normal(loc0, 1.0).to_event(2))

    def kl_constant_prior(mean):
        return kl(mean, torch.zeros(5, 3))

    _, captured = capture(kl, (mean, torch.zeros(5, 3)))
    _, captured_constant = capture(kl_constant_prior, (mean,))
    shifted = torch.full((5, 3), 0.7)
    torch.testing.assert_close(captured(mean, shifted), kl(mean, shifted))
    assert not torch.isclose(kl(mean, shifted), kl(mean, torch.zeros(5, 3)))  # can fail
    torch.testing.assert_close(captured_constant(mean), kl(mean, torch.zeros(5, 3)))
    # the constant prior mean is gone from the graph: no (5, 3) subtraction
    assert not any(
        "sub" in str(n.target) and n.meta.get("shape") == (5, 3)
        for n in captured_constant.graph.nodes
    ), captured_constant.module.code
    loc0 = [n for n in captured.graph.nodes if n.op == "placeholder"][1]
    assert loc0.users, captured.module.code  # the prior mean, an input, is read (can fail)


# --------------------------------------------------------------------------------------------
# the logit parameterisation (dropout_logit)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(6, 4), (3, 2, 3)], ids=["linear", "conv1d"])
@pytest.mark.parametrize("per_unit", [False, True], ids=["layer rate", "unit rates"])
@pytest.mark.parametrize("build", ["init", "from_mean"])
def test_a_family_built_from_the_logit_is_the_family_of_its_rate(shape, per_unit, build):
    """dropout_logit=l is dropout_rate=sigmoid(l): the same relaxed and hard draws, density,
    KL (the entropy as -BCE(l, p) = p l - softplus(l) instead of two xlogy) and gradients in l, and it is
    kept by expand."""
    seeded(2)
    loc = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    rate_shape = (1, shape[1] if per_unit else 1) + (1,) * (len(shape) - 2)
    logit = (torch.randn(rate_shape, dtype=torch.float64) * 2).requires_grad_()
    make = ConcreteMaskedNormal.from_mean if build == "from_mean" else ConcreteMaskedNormal
    a = make(loc, 0.1, dropout_logit=logit, event_dim=len(shape))
    b = make(loc, 0.1, torch.sigmoid(logit), event_dim=len(shape))
    assert a._compact_logit is not None and b._compact_logit is None
    torch.testing.assert_close(a.dropout_rate, b.dropout_rate)
    torch.testing.assert_close(a.dropout_logit, b.dropout_logit)
    prior = dist.Normal(torch.zeros(shape, dtype=torch.float64), 1.3).to_event(len(shape))
    kl_b = _assert_same_family(a, b, prior, [loc, logit])
    big = a.expand((2,))
    assert big._compact_logit is not None
    torch.testing.assert_close(kl_divergence(big, prior.expand((2,))), kl_b.expand(2))


def test_the_entropy_from_the_logit_stays_finite_where_the_rate_rounds_to_one():
    """At logit 40 (float64: sigmoid rounds to 1 - 4e-18 -> 1.0 in float32) the rate form needs
    log(1 - p); the logit form is p l - softplus(l), finite and exact (-40 e^-40 ...)."""
    loc = torch.randn(3, 2, dtype=torch.float64)
    logit = torch.tensor([[-12.0]], dtype=torch.float64, requires_grad=True)
    q = ConcreteMaskedNormal(loc, 0.1, dropout_logit=logit, validate_args=True)
    prior = dist.Normal(torch.zeros(3, 2, dtype=torch.float64), 1.0).to_event(2)
    kl = kl_divergence(q, prior)
    (grad,) = torch.autograd.grad(kl, [logit])
    assert torch.isfinite(kl) and torch.isfinite(grad)
    # against the rate form at the same point (both fine here: p = 6e-6)
    ref = kl_divergence(ConcreteMaskedNormal(loc, 0.1, torch.sigmoid(logit.detach())), prior)
    torch.testing.assert_close(kl.detach(), ref)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "neither"),
        ({"dropout_rate": 0.2, "dropout_logit": 0.0}, "both"),
    ],
)
def test_exactly_one_of_rate_and_logit(kwargs, message):
    with pytest.raises(
        ValueError, match=f"exactly one of dropout_rate and dropout_logit.*{message}"
    ):
        ConcreteMaskedNormal(torch.zeros(3, 2), 0.1, **kwargs)
    with pytest.raises(ValueError, match="exactly one"):
        ConcreteMaskedNormal.from_mean(torch.zeros(3, 2), 0.1, **kwargs)


def test_a_logit_whose_rate_rounds_to_one_is_refused_naming_the_logit():
    with pytest.raises(ValueError, match="sigmoid\\(dropout_logit\\)"):
        ConcreteMaskedNormal(torch.zeros(3, 2), 0.1, dropout_logit=40.0, validate_args=True)
