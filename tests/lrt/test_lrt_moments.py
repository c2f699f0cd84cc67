"""Local reparameterisation is exact in distribution per output element (issue: LRT tests, 1).

For fixed guide parameters the pre-activations sampled by ``local_reparameterization()`` must
have the same mean and variance, element by element, as ``op(x, W) + b`` with ``W ~ q``
computed from sampled weights, for every family (Normal: mean-field / variational dropout;
BernoulliMaskedNormal: MC dropout with p = 0.3 and σ = 0.2) and every layer (Linear, Conv1d,
Conv2d). Both are also compared with the exact moments ``op(x, E W) + E b`` and
``op(x², Var W) + Var b``.

Tolerances: every comparison is a z-score from the Monte-Carlo standard errors (see
``_stats.py``: SE of a mean ``s/√n``; of a variance ``√((m4 - s⁴)/n)`` with the empirical
fourth moment, since dropout pre-activations are far from Gaussian) and fails above
``Z = 5``. ``test_moment_check_detects_*`` shows that the same check, with the same number of
draws, rejects a slightly wrong family.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianLinear,
    local_reparameterization,
)

from ._layers import (
    LAYERS,
    exact_moments,
    guide_from,
    lrt_draws,
    make_dists,
    make_layer,
    reference,
    repeat_rows,
    weight_draws,
)
from ._stats import (
    Z,
    cov_products,
    cov_z,
    max_abs,
    mean_z,
    one_sample_var_z,
    one_sample_z,
    var_z,
)

#: Draws per input. 20 000 puts the SE of a variance at ~1-2 % of its value: a 10 % error in a
#: variance is then a >5 SE event (see the detection tests below).
R = 20_000

FAMILIES = ("normal", "dropout", "dropout_elementwise", "dropout_per_input")


def _flat(a):
    return a.reshape(a.shape[0], -1)


def _assert_same_moments(lrt, ref, mean, var, what):
    lrt, ref = _flat(lrt), _flat(ref)
    mean, var = mean.reshape(-1), var.reshape(-1)
    checks = {
        "mean LRT vs weights": mean_z(lrt, ref),
        "var LRT vs weights": var_z(lrt, ref),
        "mean LRT vs exact": one_sample_z(lrt, mean),
        "var LRT vs exact": one_sample_var_z(lrt, var),
        "mean weights vs exact": one_sample_z(ref, mean),
        "var weights vs exact": one_sample_var_z(ref, var),
    }
    worst = {k: round(max_abs(z), 2) for k, z in checks.items()}
    assert max(worst.values()) < Z, f"{what}: max |z| per check {worst} (threshold {Z})"


def test_reference_matches_per_draw_torch_layers():
    """The batched torch reference equals ``F.linear`` / ``F.conv*d`` applied draw by draw."""
    for kind in (*LAYERS, "conv2d_groups", "conv2d_dilated"):
        layer, x = make_layer(kind)
        dists = make_dists(layer, "normal")
        w, b = dists["weight"].sample((3,)), dists["bias"].sample((3,))
        got = reference(layer, x, w, b)
        for s in range(3):
            if isinstance(layer, BayesianLinear):
                want = torch.nn.functional.linear(x, w[s], b[s])
            else:
                sp = layer.spec
                conv = torch.nn.functional.conv1d if sp.ndim == 1 else torch.nn.functional.conv2d
                want = conv(x, w[s], b[s], sp.stride, sp.padding, sp.dilation, sp.groups)
            torch.testing.assert_close(got[s], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", LAYERS)
def test_lrt_moments_match_weight_sampling(kind, family):
    layer, x = make_layer(kind)
    dists = make_dists(layer, family)
    lrt = lrt_draws(layer, guide_from(dists), x, R)
    ref = weight_draws(layer, dists, x, R)
    assert lrt.shape == ref.shape
    mean, var = exact_moments(layer, dists, x)
    _assert_same_moments(lrt, ref, mean, var, f"{kind}/{family}")


@pytest.mark.parametrize("kind", ("conv2d_groups", "conv2d_dilated"))
def test_lrt_moments_grouped_and_dilated_conv_normal(kind):
    layer, x = make_layer(kind)
    dists = make_dists(layer, "normal")
    lrt = lrt_draws(layer, guide_from(dists), x, R)
    ref = weight_draws(layer, dists, x, R)
    mean, var = exact_moments(layer, dists, x)
    _assert_same_moments(lrt, ref, mean, var, kind)


def test_lrt_moments_grouped_conv_dropout():
    """Per-input-channel rates (within a group), so the channel order of the keep mask
    matters."""
    layer, x = make_layer("conv2d_groups")
    dists = make_dists(layer, "dropout_per_input")
    lrt = lrt_draws(layer, guide_from(dists), x, R)
    ref = weight_draws(layer, dists, x, R)
    mean, var = exact_moments(layer, dists, x)
    _assert_same_moments(lrt, ref, mean, var, "conv2d_groups/dropout_per_input")


def test_lrt_moments_dilated_conv_dropout():
    layer, x = make_layer("conv2d_dilated")
    dists = make_dists(layer, "dropout")
    lrt = lrt_draws(layer, guide_from(dists), x, R)
    ref = weight_draws(layer, dists, x, R)
    mean, var = exact_moments(layer, dists, x)
    _assert_same_moments(lrt, ref, mean, var, "conv2d_dilated/dropout")


@pytest.mark.parametrize("family", ("normal", "dropout", "dropout_per_input"))
def test_lrt_linear_covariance_across_outputs(family):
    """For a Linear layer LRT is exact jointly over the outputs of one example: the dropout
    mask is shared down a weight column, so outputs of one example are correlated
    (``Cov(y_j, y_k) = Σ_i x_i² p(1-p) M_ji M_ki``); LRT gets this by masking the input. A
    rule that drew a mask per weight would match the variances but not these covariances."""
    layer, x = make_layer("linear")
    dists = make_dists(layer, family)
    lrt = lrt_draws(layer, guide_from(dists), x, R)
    ref = weight_draws(layer, dists, x, R)
    z = max_abs(cov_z(lrt, ref))
    assert z < Z, f"covariance across outputs differs: max |z| = {z:.2f}"
    if family != "normal":
        # The off-diagonal covariances are really there (far beyond their SE), so the check
        # above is not vacuous.
        prods = cov_products(ref)
        off = ~torch.eye(prods.shape[-1], dtype=torch.bool)
        z0 = one_sample_z(prods, torch.zeros(prods.shape[1:]))[:, off]
        assert max_abs(z0) > 4 * Z, f"no detectable covariance: max |z| = {max_abs(z0):.1f}"


@pytest.mark.parametrize(
    "guide_cls, kwargs",
    [
        (AutoMeanField, {"init_scale": 0.2}),
        (AutoVariationalDropout, {"alpha": "weight", "init_log_alpha": -1.0}),
        (AutoVariationalDropout, {"alpha": "unit", "init_log_alpha": -0.5}),
        (AutoDropout, {"dropout_rate": 0.3, "input_dropout_rate": 0.3, "scale": 0.1}),
    ],
    ids=["mean_field", "vd_weight", "vd_unit", "dropout"],
)
@pytest.mark.parametrize("kind", ("linear", "conv2d"))
def test_lrt_moments_with_library_guides(kind, guide_cls, kwargs):
    """Same check with the distributions the library guides emit (``get_distributions()``)."""
    layer, x = make_layer(kind)
    guide = guide_cls(layer, **kwargs)
    guide(x)
    with torch.no_grad():
        dists = guide.get_distributions()
        # Guide parameters are fixed: detach so the reference draws carry no graph.
        lrt = lrt_draws(layer, guide, x, R).detach()
        ref = weight_draws(layer, dists, x, R)
        mean, var = exact_moments(layer, dists, x)
    _assert_same_moments(lrt, ref, mean, var, f"{kind}/{guide_cls.__name__}")


@pytest.mark.parametrize("family", ("normal", "dropout"))
@pytest.mark.parametrize("kind", ("linear", "conv2d"))
def test_lrt_moments_inside_particle_plate(kind, family):
    """Vectorised particles: guide and layer run inside ``pyro.plate("particles", P, dim=-2)``
    (as ``vectorize_particles=True`` does), so the weights carry batch shape ``(P, 1)`` and the
    output is ``(P, B, ...)``: each particle is an independent draw of every input's output."""
    layer, x = make_layer(kind)
    dists = make_dists(layer, family)
    P, passes = 2000, R // 2000
    outs = []
    for _ in range(passes):
        with local_reparameterization():
            with pyro.plate("particles", P, dim=-2):
                tr = poutine.trace(guide_from(dists)).get_trace(x)
                out = poutine.replay(layer, trace=tr)(x)
        outs.append(out)
    wshape = tr.nodes["weight"]["value"].shape
    assert wshape == (P, 1) + layer.weight_shape
    assert out.shape[:2] == (P, x.shape[0])
    # The draws of different particles are independent, not copies of each other.
    assert not torch.equal(out[0], out[1])
    lrt = torch.cat(outs)
    ref = weight_draws(layer, dists, x, P * passes)
    mean, var = exact_moments(layer, dists, x)
    _assert_same_moments(lrt, ref, mean, var, f"particles {kind}/{family}")


@pytest.mark.parametrize("family", ("normal", "dropout"))
@pytest.mark.parametrize("kind", LAYERS)
def test_lrt_messenger_intercepts(kind, family):
    """Identical inputs in one pass: without the messenger every row uses the same weight draw
    and gives the same output; with it each row gets its own noise."""
    layer, x = make_layer(kind)
    guide = guide_from(make_dists(layer, family))
    xr = repeat_rows(x[:1], 8)
    tr = poutine.trace(guide).get_trace(xr)
    plain = poutine.replay(layer, trace=tr)(xr)
    assert torch.equal(plain, plain[:1].expand_as(plain))
    with local_reparameterization():
        tr = poutine.trace(guide).get_trace(xr)
        lrt = poutine.replay(layer, trace=tr)(xr)
    assert lrt.shape == plain.shape
    assert all(not torch.equal(lrt[0], lrt[i]) for i in range(1, 8))


@pytest.mark.parametrize(
    "family, perturb",
    [("dropout", {"dropout_rate": 0.25}), ("normal", {"scale_mult": 1.1})],
    ids=["p=0.3 vs 0.25", "sigma x1.1"],
)
def test_moment_check_detects_wrong_family(family, perturb):
    """Power of the check: LRT draws from q against weight draws from a slightly different q
    (drop rate 0.3 vs 0.25, or σ 10 % larger) must be rejected with the same R and Z."""
    layer, x = make_layer("linear")
    lrt = lrt_draws(layer, guide_from(make_dists(layer, family)), x, R)
    ref = weight_draws(layer, make_dists(layer, family, **perturb), x, R)
    z = max(max_abs(mean_z(_flat(lrt), _flat(ref))), max_abs(var_z(_flat(lrt), _flat(ref))))
    assert z > Z, f"the moment check did not detect {perturb}: max |z| = {z:.2f}"


def test_exact_moment_reference_on_a_closed_form_case():
    """Sanity of the exact-moment reference itself on a case with a closed form: one input
    unit x, Normal(μ, σ) weight, no bias noise: Var[y] = x² σ²."""
    layer = BayesianLinear(1, 1)
    x = torch.tensor([[2.0]])
    dists = {
        "weight": dist.Normal(torch.tensor([[0.5]]), torch.tensor([[0.3]])).to_event(2),
        "bias": dist.Normal(torch.zeros(1), torch.full((1,), 1e-6)).to_event(1),
    }
    mean, var = exact_moments(layer, dists, x)
    assert math.isclose(float(mean), 1.0, rel_tol=1e-6)
    assert math.isclose(float(var), 4 * 0.09, rel_tol=1e-4)
