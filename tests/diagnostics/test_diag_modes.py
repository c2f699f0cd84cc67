"""The ArviZ export, ``compare`` and the NUTS reference run the model in eval mode, restore
every module's mode and buffers, and never mistake vectorised draws for rows (issue 39, items
1, 2 and 4)."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import pyro_dropout as pd
from pyro_dropout.diagnostics import _arviz_compat as compat
from pyro_dropout.diagnostics import compare, reference_posterior, to_inference_data
from pyro_dropout.diagnostics.reliability import loo_flags
from pyro_dropout.nn import BayesianModel, bayesianize

H = 6


class SeesMode(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, h):
        self.seen.append(self.training)
        return h


def _bn_model(seed=0):
    torch.manual_seed(seed)
    seer = SeesMode()
    net = nn.Sequential(nn.Linear(1, H), nn.BatchNorm1d(H), seer, nn.Tanh(), nn.Linear(H, 1))
    net[1].running_mean.normal_()
    net[1].running_var.uniform_(0.5, 2.0)
    model = BayesianModel(bayesianize(net, deterministic=(nn.BatchNorm1d,)), tau=25.0)
    guide = pd.AutoDropout(model, dropout_rate=0.2)
    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    y = torch.sin(2 * x).squeeze(-1)
    guide(x, y)
    model.train()
    seer = next(m for m in model.modules() if isinstance(m, SeesMode))  # bayesianize copies
    seer.seen.clear()
    return model, guide, seer, x, y


def _state(model):
    return (
        {k: v.clone() for k, v in model.named_buffers()},
        {n: m.training for n, m in model.named_modules()},
    )


def _assert_untouched(model, state):
    buffers, flags = state
    for k, v in model.named_buffers():
        torch.testing.assert_close(v, buffers[k], rtol=0, atol=0, msg=f"buffer {k} moved")
    assert {n: m.training for n, m in model.named_modules()} == flags


def _test_means(data):
    return np.asarray(compat.get_group(data, "predictions")["obs_mean"])


def test_export_on_h_test_rows_is_the_sequential_export_and_leaves_the_model():
    """x_test with N == H rows: the vectorised export (or its fallback) gives exactly the
    one-draw-per-pass export for the same seed; eval mode; buffers and modes restored."""
    model, guide, seer, x, y = _bn_model()
    state = _state(model)
    xt = torch.linspace(-1, 1, H).unsqueeze(-1)
    yt = torch.sin(2 * xt).squeeze(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's VectorizationWarning, ArviZ's
        auto = to_inference_data(model, guide, x, y, 40, x_test=xt, y_test=yt, seed=1)
        seq = to_inference_data(
            model, guide, x, y, 40, x_test=xt, y_test=yt, seed=1, parallel=False
        )
    np.testing.assert_allclose(_test_means(auto), _test_means(seq), rtol=1e-6)
    assert seer.seen and not any(seer.seen)
    _assert_untouched(model, state)


def test_export_in_train_mode_restores_the_statistics():
    model, guide, seer, x, y = _bn_model()
    state = _state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_inference_data(model, guide, x, y, 10, seed=0, module_mode="train")
    assert seer.seen and all(seer.seen)
    _assert_untouched(model, state)


def test_compare_leaves_the_model_as_it_found_it():
    model, guide, seer, x, y = _bn_model()
    state = _state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = compare({"bn": (model, guide)}, x=x, y=y, x_test=x[:H], y_test=y[:H],
                        num_samples=30)  # fmt: skip
    assert "bn" in table.index
    assert seer.seen and not any(seer.seen)
    _assert_untouched(model, state)


def test_reference_leaves_the_model_as_it_found_it():
    model, guide, seer, x, y = _bn_model()
    state = _state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 5 draws do not converge: not the point
        reference_posterior(
            model, x[:8], y[:8], num_chains=1, num_warmup=3, num_samples=3, jit_compile=False,
            max_tree_depth=2, processes=1, seed=0,
        )  # fmt: skip
    assert seer.seen and not any(seer.seen)
    _assert_untouched(model, state)


@pytest.mark.parametrize(
    "k, text",
    [
        (np.r_[0.9, np.full(199, 0.1)], "k>0.70 at 1 of 200 (0.5%)"),
        (np.r_[np.full(1999, 0.9), 0.1], "k>0.70 at 1999 of 2000 (99.95%)"),
        (np.r_[np.full(38, 0.9), np.full(62, 0.1)], "k>0.70 at 38 of 100 (38%)"),
    ],
)
def test_pareto_k_flag_never_rounds_a_share_to_0_or_100_percent(k, text):
    assert loo_flags(k, 0.7, p_loo=1.0)[0] == ("loo_k", text)
