"""Plots: each returns a Figure and writes a non-empty, non-constant PNG."""

from __future__ import annotations

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from pyro_dropout.diagnostics import (
    compare,
    plot_calibration,
    plot_compare,
    plot_khat,
    plot_predictive_bands,
    to_inference_data,
)

from ._models import categorical_model, linreg_model, normal_guide


def assert_png(path):
    assert path.exists() and path.stat().st_size > 1000
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert img.std() > 0.01  # not a blank canvas


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def curve_fits():
    """1-D regression: y = x w, inputs in [-1, 1], a test grid reaching beyond."""
    g = torch.Generator().manual_seed(4)
    x = torch.linspace(-1, 1, 30, dtype=torch.float64)[:, None]
    y = 1.5 * x[:, 0] + 0.5 * torch.randn(30, generator=g, dtype=torch.float64)
    grid = torch.linspace(-3, 3, 60, dtype=torch.float64)[:, None]
    y_grid = 1.5 * grid[:, 0] + 0.5 * torch.randn(60, generator=g, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)

    def fit(loc, scale, **kw):
        guide = normal_guide("w", loc * one, scale * one)
        return to_inference_data(linreg_model, guide, x, y, 200, grid, y_grid, **kw)

    return {"good": fit(1.5, 0.1), "narrow": fit(1.0, 0.01)}


def test_predictive_bands(tmp_path, curve_fits):
    fig = plot_predictive_bands(curve_fits, path=tmp_path / "bands.png")
    assert isinstance(fig, Figure) and len([a for a in fig.axes if a.get_visible()]) == 2
    assert_png(tmp_path / "bands.png")
    single = plot_predictive_bands(curve_fits["good"], group="train")
    assert isinstance(single, Figure)


def test_calibration_regression_and_classification(tmp_path, curve_fits, classif):
    fig = plot_calibration(curve_fits, path=tmp_path / "pit.png")
    assert isinstance(fig, Figure)
    assert_png(tmp_path / "pit.png")
    W = classif["W"]
    guide = normal_guide("W", W, torch.full_like(W, 0.2), event_dim=2)
    d = to_inference_data(
        categorical_model,
        guide,
        classif["x"],
        classif["y"],
        50,
        classif["x_test"],
        classif["y_test"],
    )
    fig = plot_calibration({"clf": d}, path=tmp_path / "rel.png", n_bins=5)
    assert "ECE" in fig.axes[0].get_title()
    assert_png(tmp_path / "rel.png")
    with pytest.raises(ValueError, match="classifier"):
        plot_predictive_bands({"clf": d})


def test_compare_plot(tmp_path, curve_fits):
    fig = plot_compare(compare(curve_fits), path=tmp_path / "cmp.png")
    assert isinstance(fig, Figure)
    assert_png(tmp_path / "cmp.png")
    assert isinstance(plot_compare(curve_fits), Figure)  # dict of fits: compared first


def test_khat_plot(tmp_path, curve_fits):
    fig = plot_khat(curve_fits, path=tmp_path / "khat.png")
    assert isinstance(fig, Figure)
    assert "VI k-hat" in fig.axes[0].get_title()
    assert_png(tmp_path / "khat.png")


def test_plot_input_errors(curve_fits):
    with pytest.raises(ValueError, match="non-empty dict"):
        plot_khat({})
    with pytest.raises(ValueError, match="not an ArviZ object"):
        plot_calibration({"a": np.zeros(3)})
    with pytest.raises(ValueError, match="group"):
        plot_predictive_bands(curve_fits, group="validation")
