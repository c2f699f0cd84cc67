"""Tests of the Standardizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pyro_dropout.datasets import Standardizer


def test_fit_uses_population_sd_and_constant_columns() -> None:
    x = np.array([[1.0, 0.998, 0.0], [3.0, 0.998, 0.0], [5.0, 0.998, 0.0]])
    y = np.array([2.0, 4.0, 6.0])
    s = Standardizer.fit(x, y)
    np.testing.assert_allclose(s.x_mean, [3.0, 0.998, 0.0])
    np.testing.assert_allclose(s.x_std, [np.std([1.0, 3.0, 5.0]), 1.0, 1.0])
    assert s.y_mean == 4.0 and s.y_std == pytest.approx(np.sqrt(8 / 3))
    z = s.transform_x(x)
    assert np.all(z[:, 1:] == 0.0)  # exactly zero, no floating noise
    np.testing.assert_allclose(z[:, 0], [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])


def test_constant_target_gets_sd_one() -> None:
    s = Standardizer.fit(np.arange(4.0)[:, None], np.full(4, 3.5))
    assert s.y_std == 1.0 and s.y_mean == 3.5
    assert np.all(s.transform_y(np.full(4, 3.5)) == 0.0)


def test_without_y_target_is_identity() -> None:
    s = Standardizer.fit(np.arange(4.0))
    assert s.x_mean.shape == (1,)
    np.testing.assert_array_equal(s.transform_y(np.array([1.0, 2.0])), [1.0, 2.0])


def test_inverse_kinds() -> None:
    s = Standardizer(np.zeros(2), np.ones(2), y_mean=10.0, y_std=3.0)
    np.testing.assert_allclose(s.inverse_y(np.array([0.0, 1.0])), [10.0, 13.0])
    np.testing.assert_allclose(s.inverse_y(np.array([0.0, 1.0]), kind="mean"), [10.0, 13.0])
    np.testing.assert_allclose(s.inverse_y(np.array([0.5, 1.0]), kind="std"), [1.5, 3.0])
    np.testing.assert_allclose(s.inverse_y(np.array([0.5, 1.0]), kind="var"), [4.5, 9.0])
    with pytest.raises(ValueError, match="kind"):
        s.inverse_y(np.zeros(1), kind="sd")  # type: ignore[arg-type]


def test_torch_in_torch_out_keeps_dtype() -> None:
    s = Standardizer.fit(np.array([[0.0, 1.0], [2.0, 5.0]]), np.array([1.0, 3.0]))
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([[1.0, 3.0]], dtype=dtype)
        z = s.transform_x(x)
        assert isinstance(z, torch.Tensor) and z.dtype == dtype
        torch.testing.assert_close(z, torch.zeros(1, 2, dtype=dtype))
        y = s.inverse_y(torch.zeros(3, dtype=dtype))
        assert y.dtype == dtype and torch.all(y == 2.0)
    # Fitting on tensors works too.
    t = Standardizer.fit(torch.tensor([[0.0], [2.0]]), torch.tensor([1.0, 3.0]))
    assert t.x_mean[0] == 1.0 and t.y_std == 1.0


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="positive"):
        Standardizer(np.zeros(2), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="rows"):
        Standardizer.fit(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError):
        Standardizer.fit(np.zeros((0, 2)))


@settings(max_examples=50, deadline=None)
@given(
    arrays(
        np.float64, st.tuples(st.integers(2, 12), st.integers(1, 4)), elements=st.floats(-1e3, 1e3)
    ),
)
def test_round_trip_and_moments(x: np.ndarray) -> None:
    s = Standardizer.fit(x, x[:, 0])
    z = s.transform_x(x)
    assert np.all(np.isfinite(z))
    np.testing.assert_allclose(s.inverse_x(z), x, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(s.inverse_y(s.transform_y(x[:, 0])), x[:, 0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-9)
    varying = x.max(0) > x.min(0)
    sd = z.std(0)
    # Columns with an extremely small spread relative to their size lose precision in
    # (x - mean); only check the SD where the spread is resolvable.
    resolvable = varying & (x.std(0) > 1e-6 * (1 + np.abs(x).max(0)))
    np.testing.assert_allclose(sd[resolvable], 1.0, rtol=1e-6)
    assert np.all(sd[~varying] == 0.0)
