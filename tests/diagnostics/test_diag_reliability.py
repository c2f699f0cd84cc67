"""Diagnostics carry their reliability: the flags of compare, its printed/HTML table, the
plots and the README demo (issue 23, item 4)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_dropout.diagnostics import compare, plot_compare, plot_khat, to_inference_data
from pyro_dropout.diagnostics.reliability import (
    NOTES,
    CompareTable,
    format_table,
    loo_flags,
    notes,
    vi_flags,
)

from ._models import categorical_model, linreg_model

S = 400


@pytest.fixture
def fits(linreg):
    """The exact posterior, and a guide 20x too wide: PSIS-LOO k-hat > good_k at every point,
    p_loo > N and a VI k-hat of about 30 (the pattern of the README demo)."""

    def export(scale, seed):
        guide = linreg.guide(scale_factor=scale)
        return to_inference_data(
            linreg_model, guide, linreg.x, linreg.y, S, linreg.x_test, linreg.y_test, seed=seed
        )

    return {"exact": export(1.0, 0), "wide": export(20.0, 1)}


def test_pathological_fit_is_flagged_and_the_exact_one_is_not(fits):
    table = compare(fits)
    assert isinstance(table, CompareTable) and isinstance(table, pd.DataFrame)
    codes = {row: [c for c, _ in fl] for row, fl in table.attrs["reliability"].items()}
    assert codes == {"wide": ["loo_k", "p_loo", "vi_k"]}
    assert table.loc["exact", "flags"] == ""
    assert table.loc[
        "wide", "flags"
    ] == "k>0.62 at 60 of 60 (100%); p_loo>N=60; VI k={:.3g} beyond range".format(
        table.loc["wide", "vi_khat"]
    )
    text = repr(table)
    lines = text.splitlines()
    wide = next(line for line in lines if line.startswith("wide"))
    exact = next(line for line in lines if line.startswith("exact"))
    assert wide.count("!") >= 7 and "!" not in exact  # elpd_loo ... weight, loo_max_k, vi_khat
    for code in ("loo_k", "p_loo", "vi_k"):
        assert sum(NOTES[code] in line for line in lines) == 1, code
    assert "held-out scores" in text and "NUTS reference" in text
    # selections keep the marks and the notes of the rows they show
    sub = table.loc[["exact"], ["elpd_loo", "vi_khat"]]
    assert isinstance(sub, CompareTable) and "!" not in repr(sub)
    sub = table[["elpd_loo", "p_loo"]]
    assert repr(sub).count(NOTES["p_loo"]) == 1 and "-inf" not in repr(sub)
    html = table._repr_html_()
    assert "<table" in html and "pyro-dropout-flags" in html and "PSIS-LOO unreliable" in html


def test_well_behaved_fits_have_plain_output(linreg):
    """Two near-exact guides with enough draws (good_k = 0.7 at S = 2200): no flag, and the
    printed table is pandas' own."""
    fits = {
        f"g{k}": to_inference_data(
            linreg_model, linreg.guide(scale_factor=s), linreg.x, linreg.y, 2200, seed=k
        )
        for k, s in enumerate((1.0, 1.1))
    }
    table = compare(fits)
    assert table.attrs["reliability"] == {} and (table["flags"] == "").all()
    assert notes(table) == []
    assert repr(table) == pd.DataFrame.__repr__(table) and "!" not in repr(table)
    assert "pyro-dropout-flags" not in table._repr_html_()


def test_infinite_khat_is_flagged_for_a_saturated_classifier(classif):
    """Weights so large that every training point's probability is 1 in float64 for every
    draw: the log-likelihood is constant, PSIS has no tail to fit, k-hat = inf."""
    x, y = classif["x"], classif["y"]
    big = 1e4 * torch.nn.functional.one_hot(y, 3).T.to(x.dtype) @ x / len(x)

    def guide(x, y=None):
        pyro.sample("W", dist.Normal(big, 1e-3).to_event(2))

    def cat(x, y=None):
        return categorical_model(x, y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy on -inf log-weights (0.23)
        d = to_inference_data(cat, guide, x, y, 100, seed=0)
        table = compare({"saturated": d})
    flags = dict(table.attrs["reliability"]["saturated"])
    assert "loo_inf" in flags and flags["loo_inf"].startswith("k=inf at ")
    n_inf = int(flags["loo_inf"].split()[-1].split("/")[0])
    assert 0 < n_inf <= len(x) and table.loc["saturated", "loo_max_k"] == np.inf
    assert NOTES["loo_inf"] in repr(table)


def test_flag_rules():
    k = np.array([0.1, 0.9, np.inf, 0.2])
    assert loo_flags(k, 0.7, p_loo=1.0) == [
        ("loo_k", "k>0.70 at 2 of 4 (50%)"),
        ("loo_inf", "k=inf at 1/4"),
    ]
    assert loo_flags(np.full(10, 0.1), 0.7, p_loo=11.0)[0] == ("p_loo", "p_loo>N=10")
    # p_loo > p only counts together with large k (loo glossary); exact posteriors sit at ~p
    assert loo_flags(np.full(10, 0.1), 0.7, p_loo=3.2, n_params=3) == []
    assert ("p_loo", "p_loo>p=3") in loo_flags(np.r_[0.9, np.full(9, 0.1)], 0.7, 3.2, 3)
    assert vi_flags(0.69) == [] and vi_flags(float("nan")) == [] and vi_flags(-np.inf) == []
    assert vi_flags(0.7) == [("vi_k", "VI k=0.70>=0.7")]
    assert vi_flags(43.0) == [("vi_k", "VI k=43 beyond range")]
    assert vi_flags(np.inf, point_mass=True)[0][1] == "VI k=inf (point mass)"


def test_format_table_marks_only_affected_columns(fits):
    text = format_table(compare(fits), ["test_lpd", "vi_khat"])
    wide = next(line for line in text.splitlines() if line.startswith("wide"))
    assert wide.count("!") == 1 and wide.rstrip().endswith("!")  # vi_khat, not test_lpd


def test_plots_flag_unreliable_fits(fits):
    import matplotlib.pyplot as plt

    fig = plot_khat(fits)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert any("wide" in t and "100%" in t and "beyond range" in t for t in titles), titles
    assert not any("!" in t for t in titles if t.startswith("exact")), titles
    assert "held-out scores" in "".join(t.get_text() for t in fig.texts)
    plt.close(fig)
    fig = plot_compare(compare(fits))
    labels = " ".join(t.get_text() for ax in fig.axes for t in [*ax.get_yticklabels(), *ax.texts])
    assert "wide !" in labels and "exact !" not in labels
    assert "PSIS-LOO unreliable" in "".join(t.get_text() for t in fig.texts)
    plt.close(fig)


def test_a_failing_fit_gets_its_row_with_the_reason(linreg):
    """One fit that cannot be exported (here a guide whose Hessian is not positive definite,
    as AutoLaplaceApproximation's can be) no longer aborts the table."""

    def broken(x, y=None):
        raise torch.linalg.LinAlgError("the Hessian is not positive definite")

    pair = {"exact": (linreg_model, linreg.guide()), "laplace": (linreg_model, broken)}
    kwargs = dict(x=linreg.x, y=linreg.y, x_test=linreg.x_test, y_test=linreg.y_test)
    with pytest.warns(UserWarning, match=r"fit 'laplace' failed .*not positive definite"):
        table = compare(pair, num_samples=100, **kwargs)
    assert list(table.index) == ["exact", "laplace"]
    assert table.loc["exact", "rank"] == 0 and pd.isna(table.loc["laplace", "rank"])
    assert np.isnan(table.loc["laplace", "elpd_loo"]) and np.isnan(table.loc["laplace", "test_lpd"])
    assert "LinAlgError: the Hessian is not positive definite" == table.loc[
        "laplace", "error"
    ].lstrip("_")
    assert table.loc["exact", "error"] == "" and table.loc["laplace", "flags"] == "failed"
    assert "laplace failed: " in repr(table) and "not positive definite" in repr(table)
    with pytest.raises(torch.linalg.LinAlgError):
        compare(pair, num_samples=100, on_error="raise", **kwargs)
    with pytest.raises(torch.linalg.LinAlgError):  # nothing left to compare
        compare({"laplace": (linreg_model, broken)}, num_samples=100, **kwargs)
    with pytest.raises(ValueError, match="on_error"):
        compare(pair, on_error="skip", **kwargs)
