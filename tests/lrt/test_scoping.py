"""Code that promises weight draws blocks an enclosing ``local_reparameterization()``.

``predict(..., local_reparameterization=False)``, ``to_inference_data`` / ``draw_posterior``
(and so the VI k-hat, which reads their log densities) must give the same distribution inside
and outside the context: coherent weight draws (identical input rows identical within a draw)
and recorded θ whose predictive quantities and log densities belong to that θ.
"""

import contextlib
import math

import numpy as np
import pyro
import pytest
import torch

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
    local_reparameterization,
    predict,
    to_inference_data,
)
from pyro_dropout.diagnostics import _arviz_compat as compat
from pyro_dropout.diagnostics.sampling import draw_posterior

from ._stats import Z, mean_z, var_z

TAU = 25.0
GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.3, scale=0.05),
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.1),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
}
CONTEXTS = {
    "outside": contextlib.nullcontext,
    "inside": local_reparameterization,
    "inside strict": lambda: local_reparameterization(strict=True),
}


def _fitted(name):
    pyro.set_rng_seed(0)
    x = torch.randn(12, 3)
    x[1] = x[0]  # two identical rows
    y = x[:, 0] - x[:, 1]
    model = BayesianMLP(3, 1, hidden=(6,), tau=TAU)
    guide = GUIDES[name](model)
    fit(model, guide, x, y, num_steps=10, lr=0.01, progress=False, seed=0)
    return model, guide, x, y


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_predict_with_weight_draws_is_coherent_inside_the_context(guide_name):
    model, guide, x, _ = _fitted(guide_name)
    samples = {}
    for where, ctx in CONTEXTS.items():
        with ctx():
            s = predict(model, guide, x, num_samples=3000, local_reparameterization=False)
        f = s.samples[..., 0]
        torch.testing.assert_close(f[:, 0], f[:, 1])  # one weight draw per pass
        samples[where] = f
    for where in ("inside", "inside strict"):
        assert mean_z(samples[where], samples["outside"]).abs().max() < Z
        assert var_z(samples[where], samples["outside"]).abs().max() < Z


def _forward(posterior, x, s):
    w0, b0 = posterior["net.layers.0.weight"][0, s], posterior["net.layers.0.bias"][0, s]
    w1, b1 = posterior["net.layers.1.weight"][0, s], posterior["net.layers.1.bias"][0, s]
    return np.maximum(x @ w0.T + b0, 0) @ w1.T + b1


@pytest.mark.parametrize("where", sorted(CONTEXTS))
@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_export_records_quantities_that_belong_to_each_theta(guide_name, where):
    model, guide, x, y = _fitted(guide_name)
    with CONTEXTS[where]():
        idata = to_inference_data(model, guide, x, y, num_samples=40, seed=3)
    post = {k: v.values for k, v in compat.get_group(idata, "posterior").data_vars.items()}
    mean = compat.get_group(idata, "posterior_predictive")["obs_mean"].values[0]
    ll = compat.get_group(idata, "log_likelihood")["obs"].values[0]
    stats = compat.get_group(idata, "sample_stats")
    xn, yn = x.numpy(), y.numpy()
    for s in range(40):
        f = _forward(post, xn, s)
        np.testing.assert_allclose(mean[s], f, rtol=1e-4, atol=1e-5)
        lik = -0.5 * TAU * (yn - f[:, 0]) ** 2 + 0.5 * math.log(TAU / (2 * math.pi))
        np.testing.assert_allclose(ll[s], lik, rtol=1e-4, atol=1e-4)
        prior = sum(-0.5 * (v[0, s] ** 2).sum() - 0.5 * v[0, s].size * math.log(2 * math.pi)
                    for v in post.values())  # fmt: skip
        np.testing.assert_allclose(stats["lp"].values[0, s], prior + lik.sum(), rtol=1e-4)


def test_log_q_is_the_guide_density_of_the_recorded_theta_inside_the_context():
    model, guide, x, y = _fitted("mean_field")
    with local_reparameterization():
        draws = draw_posterior(model, guide, x, y, num_samples=20)
    q = guide.get_distributions()
    for s in range(20):
        expected = sum(
            float(q[name].log_prob(torch.as_tensor(draws.latents[name][s])).detach())
            for name in draws.latent_names
        )
        assert draws.log_q[s] == pytest.approx(expected, rel=1e-5)
