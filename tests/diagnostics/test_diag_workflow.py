"""The Bayesian workflow around a fit (issue 25): prior and prior predictive groups, ArviZ's
own predictive checks on the export (regression and classification, both ArviZ lines),
LOO-PIT and its KS distance in ``compare``."""

from __future__ import annotations

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

import pyro_dropout as pdo
from pyro_dropout.diagnostics import (
    IS_ARVIZ_1,
    add_prior,
    compare,
    from_netcdf,
    ks_uniform,
    loo_pit,
    loo_pit_ks,
    plot_ppc_grid,
    plot_prior_functions,
    prior_contraction,
    to_inference_data,
    to_netcdf,
)
from pyro_dropout.diagnostics import _arviz_compat as compat
from pyro_dropout.diagnostics.sampling import find_obs_site

from ._models import SIGMA, categorical_model, linreg_model, normal_guide
from .test_diag_plots import assert_png

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=FutureWarning)
    import arviz as az


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def reg_fit(linreg):
    guide = linreg.guide()
    return to_inference_data(
        linreg_model, guide, linreg.x, linreg.y, 300, linreg.x_test, linreg.y_test, prior=True
    )


@pytest.fixture
def cls_fit(classif):
    guide = normal_guide("W", classif["W"], 0.2 * torch.ones(3, 2), event_dim=2)
    return to_inference_data(
        categorical_model,
        guide,
        classif["x"],
        classif["y"],
        200,
        classif["x_test"],
        classif["y_test"],
        prior=True,
    )


# --------------------------------------------------------------------------------------------
# Prior and prior predictive groups
# --------------------------------------------------------------------------------------------
def test_prior_groups_are_draws_from_the_model_prior(linreg, tmp_path):
    data = to_inference_data(
        linreg_model, linreg.guide(), linreg.x, linreg.y, 2000, prior=True, seed=0
    )
    assert {"prior", "prior_predictive"} <= set(compat.group_names(data))
    w = compat.get_group(data, "prior")["w"].values[0]  # (S, 3) from N(0, I)
    assert w.shape == (2000, 3)
    np.testing.assert_allclose(w.mean(0), 0.0, atol=0.08)
    np.testing.assert_allclose(w.std(0), 1.0, atol=0.06)
    pp = compat.get_group(data, "prior_predictive")
    # obs_mean is the function of each prior draw; obs scatters around it with sd SIGMA
    x = linreg.x.numpy()
    np.testing.assert_allclose(pp["obs_mean"].values[0], w @ x.T, rtol=1e-10, atol=1e-10)
    resid = pp["obs"].values[0] - pp["obs_mean"].values[0]
    assert abs(resid.std() - SIGMA) < 0.01
    assert pp["obs"].dims == ("chain", "draw", "obs_id")
    back = from_netcdf(to_netcdf(data, tmp_path / "fit.nc"))
    np.testing.assert_array_equal(compat.get_group(back, "prior")["w"].values[0], w)


def test_prior_of_a_library_network_and_prior_contraction():
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 40)[:, None]
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(40)
    model = pdo.BayesianMLP(1, 1, hidden=(16,), tau=100.0, prior=0.5)
    guide = pdo.AutoMeanField(model)
    pdo.fit(model, guide, x, y, num_steps=300, lr=0.02, progress=False, seed=0)
    data = to_inference_data(model, guide, x, y, 300, prior=True, seed=1)
    w = compat.get_group(data, "prior")["net.layers.0.weight"].values
    assert w.shape == (1, 300, 16, 1)
    assert abs(w.std() - 0.5) < 0.03  # prior=0.5: N(0, 0.5^2) on every weight
    c = prior_contraction(data)
    assert 0.5 < c <= 1.0  # 40 points narrow the function a lot
    no_prior = to_inference_data(model, guide, x, y, 50)
    assert np.isnan(prior_contraction(no_prior))
    # the network stores its target as (obs_id, obs_dim_0): ArviZ 0.23's plot_loo_pit wants
    # one value per observation, which plot_ppc_grid arranges
    assert compat.get_group(data, "observed_data")["obs"].dims == ("obs_id", "obs_dim_0")
    fig = plot_ppc_grid({"mf": data})
    assert any("loo_pit (KS" in ax.get_title() for ax in fig.axes)
    u = loo_pit(data)
    assert u.shape == (40,)


def test_improper_prior_has_no_prior_predictive():
    x, y = torch.randn(10, 2), torch.randn(10)
    model = pdo.BayesianMLP(2, 1, hidden=(4,), tau=1.0, prior=pdo.ImproperLogUniform())
    with pytest.raises(ValueError, match="improper prior"):
        to_inference_data(model, None, x, y, 30, prior=True)


def test_add_prior_to_mcmc_style_draws(linreg):
    draws = {"w": linreg.post_mean + linreg.post_sd * torch.randn(100, 3)}
    # all the MCMC draws are exported; num_samples is the number of prior draws
    data = to_inference_data(linreg_model, draws, linreg.x, linreg.y, 50, prior=True)
    assert compat.get_group(data, "posterior")["w"].shape[-2:] == (100, 3)
    assert compat.get_group(data, "prior")["w"].shape == (1, 50, 3)
    add_prior(data, linreg_model, linreg.x, linreg.y, 20, seed=0)  # replaced, not added twice
    assert compat.get_group(data, "prior_predictive")["obs"].shape == (1, 20, 60)


def test_find_obs_site():
    x = torch.randn(5, 2, dtype=torch.float64)
    assert find_obs_site(linreg_model, x) == "obs"
    assert find_obs_site(pdo.BayesianMLP(2, 1, hidden=(3,), tau=1.0).double(), x) == "obs"
    assert find_obs_site(categorical_model, x) == "obs"


# --------------------------------------------------------------------------------------------
# ArviZ's own predictive checks run on the export
# --------------------------------------------------------------------------------------------
def _arviz_checks(data, discrete):
    """Every ArviZ predictive check of the installed line on ``data``, with the prior's."""
    if IS_ARVIZ_1:
        import arviz_plots as azp

        ppc = azp.plot_ppc_rootogram if discrete else azp.plot_ppc_dist
        kw = {"var_names": ["obs"], "backend": "matplotlib"}
        with compat._arviz1_internal_warnings():
            pcs = [
                ppc(data, **kw),
                ppc(data, group="prior_predictive", **kw),
                azp.plot_loo_pit(data, **kw),
                azp.plot_ppc_pit(data, **kw),
                azp.plot_ppc_tstat(data, **kw),
            ]
        return [pc.get_viz("figure") for pc in pcs]
    with compat._arviz023_internal_deprecations():
        axes = [
            az.plot_ppc(data, var_names=["obs"], show=False),
            az.plot_ppc(data, var_names=["obs"], group="prior", show=False),
            az.plot_loo_pit(data, y="obs", show=False),
            az.plot_loo_pit(data, y="obs", ecdf=True, show=False),
            az.plot_bpv(data, var_names=["obs"], show=False),
            az.plot_bpv(data, var_names=["obs"], kind="t_stat", show=False),
        ]
    return [np.ravel(a)[0].figure for a in axes]


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_arviz_predictive_plots_run_on_the_export(task, reg_fit, cls_fit, tmp_path):
    data = reg_fit if task == "regression" else cls_fit
    figs = _arviz_checks(data, discrete=task == "classification")
    assert len(figs) >= 5
    for i, fig in enumerate(figs):
        fig.savefig(tmp_path / f"{i}.png", dpi=60)
        assert_png(tmp_path / f"{i}.png")


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_plot_ppc_grid(task, reg_fit, cls_fit, tmp_path):
    data = reg_fit if task == "regression" else cls_fit
    fig = plot_ppc_grid({"a": data, "b": data}, path=tmp_path / "ppc.png")
    assert isinstance(fig, Figure) and len(fig.axes) >= 6
    assert_png(tmp_path / "ppc.png")
    assert any("loo_pit (KS" in ax.get_title() for ax in fig.axes)
    with pytest.raises(ValueError, match="kinds"):
        plot_ppc_grid(data, kinds=("nope",))


def test_plot_prior_functions(reg_fit, cls_fit, tmp_path):
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 25, dtype=torch.float64)[:, None]
    y = 1.5 * x[:, 0] + 0.5 * torch.randn(25, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    curve = to_inference_data(linreg_model, normal_guide("w", 1.5 * one, 0.1 * one), x, y, 100)
    with pytest.raises(ValueError, match="prior_predictive"):
        plot_prior_functions(curve)
    add_prior(curve, linreg_model, x, y, 100, seed=0)
    fig = plot_prior_functions(
        {"1-D": curve, "3-D": reg_fit, "classes": cls_fit}, path=tmp_path / "prior.png"
    )
    assert_png(tmp_path / "prior.png")
    lines = fig.axes[0].get_lines()
    assert len(lines) == 30  # num_draws function draws over the 1-D input
    assert "prior" in fig.axes[1].get_title() and "prior" in fig.axes[2].get_title()


# --------------------------------------------------------------------------------------------
# LOO-PIT as a number
# --------------------------------------------------------------------------------------------
def test_loo_pit_is_arviz_loo_pit(reg_fit):
    ours = loo_pit(reg_fit)
    if IS_ARVIZ_1:
        theirs = az.loo_pit(reg_fit, var_names=["obs"])["obs"].values
    else:
        theirs = az.loo_pit(reg_fit, y="obs")
    np.testing.assert_allclose(ours, np.ravel(theirs), atol=1e-12)


def _noise_fit(noise, n=200):
    """y = x w + noise * eps fitted with the model's noise SIGMA = 0.5 and the exact posterior."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    y = 1.0 * x[:, 0] + noise * torch.randn(n, generator=g, dtype=torch.float64)
    prec = 1.0 + float(x[:, 0] @ x[:, 0]) / SIGMA**2
    mean = float(x[:, 0] @ y) / SIGMA**2 / prec
    one = torch.ones(1, dtype=torch.float64)
    guide = normal_guide("w", mean * one, prec**-0.5 * one)
    return to_inference_data(linreg_model, guide, x, y, 400, seed=0)


def test_loo_pit_ks_separates_calibrated_from_misspecified():
    n = 200
    good, narrow, wide = _noise_fit(0.5, n), _noise_fit(1.5, n), _noise_fit(0.1, n)
    bound = 1.63 / np.sqrt(n)  # 99 % KS quantile for independent uniforms
    assert loo_pit_ks(good) < bound
    assert loo_pit_ks(narrow) > 2 * bound  # noise 3x the model's: U-shaped PIT
    assert loo_pit_ks(wide) > 2 * bound  # noise 1/5 of the model's: PIT bunched at 1/2
    u = loo_pit(narrow)
    assert np.mean((u < 0.1) | (u > 0.9)) > 0.4


def test_randomised_loo_pit_for_classes(classif, cls_fit):
    u = loo_pit(cls_fit, seed=0)
    assert u.shape == (80,) and np.all((u >= 0) & (u <= 1))
    assert not np.allclose(u, loo_pit(cls_fit, seed=1))  # randomised within each class
    assert loo_pit_ks(cls_fit) < 1.63 / np.sqrt(80)  # labels drawn from near this model
    confident = to_inference_data(
        categorical_model,
        normal_guide("W", -3 * classif["W"], 0.01 * torch.ones(3, 2), event_dim=2),
        classif["x"],
        classif["y"],
        200,
    )
    assert loo_pit_ks(confident) > 0.3  # confidently wrong: PIT far from uniform


def test_ks_uniform():
    rng = np.random.default_rng(0)
    assert ks_uniform(rng.uniform(size=2000)) < 0.04
    assert ks_uniform(rng.beta(0.3, 0.3, size=2000)) > 0.15
    assert np.isnan(ks_uniform(np.array([])))


# --------------------------------------------------------------------------------------------
# compare: loo_pit_ks, prior=True
# --------------------------------------------------------------------------------------------
def test_compare_loo_pit_ks_and_prior(linreg):
    pairs = {
        "exact": (linreg_model, linreg.guide()),
        "narrow": (linreg_model, linreg.guide(scale_factor=0.2)),
    }
    kw = {"x": linreg.x, "y": linreg.y, "x_test": linreg.x_test, "y_test": linreg.y_test}
    table = compare(pairs, num_samples=200, **kw)
    assert "loo_pit_ks" in table and "fn_contraction" not in table
    cols = list(table.columns)
    assert cols.index("test_cov95") < cols.index("loo_pit_ks") < cols.index("family")
    assert table["loo_pit_ks"].between(0, 1).all()
    with_prior = compare(pairs, num_samples=200, prior=True, **kw)
    assert with_prior.loc["exact", "fn_contraction"] > 0.9
    # the narrow guide contracts further than the exact posterior
    assert with_prior.loc["narrow", "fn_contraction"] > with_prior.loc["exact", "fn_contraction"]
    exported = {k: to_inference_data(*v, linreg.x, linreg.y, 100) for k, v in pairs.items()}
    with pytest.raises(ValueError, match="prior=True"):
        compare(exported, prior=True)


def test_compare_prior_with_an_ensemble(linreg):
    members = [(linreg_model, linreg.guide(scale_factor=0.01, shift_sd=s)) for s in (-1, 0, 1)]
    table = compare(
        {"ens": members, "exact": (linreg_model, linreg.guide())},
        x=linreg.x,
        y=linreg.y,
        num_samples=90,
        prior=True,
    )
    assert np.isfinite(table["fn_contraction"]).all()


def test_prior_only_export_before_any_fit(tmp_path):
    """guide=None, prior=True: the prior predictive check before fitting, on a network whose
    N(0, 1) prior implies functions far larger than the data, and a fan-in-scaled one."""
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 40, dtype=torch.float64)[:, None]
    y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(40, dtype=torch.float64)
    wide = pdo.BayesianMLP(1, 1, hidden=(50,), activation="tanh", tau=25.0).double()
    data = to_inference_data(wide, None, x, y, 200, prior=True, seed=0)
    assert set(compat.group_names(data)) == {
        "prior",
        "prior_predictive",
        "observed_data",
        "constant_data",
    }
    f_sd = compat.get_group(data, "prior_predictive")["obs_mean"].values.std()
    assert f_sd > 3 * float(y.std())  # the prior's functions dwarf the data
    fig = plot_prior_functions(data, path=tmp_path / "prior.png")
    assert_png(tmp_path / "prior.png")
    assert "prior" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="prior=True"):
        to_inference_data(wide, None, x, y, 10)
