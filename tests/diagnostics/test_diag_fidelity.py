"""Fidelity scores against a reference: hand computations, scipy, known cases, compare()."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pyro.infer.autoguide import AutoDelta
from scipy import stats

from pyro_dropout import fit
from pyro_dropout.diagnostics import (
    agreement,
    compare,
    fidelity_scores,
    reference_interval_coverage,
    sd_ratio,
    to_inference_data,
    total_variation,
    wasserstein_1d,
)

from ._models import categorical_model, linreg_model, normal_guide


def test_wasserstein_matches_scipy_with_unequal_draws():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(37, 4))
    b = rng.standard_t(3, size=(53, 4)) + 0.3
    expected = [stats.wasserstein_distance(a[:, j], b[:, j]) for j in range(4)]
    np.testing.assert_allclose(wasserstein_1d(a, b), expected, rtol=1e-12)


def test_hand_computed_regression_scores():
    # point masses at 0 and 1 vs at 1 and 2: every draw moves by 1
    np.testing.assert_allclose(wasserstein_1d([[0.0], [1.0]], [[1.0], [2.0]]), [1.0])
    # {0, 0, 3} vs {1}: |0-1| * 2/3 + |3-1| * 1/3 = 4/3
    np.testing.assert_allclose(wasserstein_1d([[0.0], [0.0], [3.0]], [[1.0]]), [4 / 3])
    np.testing.assert_allclose(
        sd_ratio([[0.0, 0.0], [2.0, 1.0]], [[0.0, 0.0], [1.0, 4.0]]), [2, 0.25]
    )
    ref = np.arange(101.0)[:, None]  # central 50 %: [25, 75]; 90 %: [5, 95]
    fit = np.array([[0.0], [25.0], [50.0], [75.0], [80.0], [96.0], [4.0], [10.0]])
    np.testing.assert_allclose(reference_interval_coverage(fit, ref, 0.5), [3 / 8])
    np.testing.assert_allclose(reference_interval_coverage(fit, ref, 0.9), [5 / 8])
    with pytest.raises(ValueError, match="same test inputs"):
        wasserstein_1d(np.zeros((3, 2)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"prob must be in \(0, 1\)"):
        reference_interval_coverage(fit, ref, 1.0)


def test_hand_computed_classification_scores():
    p = [[0.6, 0.4, 0.0], [0.2, 0.8, 0.0], [0.1, 0.1, 0.8]]
    q = [[0.9, 0.1, 0.0], [0.7, 0.3, 0.0], [0.0, 0.2, 0.8]]
    assert agreement(p, q) == pytest.approx(2 / 3)
    assert total_variation(p, q) == pytest.approx((0.3 + 0.5 + 0.1) / 3)
    assert agreement(q, q) == 1.0 and total_variation(q, q) == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        total_variation(p, [[1.0, 0.0]])


@pytest.fixture
def far(linreg):
    """Test inputs 10x further out, where the posterior's spread matters next to the noise."""
    return 10.0 * linreg.x_test, 10.0 * linreg.y_test


def _export(linreg, far, guide, seed, n=400):
    return to_inference_data(linreg_model, guide, linreg.x, linreg.y, n, *far, seed=seed)


def test_regression_known_cases(linreg, far):
    ref = _export(linreg, far, linreg.guide(), seed=1)
    self_scores = fidelity_scores(ref, ref)
    assert self_scores["ref_w1"] == 0.0
    assert self_scores["ref_sd_ratio"] == pytest.approx(1.0)
    assert self_scores["ref_cov50"] == pytest.approx(0.5, abs=0.01)
    assert self_scores["ref_cov90"] == pytest.approx(0.9, abs=0.01)

    exact = fidelity_scores(_export(linreg, far, linreg.guide(), seed=2), ref)
    point = fidelity_scores(_export(linreg, far, linreg.guide(1e-9), seed=2), ref)
    wide = fidelity_scores(_export(linreg, far, linreg.guide(3.0), seed=2), ref)
    # fresh draws from the reference itself: small Monte Carlo error only
    assert exact["ref_w1"] < 0.15 and abs(exact["ref_sd_ratio"] - 1) < 0.1
    assert abs(exact["ref_cov50"] - 0.5) < 0.06
    # a point estimate: too narrow, further away, too much mass inside the central interval
    assert point["ref_w1"] > 3 * exact["ref_w1"]
    assert point["ref_sd_ratio"] < 0.7 and point["ref_cov50"] > 0.6
    # too wide: spread ratio > 1, too little mass inside
    assert wide["ref_sd_ratio"] > 1.5 and wide["ref_cov50"] < 0.4


def test_classification_known_cases(classif):
    x, y, xt, yt = classif["x"], classif["y"], classif["x_test"], classif["y_test"]
    loc = classif["W"]

    def export(scale, seed):
        guide = normal_guide("W", loc, torch.full_like(loc, scale), event_dim=2)
        return to_inference_data(categorical_model, guide, x, y, 300, xt, yt, seed=seed)

    ref = export(1.0, 1)
    assert fidelity_scores(ref, ref) == {"ref_agreement": 1.0, "ref_tv": 0.0}
    same = fidelity_scores(export(1.0, 2), ref)
    point = fidelity_scores(export(1e-9, 2), ref)
    assert same["ref_tv"] < 0.05 and same["ref_agreement"] > 0.9
    assert point["ref_tv"] > 2 * same["ref_tv"]
    assert point["ref_agreement"] <= same["ref_agreement"]


def test_inputs_must_match(linreg, far):
    ref = _export(linreg, far, linreg.guide(), seed=1, n=30)
    other = to_inference_data(
        linreg_model, linreg.guide(), linreg.x, linreg.y, 30, linreg.x_test, linreg.y_test
    )
    with pytest.raises(ValueError, match="different inputs"):
        fidelity_scores(other, ref)
    no_test = to_inference_data(linreg_model, linreg.guide(), linreg.x, linreg.y, 30)
    with pytest.raises(ValueError, match="only one of"):
        fidelity_scores(no_test, ref)


def test_compare_adds_fidelity_columns(linreg, far):
    ref = _export(linreg, far, linreg.guide(), seed=1)
    fits = {
        "exact": _export(linreg, far, linreg.guide(), seed=2),
        "narrow": _export(linreg, far, linreg.guide(0.3), seed=2),
    }
    table = compare(fits, reference=ref)
    cols = list(table.columns)
    assert cols.index("test_cov95") < cols.index("ref_w1") < cols.index("ref_sd_ratio")
    assert cols.index("ref_cov50") < cols.index("ref_cov90") < cols.index("family")
    assert table.loc["narrow", "ref_w1"] > table.loc["exact", "ref_w1"]
    assert table.loc["narrow", "ref_sd_ratio"] < table.loc["exact", "ref_sd_ratio"]
    assert "ref_w1" not in compare(fits).columns
    with pytest.raises(ValueError, match="reference must be an ArviZ object"):
        compare(fits, reference={"a": 1})


def test_map_fit_scores_worse_than_the_exact_posterior(linreg, far):
    ref = _export(linreg, far, linreg.guide(), seed=1)
    guide = AutoDelta(linreg_model)
    fit(linreg_model, guide, linreg.x, linreg.y, num_steps=300, lr=0.05, progress=False, seed=0,
        local_reparameterization=False)  # fmt: skip
    map_ = fidelity_scores(_export(linreg, far, guide, seed=2), ref)
    exact = fidelity_scores(_export(linreg, far, linreg.guide(), seed=2), ref)
    assert map_["ref_w1"] > 2 * exact["ref_w1"]
    assert map_["ref_sd_ratio"] < 0.8 < exact["ref_sd_ratio"]
    assert map_["ref_cov90"] > exact["ref_cov90"]
