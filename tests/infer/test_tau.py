"""Gal & Ghahramani's τ / weight-decay relation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_dropout import gal_tau, gal_weight_decay
from pyro_dropout.infer import prior_scale_from_length_scale


def test_gal_tau_formula():
    # τ = (1 - p) l² / (2 N λ)
    assert gal_tau(1e-2, 0.05, 455, 1e-6) == pytest.approx(0.95 * 1e-4 / (2 * 455 * 1e-6))
    assert gal_tau(2.0, 0.0, 1, 0.5) == pytest.approx(4.0)


def test_gal_weight_decay_formula():
    assert gal_weight_decay(1e-2, 0.1, 1000, 10.0) == pytest.approx(0.9 * 1e-4 / (2 * 1000 * 10))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    length_scale=st.floats(1e-3, 1e3),
    dropout_rate=st.floats(0.0, 0.99),
    num_data=st.integers(1, 10**6),
    weight_decay=st.floats(1e-10, 1e2),
)
def test_round_trip(length_scale, dropout_rate, num_data, weight_decay):
    tau = gal_tau(length_scale, dropout_rate, num_data, weight_decay)
    assert tau > 0
    assert gal_weight_decay(length_scale, dropout_rate, num_data, tau) == pytest.approx(
        weight_decay, rel=1e-9
    )
    assert gal_tau(length_scale, dropout_rate, num_data, weight_decay * 2) == pytest.approx(
        tau / 2, rel=1e-9
    )


@pytest.mark.parametrize("fn", [gal_tau, gal_weight_decay])
@pytest.mark.parametrize(
    "args, match",
    [
        ((0.0, 0.1, 10, 1.0), "length_scale"),
        ((-1.0, 0.1, 10, 1.0), "length_scale"),
        ((1.0, 1.0, 10, 1.0), "dropout_rate"),
        ((1.0, -0.1, 10, 1.0), "dropout_rate"),
        ((1.0, 0.1, 0, 1.0), "num_data"),
    ],
)
def test_bad_common_arguments(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)


@pytest.mark.parametrize("bad", [0.0, -1e-3])
def test_bad_last_argument(bad):
    with pytest.raises(ValueError, match="weight_decay must be positive"):
        gal_tau(1.0, 0.1, 10, bad)
    with pytest.raises(ValueError, match="tau must be positive"):
        gal_weight_decay(1.0, 0.1, 10, bad)


def test_prior_scale_from_length_scale():
    assert prior_scale_from_length_scale(4.0) == 0.25
    with pytest.raises(ValueError, match="length_scale"):
        prior_scale_from_length_scale(0.0)
