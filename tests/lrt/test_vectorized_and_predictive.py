"""Vectorised particles and parallel prediction agree with their sequential versions (issue: 6).

* ``TraceMeanField_ELBO(num_particles=P, vectorize_particles=True)`` against
  ``vectorize_particles=False``: same expected loss (two-sample z of the means) and same
  variance (z of the log variance ratio, delta method with the empirical kurtosis; this
  catches particles that share one draw, which would multiply the variance by P), for each
  guide, with and without LRT.
* ``Predictive(parallel=True)`` against ``parallel=False``, and ``pyro_dropout.predict``
  against sequential ``Predictive``: same shapes and the same per-element mean and variance of
  ``_RETURN`` and ``obs``. For one input point the network output has the same distribution
  with and without LRT (LRT is exact jointly over the units of one example, see
  ``test_lrt_moments.py``), so every variant is compared with one reference: sequential
  ``Predictive`` without LRT.

All comparisons: |z| < Z = 5 with SEs from the draws (``_stats.py``).
"""

import contextlib

import pytest
import torch
from pyro.infer import Predictive, TraceMeanField_ELBO

from pyro_dropout import local_reparameterization, predict

from ._models import GUIDES, make_guide, regression_data, small_mlp
from ._stats import Z, log_var_ratio_z, max_abs, mean_z, var_z

P = 4


def _ctx(lrt):
    return local_reparameterization() if lrt else contextlib.nullcontext()


@pytest.mark.slow
@pytest.mark.parametrize("lrt", [False, True], ids=["weights", "lrt"])
@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_vectorized_particles_match_sequential(guide_name, lrt):
    x, y = regression_data(32)
    model = small_mlp()
    guide = make_guide(guide_name, model, x, y)
    reps = 80
    losses = {}
    for vec in (False, True):
        elbo = TraceMeanField_ELBO(num_particles=P, vectorize_particles=vec, max_plate_nesting=1)
        with _ctx(lrt):
            losses[vec] = torch.tensor([elbo.loss(model, guide, x, y) for _ in range(reps)])
    z_mean = float(mean_z(losses[True], losses[False]))
    z_var = log_var_ratio_z(losses[True], losses[False])
    assert abs(z_mean) < Z, f"expected loss differs: z = {z_mean:.2f}"
    assert abs(z_var) < Z, f"loss variance differs: z(log ratio) = {z_var:.2f}"
    assert float(losses[True].std()) > 0  # the estimator is really stochastic here


def _predictive(model, guide, x, s, parallel):
    return Predictive(
        model, guide=guide, num_samples=s, parallel=parallel, return_sites=["_RETURN", "obs"]
    )(x)


@pytest.mark.slow
@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_parallel_predictive_and_predict_match_sequential(guide_name):
    x, y = regression_data(6, out=2)
    x[1] = x[0]  # two identical inputs: tells per-example (LRT) from shared weight noise
    model = small_mlp(out=2)
    guide = make_guide(guide_name, model, x, y)
    s = 300
    with torch.no_grad():
        ref = _predictive(model, guide, x, s, parallel=False)
        variants = {}
        for lrt in (False, True):
            with _ctx(lrt):
                if lrt:
                    variants["sequential+lrt"] = _predictive(model, guide, x, s, parallel=False)
                variants[f"parallel{'+lrt' * lrt}"] = _predictive(model, guide, x, s, parallel=True)
            variants[f"predict{'+lrt' * lrt}"] = {
                "_RETURN": predict(
                    model, guide, x, num_samples=s, local_reparameterization=lrt
                ).samples
            }
    assert ref["_RETURN"].shape == ref["obs"].shape == (s, 6, 2)
    for name, out in variants.items():
        lrt = name.endswith("+lrt")
        for site, value in out.items():
            assert value.shape == ref[site].shape, f"{name}/{site}: shape {tuple(value.shape)}"
            zm = max_abs(mean_z(value, ref[site]))
            zv = max_abs(var_z(value, ref[site]))
            assert max(zm, zv) < Z, f"{name}/{site}: max |z| mean {zm:.2f}, variance {zv:.2f}"
        f = out["_RETURN"]
        # Weight sampling: one draw per sample, so identical inputs give identical outputs;
        # LRT: independent noise per example, so they differ (the messenger intercepted).
        same = torch.equal(f[:, 0], f[:, 1])
        assert same != lrt, f"{name}: identical inputs {'differ' if not same else 'coincide'}"
    assert torch.equal(ref["_RETURN"][:, 0], ref["_RETURN"][:, 1])


def test_particle_variance_check_has_power():
    """Control: a P-fold variance change (what particles sharing one draw would cause) is
    rejected by the same variance check with the same number of repeats."""
    x, y = regression_data(32)
    model = small_mlp()
    guide = make_guide("dropout", model, x, y)
    reps = 80
    vec = TraceMeanField_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)
    one = TraceMeanField_ELBO(num_particles=1, max_plate_nesting=1)
    with local_reparameterization():
        a = torch.tensor([vec.loss(model, guide, x, y) for _ in range(reps)])
        b = torch.tensor([one.loss(model, guide, x, y) for _ in range(reps)])
    z = log_var_ratio_z(a, b)
    assert z < -Z, f"a {P}x variance ratio was not detected: z = {z:.2f}"
