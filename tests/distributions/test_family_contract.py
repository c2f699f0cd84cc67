"""Contracts of the three distributions and their KLs that the other tests leave open: dtypes,
devices, validation flags, subclassing, broadcasting and the exact log-uniform floor."""

import math

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import Independent, Normal, constraints, kl_divergence

from pyro_dropout.distributions import (
    BernoulliMaskedNormal,
    ConcreteMaskedNormal,
    ImproperLogUniform,
    LogAlphaNormal,
    kl_bernoulli_masked_normal_normal,
)

from ._helpers import seeded

# --------------------------------------------------------------------------------------------
# KL broadcasting
# --------------------------------------------------------------------------------------------


def _bmn(shape=(3, 4), rate=0.2, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return BernoulliMaskedNormal(torch.randn(shape, generator=g), scale, rate)


def test_kl_accepts_a_prior_wrapped_in_nested_independents():
    """Independent(Independent(Normal, 1), 1) has two event dims, like Independent(Normal, 2)."""
    q = _bmn()
    base = Normal(torch.linspace(-1, 1, 12).reshape(3, 4), torch.full((3, 4), 0.7))
    nested = Independent(Independent(base, 1), 1)
    flat = Independent(base, 2)
    expected = kl_bernoulli_masked_normal_normal(q, flat)
    torch.testing.assert_close(kl_divergence(q, nested), expected)
    torch.testing.assert_close(kl_bernoulli_masked_normal_normal(q, nested), expected)


def test_kl_against_a_batched_prior_has_the_prior_batch_shape():
    """An unbatched q against a prior with batch shape (2,) gives one KL per prior member."""
    q = _bmn()
    loc0 = torch.stack([torch.zeros(3, 4), torch.full((3, 4), 0.5)])
    scale0 = torch.stack([torch.ones(3, 4), torch.full((3, 4), 2.0)])
    kl = kl_divergence(q, dist.Normal(loc0, scale0).to_event(2))
    assert kl.shape == (2,)
    for i in range(2):
        single = kl_divergence(q, dist.Normal(loc0[i], scale0[i]).to_event(2))
        torch.testing.assert_close(kl[i], single)


def test_kl_broadcasts_q_along_an_input_dimension_of_the_prior():
    """q whose input dimension has size 1 against a (3, 5) prior: the KL of q broadcast to
    (3, 5), i.e. five equal columns."""
    loc = torch.tensor([[0.5], [-1.0], [2.0]])
    q = BernoulliMaskedNormal(loc, 0.3, 0.2)
    prior = dist.Normal(torch.tensor(0.0), torch.tensor(1.5)).expand((3, 5)).to_event(2)
    q_full = BernoulliMaskedNormal(loc.expand(3, 5), 0.3, 0.2)
    expected = kl_divergence(q_full, prior)
    torch.testing.assert_close(kl_divergence(q, prior), expected)
    torch.testing.assert_close(
        expected, 5 * kl_divergence(q, dist.Normal(0.0, 1.5).expand((3, 1)).to_event(2))
    )


def test_log_uniform_kl_has_the_broadcast_batch_shape_of_q_and_prior():
    q = Normal(torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.1, 0.2, 0.3]))
    kl = kl_divergence(q, ImproperLogUniform((2, 3)))
    assert kl.shape == (2, 3)
    torch.testing.assert_close(kl[0], kl_divergence(q, ImproperLogUniform((3,))))
    torch.testing.assert_close(kl[1], kl[0])


# --------------------------------------------------------------------------------------------
# BernoulliMaskedNormal: dtype and device
# --------------------------------------------------------------------------------------------


def test_integer_loc_is_converted_to_the_default_float_dtype():
    d = BernoulliMaskedNormal(torch.tensor([[1, 2, 3]]), 0.5, 0.25)
    for t in (d.loc, d.scale, d.dropout_rate):
        assert t.dtype == torch.get_default_dtype()
    torch.testing.assert_close(d.mean, torch.tensor([[0.75, 1.5, 2.25]]))


def test_parameters_and_draws_live_on_the_device_of_loc():
    """Python-number scale and rate follow loc's device (checked on the meta device)."""
    loc = torch.zeros(3, 4, device="meta")
    d = BernoulliMaskedNormal(loc, 0.5, 0.1, validate_args=False)
    assert d.scale.device == loc.device and d.dropout_rate.device == loc.device
    assert d.sample_mask((2,)).device == loc.device
    assert d.rsample((2,)).device == loc.device
    assert d.rsample((2,)).shape == (2, 3, 4)


def test_float64_draws_have_float64_mask_and_noise():
    """The mask has loc's dtype and the slab noise has full float64 resolution."""
    seeded(0)
    d = BernoulliMaskedNormal(torch.zeros(50, 40, dtype=torch.float64), 1.0, 0.3)
    mask = d.sample_mask()
    assert mask.dtype == torch.float64
    assert set(mask.unique().tolist()) == {0.0, 1.0}
    w = d.rsample()
    assert w.dtype == torch.float64
    # noise drawn in float32 and cast up would be exactly representable in float32
    assert (w.float().double() != w).float().mean() > 0.99


def test_rsample_is_the_mask_of_sample_mask_plus_scaled_standard_noise():
    """Under one seed a draw is W = z * M + sigma * eps with z = sample_mask() and eps the next
    standard-normal draw, so the mask of a draw can be recovered by re-seeding."""
    loc = torch.randn(4, 6, dtype=torch.float64)
    scale = torch.linspace(0.1, 1.0, 24, dtype=torch.float64).reshape(4, 6)
    d = BernoulliMaskedNormal(loc, scale, 0.4)
    seeded(3)
    w = d.rsample((5,))
    seeded(3)
    z = d.sample_mask((5,))
    eps = torch.randn((5, 4, 6), dtype=torch.float64)
    torch.testing.assert_close(w, z * loc + scale * eps, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_uniform_draw_equal_to_the_keep_probability_drops_the_unit(monkeypatch, dtype):
    """The mask is ``u < 1 - p`` with u uniform in loc's dtype: on the grid of u, P(z=1) is
    exactly 1 - p (``<=`` or a coarser u would add the mass of u == 1 - p)."""
    d = BernoulliMaskedNormal(torch.ones(2, 3, dtype=dtype), 0.5, 0.1)
    keep = 1.0 - torch.tensor(0.1, dtype=dtype)

    def rand_equal_to_keep(shape, dtype=None, device=None, **kwargs):
        return torch.full(shape, float(keep), dtype=dtype, device=device)

    monkeypatch.setattr(torch, "rand", rand_equal_to_keep)
    assert d.sample_mask().sum() == 0


# --------------------------------------------------------------------------------------------
# expand: subclasses and validation flags
# --------------------------------------------------------------------------------------------


class _TaggedBMN(BernoulliMaskedNormal):
    def __init__(self, loc, scale, dropout_rate, tag, validate_args=None):
        self.tag = tag
        super().__init__(loc, scale, dropout_rate, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_TaggedBMN, _instance)
        new.tag = self.tag
        return super().expand(batch_shape, _instance=new)


class _TaggedCMN(ConcreteMaskedNormal):
    def __init__(self, loc, scale, dropout_rate, tag, validate_args=None):
        self.tag = tag
        super().__init__(loc, scale, dropout_rate, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_TaggedCMN, _instance)
        new.tag = self.tag
        return super().expand(batch_shape, _instance=new)


class _TaggedLogAlphaNormal(LogAlphaNormal):
    def __init__(self, loc, log_alpha, tag, validate_args=None):
        self.tag = tag
        super().__init__(loc, log_alpha, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_TaggedLogAlphaNormal, _instance)
        new.tag = self.tag
        return super().expand(batch_shape, _instance=new)


class _ScaledLogUniform(ImproperLogUniform):
    """A subclass with a checked parameter: ``c * p(w)``, c > 0."""

    arg_constraints = {"c": constraints.positive}

    def __init__(self, c, batch_shape=(), validate_args=None):
        self.c = torch.as_tensor(c)
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_ScaledLogUniform, _instance)
        new.c = self.c
        return super().expand(batch_shape, _instance=new)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _TaggedBMN(torch.randn(3, 4), 0.5, 0.2, tag="t"),
        lambda: _TaggedCMN(torch.randn(3, 4), 0.5, 0.2, tag="t"),
        lambda: _TaggedLogAlphaNormal(torch.randn(3, 4), torch.zeros(3, 4), tag="t"),
        lambda: _ScaledLogUniform(2.0, (3, 4)),
    ],
    ids=["BernoulliMaskedNormal", "ConcreteMaskedNormal", "LogAlphaNormal", "ImproperLogUniform"],
)
def test_subclass_expand_returns_the_subclass_instance(make):
    """A subclass that calls ``super().expand(..., _instance=new)`` gets its own instance back."""
    d = make()
    e = d.expand((2,) + tuple(d.batch_shape))
    assert type(e) is type(d)
    assert e.batch_shape == (2,) + tuple(d.batch_shape)
    assert getattr(e, "tag", None) == getattr(d, "tag", None)
    assert getattr(e, "c", None) is getattr(d, "c", None)


@pytest.mark.parametrize(
    "make",
    [
        lambda: BernoulliMaskedNormal(torch.zeros(3, 4), -1.0, 0.2, validate_args=False),
        lambda: ConcreteMaskedNormal(torch.zeros(3, 4), -1.0, 0.2, validate_args=False),
        lambda: LogAlphaNormal(torch.full((4,), float("nan")), torch.zeros(4), validate_args=False),
        lambda: _ScaledLogUniform(-1.0, (4,), validate_args=False),
    ],
    ids=["BernoulliMaskedNormal", "ConcreteMaskedNormal", "LogAlphaNormal", "ImproperLogUniform"],
)
def test_expand_keeps_validation_off_when_it_was_switched_off(make):
    """validate_args=False survives expand even with global validation on (conftest)."""
    d = make()
    e = d.expand((2,) + tuple(d.batch_shape))
    assert e._validate_args is False


def test_log_alpha_normal_validate_args_is_honoured_and_kept_by_expand():
    nan = torch.tensor([float("nan")])
    LogAlphaNormal(nan, torch.zeros(1), validate_args=False)  # no check when switched off
    with pytest.raises(ValueError, match="loc"):
        LogAlphaNormal(nan, torch.zeros(1))  # global validation is on
    d = LogAlphaNormal(torch.ones(3), torch.zeros(3), validate_args=True).expand((2, 3))
    assert d._validate_args is True
    with pytest.raises(ValueError, match="support"):
        d.log_prob(torch.full((2, 3), float("nan")))


# --------------------------------------------------------------------------------------------
# ImproperLogUniform
# --------------------------------------------------------------------------------------------


def test_log_uniform_constructor_sets_batch_shape():
    p = ImproperLogUniform((2, 3))
    assert p.batch_shape == (2, 3) and p.event_shape == ()
    assert p.log_prob(torch.tensor(2.0)).shape == (2, 3)


def test_log_uniform_validate_args_false_skips_the_support_check():
    """Global validation is on (conftest); an explicit validate_args=False wins."""
    value = torch.tensor([float("nan"), 1.0])
    assert ImproperLogUniform(validate_args=False).log_prob(value)[1] == 0.0
    with pytest.raises(ValueError, match="support"):
        ImproperLogUniform().log_prob(value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_uniform_floor_at_zero_is_the_dtype_tiny(dtype):
    tiny = torch.finfo(dtype).tiny
    lp = ImproperLogUniform().log_prob(torch.tensor([0.0, 1e-300, 4.0], dtype=dtype))
    assert lp.dtype == dtype
    expected = torch.tensor(
        [
            -math.log(tiny),
            -math.log(max(float(torch.tensor(1e-300, dtype=dtype)), tiny)),
            -math.log(4.0),
        ],
        dtype=dtype,
    )
    torch.testing.assert_close(lp, expected)


def test_log_uniform_integer_values_are_floored_at_1e_38():
    lp = ImproperLogUniform().log_prob(torch.tensor([0, -2, 3]))
    torch.testing.assert_close(
        lp, torch.tensor([-math.log(1e-38), -math.log(2.0), -math.log(3.0)]), rtol=1e-6, atol=1e-5
    )
