r"""MC dropout *is* AutoDropout: the ELBO gradient equals the dropout objective's (issue: 3).

Gal & Ghahramani (2016), eq. (1): standard dropout minimises

.. math::

    E = \frac{1}{2N} \sum_n \|y_n - \hat y_n\|^2 + λ_W \sum_i \|M_i\|^2 + λ_b \sum_i \|b_i\|^2

with ``ŷ`` computed with dropout masks on the layer inputs. With AutoDropout (drop rate p,
slab σ → 0), the prior ``N(0, l^{-2})`` on weights and biases and the Gaussian likelihood of
precision τ, the ELBO loss is

.. math::

    \mathcal L = \frac{τ}{2} \sum_n \|y_n - \hat y_n\|^2
      + \sum_i \Big[\frac{(1-p)\,l^2}{2}\|M_i\|^2 + \frac{l^2}{2}\|b_i\|^2\Big] + \text{const},

(the σ-dependent parts of the KL do not depend on M or b), so
``∇_M 𝓛 = Nτ · ∇_M E`` exactly when ``λ_W = (1-p) l² / (2Nτ)`` (``gal_weight_decay``) and
``λ_b = l² / (2Nτ) = λ_W / (1-p)``: the bias is never dropped, so its KL has no (1-p) factor.

"The same masks": the masks the library draws are recorded by intercepting ``torch.rand``
with a ``TorchFunctionMode`` (no monkeypatching): without LRT one mask per weight column,
shared by the whole batch (``BernoulliMaskedNormal.sample_mask``); under
``local_reparameterization()`` one mask per example and input unit (standard dropout).

Tolerance: the only difference between the two sides is the slab noise σ ε, which moves each
pre-activation by ~σ‖x‖ against residuals of order 0.5, so the gradient error is O(σ). It is
measured relative to the whole gradient (all parameters together; a single site's gradient can
be nearly zero, e.g. 0.2 against 20 for the others): over 24 seeds/settings at σ = 1e-4 it
was 1e-4 to 1e-3 (≤ 10 σ), at σ = 1e-5 ten times less (float32 rounding is ~1e-6).
``rtol = 30 σ`` leaves a 3× margin and, at σ = 1e-5, checks that the error really vanishes
with σ. Power: at σ = 1e-5 a wrong factor (1-p), λ_b = λ_W, or no weight decay must each be
off by more than 4 · rtol (measured ≥ 1.3e-2 = 40 · rtol).
"""

import contextlib

import pytest
import torch
from pyro.infer import TraceMeanField_ELBO
from torch.overrides import TorchFunctionMode

from pyro_dropout import AutoDropout, BayesianMLP, gal_weight_decay, local_reparameterization

from ._models import regression_data

N, D, H = 32, 3, 6
TAU, LENGTH_SCALE, P = 2.0, 2.0, 0.3
SITES = ("net.layers.0", "net.layers.1")


class RecordRand(TorchFunctionMode):
    """Records the output of every ``torch.rand`` call made while active."""

    def __init__(self):
        super().__init__()
        self.draws = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.rand:
            self.draws.append(out.clone())  # the LRT rule turns its draw into a mask in place
        return out


def _setup(sigma):
    x, y = regression_data(N, d=D, seed=1)
    model = BayesianMLP(D, 1, hidden=(H,), tau=TAU, prior=1.0 / LENGTH_SCALE)
    guide = AutoDropout(model, dropout_rate=P, input_dropout_rate=P, scale=sigma)
    guide(x, y)
    params = {}
    g = torch.Generator().manual_seed(3)
    for name, value in guide.named_parameters():
        key = name.removeprefix("locs.").removesuffix("_unconstrained")
        if key.endswith("bias"):
            with torch.no_grad():
                value.copy_(0.5 * torch.randn(value.shape, generator=g))  # non-zero biases
        params[key] = value
    return x, y, model, guide, params


def _dropout_objective(params, x, y, z0, z1, lam_w, lam_b):
    """Gal's eq. (1) with masks z0 (on x) and z1 (on the hidden units), weights M, biases b."""
    m0, b0 = params["net.layers.0.weight"], params["net.layers.0.bias"]
    m1, b1 = params["net.layers.1.weight"], params["net.layers.1.bias"]
    h = torch.relu((x * z0) @ m0.T + b0)
    y_hat = ((h * z1) @ m1.T + b1).squeeze(-1)
    sq = 0.5 * ((y - y_hat) ** 2).sum() / N
    decay = lam_w * (m0.pow(2).sum() + m1.pow(2).sum()) + lam_b * (
        b0.pow(2).sum() + b1.pow(2).sum()
    )
    return sq + decay


def _grads(loss, params):
    names = sorted(params)
    return dict(zip(names, torch.autograd.grad(loss, [params[k] for k in names]), strict=True))


def _rel_err(a, b):
    """``‖a - b‖ / ‖b‖`` over all parameters together."""
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in b)
    den = sum(float(b[k].pow(2).sum()) for k in b)
    return (num / den) ** 0.5


@pytest.mark.parametrize("sigma", [1e-4, 1e-5])
@pytest.mark.parametrize("lrt", [False, True], ids=["weight_masks", "lrt_per_example_masks"])
def test_elbo_gradient_is_scaled_dropout_gradient(lrt, sigma):
    rtol = 30 * sigma
    x, y, model, guide, params = _setup(sigma)
    keep = 1.0 - torch.tensor(P)
    elbo = TraceMeanField_ELBO(max_plate_nesting=1)
    # Draw until both layers' masks drop some and keep some units (with 3 inputs all are kept
    # with probability 0.7³ ≈ 0.34), so that the masks matter; deterministic given the seed.
    for _ in range(50):
        ctx = local_reparameterization() if lrt else contextlib.nullcontext()
        with ctx, RecordRand() as rec:
            loss = elbo.differentiable_loss(model, guide, x, y)
        # Which uniforms became masks: the guide's column masks (1, in) are always drawn;
        # under LRT the rule draws one (N, in) mask per layer and the weights' are unused.
        shapes = [tuple(u.shape) for u in rec.draws]
        want = [(1, D), (1, H)] + ([(N, D), (N, H)] if lrt else [])
        assert shapes == want, f"unexpected torch.rand calls {shapes}"
        z0, z1 = ((u < keep).float() for u in rec.draws[-2:])
        if 0 < z0.mean() < 1 and 0 < z1.mean() < 1:
            break
    else:
        pytest.fail("no draw with non-trivial masks in 50 tries")
    g_elbo = _grads(loss, params)
    if lrt:
        # Per-example masks really differ between examples (standard dropout).
        assert not torch.equal(z0, z0[:1].expand_as(z0))

    lam_w = gal_weight_decay(LENGTH_SCALE, P, N, TAU)
    assert lam_w == pytest.approx((1 - P) * LENGTH_SCALE**2 / (2 * N * TAU))
    lam_b = lam_w / (1 - P)
    g_drop = _grads(_dropout_objective(params, x, y, z0, z1, lam_w, lam_b), params)
    scaled = {k: N * TAU * v for k, v in g_drop.items()}

    err = _rel_err(g_elbo, scaled)
    assert err < rtol, (
        f"ELBO gradient ≠ Nτ · dropout gradient: relative error {err:.2e} (rtol {rtol:.0e})"
    )

    if sigma > 1e-5:
        return

    # The comparison has power: the wrong constant factor, the same decay on biases as on
    # weights (λ_b = λ_W), or no weight decay at all are all rejected by a wide margin.
    def scaled_grads(lw, lb):
        return {
            k: N * TAU * v
            for k, v in _grads(_dropout_objective(params, x, y, z0, z1, lw, lb), params).items()
        }

    wrong = {
        "factor 1-p": {k: (1 - P) * v for k, v in scaled.items()},
        "λ_b = λ_W": scaled_grads(lam_w, lam_w),
        "no weight decay": scaled_grads(0.0, 0.0),
    }
    for what, g in wrong.items():
        err_wrong = _rel_err(g_elbo, g)
        assert err_wrong > 4 * rtol, f"the check cannot tell {what}: error {err_wrong:.1e}"
