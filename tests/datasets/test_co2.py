"""Tests of the Mauna Loa CO2 loader (needs the optional statsmodels)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from pyro_dropout.datasets import CO2Series, co2_extrapolation_split, load_co2


def test_missing_statsmodels_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "statsmodels.datasets.co2", None)
    with pytest.raises(ImportError, match=r"pip install pyro-dropout\[examples\]"):
        load_co2()


@pytest.fixture(scope="module")
def weekly() -> CO2Series:
    pytest.importorskip(
        "statsmodels", reason="needs the examples extra: pip install -e '.[examples]'"
    )
    return load_co2()


def test_weekly_series(weekly: CO2Series) -> None:
    assert len(weekly) == 2284 and weekly.frequency == "weekly"
    assert weekly.t.dtype == np.float64 and weekly.ppm.dtype == np.float64
    assert weekly.t.shape == weekly.ppm.shape == weekly.filled.shape == (2284,)
    assert np.all(np.isfinite(weekly.ppm))
    assert int(weekly.filled.sum()) == 59
    # Decimal years: 1958-03-29 is day 87 of 365; weekly steps of 7 days.
    assert weekly.t[0] == pytest.approx(1958 + 87 / 365)
    assert np.all(np.diff(weekly.t) > 0) and np.median(np.diff(weekly.t)) == pytest.approx(7 / 365)
    assert 1958 < weekly.t[0] and weekly.t[-1] < 2002
    assert weekly.ppm[0] == pytest.approx(316.1)
    assert 310 < weekly.ppm.min() and weekly.ppm.max() < 380
    assert weekly.ppm[-52:].mean() > weekly.ppm[:52].mean() + 40  # the trend


def test_interpolated_gaps_lie_between_neighbours(weekly: CO2Series) -> None:
    inner = np.flatnonzero(weekly.filled)
    inner = inner[(inner > 0) & (inner < len(weekly) - 1)]
    assert inner.size > 0
    for i in inner:
        lo = i - 1
        while weekly.filled[lo]:
            lo -= 1
        hi = i + 1
        while weekly.filled[hi]:
            hi += 1
        expected = np.interp(weekly.t[i], weekly.t[[lo, hi]], weekly.ppm[[lo, hi]])
        assert weekly.ppm[i] == pytest.approx(expected)


def test_ffill_and_monthly() -> None:
    pytest.importorskip(
        "statsmodels", reason="needs the examples extra: pip install -e '.[examples]'"
    )
    ff = load_co2(fill="ffill")
    i = np.flatnonzero(ff.filled & (np.arange(len(ff)) > 0))[0]
    assert ff.ppm[i] == ff.ppm[i - 1]
    monthly = load_co2(frequency="monthly")
    assert len(monthly) == 526 and monthly.frequency == "monthly"
    assert np.all(np.isfinite(monthly.ppm))
    assert monthly.t[0] == pytest.approx(1958 + 2.5 / 12)  # mid-March 1958
    np.testing.assert_allclose(np.diff(monthly.t), 1 / 12)
    with pytest.raises(ValueError, match="frequency"):
        load_co2(frequency="daily")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fill"):
        load_co2(fill="zero")  # type: ignore[arg-type]


def test_extrapolation_split(weekly: CO2Series) -> None:
    task = co2_extrapolation_split(1990.0, series=weekly)
    assert task.cutoff == 1990.0
    assert np.all(task.t_train < 1990.0) and np.all(task.t_test >= 1990.0)
    assert len(task.t_train) + len(task.t_test) == len(weekly)
    n_train, n_test = len(task.t_train), len(task.t_test)
    assert task.x_train.shape == (n_train, 1) and task.y_train.shape == (n_train,)
    assert task.x_test.shape == (n_test, 1) and task.y_test.shape == (n_test,)
    assert all(
        t.dtype == torch.float32 for t in (task.x_train, task.y_train, task.x_test, task.y_test)
    )
    # Standardised with the training rows only.
    assert task.x_train.double().mean().abs() < 1e-5
    assert task.y_train.double().std(correction=0) == pytest.approx(1.0, abs=1e-5)
    assert task.x_test.min() > task.x_train.max()  # extrapolation lies beyond the data
    assert task.y_test.mean() > 1.0  # CO2 keeps rising past the cut-off
    back = task.standardizer.inverse_y(task.y_test.double()).numpy()
    np.testing.assert_allclose(back, task.ppm_test, rtol=1e-6)
    with pytest.raises(ValueError, match="empty"):
        co2_extrapolation_split(2050.0, series=weekly)
