"""VI k-hat of Yao et al. (2018): PSIS sign, exact vs bad guides, point masses, edge cases."""

from __future__ import annotations

import numpy as np
import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoDelta, AutoNormal
from torch.distributions import transform_to

from pyro_dropout.diagnostics import (
    _arviz_compat as compat,
)
from pyro_dropout.diagnostics import (
    interpret_vi_khat,
    to_inference_data,
    vi_diagnostic,
    vi_khat,
)

from ._models import linreg_model


@pytest.mark.parametrize("sigma", [1.5, 2.0])
def test_psis_sign_on_a_known_case(sigma):
    """q = N(0, 1), p = N(0, sigma^2): ratios ~ exp(a x^2 / 2), tail index k = 1 - 1/sigma^2."""
    rng = np.random.default_rng(0)
    th = rng.normal(size=8000)
    log_p = -0.5 * th**2 / sigma**2
    log_q = -0.5 * th**2
    k = vi_khat(log_p, log_q)
    assert abs(k - (1 - 1 / sigma**2)) < 0.12
    # the other sign smooths q/p, which is bounded: k well below the truth
    assert vi_khat(log_q, log_p) < 0.0
    assert compat.psis_khat(log_p - log_q) == pytest.approx(k)


def test_exact_guide_has_small_khat(linreg):
    d = to_inference_data(linreg_model, linreg.guide(), linreg.x, linreg.y, 400)
    res = vi_diagnostic(d)
    assert res["khat"] < 0.5
    assert res["diagnosis"].startswith("good")
    assert not res["point_mass"] and res["num_draws"] == 400
    # log p(theta, D) - log q(theta) = log p(D): constant up to rounding for the exact guide
    stats = compat.get_group(d, "sample_stats")
    r = stats["lp"].values - stats["lq"].values
    assert np.ptp(r) < 1e-9


def test_exact_autonormal_guide_has_small_khat(linreg):
    guide = AutoNormal(linreg_model)
    guide(linreg.x, linreg.y)  # create the parameters, then set them to the exact posterior
    with torch.no_grad():
        guide.locs.w_unconstrained.copy_(linreg.post_mean)
        constraint = guide.scales._pyro_params["w"][0]
        guide.scales.w_unconstrained.copy_(transform_to(constraint).inv(linreg.post_sd))
    torch.testing.assert_close(guide.scales.w.detach(), linreg.post_sd)
    d = to_inference_data(linreg_model, guide, linreg.x, linreg.y, 400)
    assert vi_diagnostic(d)["khat"] < 0.5
    w = compat.get_group(d, "posterior")["w"].values[0]
    np.testing.assert_allclose(w.std(0), linreg.post_sd.numpy(), rtol=0.15)


def test_bad_guide_has_large_khat(linreg):
    too_narrow_and_shifted = linreg.guide(scale_factor=0.2, shift_sd=1.5)
    d = to_inference_data(linreg_model, too_narrow_and_shifted, linreg.x, linreg.y, 400)
    res = vi_diagnostic(d)
    assert res["khat"] > 0.7
    assert res["diagnosis"].startswith("unreliable")


def test_wider_guide_is_fine(linreg):
    """Over-dispersed q gives bounded ratios: k-hat small (IS from a wide proposal works)."""
    d = to_inference_data(linreg_model, linreg.guide(scale_factor=1.3), linreg.x, linreg.y, 400)
    assert vi_diagnostic(d)["khat"] < 0.5


def test_point_mass_guide_is_flagged(linreg):
    guide = AutoDelta(linreg_model)
    svi = pyro.infer.SVI(linreg_model, guide, pyro.optim.Adam({"lr": 0.1}), pyro.infer.Trace_ELBO())
    for _ in range(50):
        svi.step(linreg.x, linreg.y)
    d = to_inference_data(linreg_model, guide, linreg.x, linreg.y, 40)
    res = vi_diagnostic(d)
    assert res["point_mass"] and res["khat"] == np.inf
    assert res["diagnosis"].startswith("point mass")


def test_vi_khat_edge_cases():
    rng = np.random.default_rng(1)
    assert np.isnan(vi_khat(rng.normal(size=10), np.zeros(10)))  # too few draws
    assert vi_khat(np.full(50, 3.0), np.zeros(50)) == -np.inf  # perfectly flat weights
    lp = rng.normal(size=50)
    lp[3] = np.nan
    assert vi_khat(lp, np.zeros(50)) == np.inf
    with pytest.raises(ValueError, match="shape"):
        vi_khat(np.zeros(40), np.zeros(41))


def test_interpretation_thresholds():
    assert interpret_vi_khat(0.49).startswith("good")
    assert interpret_vi_khat(0.5).startswith("usable")
    assert interpret_vi_khat(0.69).startswith("usable")
    assert interpret_vi_khat(0.7).startswith("unreliable")
    assert interpret_vi_khat(float("inf")).startswith("unreliable")
    assert interpret_vi_khat(float("nan")).startswith("undefined")
    assert interpret_vi_khat(0.1, point_mass=True).startswith("point mass")


def test_vi_diagnostic_needs_lp_lq(linreg):
    d = to_inference_data(linreg_model, linreg.guide(), linreg.x, linreg.y, 5)
    groups = {n: compat.get_group(d, n) for n in compat.group_names(d)}
    groups["sample_stats"] = groups["sample_stats"].drop_vars("lq")
    with pytest.raises(ValueError, match="lq"):
        vi_diagnostic(compat.build(groups, {}))
