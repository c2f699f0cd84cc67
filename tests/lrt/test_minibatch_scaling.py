"""Minibatches with ``num_data=N`` give an unbiased estimate of the full-data ELBO (issue: 4).

``BayesianModel`` observes a minibatch of B points inside ``pyro.plate("data", N,
subsample=...)``, which scales the likelihood by N/B; averaged over a partition of the data
(or over random minibatches) the subsampled ELBO is then the full-data ELBO, with the KL
counted once. Forgetting ``num_data`` silently shrinks the likelihood by B/N, which each test
also checks is detected.
"""

import contextlib

import pytest
import torch
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO

from pyro_dropout import AutoDropout, AutoMeanField, local_reparameterization

from ._models import GUIDES, make_guide, regression_data, small_mlp
from ._stats import Z, mean_and_se

N, B = 64, 16
K = N // B


def _batches(x, y):
    return [(x[k * B : (k + 1) * B], y[k * B : (k + 1) * B]) for k in range(K)]


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_partition_of_log_joint_sums_to_full_data_for_a_fixed_draw(guide_name):
    """Exact identity for one fixed weight draw (any guide): the mean over a partition of
    the model's scaled log joint equals the full-data log joint. Only float32 rounding
    separates the two sides (relative 1e-6 on sums of ~100 terms of order 1)."""
    x, y = regression_data(N)
    model = small_mlp()
    guide = make_guide(guide_name, model, x, y)
    guide_tr = poutine.trace(guide).get_trace(x, y)

    def log_joint(xb, yb, **kw):
        tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(xb, yb, **kw)
        return float(tr.log_prob_sum().detach()), tr

    full, full_tr = log_joint(x, y)
    scaled = [log_joint(xb, yb, num_data=N) for xb, yb in _batches(x, y)]
    assert all(float(tr.nodes["obs"]["scale"]) == N / B for _, tr in scaled)
    assert float(full_tr.nodes["obs"]["scale"]) == 1.0
    mean_scaled = sum(v for v, _ in scaled) / K
    assert mean_scaled == pytest.approx(full, rel=1e-5, abs=1e-3)

    # Forgetting num_data: each batch believes it is the whole data set.
    prior = float(
        poutine.trace(poutine.replay(poutine.block(model, hide=["obs"]), trace=guide_tr))
        .get_trace(x, y)
        .log_prob_sum()
        .detach()
    )
    unscaled = sum(log_joint(xb, yb)[0] for xb, yb in _batches(x, y)) / K
    assert unscaled == pytest.approx(prior + (B / N) * (full - prior), rel=1e-5, abs=1e-3)
    assert abs(unscaled - full) > 1.0


@pytest.mark.parametrize("lrt", [False, True], ids=["weights", "lrt"])
def test_minibatch_elbo_loss_averages_to_full_loss_deterministic_guide(lrt):
    """``TraceMeanField_ELBO().loss`` itself, with a guide of scale 1e-6 so that a loss is
    deterministic up to ~1e-4 (measured std 7e-5 on a loss of ~600, i.e. float32 rounding).
    Tolerance: 5 SE of the difference, with the SEs measured from repeats, floored at a few
    float32 ulps of the loss."""
    x, y = regression_data(N)
    model = small_mlp()
    guide = AutoMeanField(model, init_scale=1e-6)
    guide(x, y)
    elbo = TraceMeanField_ELBO(max_plate_nesting=1)
    reps = 4
    ctx = local_reparameterization() if lrt else contextlib.nullcontext()
    with ctx:
        full = torch.tensor([elbo.loss(model, guide, x, y) for _ in range(reps)])
        parts = torch.tensor(
            [
                [elbo.loss(model, guide, xb, yb, num_data=N) for xb, yb in _batches(x, y)]
                for _ in range(reps)
            ]
        ).mean(1)
        unscaled = torch.tensor([elbo.loss(model, guide, xb, yb) for xb, yb in _batches(x, y)])
        kl = elbo.loss(poutine.block(model, hide=["obs"]), guide, x, y)
    m_full, se_full = mean_and_se(full)
    m_parts, se_parts = mean_and_se(parts)
    ulp = 4 * torch.finfo(torch.float32).eps * abs(float(m_full))
    tol = Z * float((se_full**2 + se_parts**2).sqrt()) + ulp
    assert abs(float(m_parts - m_full)) < tol, (
        f"mean minibatch loss {float(m_parts):.5f} vs full-data loss {float(m_full):.5f} "
        f"(tol {tol:.2e})"
    )
    # Forgetting num_data gives KL + (B/N)·(full - KL), far outside the tolerance.
    wrong = float(unscaled.mean())
    assert wrong == pytest.approx(kl + (B / N) * (float(m_full) - kl), abs=10 * tol + 1e-3)
    assert abs(wrong - float(m_full)) > 1000 * tol


@pytest.mark.slow
@pytest.mark.parametrize("lrt", [False, True], ids=["weights", "lrt"])
def test_random_minibatch_elbo_is_unbiased_with_noisy_guide(lrt):
    """Monte Carlo: random minibatches (a fresh random subset each time) and fresh draws from
    a noisy AutoDropout guide (p = 0.3) against full-data loss draws; the two means must agree
    within 5 SE of their difference (SEs from the draws). The same comparison rejects the
    num_data-less estimator."""
    x, y = regression_data(N)
    model = small_mlp()
    guide = AutoDropout(model, dropout_rate=0.3, scale=0.05)
    guide(x, y)
    elbo = TraceMeanField_ELBO(max_plate_nesting=1)
    reps = 120
    ctx = local_reparameterization() if lrt else contextlib.nullcontext()
    full, mini, wrong = [], [], []
    g = torch.Generator().manual_seed(5)
    with ctx:
        for _ in range(reps):
            full.append(elbo.loss(model, guide, x, y))
            idx = torch.randperm(N, generator=g)[:B]
            mini.append(elbo.loss(model, guide, x[idx], y[idx], num_data=N))
            wrong.append(elbo.loss(model, guide, x[idx], y[idx]))
    (m_f, s_f), (m_m, s_m), (m_w, s_w) = (mean_and_se(torch.tensor(v)) for v in (full, mini, wrong))
    z = float((m_m - m_f) / (s_m**2 + s_f**2).sqrt())
    assert abs(z) < Z, f"minibatch ELBO biased: {float(m_m):.3f} vs {float(m_f):.3f} (z = {z:.2f})"
    z_wrong = float((m_w - m_f) / (s_w**2 + s_f**2).sqrt())
    assert abs(z_wrong) > 4 * Z, f"forgetting num_data not detected (z = {z_wrong:.2f})"
