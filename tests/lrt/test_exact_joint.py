"""Every estimator that claims to be exact for q is checked *jointly* against weight sampling.

An estimator is exact for q when each example's whole output (all channels and positions of a
convolution, all units of a Linear layer) has the distribution it has under one weight draw
``W ~ q``; examples are then drawn independently (Flipout: uncorrelated). Per-element moments
(``test_lrt_moments.py``) cannot see an estimator that decorrelates outputs sharing a weight or
a mask: Concrete dropout's rule on a grouped convolution drew each group's channel masks
independently where q shares them (corr(out0, out1) +0.01 against +1.00 by weight sampling).

For every family (mean-field Normal, variational dropout's ``LogAlphaNormal``, MC dropout's
``BernoulliMaskedNormal``, ``ConcreteMaskedNormal`` with hard and relaxed masks) × layer
(Linear, a functional ``x @ w``, Conv1d, Conv2d, grouped Conv2d, depthwise Conv1d) × estimator whose documented claim
is "exact" (``docs/local-reparameterization.md``), this compares, on ``K = 2`` inputs:

* the means and the full covariance matrix of one example's flattened output (every pair of
  channels and positions) with those of ``op(x, W) + b`` for ``W ~ q`` (two-sample z from the
  Monte-Carlo standard errors, ``_stats.py``);
* the covariance between the two examples' outputs with 0 (examples independent / Flipout's
  pseudo-independence), where weight sampling would give a non-zero covariance.

Fails when any |z| > 5 (``_stats.Z``). ``test_the_joint_check_can_fail`` shows that the same
check with the same draws rejects per-position LRT on convolutions (documented as exact per
element only) and the old grouped-convolution Concrete rule.
"""

import functools

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_dropout import (
    BayesianConv1d,
    BayesianConv2d,
    BayesianLinear,
    BernoulliMaskedNormal,
    ConcreteMaskedNormal,
)
from pyro_dropout.distributions import LogAlphaNormal

from ._layers import guide_from, lrt_draws, reference
from ._stats import Z, cov_products, max_abs, mean_z, one_sample_z

#: Draws per estimator and per reference. The outputs are 8-16 numbers per example, so a
#: covariance matrix has at most 32² entries and the family-wise false-alarm rate at Z = 5 is
#: below 1e-3 per test (and every test is seeded).
R = 6000

FAMILIES = ("normal", "vd", "dropout", "concrete_hard", "concrete_relaxed")
LAYERS = ("linear", "matmul", "conv1d", "conv2d", "conv2d_grouped", "conv1d_depthwise")


class _Matmul:
    """A functional model ``x @ w`` with ``w`` stored ``(in, out)``: the dropout families'
    mask, shared along the first dim, then zeroes whole output units. (No bias: a bias added
    with ``+ b`` in user code is used as drawn, shared by the rows.)"""

    weight_shape = (4, 3)

    def __call__(self, x):
        w = pyro.sample("weight", dist.Normal(0.0, 1.0).expand(self.weight_shape).to_event(2))
        return x @ w


def _apply(layer, x, w, b):
    """``layer`` applied with ``S`` weight draws: ``(S, K, *out)``, plain torch."""
    if isinstance(layer, _Matmul):
        return torch.einsum("sio,ki->sko", w, x)
    return reference(layer, x, w, b)


def _layer(kind):
    g = torch.Generator().manual_seed(11)
    if kind == "linear":
        layer, x = BayesianLinear(4, 3), torch.randn(2, 4, generator=g)
    elif kind == "matmul":
        layer, x = _Matmul(), torch.randn(2, 4, generator=g)
    elif kind == "conv1d":
        layer = BayesianConv1d(2, 3, kernel_size=3, padding=1)
        x = torch.randn(2, 2, 4, generator=g)
    elif kind == "conv2d":
        layer = BayesianConv2d(2, 2, kernel_size=3, stride=2, padding=1)
        x = torch.randn(2, 2, 4, 4, generator=g)
    elif kind == "conv2d_grouped":
        layer = BayesianConv2d(4, 4, kernel_size=2, groups=2)
        x = torch.randn(2, 4, 3, 3, generator=g)
    elif kind == "conv1d_depthwise":
        layer = BayesianConv1d(3, 3, kernel_size=3, padding=1, groups=3)
        x = torch.randn(2, 3, 4, generator=g)
    else:
        raise ValueError(kind)
    x[1, 0] = 0.0  # a zero input unit / channel
    return layer, x


def _dists(layer, family):
    g = torch.Generator().manual_seed(5)
    shape = layer.weight_shape
    ev, out, n_in = len(shape), shape[0], shape[1]
    if isinstance(layer, _Matmul):
        out = shape[1]
    loc = torch.randn(shape, generator=g)
    if family == "normal":
        qw = dist.Normal(0.5 * loc, 0.1 + 0.4 * torch.rand(shape, generator=g)).to_event(ev)
    elif family == "vd":
        qw = LogAlphaNormal(loc, torch.empty(shape).uniform_(-2.0, 0.0, generator=g))
        qw = qw.to_event(ev)
    else:
        # Drop rates that differ between input units (kernel input channels; output units of
        # ``x @ w``): a rule that permutes or re-tiles masks then gives other moments.
        rate = torch.linspace(0.2, 0.5, n_in).reshape((1, n_in) + (1,) * (ev - 2))
        if family == "dropout":
            qw = BernoulliMaskedNormal(loc, 0.2, rate, event_dim=ev)
        else:
            relaxed = family == "concrete_relaxed"
            qw = ConcreteMaskedNormal(loc, 0.2, rate, 0.5, relaxed=relaxed, event_dim=ev)
    qb = dist.Normal(0.3 * torch.randn(out, generator=g), torch.full((out,), 0.3)).to_event(1)
    if isinstance(layer, _Matmul):
        return {"weight": qw}
    return {"weight": qw, "bias": qb}


def exact_estimators(family, kind):
    """The estimators documented as exact for q on this family and layer (the "auto" choice
    included): ``docs/local-reparameterization.md``, "Which estimator, exact for what"."""
    claims = ["auto", "per_example"]
    if family in ("normal", "vd"):
        claims.append("flipout")
    if kind in ("linear", "matmul") or family.startswith("concrete"):
        claims.append("lrt")  # Linear: every family; convolutions: Concrete's channel masks
    return claims


CASES = [
    (family, kind, estimator)
    for family in FAMILIES
    for kind in LAYERS
    for estimator in exact_estimators(family, kind)
]


def _flat(a):
    return a.reshape(a.shape[0], a.shape[1], -1)  # (R, K, D)


@functools.cache
def _reference(family, kind):
    """``R`` outputs from weights drawn by the family's own ``rsample`` (relaxed masks for
    ``concrete_relaxed``, as the rule draws them): ``(R, K, D)``."""
    pyro.set_rng_seed(2024)
    layer, x = _layer(kind)
    dists = _dists(layer, family)
    with torch.no_grad():
        w = dists["weight"].rsample((R,))
        b = dists["bias"].rsample((R,)) if "bias" in dists else None
        return _flat(_apply(layer, x, w, b))


def _estimator_draws(family, kind, estimator, seed=0):
    pyro.set_rng_seed(seed)
    layer, x = _layer(kind)
    dists = _dists(layer, family)
    with torch.no_grad():
        return _flat(lrt_draws(layer, guide_from(dists), x, R, estimator))


def joint_z(got, ref):
    """Worst |z| of: means, the within-example covariance matrix (both examples) against
    weight sampling, and the cross-example covariance against 0."""
    worst = {
        "mean": max_abs(mean_z(got.flatten(1), ref.flatten(1))),
        "cov within example": max(
            max_abs(mean_z(cov_products(got[:, k]), cov_products(ref[:, k])))
            for k in range(got.shape[1])
        ),
    }
    c = got.double() - got.double().mean(0)
    cross = c[:, 0, :, None] * c[:, 1, None, :]
    worst["cov across examples vs 0"] = max_abs(one_sample_z(cross, torch.zeros(())))
    return worst


@pytest.mark.parametrize(("family", "kind", "estimator"), CASES)
def test_exact_estimators_match_weight_sampling_jointly(family, kind, estimator):
    ref = _reference(family, kind)
    got = _estimator_draws(family, kind, estimator)
    worst = joint_z(got, ref)
    assert max(worst.values()) < Z, f"{family}/{kind}/{estimator}: max |z| {worst}"


def test_weight_sampling_shares_the_weights_across_examples_and_groups():
    """The reference itself has what the estimators must reproduce: outputs of two groups
    that read one Concrete channel mask are strongly correlated (and so are the two examples
    of one weight draw, which is why the cross-example check uses 0, not the reference)."""
    ref = _reference("concrete_hard", "conv2d_grouped")  # (R, K, 4 channels * 2 * 2)
    c = ref[:, 0].reshape(R, 2, 8).double()  # (draws, group, 2 channels * 2 * 2 positions)
    c = c - c.mean(0)
    cross = c[:, 0, :, None] * c[:, 1, None, :]  # group 0's outputs times group 1's
    assert max_abs(one_sample_z(cross, torch.zeros(()))) > 10 * Z


@pytest.mark.parametrize(
    ("family", "kind"),
    [
        ("normal", "conv1d"),  # per-position LRT: positions independent
        ("vd", "conv2d_grouped"),
        ("dropout", "conv2d"),  # per-element masks: positions and outputs decorrelated
        ("dropout", "conv1d_depthwise"),
    ],
)
def test_the_joint_check_can_fail(family, kind):
    """``estimator="lrt"`` on a convolution is documented as right per output element only:
    the joint check rejects it (its per-element means and variances agree)."""
    ref = _reference(family, kind)
    got = _estimator_draws(family, kind, "lrt")
    worst = joint_z(got, ref)
    assert worst["mean"] < Z
    assert worst["cov within example"] > 2 * Z, worst


def test_the_joint_check_rejects_independent_masks_per_group(monkeypatch):
    """The bug this file was written for: Concrete masks drawn per *input* channel of a
    grouped convolution (independently per group) instead of per kernel input channel and
    shared by the groups. Simulated by giving the rule a kernel that lists every group's
    channels separately (what the old rule did): the check must fail."""
    from pyro_dropout.handlers import lrt_rules

    rule = lrt_rules._lrt_concrete_masked_normal

    def per_group_masks(fn, x, spec):
        if spec.groups == 1:
            return rule(fn, x, spec)
        # Tile the rate over the groups and draw a mask per input channel (the old rule).
        rate = fn.dropout_rate.select(-fn.event_dim, 0)
        rate = rate.repeat((1,) * (rate.dim() - spec.ndim - 1) + (spec.groups,) + (1,) * spec.ndim)
        rows = x.shape[: x.dim() - spec.ndim] + (1,) * spec.ndim
        shape = lrt_rules.broadcast_shape(rows, rate.shape)
        mask = lrt_rules.concrete_keep_mask(rate, fn.temperature, shape, fn.relaxed)
        delta = fn.scale * torch.randn(fn.batch_shape + fn.event_shape)
        s = lrt_rules._signs(lrt_rules._per_channel(x.shape, spec), x)
        pert = spec(x * s, delta)
        out = spec(x * mask, fn.loc)
        return out + lrt_rules._signs(lrt_rules._per_channel(pert.shape, spec), x) * pert

    monkeypatch.setitem(lrt_rules.__dict__, "_lrt_concrete_masked_normal", per_group_masks)
    from pyro_dropout.handlers import registry

    monkeypatch.setitem(registry._RULES, ("lrt", ConcreteMaskedNormal), per_group_masks)
    per_group_masks.exact_for_conv = True
    ref = _reference("concrete_hard", "conv2d_grouped")
    got = _estimator_draws("concrete_hard", "conv2d_grouped", "auto")
    worst = joint_z(got, ref)
    assert worst["mean"] < Z
    assert worst["cov within example"] > 10 * Z, worst
