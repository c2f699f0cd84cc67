"""metrics.py against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyro_dropout.diagnostics import metrics as m


def test_lppd_and_mean_lpd():
    lik = np.array([[0.5, 0.1, 0.2], [0.3, 0.1, 0.6]])
    np.testing.assert_allclose(m.lppd(np.log(lik)), np.log([0.4, 0.1, 0.4]), rtol=1e-14)
    assert m.mean_lpd(np.log(lik)) == pytest.approx((2 * math.log(0.4) + math.log(0.1)) / 3)


def test_lppd_is_stable_for_very_negative_log_lik():
    ll = np.array([[-1000.0], [-1001.0]])
    expect = -1000.0 + math.log((1 + math.exp(-1)) / 2)
    assert m.lppd(ll)[0] == pytest.approx(expect, rel=1e-14)
    assert m.lppd(np.array([[-np.inf], [-np.inf]]))[0] == -np.inf
    with pytest.raises(ValueError, match="shape"):
        m.lppd(np.zeros(3))


def test_log_mean_exp_axis():
    a = np.log(np.array([[1.0, 2.0], [3.0, 6.0]]))
    np.testing.assert_allclose(m.log_mean_exp(a, axis=1), np.log([1.5, 4.5]), rtol=1e-14)


def test_rmse():
    assert m.rmse(np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 6.0])) == pytest.approx(
        math.sqrt((0 + 4 + 9) / 3)
    )
    with pytest.raises(ValueError, match="shape"):
        m.rmse(np.zeros(2), np.zeros(3))


def test_interval_coverage_by_hand():
    draws = np.tile(np.arange(101.0)[:, None], (1, 5))  # quantiles are exact: q(p) = 100 p
    y = np.array([4.0, 5.0, 50.0, 95.0, 96.0])
    assert m.interval_coverage(y, draws, 0.9) == pytest.approx(3 / 5)  # [5, 95]
    assert m.interval_coverage(y, draws, 0.5) == pytest.approx(1 / 5)  # [25, 75]
    assert m.coverage_table(y, draws, (0.5, 0.9)) == {0.5: 0.2, 0.9: 0.6}
    with pytest.raises(ValueError, match="prob"):
        m.interval_coverage(y, draws, 1.0)
    with pytest.raises(ValueError, match="shape"):
        m.interval_coverage(y[:3], draws, 0.5)


def test_interval_coverage_is_calibrated_for_the_true_distribution():
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(2000, 3000))
    y = rng.normal(size=3000)
    for p in (0.5, 0.9, 0.95):
        assert abs(m.interval_coverage(y, draws, p) - p) < 0.03


def test_pit():
    draws = np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0], [3.0, 4.0]])
    np.testing.assert_allclose(m.pit(np.array([1.5, 0.5]), draws), [0.5, 0.0])
    rng = np.random.default_rng(1)
    u = m.pit(rng.normal(size=4000), rng.normal(size=(500, 4000)))
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.var() - 1 / 12) < 0.01


def test_accuracy_and_brier():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1]])
    y = np.array([0, 1, 1])
    assert m.accuracy(y, probs) == pytest.approx(1 / 3)
    b = ((0.3**2 + 0.2**2 + 0.1**2) + (0.1**2 + 0.7**2 + 0.6**2) + (0.5**2 + 0.6**2 + 0.1**2)) / 3
    assert m.brier_score(y, probs) == pytest.approx(b)
    assert m.brier_score(np.array([1]), np.array([[0.0, 1.0]])) == 0.0
    with pytest.raises(ValueError, match="labels"):
        m.accuracy(np.array([0, 3, 1]), probs)
    with pytest.raises(ValueError, match="shape"):
        m.brier_score(np.array([0, 1]), probs)


def test_reliability_and_ece_by_hand():
    # confidences 0.95, 0.95, 0.65, 0.55 (two bins of width 0.5 with n_bins=2)
    probs = np.array([[0.95, 0.05], [0.05, 0.95], [0.65, 0.35], [0.45, 0.55]])
    y = np.array([0, 0, 0, 0])  # correct, wrong, correct, wrong
    conf, acc, count = m.reliability_curve(y, probs, n_bins=2)
    assert count.tolist() == [0, 4]
    assert np.isnan(conf[0]) and np.isnan(acc[0])
    assert conf[1] == pytest.approx((0.95 + 0.95 + 0.65 + 0.55) / 4)
    assert acc[1] == pytest.approx(0.5)
    assert m.expected_calibration_error(y, probs, n_bins=2) == pytest.approx(abs(0.5 - 0.775))
    # ten bins: 0.95 -> bin 9 (2 pts, acc 0.5), 0.65 -> bin 6 (acc 1), 0.55 -> bin 5 (acc 0)
    ece = (2 / 4) * abs(0.5 - 0.95) + (1 / 4) * abs(1 - 0.65) + (1 / 4) * abs(0 - 0.55)
    assert m.expected_calibration_error(y, probs, n_bins=10) == pytest.approx(ece)
    assert m.expected_calibration_error(np.array([0, 1]), np.eye(2)) == 0.0
    with pytest.raises(ValueError, match="n_bins"):
        m.reliability_curve(y, probs, n_bins=0)


def test_bin_edges_are_right_closed():
    probs = np.array([[0.6, 0.4], [0.7, 0.3]])
    _, _, count = m.reliability_curve(np.array([0, 0]), probs, n_bins=10)
    assert count[5] == 1 and count[6] == 1  # 0.6 falls in (0.5, 0.6], 0.7 in (0.6, 0.7]


@pytest.mark.parametrize("module", ["metrics", "vi_diagnostic", "export", "fidelity"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    mod = importlib.import_module(f"pyro_dropout.diagnostics.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
