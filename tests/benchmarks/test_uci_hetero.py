"""The UCI benchmark's "<guide>-hetero" configurations (issue 24, item 3): heteroscedastic
outputs and a learned prior scale in the batched-members model, and their test LL (the
mixture over draws of the predicted Gaussians)."""

import math

import pytest
import torch

from pyro_dropout.benchmarks import uci_model

from .test_uci_quick import _tiny_batched_fit, data_dir, one_thread  # noqa: F401

HETERO = tuple(uci_model.HETERO_BASE)


def test_grids_have_no_tau_axis():
    rates, taus = [0.005, 0.01, 0.05, 0.1], [0.25, 0.5, 1.0]
    assert uci_model.grid("dropout-hetero", rates, taus) == [
        {"dropout_rate": p, "noise": "heteroscedastic"} for p in rates
    ]
    for g in ("concrete-hetero", "meanfield-hetero", "vd-hetero"):
        assert uci_model.grid(g, rates, taus) == [{"noise": "heteroscedastic"}]


@pytest.mark.parametrize("guide", HETERO)
def test_hetero_members_learn_their_own_prior_scales_and_noise(data_dir, guide):  # noqa: F811
    model, g, eval_tau, (xt, yt, mean, std), per = _tiny_batched_fit(data_dir, guide)
    m = model.members
    assert model.heteroscedastic and model.layers[1].out_features == 2
    med = g.median()
    for layer in ("layers.0", "layers.1"):
        s = med[f"{layer}.weight_prior_scale"]
        assert s.shape == (m, 1) and (s > 0).all()
        w = g.get_distributions()[f"{layer}.weight"]
        torch.testing.assert_close(s, (w.variance + w.mean**2).mean((-2, -1)).sqrt())
    assert torch.isnan(eval_tau()).all()  # no τ: each draw carries its own scale
    ev = uci_model.evaluate(model, g, xt, yt, per, mean, std, eval_tau(), 50, keep_samples=True)
    assert ev.samples.shape == (50, m, yt.shape[1])
    assert torch.isfinite(ev.ll).all() and torch.isfinite(ev.rmse).all()
    assert torch.isfinite(ev.rmse_mean_weights).all()


def test_hetero_ll_is_the_mixture_of_the_drawn_gaussians(data_dir, monkeypatch):  # noqa: F811
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
