"""AutoConcreteDropout: arguments, rate layouts, relaxed masks in training and hard ones in
prediction, learned rates, and the paper's qualitative result (rates fall as N grows)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro import poutine
from pyro.infer import SVI, Predictive

from pyro_dropout import (
    AutoConcreteDropout,
    BayesianConvNet,
    BayesianMLP,
    ConcreteMaskedNormal,
    fit,
    local_reparameterization,
    predict,
)
from pyro_dropout.distributions import concrete_masked_normal
from pyro_dropout.handlers import lrt_rules
from pyro_dropout.infer import JitMeanFieldELBO, MeanFieldELBO


def _data(n=16, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.tanh(x[:, 0]) + 0.1 * torch.randn(n, generator=g)


def _fitted(steps=3, **kwargs):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=25.0)
    guide = AutoConcreteDropout(model, **kwargs)
    fit(model, guide, x, y, num_steps=steps, lr=0.01, progress=False, seed=0)
    return model, guide, x, y


# --------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"init_rate": 0.0}, "init_rate"),
        ({"init_rate": 1.0}, "init_rate"),
        ({"init_rate": -0.2}, "init_rate"),
        ({"init_rate": "0.1"}, "init_rate"),
        ({"init_rate": float("nan")}, "init_rate"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": None}, "temperature"),
        ({"rate_per": "weight"}, "rate_per"),
        ({"rate_per": None}, "rate_per"),
        ({"scale": 0.0}, "scale"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        AutoConcreteDropout(BayesianMLP(3, 1, hidden=(4,)), **kwargs)


@settings(max_examples=20, deadline=None)
@given(
    init_rate=st.floats(1e-4, 1 - 1e-4),
    temperature=st.floats(1e-3, 10.0),
    rate_per=st.sampled_from(["layer", "unit"]),
    hidden=st.integers(1, 5),
)
def test_initial_rates_have_the_layout_asked_for(init_rate, temperature, rate_per, hidden):
    pyro.clear_param_store()
    x, y = _data(n=4)
    model = BayesianMLP(3, 1, hidden=(hidden,), tau=4.0)
    guide = AutoConcreteDropout(
        model, init_rate=init_rate, temperature=temperature, rate_per=rate_per
    )
    guide(x, y)
    rates = guide.dropout_rates()
    inputs = {"net.layers.0.weight": 3, "net.layers.1.weight": hidden}
    assert sorted(rates) == sorted(inputs)
    for name, p in rates.items():
        assert p.shape == (() if rate_per == "layer" else (inputs[name],))
        torch.testing.assert_close(p, torch.full_like(p, init_rate), rtol=1e-5, atol=1e-6)
    fn = guide.get_distributions()["net.layers.0.weight"]
    assert isinstance(fn, ConcreteMaskedNormal) and fn.temperature == temperature
    assert guide.describe()["family"] == "concrete_dropout"


def test_conv_rates_are_per_input_channel():
    torch.manual_seed(0)
    model = BayesianConvNet(
        in_channels=2, num_classes=3, channels=(4, 3), hidden=5, image_size=12, kernel_size=3
    )
    x, y = torch.randn(3, 2, 12, 12), torch.tensor([0, 1, 2])
    guide = AutoConcreteDropout(model, rate_per="unit")
    guide(x, y)
    rates = guide.dropout_rates()
    assert rates["net.conv1.weight"].shape == (2,)  # input channels
    assert rates["net.conv2.weight"].shape == (4,)
    with local_reparameterization(strict=True):
        fit(model, guide, x, y, num_steps=2, progress=False, seed=0)
    for parallel in (False, True):
        out = Predictive(model, guide=guide, num_samples=3, parallel=parallel)(x)
        assert torch.isfinite(out["obs"].float()).all()


def test_rates_in_a_plate_have_one_value_per_member():
    def model(x, y=None):
        # As the UCI benchmark's ensemble of configurations: weights of batch shape (3, 1).
        with pyro.plate("members", 3, dim=-2):
            w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 2]).to_event(2))
            with pyro.plate("data", x.shape[0], dim=-1):
                f = (x @ w.transpose(-1, -2)).sum(-1)  # (3, 1, N)
                f = f.reshape(f.shape[:-3] + (3, x.shape[0]))
                pyro.sample("obs", dist.Normal(f, 1.0), obs=y)

    x, y = torch.randn(5, 2), torch.randn(5)
    for rate_per, shape in (("layer", (3, 1)), ("unit", (3, 1, 2))):
        guide = AutoConcreteDropout(model, rate_per=rate_per)
        with local_reparameterization(strict=True):
            fit(model, guide, x, y, num_steps=2, progress=False, seed=0)
        assert guide.dropout_rates()["w"].shape == shape
        assert guide.get_distributions()["w"].batch_shape == (3, 1)
        pyro.clear_param_store()


# --------------------------------------------------------------------------------------------
# relaxed masks in training, hard masks in prediction
# --------------------------------------------------------------------------------------------


@pytest.fixture
def mask_calls(monkeypatch):
    """Record the ``relaxed`` flag of every mask drawn, by the LRT rule or by the family."""
    calls = []
    original = lrt_rules.concrete_keep_mask

    def spy(rate, temperature, shape, relaxed=True, dropout_logit=None):
        calls.append(relaxed)
        return original(rate, temperature, shape, relaxed, dropout_logit)

    monkeypatch.setattr(lrt_rules, "concrete_keep_mask", spy)
    monkeypatch.setattr(concrete_masked_normal, "concrete_keep_mask", spy)
    return calls


def test_training_draws_relaxed_masks_and_prediction_hard_ones(mask_calls):
    model, guide, x, y = _fitted(steps=2)
    assert mask_calls and all(mask_calls)  # fit: relaxed
    mask_calls.clear()
    predict(model, guide, x, num_samples=4)
    assert mask_calls and not any(mask_calls)
    for parallel in (False, True):
        mask_calls.clear()
        with local_reparameterization():
            Predictive(model, guide=guide, num_samples=3, parallel=parallel)(x)
        assert mask_calls and not any(mask_calls)
    mask_calls.clear()
    guide.eval()  # hard masks even with gradients on
    with local_reparameterization():
        poutine.replay(model, trace=poutine.trace(guide).get_trace(x, y))(x, y)
    assert mask_calls and not any(mask_calls)
    guide.train()


def test_weight_draws_are_hard_in_predictive_and_relaxed_in_the_guide_when_training():
    _, guide, x, y = _fitted(steps=1, scale=1e-7, init_rate=0.5)
    mean = guide.median()["net.layers.0.weight"]  # (1 - p) M
    rate = guide.dropout_rates()["net.layers.0.weight"]
    kept = mean / (1 - rate)
    draws = Predictive(guide.model, guide=guide, num_samples=20)(x)["net.layers.0.weight"]
    ratio = (draws / kept).squeeze(1)
    assert torch.allclose(ratio, ratio.round(), atol=1e-4)  # each draw keeps or drops
    w = poutine.trace(guide).get_trace(x, y).nodes["net.layers.0.weight"]["value"]
    assert not torch.allclose(w / kept, (w / kept).round(), atol=1e-4)  # relaxed


def test_to_inference_data_draws_hard_masks(mask_calls):
    from pyro_dropout import to_inference_data

    model, guide, x, y = _fitted(steps=1)
    mask_calls.clear()
    to_inference_data(model, guide, x, y, num_samples=4)
    assert mask_calls and not any(mask_calls)


def test_the_rate_is_learned_through_the_likelihood():
    """The KL alone moves p; with the relaxed likelihood term the gradient differs from the
    KL's gradient (the rate is trained through the mask)."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=25.0)
    guide = AutoConcreteDropout(model)
    guide(x, y)
    param = dict(guide.named_parameters())["drop_rates.net.layers.0.weight_unconstrained"]
    with local_reparameterization():
        full = torch.autograd.grad(MeanFieldELBO().differentiable_loss(model, guide, x, y), param)
    trace = poutine.trace(guide).get_trace(x, y)
    prior = poutine.trace(model).get_trace(x, y).nodes["net.layers.0.weight"]["fn"]
    kl = torch.distributions.kl_divergence(trace.nodes["net.layers.0.weight"]["fn"], prior)
    (kl_only,) = torch.autograd.grad(kl, param)
    assert full[0].abs() > 0 and not torch.allclose(full[0], kl_only)


def test_jit_elbo_keeps_separate_graphs_for_relaxed_and_hard_masks():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(6,), tau=25.0)
    guide = AutoConcreteDropout(model)
    guide(x, y)
    elbo = JitMeanFieldELBO()
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
    with local_reparameterization():
        svi.evaluate_loss(x, y)  # no_grad: hard masks
        svi.step(x, y)  # relaxed masks: must not reuse the hard-mask graph
    assert len(elbo._compiled) == 2


# --------------------------------------------------------------------------------------------
# the paper's qualitative result
# --------------------------------------------------------------------------------------------


def _learned_rates(n, steps, seed=0):
    pyro.clear_param_store()
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.sin(x).squeeze(-1) + 0.1 * torch.randn(n, generator=g)
    model = BayesianMLP(1, 1, hidden=(32,), tau=100.0, prior=1.0)
    guide = AutoConcreteDropout(model)
    fit(model, guide, x, y, num_steps=steps, lr=0.01, progress=False, seed=seed)
    return torch.stack(list(guide.dropout_rates().values()))


@pytest.mark.slow
def test_learned_rates_fall_as_the_training_set_grows():
    """Gal, Hron & Kendall (2017, fig. 2-3): with more data the KL weighs less against the
    likelihood and the optimal drop rate falls. Same problem, N and 10 N points, same steps."""
    small = _learned_rates(30, steps=400)
    large = _learned_rates(300, steps=400)
    assert (large < small).all(), (small, large)


# --------------------------------------------------------------------------------------------
# the families read the rate's logit from its unconstrained parameter
# --------------------------------------------------------------------------------------------


def _site_fns(model, guide, x):
    trace = poutine.trace(guide).get_trace(x)
    return {
        n: s["fn"] for n, s in trace.nodes.items() if isinstance(s.get("fn"), ConcreteMaskedNormal)
    }


def test_the_families_are_built_from_the_clamped_logit_of_the_stored_rate():
    """Each weight family carries logit p read from the param store's unconstrained tensor
    (p = sigmoid(θ)), clamped to the rate clamp's range; its rate is dropout_rates()'s. A value
    replayed whose unconstrained tensor is gone falls back to the rate (same family)."""
    model, guide, x, _ = _fitted(steps=3)
    fns = _site_fns(model, guide, x)
    assert fns
    rates = guide.dropout_rates(x)
    for name, fn in fns.items():
        assert fn._compact_logit is not None
        torch.testing.assert_close(fn.dropout_rate.detach().reshape(-1)[0], rates[name].reshape(()))
    # a stored logit beyond the clamp: the family's rate stays inside (eps, 1 - eps)
    store = pyro.get_param_store()
    names = [n for n in store.keys() if "drop_rates" in n]
    assert names
    with torch.no_grad():
        for n in names:
            store[n].unconstrained().fill_(60.0)
    for fn in _site_fns(model, guide, x).values():
        assert 0 < float(fn.dropout_rate.detach().max()) < 1
    # replayed with no unconstrained tensor: the rate path, the same distribution
    with torch.no_grad():
        for n in names:
            store[n].unconstrained().fill_(-1.3)
    # (Pyro's replay wants constrained values, with ``unconstrained``; a weakref to a tensor
    # that is gone, e.g. after the param store was cleared, gives None)
    plain = {n: store[n].detach().clone() for n in names}
    for v in plain.values():
        v.unconstrained = lambda: None
    replayed = poutine.trace(poutine.replay(guide, params=plain)).get_trace(x)
    by_rate = {
        n: s["fn"]
        for n, s in replayed.nodes.items()
        if isinstance(s.get("fn"), ConcreteMaskedNormal)
    }
    by_logit = _site_fns(model, guide, x)
    assert by_rate.keys() == by_logit.keys()
    for n, fn in by_rate.items():
        assert fn._compact_logit is None and by_logit[n]._compact_logit is not None
        torch.testing.assert_close(fn.dropout_rate.detach(), by_logit[n].dropout_rate.detach())
