"""The ArviZ layer on the library's own model and guides (the user's workflow end to end)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    compare,
    fit,
    to_inference_data,
)
from pyro_dropout.diagnostics import _arviz_compat as compat
from pyro_dropout.diagnostics import from_netcdf, to_netcdf

GUIDES = {
    "mc_dropout": lambda m: AutoDropout(m, dropout_rate=0.05),
    "bbb": lambda m: AutoMeanField(m),
    "vd": lambda m: AutoVariationalDropout(m),
}


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(80, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(80, generator=g)
    xt = torch.linspace(-2, 2, 30).unsqueeze(-1)
    yt = torch.sin(2 * xt[:, 0]) + 0.1 * torch.randn(30, generator=g)
    return x, y, xt, yt


@pytest.fixture(scope="module")
def fits(data):
    x, y, xt, yt = data
    model = BayesianMLP(1, 1, hidden=(20,), tau=100.0)  # one model, three guides
    out = {}
    for name, make in GUIDES.items():
        guide = make(model)
        fit(model, guide, x, y, num_steps=300, lr=1e-2, progress=False, seed=1)
        out[name] = to_inference_data(model, guide, x, y, 60, x_test=xt, y_test=yt, seed=2)
    return out


def test_export_groups_dims_and_attrs(fits):
    idata = fits["mc_dropout"]
    post = compat.get_group(idata, "posterior")
    weight = post["net.layers.0.weight"]
    assert weight.sizes["chain"] == 1 and weight.sizes["draw"] == 60
    assert weight.shape[-2:] == (20, 1)
    ll = compat.get_group(idata, "log_likelihood")
    assert ll["obs"].shape == (1, 60, 80)
    attrs = {**compat.root_attrs(idata), **compat.get_group(idata, "posterior").attrs}
    assert attrs["guide_family"] == "mc_dropout"
    assert '"dropout_rate": 0.05' in attrs["guide_config"]


def test_compare_table_for_the_three_guides(fits):
    table = compare(fits)
    assert set(table.index) == set(GUIDES)
    assert np.isfinite(table["elpd_loo"]).all()
    # Held-out scores come from the predictions groups.
    assert np.isfinite(table["test_lpd"]).all() and (table["test_rmse"] < 0.5).all()
    # the k-hat column is the Pareto k of log p(theta, D) - log q(theta), from each export
    for name, d in fits.items():
        stats = compat.get_group(d, "sample_stats")
        log_ratio = (stats["lp"].values - stats["lq"].values).ravel()
        assert table.loc[name, "vi_khat"] == pytest.approx(compat.psis_khat(log_ratio))
    # and these BNN guides are far from the posterior (Yao et al.: k >= 0.7), as the demo finds
    assert (table["vi_khat"] > 0.7).all()


def test_khat_is_not_reported_under_an_improper_prior(data):
    from pyro_dropout import ImproperLogUniform
    from pyro_dropout.diagnostics import vi_diagnostic

    x, y, xt, yt = data
    model = BayesianMLP(1, 1, hidden=(8,), tau=100.0, prior=ImproperLogUniform(), bias_prior=1.0)
    guide = AutoVariationalDropout(model)
    fit(model, guide, x, y, num_steps=20, lr=1e-2, progress=False, seed=1)
    d = to_inference_data(model, guide, x, y, 40, seed=2)
    assert "net.layers.0.weight" in compat.root_attrs(d)["improper_prior_sites"]
    with pytest.warns(UserWarning, match="improper"):
        res = vi_diagnostic(d)
    assert np.isnan(res["khat"]) and res["diagnosis"].startswith("undefined: improper prior")
    with pytest.warns(UserWarning, match="improper"):
        table = compare({"vd": d, "other": fits_without_improper(data)})
    assert np.isnan(table.loc["vd", "vi_khat"]) and np.isfinite(table.loc["other", "vi_khat"])


def fits_without_improper(data):
    x, y, _, _ = data
    model = BayesianMLP(1, 1, hidden=(8,), tau=100.0)
    guide = AutoMeanField(model)
    fit(model, guide, x, y, num_steps=20, lr=1e-2, progress=False, seed=1)
    return to_inference_data(model, guide, x, y, 40, seed=2)


def test_netcdf_round_trip_with_a_guide_fit(fits, tmp_path):
    path = tmp_path / "vd.nc"
    to_netcdf(fits["vd"], path)
    back = from_netcdf(path)
    a = compat.get_group(fits["vd"], "log_likelihood")["obs"].values
    b = compat.get_group(back, "log_likelihood")["obs"].values
    np.testing.assert_array_equal(a, b)
