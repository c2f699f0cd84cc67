"""The local-reparameterisation rule of ConcreteMaskedNormal (Concrete dropout).

Per-example masks on the layer input, relaxed or hard as the family says. For Linear layers
the output moments match weight sampling and the closed form; for convolutions the family
shares one mask per input channel, so the rule (the default for convolutions, also under
``estimator="lrt"``) is exact jointly over positions: the maximum over positions matches weight
sampling, where per-element masks (MC dropout's rule) would not.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import ConcreteMaskedNormal, local_reparameterization

from ._layers import exact_moments, guide_from, lrt_draws, make_layer, reference
from ._stats import Z, max_abs, mean_z, one_sample_var_z, one_sample_z, var_z

R = 20_000


def _dists(layer, relaxed, temperature=0.5):
    g = torch.Generator().manual_seed(7)
    shape = layer.weight_shape
    out, n_in, ev = shape[0], shape[1], len(shape)
    rate = torch.linspace(0.1, 0.5, n_in).reshape((1, n_in) + (1,) * (ev - 2))
    qw = ConcreteMaskedNormal(
        torch.randn(shape, generator=g), 0.2, rate, temperature, relaxed=relaxed, event_dim=ev
    )
    qb = dist.Normal(0.3 * torch.randn(out, generator=g), torch.full((out,), 0.3)).to_event(1)
    return {"weight": qw, "bias": qb}


def _weight_draws(layer, dists, x, r):
    """Outputs from weights drawn as the family draws them (relaxed or hard) by ``rsample``."""
    return reference(layer, x, dists["weight"].rsample((r,)), dists["bias"].rsample((r,)))


def _flat(a):
    return a.reshape(a.shape[0], -1)


@pytest.mark.parametrize("relaxed", [False, True], ids=["hard", "relaxed"])
@pytest.mark.parametrize("kind", ["linear", "conv1d", "conv2d"])
def test_rule_moments_match_weight_sampling(kind, relaxed):
    pyro.set_rng_seed(0)
    layer, x = make_layer(kind)
    dists = _dists(layer, relaxed)
    with torch.no_grad():
        lrt = _flat(lrt_draws(layer, guide_from(dists), x, R))
        ref = _flat(_weight_draws(layer, dists, x, R))
    worst = {"mean": max_abs(mean_z(lrt, ref)), "var": max_abs(var_z(lrt, ref))}
    if kind == "linear" and not relaxed:  # the closed form of q (hard masks)
        mean, var = exact_moments(layer, dists, x)
        worst["mean exact"] = max_abs(one_sample_z(lrt, mean.reshape(-1)))
        worst["var exact"] = max_abs(one_sample_var_z(lrt, var.reshape(-1)))
    assert max(worst.values()) < Z, worst


def _max_over_positions(dists, estimator):
    layer, _ = make_layer("conv1d")
    x = torch.ones(1, 2, 6)
    with torch.no_grad(), pyro.plate("draws", R, dim=-2):
        if estimator == "weights":
            w = dists["weight"].rsample((R,))
            out = reference(layer, x, w, dists["bias"].rsample((R,)))
        else:
            with local_reparameterization(estimator=estimator):
                tr = poutine.trace(guide_from(dists)).get_trace(x)
                out = poutine.replay(layer, trace=tr)(x)
    return out.amax(-1).reshape(R, -1)


@pytest.mark.parametrize("estimator", ["auto", "lrt"])
def test_channel_masks_are_exact_jointly_over_positions(estimator):
    pyro.set_rng_seed(1)
    layer, _ = make_layer("conv1d")
    dists = _dists(layer, relaxed=False)
    ref = _max_over_positions(dists, "weights")
    got = _max_over_positions(dists, estimator)
    assert max_abs(mean_z(got, ref)) < Z
    # The check can fail: masks drawn per input element instead (MC dropout's convolution
    # rule, independent across positions) give another distribution of the maximum.
    per_element = ConcreteMaskedNormal(
        dists["weight"].loc, 0.2, dists["weight"].dropout_rate, relaxed=False
    )
    keep = (torch.rand(R, 1, 2, 6) >= per_element.dropout_rate[0, :, :1]).float()
    x = torch.ones(1, 2, 6)
    out = (
        torch.nn.functional.conv1d((x * keep).reshape(R, 2, 6), per_element.loc, None, 1, 1)
        + 0.2
        * torch.randn(R, 3, 6)
        * torch.nn.functional.conv1d(
            (x * x).reshape(1, 2, 6), torch.ones(3, 2, 3), None, 1, 1
        ).sqrt()
        + dists["bias"].rsample((R,))[:, :, None]
    )
    assert max_abs(mean_z(out.amax(-1), ref)) > 2 * Z


@pytest.mark.parametrize("rates", ["per_unit", "per_layer"])
@pytest.mark.parametrize("relaxed", [False, True], ids=["hard", "relaxed"])
@pytest.mark.parametrize("kind", ["linear", "conv1d", "conv2d_groups"])
def test_rule_of_a_family_built_from_its_mean_weight(kind, relaxed, rates):
    """``ConcreteMaskedNormal.from_mean`` (AutoConcreteDropout's family) runs the rule on the
    mean weight with masks ``z / (1 - p)`` (one rate per layer: masks ``z`` and the output
    scaled by ``1 / (1 - p)``): the same outputs, draw for draw, as the family built from
    ``M = mean / (1 - p)``, with the same gradients, under a plate of draws too."""
    layer, x = make_layer(kind)
    base = _dists(layer, relaxed)
    rate = base["weight"]._compact_rate
    if rates == "per_layer":
        rate = torch.full((1,) * rate.dim(), 0.3)
    mean = (base["weight"].loc * (1 - rate)).detach().requires_grad_()
    rate = rate.detach().requires_grad_()

    def run(from_mean):
        w = base["weight"]
        if from_mean:
            q = ConcreteMaskedNormal.from_mean(mean, 0.2, rate, w.temperature, relaxed, w.event_dim)
        else:
            q = ConcreteMaskedNormal(
                mean / (1 - rate), 0.2, rate, w.temperature, relaxed, w.event_dim
            )
        pyro.set_rng_seed(3)
        out = lrt_draws(layer, guide_from({"weight": q, "bias": base["bias"]}), x, 50)
        return out, torch.autograd.grad(out.square().sum(), [mean, rate])

    (out_a, grads_a), (out_b, grads_b) = run(True), run(False)
    assert out_a.shape == out_b.shape
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-5)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("relaxed", [False, True], ids=["hard", "relaxed"])
def test_rule_of_a_family_built_from_its_mean_weight_used_as_x_at_w(relaxed):
    """A weight stored (in, out) and used as ``x @ W`` (masks on the output columns): the
    family built from its mean weight gives the rule's mean and variance, and their gradients,
    of the family built from ``M = mean / (1 - p)``."""
    from pyro_dropout.handlers.lrt_rules import _lrt_concrete_masked_normal
    from pyro_dropout.nn.functional import LinearSpec

    g = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 7, generator=g, dtype=torch.float64).requires_grad_()
    rate = (0.1 + 0.5 * torch.rand(1, 7, generator=g, dtype=torch.float64)).requires_grad_()
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    outs = []
    for from_mean in (True, False):
        if from_mean:
            q = ConcreteMaskedNormal.from_mean(mean, 0.1, rate, relaxed=relaxed)
        else:
            q = ConcreteMaskedNormal(mean / (1 - rate), 0.1, rate, relaxed=relaxed)
        torch.manual_seed(1)
        r = _lrt_concrete_masked_normal(q, x, LinearSpec(transposed=True))
        loss = (r.mean**2).sum() + r.variance().sum()
        outs.append((r.mean, r.variance(), torch.autograd.grad(loss, [mean, rate])))
    (m_a, v_a, g_a), (m_b, v_b, g_b) = outs
    torch.testing.assert_close(m_a, m_b)
    torch.testing.assert_close(v_a, v_b)
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(a, b)
