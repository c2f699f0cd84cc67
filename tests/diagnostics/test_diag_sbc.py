"""Simulation-based calibration (issue 25, part 3), validated where the answer is known: on a
conjugate Bayesian linear regression the exact posterior gives uniform ranks, and shrunk,
widened and shifted versions of it do not. Each test can fail both ways: the exact posterior
must pass and each control must fail."""

from __future__ import annotations

import functools
import os

import matplotlib.pyplot as plt
import numpy as np
import pyro
import pytest
import torch

import pyro_dropout as pdo
from pyro_dropout.diagnostics import (
    ConjugateLinearRegression,
    ExactPosteriorGuide,
    plot_sbc_ranks,
    simulation_based_calibration,
)

from .test_diag_plots import assert_png

FACTORIES = {
    "exact": ExactPosteriorGuide,
    "over": functools.partial(ExactPosteriorGuide, scale=0.3),
    "under": functools.partial(ExactPosteriorGuide, scale=2.0),
    "biased": functools.partial(ExactPosteriorGuide, shift=1.0),
}


@pytest.fixture
def problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2, generator=g, dtype=torch.float64)
    x_test = torch.randn(3, 2, generator=g, dtype=torch.float64)
    return ConjugateLinearRegression(2), x, x_test


def test_conjugate_posterior_is_exact(problem):
    """The closed form against a brute-force Gaussian update."""
    model, x, _ = problem
    y = x @ torch.tensor([1.0, -2.0], dtype=torch.float64)
    mean, cov = model.posterior(x, y)
    prec = torch.eye(2, dtype=torch.float64) + x.T @ x / 0.25
    torch.testing.assert_close(cov, torch.linalg.inv(prec))
    torch.testing.assert_close(mean, torch.linalg.solve(prec, x.T @ y / 0.25))


def test_sbc_ranks_uniform_for_the_exact_posterior_only(problem):
    model, x, x_test = problem
    res = simulation_based_calibration(
        model, FACTORIES, x, x_test, num_steps=0, num_replications=60, num_samples=19, seed=0
    )
    assert res.ranks["exact"].shape == (60, 3) and res.truth.shape == (60, 3)
    assert res.ranks["exact"].min() >= 0 and res.ranks["exact"].max() <= 19
    t = res.table()
    # the exact posterior passes both tests ...
    assert t.loc["exact", "pvalue"] > 0.05
    assert t.loc["exact", "vsbc_pvalue"] > 0.05
    assert 0.85 < t.loc["exact", "rank_spread"] < 1.15
    # ... the over-confident one (sd x 0.3) has U-shaped ranks ...
    assert t.loc["over", "pvalue"] < 1e-6
    assert t.loc["over", "rank_spread"] > 1.4
    # ... the under-confident one (sd x 2) ranks bunched in the middle ...
    assert t.loc["under", "pvalue"] < 1e-3
    assert t.loc["under", "rank_spread"] < 0.8
    # ... and the biased one (mean + 1 sd) fails the VSBC symmetry test.
    assert t.loc["biased", "vsbc_pvalue"] < 1e-4
    assert t.loc["biased", "vsbc_asymmetry"] > 3 * t.loc["exact", "vsbc_asymmetry"] / 2


def test_sbc_histogram_and_plot(problem, tmp_path):
    model, x, x_test = problem
    res = simulation_based_calibration(
        model,
        {k: FACTORIES[k] for k in ("exact", "over")},
        x,
        x_test,
        num_steps=0,
        num_replications=20,
        num_samples=9,
        seed=1,
    )
    counts, share = res.histogram("over", bins=5)
    assert counts.sum() == 60 and np.isclose(share.sum(), 1.0)
    assert counts[0] + counts[-1] > counts[1:-1].sum()  # U-shaped
    fig = plot_sbc_ranks(res, bins=5, path=tmp_path / "sbc.png")
    assert_png(tmp_path / "sbc.png")
    assert "exact" in fig.axes[0].get_title()
    plt.close("all")


def test_sbc_resumes_from_its_folder(problem, tmp_path):
    model, x, x_test = problem
    kw = {"num_steps": 0, "num_replications": 5, "num_samples": 9, "seed": 3}
    fresh = simulation_based_calibration(model, FACTORIES, x, x_test, **kw)
    first = simulation_based_calibration(model, FACTORIES, x, x_test, folder=tmp_path, **kw)
    names = sorted(os.listdir(tmp_path))
    assert names == ["rep_00000.npz", "rep_00001.npz", "rep_00002.npz", "rep_00003.npz"] + [
        "rep_00004.npz",
        "sbc.json",
    ]
    os.remove(tmp_path / "rep_00002.npz")
    stamp = os.path.getmtime(tmp_path / "rep_00000.npz")
    again = simulation_based_calibration(model, FACTORIES, x, x_test, folder=tmp_path, **kw)
    assert os.path.getmtime(tmp_path / "rep_00000.npz") == stamp  # reused, not recomputed
    assert (tmp_path / "rep_00002.npz").exists()
    for k in FACTORIES:
        np.testing.assert_array_equal(first.ranks[k], fresh.ranks[k])
        np.testing.assert_array_equal(again.ranks[k], fresh.ranks[k])
    with pytest.raises(ValueError, match="num_samples"):
        simulation_based_calibration(
            model, FACTORIES, x, x_test, folder=tmp_path, **{**kw, "num_samples": 19}
        )


def test_sbc_fits_each_guide_in_its_own_param_store(problem):
    """The fitting path: the library's fit on every simulated data set, with a guide of this
    library and one of Pyro's; the caller's parameter store is left as it was."""
    model, x, x_test = problem
    pyro.param("mine", torch.tensor(1.0))
    res = simulation_based_calibration(
        model,
        {"mean_field": pdo.AutoMeanField, "auto_normal": pyro.infer.autoguide.AutoNormal},
        x,
        x_test,
        num_steps=20,
        num_replications=2,
        num_samples=9,
        fit_kwargs={"jit": False},
    )
    assert set(res.ranks) == {"mean_field", "auto_normal"}
    assert list(pyro.get_param_store().keys()) == ["mine"]
    assert (res.seconds["mean_field"] > 0).all()
    single = simulation_based_calibration(
        model, pdo.AutoMeanField, x, x_test, num_steps=5, num_replications=1, num_samples=4
    )
    assert list(single.ranks) == ["AutoMeanField"]


def test_sbc_on_a_classifier():
    """Class probabilities are the function values of a classifier: K per test input."""
    torch.manual_seed(0)
    model = pdo.BayesianMLP(2, 3, hidden=(4,), likelihood="categorical").double()
    x = torch.randn(30, 2, dtype=torch.float64)
    res = simulation_based_calibration(
        model,
        pdo.AutoMeanField,
        x,
        x[:2],
        num_steps=5,
        num_replications=2,
        num_samples=9,
        fit_kwargs={"jit": False},
    )
    assert res.ranks["AutoMeanField"].shape == (2, 6)  # 2 inputs x 3 classes


def test_sbc_arguments(problem):
    model, x, x_test = problem
    with pytest.raises(ValueError, match="num_replications"):
        simulation_based_calibration(model, FACTORIES, x, x_test, num_replications=0)
    with pytest.raises(ValueError, match="guide_factory"):
        simulation_based_calibration(model, {}, x, x_test)


@pytest.mark.slow
def test_sbc_in_worker_processes_matches_one_process(problem, tmp_path):
    model, x, x_test = problem
    kw = {"num_steps": 0, "num_replications": 4, "num_samples": 9, "seed": 4}
    serial = simulation_based_calibration(model, FACTORIES, x, x_test, **kw)
    parallel = simulation_based_calibration(
        model, FACTORIES, x, x_test, processes=2, folder=tmp_path, **kw
    )
    for k in FACTORIES:
        np.testing.assert_array_equal(parallel.ranks[k], serial.ranks[k])
    assert len(list(tmp_path.glob("rep_*.npz"))) == 4
