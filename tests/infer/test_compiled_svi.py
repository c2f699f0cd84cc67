"""``CompiledSVI``: the same steps as ``pyro.infer.SVI`` (bit for bit, on the same seed), the
checked graph called directly once a signature is checked, Pyro's path otherwise."""

import pyro
import pytest
import torch
from pyro.infer import SVI

from pyro_dropout import AutoDropout, AutoMeanField, BayesianMLP, local_reparameterization
from pyro_dropout.guides import AutoConcreteDropout
from pyro_dropout.infer import CompiledSVI, JitMeanFieldELBO, MeanFieldELBO, fused_adam
from pyro_dropout.infer.flat_adam import FlatAdam

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.1),
    "concrete": AutoConcreteDropout,
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.1),
}


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70, 3, generator=g)
    return x, x[:, 0] - x[:, 2] + 0.1 * torch.randn(70, generator=g)


def _train(svi_class, guide, steps=12, elbo=None, optim=None):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(16,), tau=25.0)
    q = GUIDES[guide](model)
    svi = svi_class(
        model,
        q,
        optim if optim is not None else fused_adam({"lr": 1e-2}),
        elbo if elbo is not None else JitMeanFieldELBO(max_plate_nesting=1),
    )
    losses = []
    with local_reparameterization():
        for step in range(steps):
            # minibatches of 32, 32 and a last one of 6: two signatures
            i = (step % 3) * 32
            losses.append(svi.step(x[i : i + 32], y[i : i + 32], num_data=70))
    # names without the guide's prefix (a second AutoDropout is "AutoDropout_1")
    params = {k.split(".", 1)[1]: v.detach().clone() for k, v in pyro.get_param_store().items()}
    return svi, losses, params


@pytest.mark.parametrize("guide", list(GUIDES))
def test_same_steps_as_svi(guide):
    _, l0, p0 = _train(SVI, guide)
    svi, l1, p1 = _train(CompiledSVI, guide)
    assert svi.compiled_elbo is not None
    assert l1 == l0
    assert p1.keys() == p0.keys()
    for k in p0:
        torch.testing.assert_close(p1[k], p0[k], rtol=0, atol=0)


def test_fast_path_taken_after_the_checked_traces(monkeypatch):
    calls = []
    eager = CompiledSVI._eager_step
    monkeypatch.setattr(
        CompiledSVI, "_eager_step", lambda self, *a: calls.append(1) or eager(self, *a)
    )
    svi, _, _ = _train(CompiledSVI, "dropout", steps=12)
    # two signatures (32 rows, 6 rows), each traced on two calls through SVI.step's path
    assert len(calls) == 4
    # cleared after the step: zeroed in place, views of the flat Adam's gradient buffer
    flat = svi.optim._flat
    assert flat is not None
    for p in svi.guide.parameters():
        assert p.grad is not None and not p.grad.any()
        assert p.grad.untyped_storage().data_ptr() == flat.flat_grad.untyped_storage().data_ptr()


SVI_STEP = SVI.step


def test_other_elbo_or_optimiser_is_plain_svi():
    svi, l1, _ = _train(CompiledSVI, "dropout", elbo=MeanFieldELBO(max_plate_nesting=1))
    assert svi.compiled_elbo is None
    _, l0, _ = _train(SVI, "dropout", elbo=MeanFieldELBO(max_plate_nesting=1))
    assert l1 == l0
    svi, _, _ = _train(CompiledSVI, "dropout", optim=pyro.optim.Adam({"lr": 1e-2}))
    assert svi.compiled_elbo is None


def test_eager_steps_keep_the_gradients_in_the_flat_adams_buffer(monkeypatch):
    """With an ELBO that is not compiled, CompiledSVI takes SVI.step's steps (same losses,
    checked above) but clears the gradients in place: they stay views of the flat Adam's
    buffer, so its steps copy nothing (Pyro's zero_grads would give each a new tensor)."""
    copies = []
    ready = FlatAdam.ready

    def counting_ready(self):
        before = [p.grad for p in self.params]
        out = ready(self)
        copies.extend(g is not p.grad for g, p in zip(before, self.params, strict=True))
        return out

    monkeypatch.setattr(FlatAdam, "ready", counting_ready)
    svi, _, _ = _train(CompiledSVI, "dropout", elbo=MeanFieldELBO(max_plate_nesting=1))
    flat = svi.optim._flat
    assert flat is not None and copies and not any(copies)
    for p in flat.params:
        assert p.grad is not None and not p.grad.any()
        assert p.grad.untyped_storage().data_ptr() == flat.flat_grad.untyped_storage().data_ptr()
    copies.clear()
    _train(SVI, "dropout", elbo=MeanFieldELBO(max_plate_nesting=1))  # plain SVI: copies
    assert any(copies)


# A model that cannot be compiled (eager with one CompilationWarning) through fit, which trains
# with CompiledSVI: tests/infer/test_compiled_default.py.


def test_a_guide_list_around_concrete_dropout_recaptures_in_eval_mode():
    """AutoConcreteDropout's masks are relaxed in training and hard in eval mode (its
    ``jit_key``); inside an ``AutoGuideList`` (no ``jit_key``) the compiled loss is keyed by
    the list's ``training`` flag, which ``eval()`` passes down: a step in eval mode does not
    replay the relaxed graph."""
    from pyro.infer.autoguide import AutoGuideList

    from pyro_dropout import AutoConcreteDropout, BayesianMLP, local_reparameterization
    from pyro_dropout.infer import JitMeanFieldELBO, fused_adam

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = torch.randn(32, 3), torch.randn(32)
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = AutoGuideList(model)
    guide.append(AutoConcreteDropout(model))
    elbo = JitMeanFieldELBO()
    svi = CompiledSVI(model, guide, fused_adam({"lr": 1e-2}), elbo)
    with local_reparameterization():
        for _ in range(3):
            svi.step(x, y, num_data=32)
        assert len(elbo._compiled) == 1
        guide.eval()
        assert not guide[0].relaxed
        svi.step(x, y, num_data=32)
    assert len(elbo._compiled) == 2  # a second graph, captured with hard masks
