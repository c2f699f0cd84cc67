"""Tests of :class:`BernoulliMaskedNormal`: moments, column masking, density, gradients, shapes.

Statistical tolerances are multiples (4.5-5) of the standard error of the estimator, computed
from the samples or from the binomial formula; every random test is seeded.
"""

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats
from torch.distributions import constraints

from pyro_dropout.distributions import BernoulliMaskedNormal

from ._helpers import first_argument_named, seeded

Z = 5.0  # z-score bound for the moment checks (two-sided p ~ 6e-7 per comparison)


def _z_scores_of_moments(x, mean, variance):
    """z-scores of the sample mean and sample variance of ``x`` (samples along dim 0)."""
    n = x.shape[0]
    xbar = x.mean(0)
    z_mean = (xbar - mean) / (variance / n).sqrt()
    d2 = (x - xbar) ** 2
    s2 = d2.mean(0)
    # SE of the sample variance from the sample fourth central moment: Var[(x - mu)^2] / n.
    se_var = (d2.var(0) / n).sqrt()
    z_var = (s2 - variance) / se_var
    return z_mean, z_var


# --------------------------------------------------------------------------------------------
# 1. Sample moments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loc_shape, rate, event_dim",
    [
        # Linear (out, in) with one rate per input column.
        ((4, 3), torch.tensor([0.1, 0.5, 0.8]), None),
        # Conv (out, in, kh, kw) with one rate per input channel, broadcast over the kernel.
        ((2, 3, 2, 2), torch.tensor([0.2, 0.6, 0.9]).reshape(3, 1, 1), None),
        # Conv with one rate per (in, kh, kw) column.
        ((2, 2, 2, 2), torch.linspace(0.05, 0.95, 8).reshape(1, 2, 2, 2), None),
        # A batch of two Linear weights with batch-dependent per-column rates.
        ((2, 3, 4), torch.tensor([[0.1, 0.3, 0.5, 0.7], [0.9, 0.6, 0.4, 0.0]]).unsqueeze(-2), 2),
    ],
    ids=["linear", "conv-per-channel", "conv-per-column", "batched-linear"],
)
def test_sample_moments(loc_shape, rate, event_dim):
    seeded(0)
    loc = torch.randn(loc_shape, dtype=torch.float64) + 0.5
    scale = torch.rand(loc_shape, dtype=torch.float64) * 0.5 + 0.1
    d = BernoulliMaskedNormal(loc, scale, rate.double(), event_dim=event_dim)
    p = rate.double()
    expected_mean = (1 - p) * loc
    expected_var = p * (1 - p) * loc**2 + scale**2
    torch.testing.assert_close(d.mean, expected_mean.expand(loc_shape))
    torch.testing.assert_close(d.variance, expected_var.expand(loc_shape))

    x = d.sample((40000,))
    z_mean, z_var = _z_scores_of_moments(x, d.mean, d.variance)
    assert z_mean.abs().max() < Z, z_mean
    assert z_var.abs().max() < Z, z_var


def test_moments_use_drop_probability_not_keep_probability():
    # p is the *drop* probability (torch.nn.Dropout convention).
    d = BernoulliMaskedNormal(torch.ones(2, 2), 0.1, 0.9)
    torch.testing.assert_close(d.mean, torch.full((2, 2), 0.1))
    torch.testing.assert_close(d.keep_prob, torch.full((1, 2), 0.1))


# --------------------------------------------------------------------------------------------
# 2. Columns are masked together
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loc_shape, rate",
    [
        ((6, 4), torch.tensor([0.1, 0.4, 0.7, 0.95])),
        ((3, 2, 2, 2), torch.tensor([0.25, 0.6]).reshape(2, 1, 1)),
    ],
    ids=["linear", "conv"],
)
def test_columns_are_masked_together(loc_shape, rate):
    seeded(1)
    n = 4000
    sign = torch.where(torch.rand(loc_shape) < 0.5, -1.0, 1.0).double()
    loc = sign * (0.5 + torch.rand(loc_shape, dtype=torch.float64))  # |m| in [0.5, 1.5]
    d = BernoulliMaskedNormal(loc, 1e-6, rate.double())
    w = d.sample((n,))

    tol = 1e-4  # 100 standard deviations of the noise, far below min |m| = 0.5
    kept = ((w - loc).abs() < tol).all(dim=1)  # per (sample, column): all outputs at M_col
    dropped = (w.abs() < tol).all(dim=1)  # per (sample, column): all outputs at 0
    assert kept.shape == (n,) + loc_shape[1:]
    assert torch.all(kept ^ dropped), "a column is partly kept and partly dropped"

    p = rate.double().expand((1,) + loc_shape[1:])[0]
    frac = dropped.double().mean(0)
    se = (p * (1 - p) / n).sqrt()
    assert ((frac - p).abs() / se).max() < Z, (frac, p)


def test_masks_independent_across_columns_and_batch():
    seeded(2)
    n = 20000
    p = torch.tensor([0.3, 0.6], dtype=torch.float64)
    d = BernoulliMaskedNormal(torch.ones(5, 2, dtype=torch.float64), 1e-6, p).expand([2])
    w = d.sample((n,))  # (n, batch=2, out=5, in=2)
    dropped = (w.abs() < 1e-3).all(dim=-2).double()  # (n, 2, 2)

    def check(a, b, q):
        both = (a * b).mean()
        assert abs(both - q) < Z * math.sqrt(q * (1 - q) / n), (both, q)

    check(dropped[:, 0, 0], dropped[:, 0, 1], p[0] * p[1])  # two columns, same weight
    check(dropped[:, 0, 0], dropped[:, 1, 0], p[0] ** 2)  # same column, two batch members
    # A shared draw across the batch would make the second frequency p[0], not p[0]**2.


# --------------------------------------------------------------------------------------------
# 3. log_prob is the normalised per-column mixture density
# --------------------------------------------------------------------------------------------


def test_log_prob_integrates_to_one_1d():
    m, s, p = 0.7, 0.3, 0.4
    d = BernoulliMaskedNormal(torch.tensor([[m]], dtype=torch.float64), s, p)

    def density(x, power):
        return x**power * d.log_prob(torch.tensor([[x]], dtype=torch.float64)).exp().item()

    opts = dict(points=[0.0, m], limit=200, epsabs=1e-12, epsrel=1e-12)
    total = integrate.quad(density, -10, 10, args=(0,), **opts)[0]
    first = integrate.quad(density, -10, 10, args=(1,), **opts)[0]
    second = integrate.quad(density, -10, 10, args=(2,), **opts)[0]
    assert abs(total - 1) < 1e-9
    # The moments fix the mixture weights (normalisation alone would not catch p <-> 1 - p).
    assert abs(first - (1 - p) * m) < 1e-9
    assert abs(second - ((1 - p) * m**2 + s**2)) < 1e-9


@pytest.mark.parametrize("event_shape", [(2, 1), (1, 2)], ids=["one-column", "two-columns"])
def test_log_prob_integrates_to_one_2d(event_shape):
    """Event (2, 1) is ONE column of two outputs (a 2-D mixture whose coordinates share the
    mask, so they are correlated); (1, 2) is two independent one-output columns."""
    m = np.array([1.0, -0.8])
    s, p = 0.5, 0.4
    loc = torch.tensor(m, dtype=torch.float64).reshape(event_shape)
    d = BernoulliMaskedNormal(loc, s, p)

    def integrand(x):  # x: (npoints, 2), row-major over the event
        w = torch.as_tensor(x, dtype=torch.float64).reshape((-1,) + event_shape)
        q = d.log_prob(w).exp().numpy()
        return np.stack([q, x[:, 0] * q, x[:, 1] * q, x[:, 0] * x[:, 1] * q], axis=-1)

    res = integrate.cubature(integrand, [-7.0, -7.0], [7.0, 7.0], rtol=1e-11, atol=1e-13)
    assert res.status == "converged"
    total, e1, e2, e12 = res.estimate
    assert abs(total - 1) < 1e-8
    assert abs(e1 - (1 - p) * m[0]) < 1e-8
    assert abs(e2 - (1 - p) * m[1]) < 1e-8
    if event_shape == (2, 1):  # shared mask: E[w1 w2] = E[z^2] m1 m2 = (1 - p) m1 m2
        expected_cross = (1 - p) * m[0] * m[1]
    else:  # independent masks: E[w1 w2] = (1 - p)^2 m1 m2
        expected_cross = (1 - p) ** 2 * m[0] * m[1]
    assert abs(e12 - expected_cross) < 1e-8


def _scipy_log_prob(w, loc, scale, rate, event_dim):
    """Direct per-column mixture density with scipy.stats (numpy arrays, rate in mask shape)."""
    out_axis = w.ndim - event_dim
    on = stats.norm.logpdf(w, loc, scale).sum(axis=out_axis, keepdims=True)
    off = stats.norm.logpdf(w, 0.0, scale).sum(axis=out_axis, keepdims=True)
    comps = np.stack(np.broadcast_arrays(on, off))
    weights = np.stack([np.broadcast_to(1 - rate, on.shape), np.broadcast_to(rate, on.shape)])
    log_mix = special.logsumexp(comps, b=weights, axis=0)
    return log_mix.sum(axis=tuple(range(-event_dim, 0)))


def test_log_prob_matches_scipy_mixture():
    seeded(3)
    batch, event = (2,), (5, 3, 2)
    loc = torch.randn(batch + event, dtype=torch.float64)
    scale = torch.rand(batch + event, dtype=torch.float64) * 0.8 + 0.2
    rate = torch.rand(batch + (1,) + event[1:], dtype=torch.float64) * 0.95
    d = BernoulliMaskedNormal(loc, scale, rate, event_dim=3)
    # Values from the distribution (so both components matter) and from a broad Normal.
    value = torch.cat([d.sample((6,)), 2 * torch.randn((6,) + batch + event, dtype=torch.float64)])
    lp = d.log_prob(value)
    assert lp.shape == (12,) + batch
    expected = _scipy_log_prob(value.numpy(), loc.numpy(), scale.numpy(), rate.numpy(), 3)
    np.testing.assert_allclose(lp.numpy(), expected, rtol=1e-12, atol=1e-10)


def test_log_prob_with_zero_dropout_is_the_gaussian():
    seeded(4)
    loc, scale = torch.randn(4, 3, dtype=torch.float64), torch.rand(4, 3).double() + 0.1
    value = torch.randn(7, 4, 3, dtype=torch.float64)
    lp = BernoulliMaskedNormal(loc, scale, 0.0).log_prob(value)
    torch.testing.assert_close(lp, dist.Normal(loc, scale).log_prob(value).sum((-2, -1)))


def test_log_prob_is_differentiable_and_finite_far_in_the_tails():
    loc = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    d = BernoulliMaskedNormal(loc, 0.01, 0.5)
    lp = d.log_prob(torch.full((3, 2), 50.0, dtype=torch.float64))  # ~1e7 nats from both modes
    assert torch.isfinite(lp)
    (g,) = torch.autograd.grad(lp, loc)
    assert torch.isfinite(g).all()


# --------------------------------------------------------------------------------------------
# 8. Gradients through rsample
# --------------------------------------------------------------------------------------------


def test_rsample_gradients_match_finite_differences():
    seeded(5)
    loc0 = torch.randn(4, 3, dtype=torch.float64)
    scale0 = torch.rand(4, 3, dtype=torch.float64) + 0.2
    weights = torch.randn(4, 3, dtype=torch.float64)

    def f(loc, scale):
        pyro.set_rng_seed(123)  # same mask and noise on every evaluation
        w = BernoulliMaskedNormal(loc, scale, torch.tensor([0.2, 0.5, 0.7])).rsample((3,))
        return (torch.sin(w) * weights).sum()

    loc = loc0.clone().requires_grad_()
    scale = scale0.clone().requires_grad_()
    g_loc, g_scale = torch.autograd.grad(f(loc, scale), (loc, scale))
    assert g_loc.abs().sum() > 0 and g_scale.abs().sum() > 0

    h = 1e-6
    for g, which in ((g_loc, 0), (g_scale, 1)):
        fd = torch.zeros_like(loc0)
        for i in range(loc0.numel()):
            e = torch.zeros(loc0.numel(), dtype=torch.float64)
            e[i] = h
            e = e.reshape(loc0.shape)
            args_p = [loc0, scale0]
            args_m = [loc0, scale0]
            args_p[which] = args_p[which] + e
            args_m[which] = args_m[which] - e
            fd.view(-1)[i] = (f(*args_p) - f(*args_m)) / (2 * h)
        torch.testing.assert_close(g, fd, rtol=1e-6, atol=1e-8)


def test_mask_has_no_gradient_dependency_on_loc():
    seeded(6)
    loc = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    scale = torch.full((5, 4), 0.3, dtype=torch.float64, requires_grad=True)
    d = BernoulliMaskedNormal(loc, scale, 0.5)
    assert d.sample_mask().grad_fn is None and not d.sample_mask().requires_grad
    w = d.rsample((200,))
    g_loc, g_scale = torch.autograd.grad(w.sum(), (loc, scale))
    # dW/dM = z exactly: with no path through the mask, each sample contributes 0 or 1, equally
    # for every output unit of a column.
    z_counts = g_loc
    assert torch.equal(z_counts, z_counts.round())
    assert torch.equal(z_counts, z_counts[:1].expand_as(z_counts))
    assert 0 < z_counts.min() and z_counts.max() < 200
    # Per sample: W = z*M + scale*eps with z in {0, 1} and the gradient w.r.t. loc equal to z.
    pyro.set_rng_seed(7)
    w1 = d.rsample()
    (g1,) = torch.autograd.grad(w1.sum(), loc)
    assert set(g1.unique().tolist()) <= {0.0, 1.0}
    eps = (w1 - g1 * loc) / scale
    (g1_scale,) = torch.autograd.grad(w1.sum(), scale)
    torch.testing.assert_close(g1_scale, eps.detach())


def test_sample_is_detached_and_rsample_is_not():
    loc = torch.randn(3, 2, requires_grad=True)
    d = BernoulliMaskedNormal(loc, 0.1, 0.5)
    assert d.has_rsample
    assert not d.sample().requires_grad
    assert d.rsample().requires_grad


# --------------------------------------------------------------------------------------------
# 6. expand and plates
# --------------------------------------------------------------------------------------------


def test_expand_keeps_class_and_parameters():
    seeded(8)
    loc = torch.randn(4, 3)
    rate = torch.tensor([0.1, 0.2, 0.3])
    d = BernoulliMaskedNormal(loc, 0.2, rate)
    e = d.expand([5, 2])
    assert type(e) is BernoulliMaskedNormal
    assert e.batch_shape == (5, 2) and e.event_shape == (4, 3)
    assert e.mask_shape == (5, 2, 1, 3)
    torch.testing.assert_close(e.mean, d.mean.expand(5, 2, 4, 3))
    torch.testing.assert_close(e.variance, d.variance.expand(5, 2, 4, 3))
    value = d.sample((5, 2))
    torch.testing.assert_close(e.log_prob(value), d.log_prob(value))
    assert e._validate_args == d._validate_args
    assert e.sample().shape == (5, 2, 4, 3)


def test_pyro_plate_keeps_the_class_in_the_trace():
    seeded(9)

    def guide():
        with pyro.plate("members", 4):
            pyro.sample("w", BernoulliMaskedNormal(torch.randn(5, 3), 0.1, 0.3))

    trace = pyro.poutine.trace(guide).get_trace()
    fn = trace.nodes["w"]["fn"]
    assert type(fn) is BernoulliMaskedNormal  # not ExpandedDistribution
    assert fn.batch_shape == (4,) and fn.event_shape == (5, 3)
    assert trace.nodes["w"]["value"].shape == (4, 5, 3)
    trace.compute_log_prob()
    assert trace.nodes["w"]["log_prob"].shape == (4,)


# --------------------------------------------------------------------------------------------
# Contract details
# --------------------------------------------------------------------------------------------


def test_contract_attributes():
    d = BernoulliMaskedNormal(torch.zeros(3, 2, 2), 1.0, 0.5, event_dim=2)
    assert set(d.arg_constraints) == {"loc", "scale", "dropout_rate"}
    assert d.batch_shape == (3,) and d.event_shape == (2, 2)
    assert d.support.event_dim == d.event_dim == 2
    assert d.support.check(torch.zeros(3, 2, 2)).all()
    assert not d.support.check(torch.full((3, 2, 2), float("nan"))).any()
    assert BernoulliMaskedNormal(torch.zeros(4, 3), 1.0, 0.5).event_dim == 2  # default loc.dim()
    with pytest.raises(NotImplementedError):
        d.entropy()


def test_validation_is_on_by_default_in_these_tests():
    assert torch.distributions.Distribution._validate_args is True
    assert BernoulliMaskedNormal(torch.zeros(2, 2), 1.0, 0.5)._validate_args is True


def test_validate_args_false_skips_the_constraint_checks():
    d = BernoulliMaskedNormal(torch.zeros(2, 2), 1.0, 1.0, validate_args=False)
    assert d._validate_args is False


def test_validation_of_sample_value():
    d = BernoulliMaskedNormal(torch.zeros(2, 2), 1.0, 0.5)
    with pytest.raises(ValueError):
        d.log_prob(torch.full((2, 2), float("nan")))
    with pytest.raises(ValueError):
        d.log_prob(torch.zeros(3, 3))  # does not broadcast with the event shape


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dropout_rate=1.0), "dropout_rate"),
        (dict(dropout_rate=-0.1), "dropout_rate"),
        (dict(dropout_rate=float("nan")), "dropout_rate"),
        (dict(dropout_rate=torch.full((4, 3), 0.5)), "dropout_rate"),  # not one per column
        (dict(scale=0.0), "scale"),
        (dict(scale=-1.0), "scale"),
        (dict(scale=torch.ones(2)), "scale"),
        (dict(event_dim=0), "event_dim"),
        (dict(event_dim=3), "event_dim"),
        (dict(event_dim=1.0), "event_dim"),
        (dict(loc=torch.full((4, 3), float("nan"))), "loc"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    args = dict(loc=torch.zeros(4, 3), scale=0.1, dropout_rate=0.5)
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        BernoulliMaskedNormal(**args)
    assert first_argument_named(str(info.value)) == name, str(info.value)


# --------------------------------------------------------------------------------------------
# 9. hypothesis properties
# --------------------------------------------------------------------------------------------

sizes = st.lists(st.integers(1, 3), max_size=2).map(tuple)


@st.composite
def bmn_args(draw, min_size=1):
    batch = draw(sizes)
    event = tuple(draw(st.lists(st.integers(min_size, 4), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    loc = torch.randn(batch + event, generator=g).to(dtype)
    scale_kind = draw(st.sampled_from(["scalar", "full", "event"]))
    if scale_kind == "scalar":
        scale = draw(st.floats(1e-3, 10.0))
    else:
        shape = batch + event if scale_kind == "full" else event
        scale = (torch.rand(shape, generator=g) * 3 + 1e-3).to(dtype)
    rate_kind = draw(st.sampled_from(["scalar", "per-column", "mask"]))
    if rate_kind == "scalar":
        rate = draw(st.floats(0.0, 0.99))
    else:
        shape = event[1:] if rate_kind == "per-column" else batch + (1,) + event[1:]
        rate = (torch.rand(shape, generator=g) * 0.99).to(dtype)
    return dict(loc=loc, scale=scale, dropout_rate=rate, event_dim=len(event)), batch, event


@settings(max_examples=60, deadline=None)
@given(bmn_args(), sizes)
def test_shapes_property(args, sample_shape):
    args, batch, event = args
    seeded(10)
    d = BernoulliMaskedNormal(**args)
    dtype = args["loc"].dtype
    assert d.batch_shape == batch and d.event_shape == event
    assert d.mask_shape == batch + (1,) + event[1:]
    assert d.dropout_rate.shape == d.mask_shape
    x = d.rsample(sample_shape)
    assert x.shape == sample_shape + batch + event and x.dtype == dtype
    assert d.sample(sample_shape).shape == sample_shape + batch + event
    assert d.sample_mask(sample_shape).shape == sample_shape + d.mask_shape
    lp = d.log_prob(x)
    assert lp.shape == sample_shape + batch and torch.isfinite(lp).all()
    assert d.mean.shape == batch + event and d.variance.shape == batch + event
    assert (d.variance > 0).all()
    e = d.expand((2,) + batch)
    assert type(e) is BernoulliMaskedNormal
    assert e.batch_shape == (2,) + batch and e.event_shape == event
    assert e.rsample(sample_shape).shape == sample_shape + (2,) + batch + event
    lp_e = e.log_prob(x.unsqueeze(len(sample_shape)))
    torch.testing.assert_close(lp_e, lp.unsqueeze(len(sample_shape)).expand(lp_e.shape))
    assert lp_e.shape == sample_shape + (2,) + batch


@settings(max_examples=60, deadline=None)
@given(bmn_args(min_size=2), st.data())
def test_bad_arguments_property(args, data):
    args, batch, event = args
    which = data.draw(st.sampled_from(["rate", "scale", "scale_shape", "rate_shape", "event_dim"]))
    bad = dict(args)
    loc = args["loc"]
    if which == "rate":
        bad["dropout_rate"] = data.draw(st.sampled_from([1.0, 1.5, -0.1, -1e-6, float("nan")]))
        name = "dropout_rate"
    elif which == "scale":
        value = data.draw(st.sampled_from([0.0, -1.0, -1e-6, float("nan")]))
        bad["scale"] = (
            value
            if data.draw(st.booleans())
            else torch.rand(loc.shape, dtype=loc.dtype).masked_fill(
                torch.arange(loc.numel()).reshape(loc.shape) == 0, value
            )
        )
        name = "scale"
    elif which == "scale_shape":
        dim = data.draw(st.integers(len(batch), loc.dim() - 1))
        shape = list(loc.shape)
        shape[dim] += 1  # event sizes are >= 2, so this never broadcasts
        bad["scale"] = torch.ones(shape, dtype=loc.dtype)
        name = "scale"
    elif which == "rate_shape":
        # One rate per *element* (not per column): the output dimension is >= 2.
        bad["dropout_rate"] = torch.full(batch + event, 0.5, dtype=loc.dtype)
        name = "dropout_rate"
    else:
        bad["event_dim"] = data.draw(st.sampled_from([0, -1, loc.dim() + 1, loc.dim() + 3]))
        bad["scale"] = 1.0
        name = "event_dim"
    try:
        BernoulliMaskedNormal(**bad)
    except ValueError as e:
        assert first_argument_named(str(e)) == name, str(e)
    else:
        raise AssertionError(f"no ValueError for bad {name}")


def test_support_is_real_with_event_dim():
    d = BernoulliMaskedNormal(torch.zeros(2, 3, 4), 1.0, 0.5, event_dim=2)
    assert isinstance(d.support, constraints.independent)
    assert d.support.base_constraint is constraints.real
