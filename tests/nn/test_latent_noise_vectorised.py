"""A latent noise scale (``BayesianMLP(tau=None)``, the default) under a leading sample plate:
vectorised particles and parallel draws give, draw by draw, the numbers of one draw at a time
(before, the (S, 1) scale broadcast against the rows and raised a shape error)."""

import pyro
import pyro.poutine as poutine
import pytest
import torch

from pyro_dropout import AutoDropout, AutoMeanField, BayesianMLP, fit
from pyro_dropout.diagnostics import to_inference_data


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    return x, x[:, 0] - x[:, 1] + 0.1 * torch.randn(40, generator=g)


@pytest.mark.parametrize("guide_cls", [AutoMeanField, AutoDropout])
def test_vectorised_model_log_likelihood_equals_each_draw_alone(guide_cls):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,))
    guide = guide_cls(model)
    fit(model, guide, x, y, num_steps=30, seed=0, progress=False)
    s = 5
    with pyro.plate("particles", s, dim=-2):
        g_tr = poutine.trace(guide).get_trace(x, y)
        m_tr = poutine.trace(poutine.replay(model, trace=g_tr)).get_trace(x, y)
    joint = m_tr.nodes["obs"]["fn"].log_prob(m_tr.nodes["obs"]["value"])  # (S, 1, N) or (S, N)
    joint = joint.reshape(s, -1).sum(-1)
    for i in range(s):
        one = {
            k: v["value"][i].reshape(v["fn"].event_shape)
            if v["fn"].event_shape
            else v["value"][i].reshape(())
            for k, v in g_tr.nodes.items()
            if v["type"] == "sample" and not v["is_observed"]
        }
        tr = poutine.trace(poutine.condition(model, data=one)).get_trace(x, y)
        alone = tr.nodes["obs"]["fn"].log_prob(tr.nodes["obs"]["value"]).sum()
        torch.testing.assert_close(joint[i], alone, rtol=1e-5, atol=1e-4)


def test_vectorised_particles_and_parallel_export_run():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,))
    guide = AutoMeanField(model)
    losses = fit(
        model,
        guide,
        x,
        y,
        num_steps=5,
        seed=0,
        progress=False,
        vectorize_particles=True,
        num_particles=4,
    )
    assert all(torch.isfinite(torch.tensor(losses)))
    data = to_inference_data(model, guide, x, y, num_samples=20, parallel=True, seed=0)
    assert data is not None
