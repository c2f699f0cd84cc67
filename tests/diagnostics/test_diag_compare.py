"""compare(): ArviZ LOO table + held-out scores + VI k-hat, one row per fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_dropout.diagnostics import compare, held_out_scores, loo, to_inference_data
from pyro_dropout.diagnostics import metrics as m

from ._models import categorical_model, linreg_model, normal_guide

S = 400


@pytest.fixture
def reg_fits(linreg):
    def fit(guide):
        return to_inference_data(
            linreg_model, guide, linreg.x, linreg.y, S, linreg.x_test, linreg.y_test
        )

    return {"bad": fit(linreg.guide(0.2, 1.5)), "exact": fit(linreg.guide())}


def test_table_columns_and_ranking(reg_fits):
    table = compare(reg_fits)
    assert isinstance(table, pd.DataFrame) and set(table.index) == {"bad", "exact"}
    for col in [
        "rank",
        "elpd_loo",
        "se",
        "p_loo",
        "elpd_diff",
        "dse",
        "weight",
        "loo_warning",
        "loo_max_k",
        "loo_n_high_k",
        "vi_khat",
        "vi_diagnosis",
        "test_lpd",
        "test_rmse",
        "test_cov50",
        "test_cov90",
        "test_cov95",
        "family",
    ]:
        assert col in table.columns, col
    assert "test_accuracy" not in table.columns
    # the exact posterior wins on LOO and on held-out density
    assert table.index[0] == "exact" and table.loc["exact", "rank"] == 0
    assert table.loc["exact", "elpd_diff"] == 0.0 and table.loc["bad", "elpd_diff"] < 0
    assert table.loc["exact", "test_lpd"] > table.loc["bad", "test_lpd"] + 0.05
    assert table.loc["exact", "weight"] > table.loc["bad", "weight"]
    assert table.loc["exact", "vi_khat"] < 0.5 < 0.7 < table.loc["bad", "vi_khat"]
    assert table.loc["bad", "vi_diagnosis"].startswith("unreliable")
    assert table.loc["exact", "test_cov95"] > table.loc["bad", "test_cov95"]
    by_test = compare(reg_fits, sort_by="test_lpd")
    assert list(by_test.index) == ["exact", "bad"]


def test_table_values_match_independent_computation(reg_fits):
    table = compare(reg_fits)
    d = reg_fits["exact"]
    assert table.loc["exact", "elpd_loo"] == pytest.approx(loo(d).elpd)
    scores = held_out_scores(d)
    from pyro_dropout.diagnostics import _arviz_compat as compat

    ll = compat.get_group(d, "predictions_log_likelihood")["obs"].values[0]
    expect = np.mean(np.log(np.mean(np.exp(ll), axis=0)))
    assert scores["test_lpd"] == pytest.approx(expect, rel=1e-12)
    assert table.loc["exact", "test_lpd"] == pytest.approx(expect, rel=1e-12)
    y = compat.get_group(d, "predictions_observed_data")["obs"].values
    mean = compat.get_group(d, "predictions")["obs_mean"].values[0].mean(0)
    assert scores["test_rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)))


def test_model_guide_pairs(linreg):
    fits = {"exact": (linreg_model, linreg.guide()), "bad": (linreg_model, linreg.guide(0.2, 1.5))}
    table = compare(
        fits,
        x=linreg.x,
        y=linreg.y,
        x_test=linreg.x_test,
        y_test=linreg.y_test,
        num_samples=S,
        sort_by="test_lpd",
    )
    # (PSIS-LOO of the too-narrow guide is optimistic: its elpd_loo ties with the exact one's
    # within Monte-Carlo error, so the ranking is checked on held-out data and k-hat.)
    assert table.index[0] == "exact"
    assert table.loc["exact", "test_lpd"] > table.loc["bad", "test_lpd"]
    assert table.loc["exact", "vi_khat"] < 0.5 < 0.7 < table.loc["bad", "vi_khat"]
    assert (table["num_samples"] == S).all()


def test_no_test_data_and_single_fit(linreg):
    d = to_inference_data(linreg_model, linreg.guide(), linreg.x, linreg.y, 100)
    table = compare({"only": d})
    assert len(table) == 1 and table.loc["only", "weight"] == 1.0
    assert "test_lpd" not in table.columns
    with pytest.raises(ValueError, match="test_lpd"):
        compare({"only": d}, sort_by="test_lpd")


def test_classification_scores(classif):
    W = classif["W"]

    def fit(loc):
        guide = normal_guide("W", loc, torch.full_like(loc, 0.2), event_dim=2)
        args = (classif["x"], classif["y"], 200, classif["x_test"], classif["y_test"])
        return to_inference_data(categorical_model, guide, *args)

    fits = {"good": fit(W), "flipped": fit(-W)}
    table = compare(fits)
    for col in ("test_accuracy", "test_ece", "test_brier", "test_lpd"):
        assert col in table.columns
    assert "test_rmse" not in table.columns
    assert table.index[0] == "good"
    assert table.loc["good", "test_accuracy"] > 0.6 > table.loc["flipped", "test_accuracy"]
    assert table.loc["good", "test_brier"] < table.loc["flipped", "test_brier"]
    assert table.loc["good", "test_lpd"] > table.loc["flipped", "test_lpd"]
    # hand check of accuracy / Brier from the stored probabilities
    from pyro_dropout.diagnostics import _arviz_compat as compat

    probs = compat.get_group(fits["good"], "predictions")["obs_probs"].values[0].mean(0)
    y = classif["y_test"].numpy()
    assert table.loc["good", "test_accuracy"] == pytest.approx(np.mean(probs.argmax(1) == y))
    assert table.loc["good", "test_brier"] == pytest.approx(m.brier_score(y, probs))


def test_bad_compare_input(linreg, reg_fits):
    with pytest.raises(ValueError, match="mixes"):
        compare({"a": reg_fits["exact"], "b": (linreg_model, linreg.guide())})
    with pytest.raises(ValueError, match="non-empty"):
        compare({})
    with pytest.raises(ValueError, match="expected an ArviZ object"):
        compare({"a": 3})
    with pytest.raises(ValueError, match="x= and y="):
        compare({"a": (linreg_model, linreg.guide())})
    with pytest.raises(ValueError, match="sort_by"):
        compare(reg_fits, sort_by="waic")


def test_point_mass_fit_is_flagged_in_the_table(linreg, reg_fits):
    """A point-mass 'posterior' collapses LOO to the training fit; the table says so."""

    def point(x, y=None):  # what AutoDelta / MAP emits
        pyro.sample("w", dist.Delta(linreg.post_mean).to_event(1))

    d = to_inference_data(linreg_model, point, linreg.x, linreg.y, 50, linreg.x_test, linreg.y_test)
    table = compare({"point": d, "exact": reg_fits["exact"]})
    assert table.loc["point", "vi_khat"] == np.inf
    assert table.loc["point", "vi_diagnosis"].startswith("point mass")
    assert table.loc["point", "loo_warning"]
    assert table.loc["point", "p_loo"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("draws, ok", [(24, False), (25, True)])
def test_loo_needs_25_draws_on_both_arviz_lines(linreg, draws, ok):
    """PSIS fits a Pareto tail to min(20 % of S, 3 sqrt(S)) draws, at least 5: with fewer than
    25 draws arviz-stats 1.x fails deep inside, 0.23 silently uses a shorter tail. Both lines
    refuse, naming the argument to raise."""
    idata = to_inference_data(linreg_model, linreg.guide(), linreg.x, linreg.y, draws)
    if ok:
        assert np.isfinite(loo(idata).elpd)
    else:
        with pytest.raises(ValueError, match="num_samples >= 25"):
            loo(idata)
        with pytest.raises(ValueError, match="num_samples >= 25"):
            compare({"a": idata, "b": idata})
