"""AutoConcreteDropout's documented parameterisation, checked by Monte Carlo.

* The guide's parameter is the mean weight: :math:`M' = \\mathbb E_q W = (1-p) M` (the weight
  of inverted dropout), so the family it emits has ``loc = M' / (1 - p)``. Checked on hard
  draws from q with drop rates that differ per input unit (a swapped ``p`` / ``1 - p`` or a
  missing ``1/(1-p)`` moves the mean by many standard errors).
* The default temperature is 0.1 (the paper's), for the guide and for
  :class:`~pyro_dropout.ConcreteMaskedNormal`, and it is the temperature of the relaxed masks
  the guide draws while training: their distribution function is the BinConcrete one,
  :math:`P(\\text{keep} \\le k) = \\sigma(t \\operatorname{logit} k + \\operatorname{logit} p)`.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.nn import PyroParam

from pyro_dropout import AutoConcreteDropout, ConcreteMaskedNormal
from pyro_dropout.distributions import concrete_keep_mask

#: z threshold (two-sided normal tail 5.7e-7 per compared number; every test is seeded).
Z = 5.0
N_IN = 4000


def one_sample_z(a, expected):
    """z-scores of the mean over dim 0 of ``a`` against ``expected`` (SE from the sample)."""
    a = a.double()
    se = a.std(0) / math.sqrt(a.shape[0])
    return (a.mean(0) - expected.double()) / se.clamp_min(1e-300)


def max_abs(z):
    return float(z.abs().max())


def _model(shape=(3, 5)):
    def model():
        pyro.sample("w", dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape)))

    return model


def _guide(shape, init, **kwargs):
    guide = AutoConcreteDropout(_model(shape), init_loc_fn=lambda site: init.clone(), **kwargs)
    guide()
    return guide


def _site_fn(guide):
    return poutine.trace(guide).get_trace().nodes["w"]["fn"]


def binconcrete_cdf(k, p, t):
    """P(keep <= k) for keep = 1 - RelaxedBernoulli(t, p) (Maddison et al. 2017)."""
    k, p = torch.as_tensor(k, dtype=torch.float64), torch.as_tensor(p, dtype=torch.float64)
    return torch.sigmoid(t * torch.logit(k) + torch.logit(p))


def test_the_guides_parameter_is_the_mean_weight_under_q():
    pyro.set_rng_seed(0)
    g = torch.Generator().manual_seed(0)
    shape = (3, 5)
    mean_weight = torch.randn(shape, generator=g)
    guide = _guide(shape, mean_weight, rate_per="unit", scale=0.05)
    rates = torch.tensor([0.1, 0.2, 0.35, 0.5, 0.7]).reshape(1, 5)
    guide.drop_rates.w = PyroParam(rates, constraints.unit_interval, 2)  # per input unit
    with torch.no_grad():  # hard masks: draws from q itself
        fn = _site_fn(guide)
        assert not fn.relaxed
        assert torch.allclose(fn.loc, mean_weight / (1 - rates))
        assert torch.allclose(fn.mean, mean_weight, atol=1e-6)
        draws = fn.sample((20_000,))
    z = one_sample_z(draws.flatten(1), mean_weight.flatten())
    assert max_abs(z) < Z, z
    # The check can fail: the family's loc M' (no 1/(1-p)) has mean (1-p) M'.
    wrong = one_sample_z(draws.flatten(1), ((1 - rates) * mean_weight).flatten())
    assert max_abs(wrong) > 10 * Z


def test_the_default_temperature_is_the_papers():
    guide = _guide((2, 3), torch.ones(2, 3))
    assert guide.temperature == 0.1 and guide.config["temperature"] == 0.1
    assert _site_fn(guide).temperature == 0.1
    q = ConcreteMaskedNormal(torch.ones(2, 3), 0.01, 0.2)
    assert q.temperature == 0.1


@pytest.mark.parametrize("source", ["guide", "distribution"])
def test_relaxed_masks_follow_the_binconcrete_law_at_the_default_temperature(source):
    """Relaxed keep masks drawn by the guide (training, gradients on) and by
    ``ConcreteMaskedNormal.rsample`` with default arguments have the BinConcrete distribution
    function at t = 0.1, which at k = 0.9 is 0.12 (0.50 at t = 1)."""
    pyro.set_rng_seed(1)
    p = 0.1
    if source == "guide":
        # M' = 1 - p, slab 1e-7: a weight draw is its keep mask.
        guide = _guide((1, N_IN), torch.full((1, N_IN), 1 - p), init_rate=p, scale=1e-7)
        assert guide.relaxed
        keep = torch.cat([poutine.trace(guide).get_trace().nodes["w"]["value"] for _ in range(5)])
        keep = keep.detach()
    else:
        keep = ConcreteMaskedNormal(torch.ones(5, N_IN), 1e-7, p, event_dim=2).rsample()
        keep = keep.detach()
    keep = keep.double().flatten()
    for k in (0.1, 0.5, 0.9, 0.99):
        hit = (keep <= k).double()
        expected = binconcrete_cdf(k, p, 0.1)
        z = one_sample_z(hit[:, None], expected.reshape(1))
        assert abs(z.item()) < Z, (k, hit.mean().item(), expected.item())
        other = binconcrete_cdf(k, p, 1.0)  # what t = 1 would give
        if abs(other - expected) > 0.05:
            assert abs(one_sample_z(hit[:, None], other.reshape(1)).item()) > 2 * Z


def test_binconcrete_cdf_is_that_of_concrete_keep_mask_at_any_temperature():
    """The closed form used above, checked on the sampler at a few (p, t)."""
    torch.manual_seed(3)
    for p, t in ((0.3, 0.5), (0.7, 0.1), (0.1, 2.0)):
        keep = concrete_keep_mask(torch.tensor(p, dtype=torch.float64), t, (50_000,))
        for k in (0.05, 0.3, 0.6, 0.95):
            hit = (keep <= k).double()
            z = one_sample_z(hit[:, None], binconcrete_cdf(k, p, t).reshape(1))
            assert abs(z.item()) < Z, (p, t, k)


# --------------------------------------------------------------------------------------------
# ELBOs that score the guide's relaxed draws are refused
# --------------------------------------------------------------------------------------------


def _svi(elbo, prior=None):
    from pyro_dropout import BayesianMLP

    pyro.clear_param_store()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, generator=g)
    y = torch.tanh(x[:, 0])
    kwargs = {} if prior is None else {"prior": prior}
    model = BayesianMLP(3, 1, hidden=(6,), tau=25.0, **kwargs)
    guide = AutoConcreteDropout(model)
    guide(x, y)
    return pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), elbo), guide, x, y


def test_trace_elbo_is_refused_naming_the_mean_field_elbos():
    from pyro_dropout.distributions import RelaxedDensityError

    pyro.set_rng_seed(0)
    svi, _, x, y = _svi(pyro.infer.Trace_ELBO())
    with pytest.raises(RelaxedDensityError, match="MeanFieldELBO") as err:
        svi.step(x, y)
    assert "TraceMeanField_ELBO" in str(err.value) and "Trace_ELBO" in str(err.value)


@pytest.mark.parametrize("elbo", ["MeanFieldELBO", "TraceMeanField_ELBO"])
def test_the_mean_field_elbos_still_train(elbo):
    from pyro_dropout.infer import MeanFieldELBO

    pyro.set_rng_seed(0)
    make = MeanFieldELBO if elbo == "MeanFieldELBO" else pyro.infer.TraceMeanField_ELBO
    svi, guide, x, y = _svi(make())
    before = {k: v.detach().clone() for k, v in guide.named_parameters()}
    losses = [svi.step(x, y) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses)
    rate = "drop_rates.net.layers.0.weight_unconstrained"
    assert not torch.equal(dict(guide.named_parameters())[rate], before[rate])


def test_log_q_of_hard_draws_stays_differentiable():
    """Hard draws (relaxed=False, or the guide in eval mode) are draws from q and their exact
    log density can be differentiated, e.g. by Trace_ELBO on a guide switched to eval."""
    loc = torch.randn(3, 4, requires_grad=True)
    q = ConcreteMaskedNormal(loc, 0.1, 0.3, relaxed=False)
    q.log_prob(q.sample()).sum().backward()
    assert loc.grad is not None and loc.grad.abs().sum() > 0
    relaxed = ConcreteMaskedNormal(loc, 0.1, 0.3)
    value = relaxed.log_prob(relaxed.rsample())  # computing the value is allowed
    assert torch.isfinite(value).all()
    from pyro_dropout.distributions import RelaxedDensityError

    with pytest.raises(RelaxedDensityError, match="MeanFieldELBO"):
        value.sum().backward()


@pytest.mark.parametrize("unconstrained", [-120.0, 120.0])
def test_saturated_rates_are_kept_inside_the_open_interval(unconstrained):
    """A drop rate's sigmoid saturates in float32 (to 1 - eps above a logit of ~17, torch's
    clamp; to 0, clamped by torch to the dtype's tiny, below ~-104). As documented, the guide
    clamps p "away from its ends by the float epsilon": the family and ``dropout_rates()``
    see p in [eps, 1 - eps], and logit p, the relaxed masks, the KL, the loss and its
    gradient stay finite."""
    from pyro_dropout.infer import MeanFieldELBO

    pyro.set_rng_seed(0)
    svi, guide, x, y = _svi(MeanFieldELBO())
    name = "net.layers.0.weight"
    with torch.no_grad():
        dict(guide.named_parameters())[f"drop_rates.{name}_unconstrained"].fill_(unconstrained)
    fn = poutine.trace(guide).get_trace(x, y).nodes[name]["fn"]
    eps = torch.finfo(fn.dropout_rate.dtype).eps
    for p in (fn.dropout_rate, guide.dropout_rates()[name]):
        assert ((p >= eps) & (p <= 1 - eps)).all(), p
    assert torch.isfinite(fn.rsample()).all()
    loss = MeanFieldELBO().differentiable_loss(guide.model, guide, x, y)
    grads = torch.autograd.grad(loss, list(guide.parameters()), allow_unused=True)
    assert torch.isfinite(loss) and all(g is None or torch.isfinite(g).all() for g in grads)
