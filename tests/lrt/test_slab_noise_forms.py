"""The two forms of a Linear layer's slab noise under one shared σ (``handlers/lrt_rules.py``,
``_with_slab_noise``): the SD ``σ‖x‖`` (with a bias scale σ_b, ``hypot(σ‖x‖, σ_b)``) on
small inputs and the variance ``σ²Σx²`` (floored, then its square root) on large ones draw the
same pre-activations from the same random stream, with the same gradients, also where an input
row is all zeros (the norm's gradient there is 0, not NaN)."""

import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    BayesianLinear,
    BernoulliMaskedNormal,
    ConcreteMaskedNormal,
    local_reparameterization,
)
from pyro_dropout.handlers import lrt_rules

from ._layers import guide_from


def _params(family, bias):
    g = torch.Generator().manual_seed(3)
    loc = torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_()
    scale = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    b_loc = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    if bias == "scalar":  # one scale for all units, as AutoDropout's: the hypot branch
        b_scale = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    elif bias == "zero":  # a learned scalar σ_b rounded to 0: hypot(0, 0) must not give NaN
        b_scale = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    else:  # one per unit: the variance is formed from the SD
        b_scale = torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64, requires_grad=True)
    return loc, scale, b_loc, b_scale


def _dists(family, bias, params):
    loc, scale, b_loc, b_scale = params
    if family == "dropout":
        qw = BernoulliMaskedNormal(loc, scale.expand(3, 5), torch.tensor(0.3), event_dim=2)
    else:
        rate = torch.full((1, 1), 0.3, dtype=torch.float64)
        qw = ConcreteMaskedNormal(loc, scale.expand(3, 5), rate, event_dim=2)
    dists = {"weight": qw}
    if bias != "none":
        import pyro.distributions as dist

        dists["bias"] = dist.Normal(b_loc, b_scale.expand(3), validate_args=False).to_event(1)
    return dists


def _run(family, bias, x, seed):
    params = _params(family, bias)
    layer = BayesianLinear(5, 3, bias=bias != "none").double()
    torch.manual_seed(seed)
    with local_reparameterization():
        tr = poutine.trace(guide_from(_dists(family, bias, params))).get_trace(x)
        out = poutine.replay(layer, trace=tr)(x)
    wrt = [x, *(p for p in params if p.requires_grad)]
    grads = torch.autograd.grad((out * out).sum() + out.sum(), wrt, allow_unused=True)
    return out, grads


@pytest.mark.parametrize("family", ["dropout", "concrete"])
@pytest.mark.parametrize("bias", ["scalar", "zero", "per_unit", "none"])
def test_the_sd_and_the_variance_forms_draw_the_same_preactivations(monkeypatch, family, bias):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[2] = 0.0  # an all-zero row: ‖x‖ = 0
    x.requires_grad_()
    sd_out, sd_grads = _run(family, bias, x, seed=11)
    monkeypatch.setattr(lrt_rules, "NORM_FORM_MAX", -1)  # every input takes the variance form
    var_out, var_grads = _run(family, bias, x, seed=11)
    # (without a bias the variance form floors 0 at 1e-12, an SD of 1e-6: hence atol)
    torch.testing.assert_close(sd_out, var_out, rtol=1e-10, atol=1e-5)
    for a, b in zip(sd_grads, var_grads, strict=True):
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-5)


def test_the_sd_form_is_taken_on_small_inputs_and_the_variance_form_on_large_ones():
    scale = torch.tensor(0.2)
    spec = lrt_rules.LinearSpec()
    for rows, form in [(4, "sd"), (lrt_rules.NORM_FORM_MAX // 5 + 1, "var")]:
        x = torch.randn(rows, 5)
        pre = lrt_rules._with_slab_noise(torch.zeros(rows, 3), x, scale, spec)
        assert (pre.sd is None) == (form == "var") and (pre.var is None) == (form == "sd")
        torch.testing.assert_close(pre.variance(), 0.04 * (x * x).sum(-1, keepdim=True))


@pytest.mark.parametrize("rates", ["layer", "unit"])
@pytest.mark.parametrize("family", ["dropout", "concrete", "concrete_from_mean"])
def test_a_single_input_vector_gives_an_output_vector(family, rates):
    """A Linear layer applied to one input vector ``(in,)`` under local reparameterisation
    returns ``(out,)``, as without it (the rules broadcast the rates against the rows)."""
    import pyro.distributions as dist

    torch.manual_seed(5)  # the rules' draws
    g = torch.Generator().manual_seed(5)
    loc = torch.randn(3, 5, generator=g)
    rate = torch.full((1, 1), 0.3) if rates == "layer" else torch.linspace(0.1, 0.5, 5)[None]
    if family == "dropout":
        qw = BernoulliMaskedNormal(loc, torch.tensor(0.1), rate, event_dim=2)
    elif family == "concrete":
        qw = ConcreteMaskedNormal(loc, 0.1, rate, event_dim=2)
    else:
        qw = ConcreteMaskedNormal.from_mean(loc, 0.1, rate, event_dim=2)
    dists = {"weight": qw, "bias": dist.Normal(torch.zeros(3), torch.full((3,), 0.3)).to_event(1)}
    layer = BayesianLinear(5, 3)
    for x in (torch.randn(5, generator=g), torch.randn(4, 5, generator=g)):
        with local_reparameterization():
            tr = poutine.trace(guide_from(dists)).get_trace(x)
            out = poutine.replay(layer, trace=tr)(x)
        assert out.shape == x.shape[:-1] + (3,)
