"""The UCI benchmark's "<guide>-hetero" configurations (issue 24, item 3): heteroscedastic
outputs and a learned prior scale in the batched-members model, and their test LL (the
mixture over draws of the predicted Gaussians)."""

import math

import pytest
import torch

from benchmarks import uci_model

from .test_uci_quick import _tiny_batched_fit

pytestmark = pytest.mark.usefixtures("one_thread")

HETERO = tuple(uci_model.HETERO_BASE)


def test_grids_have_no_tau_axis():
    rates, taus = [0.005, 0.01, 0.05, 0.1], [0.25, 0.5, 1.0]
    assert uci_model.grid("dropout-hetero", rates, taus) == [
        {"dropout_rate": p, "noise": "heteroscedastic"} for p in rates
    ]
    for g in ("concrete-hetero", "meanfield-hetero", "vd-hetero"):
        assert uci_model.grid(g, rates, taus) == [{"noise": "heteroscedastic"}]


@pytest.mark.parametrize("guide", HETERO)
def test_hetero_members_learn_their_own_prior_scales_and_noise(data_dir, guide):
    model, g, eval_tau, (xt, yt, mean, std), per = _tiny_batched_fit(data_dir, guide)
    m = model.members
    assert model.heteroscedastic and model.layers[1].out_features == 2
    med = g.median()
    if uci_model.HETERO_BASE[guide] in ("dropout", "concrete"):
        # the MC-dropout families keep their base guide's fixed prior (see the next test)
        assert not any(k.endswith("prior_scale") for k in med)
        import pyro.poutine as poutine

        tr = poutine.trace(model).get_trace(xt[:, :4].repeat_interleave(per, 0))
        prior = tr.nodes["layers.0.weight"]["fn"]
        assert torch.allclose(prior.stddev, torch.tensor(1.0 / uci_model.LENGTH_SCALE))
    for layer in ("layers.0", "layers.1") if "prior_scale" in str(list(med)) else ():
        s = med[f"{layer}.weight_prior_scale"]
        assert s.shape == (m, 1) and (s > 0).all()
        w = g.get_distributions()[f"{layer}.weight"]
        torch.testing.assert_close(s, (w.variance + w.mean**2).mean((-2, -1)).sqrt())
    assert torch.isnan(eval_tau()).all()  # no τ: each draw carries its own scale
    ev = uci_model.evaluate(model, g, xt, yt, per, mean, std, eval_tau(), 50, keep_samples=True)
    assert ev.samples.shape == (50, m, yt.shape[1])
    assert torch.isfinite(ev.ll).all() and torch.isfinite(ev.rmse).all()
    assert torch.isfinite(ev.rmse_mean_weights).all()


@pytest.mark.parametrize("fixed_sd", [True, False])
def test_learned_prior_under_a_fixed_slab_rewards_shrinking_the_first_layer(fixed_sd):
    """Why the MC-dropout "-hetero" configurations keep a fixed prior: with the posterior SD
    fixed at the slab, the profiled KL (each layer against N(0, s²), s² = mean E_q[w²]) falls
    when ReLU rescaling moves the first layer (8·50 weights) down and the second (50·2) up,
    which leaves the network's function alone; with learned posterior SDs (scaled with the
    means, as mean-field can) it does not change."""
    from pyro.distributions import Normal
    from torch.distributions import kl_divergence

    from pyro_dropout.distributions import BernoulliMaskedNormal

    g = torch.Generator().manual_seed(0)
    m1, m2 = torch.randn(50, 8, generator=g) * 0.3, torch.randn(2, 50, generator=g) * 0.3

    def layer_kl(mean, sd):
        if fixed_sd:
            q = BernoulliMaskedNormal(mean, torch.full_like(mean, sd), torch.tensor(0.05))
        else:
            q = Normal(mean, sd)
        s = (q.variance + q.mean**2).mean().sqrt()
        p = Normal(torch.zeros_like(mean), s).to_event(2 if fixed_sd else 0)
        return kl_divergence(q, p).sum()

    def total(c):
        if fixed_sd:
            return layer_kl(m1 * c, 1e-4) + layer_kl(m2 / c, 1e-4)
        return layer_kl(m1 * c, 0.05 * c) + layer_kl(m2 / c, 0.05 / c)

    drop = float(total(1.0) - total(1e-3))
    if fixed_sd:
        assert drop > 1000  # (K1 - K2) log(1000) ≈ 2000 nats to gain
    else:
        assert abs(drop) < 1e-2


def test_hetero_ll_is_the_mixture_of_the_drawn_gaussians(data_dir, monkeypatch):
    """evaluate's LL against logsumexp_t log N(y; μ_t, σ_t) − log T from the same draws,
    captured from the draw function (original scale: μ·sd + mean, σ·sd)."""
    model, g, eval_tau, (xt, yt, mean, std), per = _tiny_batched_fit(data_dir, "meanfield-hetero")
    captured = []
    call = uci_model._Draw.__call__

    def spy(self, x, c, rows):
        out = call(self, x, c, rows)
        captured.append(out.double())
        return out

    monkeypatch.setattr(uci_model._Draw, "__call__", spy)
    ev = uci_model.evaluate(model, g, xt, yt, per, mean, std, eval_tau(), 40, jit=False)
    out = torch.cat(captured, 0)  # (T, M, N, 2)
    sd, mu = std.double().reshape(-1, 1), mean.double().reshape(-1, 1)
    loc, scale = out[..., 0] * sd + mu, out[..., 1] * sd
    y = yt.double().repeat_interleave(per, 0)
    log_n = -0.5 * ((y - loc) / scale) ** 2 - scale.log() - 0.5 * math.log(2 * math.pi)
    expected = (torch.logsumexp(log_n, 0) - math.log(out.shape[0])).mean(-1)
    torch.testing.assert_close(ev.ll, expected)
