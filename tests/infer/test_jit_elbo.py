"""``JitMeanFieldELBO``: same loss and gradients as ``MeanFieldELBO`` (in expectation, and
exactly where the noise vanishes), one trace per input signature, clear errors."""

import pytest
import torch

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
    local_reparameterization,
)
from pyro_dropout.infer import JitMeanFieldELBO, MeanFieldELBO

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.2),
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.1),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
}


def _data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] - x[:, 2] + 0.1 * torch.randn(n, generator=g)


def _setup(guide):
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    return model, GUIDES[guide](model) if isinstance(guide, str) else guide(model)


def _loss_and_grads(elbo, model, guide, x, y, draws):
    """Per-draw losses and gradients (flattened over the guide's parameters)."""
    elbo.loss(model, guide, x, y, num_data=100)  # sets the guide up (and traces)
    params = [p for _, p in sorted(guide.named_parameters())]
    losses, grads = [], []
    for _ in range(draws):
        for p in params:
            p.grad = None
        losses.append(elbo.loss_and_grads(model, guide, x, y, num_data=100))
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
    return torch.tensor(losses), torch.stack(grads)


@pytest.mark.parametrize("guide", list(GUIDES))
def test_same_loss_and_gradient_in_expectation(guide):
    """The traced graph draws its noise in another order (and drops the guide's unused weight
    draw), so compare Monte-Carlo means: both estimate the same expected loss and gradient.
    A missing KL term or a wrong scale shifts the loss by hundreds of standard errors."""
    x, y = _data()
    model, g = _setup(guide)
    jit, eager = JitMeanFieldELBO(max_plate_nesting=1), MeanFieldELBO(max_plate_nesting=1)
    with local_reparameterization():
        lj, gj = _loss_and_grads(jit, model, g, x, y, 300)
        le, ge = _loss_and_grads(eager, model, g, x, y, 300)
    se = ((lj.var() + le.var()) / 300).sqrt()
    assert (lj.mean() - le.mean()).abs() < 5 * se, (lj.mean(), le.mean(), se)
    gse = ((gj.var(0) + ge.var(0)) / 300).sqrt().clamp_min(1e-6)
    z = (gj.mean(0) - ge.mean(0)) / gse
    # 5 SE per coordinate; a few hundred coordinates, so allow a rare 4-5 SE one
    assert z.abs().max() < 5.5, z.abs().max()
    assert (z.abs() > 3.5).float().mean() < 0.02


@pytest.mark.parametrize(
    "make_guide",
    [
        lambda m: AutoDropout(m, dropout_rate=0.0, scale=1e-6),
        lambda m: AutoMeanField(m, init_scale=1e-6),
    ],
    ids=["dropout p=0", "mean_field tiny scale"],
)
def test_exact_where_the_noise_vanishes(make_guide):
    x, y = _data()
    model, g = _setup(make_guide)
    jit, eager = JitMeanFieldELBO(max_plate_nesting=1), MeanFieldELBO(max_plate_nesting=1)
    with local_reparameterization():
        lj, gj = _loss_and_grads(jit, model, g, x, y, 2)
        le, ge = _loss_and_grads(eager, model, g, x, y, 1)
    torch.testing.assert_close(lj[-1:], le, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(gj[-1:], ge, rtol=1e-3, atol=1e-2)


def test_one_trace_per_input_signature():
    x, y = _data()
    model, g = _setup("dropout")
    elbo = JitMeanFieldELBO(max_plate_nesting=1)
    with local_reparameterization():
        for b in (16, 16, 8, 16, 8):
            elbo.loss(model, g, x[:b], y[:b], num_data=40)
        assert len(elbo._compiled) == 2
        elbo.loss(model, g, x[:8], y[:8], num_data=80)  # another constant: another trace
        assert len(elbo._compiled) == 3
    elbo.loss(model, g, x[:8], y[:8], num_data=80)  # outside the LRT context: another trace
    assert len(elbo._compiled) == 4


def test_traced_loss_follows_the_minibatch_size():
    """The likelihood scale N/B is baked into a trace; each batch size gets its own."""
    x, y = _data()
    model, g = _setup(lambda m: AutoMeanField(m, init_scale=1e-6))
    elbo = JitMeanFieldELBO(max_plate_nesting=1)
    with local_reparameterization():
        big = elbo.loss(model, g, x[:20].repeat(2, 1), y[:20].repeat(2), num_data=40)
        small = elbo.loss(model, g, x[:20], y[:20], num_data=40)
    assert small == pytest.approx(big, rel=1e-4)


def test_unsupported_argument_type_is_named():
    x, y = _data()
    model, g = _setup("dropout")
    with pytest.raises(TypeError, match="cannot compile for an argument of type list"):
        JitMeanFieldELBO().loss(model, g, x, y, num_data=[40])


def test_fit_with_jit_learns_and_handles_a_short_last_batch():
    x, y = _data(50)
    model, g = _setup("mean_field")
    losses = fit(
        model, g, x, y, num_epochs=60, batch_size=16, jit=True, lr=0.01, seed=1, progress=False
    )
    assert len(losses) == 60 * 4  # 16 + 16 + 16 + 2 rows per epoch
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < 0.5 * first, (first, last)
