"""Prediction does not touch the model (eval mode, modes and buffers restored), and vectorised
draws are never mistaken for rows, whatever the number of rows (issue 39, items 1 and 2)."""

import warnings

import pyro
import pytest
import torch
from torch import nn

from pyro_dropout import AutoDropout, BayesianMLP, predict
from pyro_dropout.infer.draws import VectorizationWarning, run_draws
from pyro_dropout.infer.draws import run as run_module
from pyro_dropout.infer.draws.modes import module_mode, modules_of
from pyro_dropout.infer.draws.verify import needs_check
from pyro_dropout.nn import BayesianModel, bayesianize

H1, H2 = 6, 4  # the hidden widths of the test network


class FeatureSoftmax(nn.Module):
    """A user's module whose op reads a fixed dim: ``dim=1`` is the features of an ``(N, H)``
    input but the rows of a ``(draws, N, H)`` one."""

    def forward(self, h):
        return h.softmax(dim=1)


class Scale(nn.Module):
    """A user's module that broadcasts over any leading dims (the check runs and passes)."""

    def forward(self, h):
        return 0.5 * h


class SeesMode(nn.Module):
    """Records the training flag it ran with."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, h):
        self.seen.append(self.training)
        return h


NORMS = {
    "batchnorm": lambda w: nn.BatchNorm1d(w),
    "layernorm": lambda w: nn.LayerNorm(w),
    "user_softmax": lambda w: FeatureSoftmax(),
    "user_scale": lambda w: Scale(),
}
#: the ones that give other results on a (draws, N, H) input (rank-dependent): LayerNorm
#: normalises the last dim whatever the rank, Scale is elementwise.
RANK_DEPENDENT = {"batchnorm", "user_softmax"}


def _model(norm, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(2, H1), NORMS[norm](H1), nn.Tanh(), nn.Linear(H1, H2), nn.Tanh(),
        nn.Linear(H2, 1),
    )  # fmt: skip
    for m in net.modules():  # running statistics far from (0, 1): eval mode is visible
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    model = BayesianModel(bayesianize(net, deterministic=(nn.BatchNorm1d, nn.LayerNorm)), tau=4.0)
    guide = AutoDropout(model, dropout_rate=0.2)
    x = torch.randn(12, 2)
    guide(x, x[:, 0])  # set up the guide
    return model, guide


def _buffers(model):
    return {k: v.clone() for k, v in model.named_buffers()}


@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("n", [H1, H2, H1 + 1])
def test_vectorised_equals_sequential_whatever_the_number_of_rows(norm, n):
    """N equal to each hidden width: the draws must not be read as rows. With the same seed
    the vectorised run (or its fallback) gives exactly the sequential predictions."""
    model, guide = _model(norm)
    x = torch.linspace(-2, 2, 2 * n).reshape(n, 2)
    seq = predict(model, guide, x, num_samples=20, seed=1, vectorize=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = predict(model, guide, x, num_samples=20, seed=1)
    fallback = [w for w in caught if issubclass(w.category, VectorizationWarning)]
    if norm in RANK_DEPENDENT:
        torch.testing.assert_close(auto.samples, seq.samples)
        assert len(fallback) == 1  # never silent, once per run
        assert fallback[0].filename == __file__  # at the user's line (not torch.no_grad's)
        assert "one draw per pass" in str(fallback[0].message)
        if norm == "user_softmax" or n == H1:  # BatchNorm1d(H1) only passes its check at N=H1
            assert "differs by up to" in str(fallback[0].message)
        else:  # elsewhere it raises on (draws, N, H1): the warning names the exception
            assert "does not broadcast" in str(fallback[0].message)
    else:
        assert not fallback
        # vectorised draws differ from the sequential ones: compare the predictive moments
        # (20 draws each; the dropout spread is small against the tolerance)
        torch.testing.assert_close(auto.mean, seq.mean, atol=0.15, rtol=0.0)


def test_vectorize_true_raises_when_the_check_fails():
    model, guide = _model("batchnorm")
    x = torch.randn(H1, 2)
    with pytest.raises(RuntimeError, match="differs by up to"):
        predict(model, guide, x, num_samples=10, seed=0, vectorize=True)


def test_library_mlp_stays_vectorised_with_n_equal_to_its_width(monkeypatch):
    """BayesianMLP is made of the library's modules: no check pass, the run is vectorised."""
    torch.manual_seed(0)
    model = BayesianMLP(3, 1, hidden=(16,), tau=10.0)
    guide = AutoDropout(model, dropout_rate=0.1)
    x = torch.randn(16, 3)
    guide(x, x[:, 0])
    assert not needs_check(model)
    calls = _spy_check(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VectorizationWarning)
        run = run_draws(model, guide, [((x,), {})], 50)
    assert run.vectorized and calls == []
    assert run.obs[0].params["loc"].shape == (50, 16, 1)


def _spy_check(monkeypatch):
    calls = []
    original = run_module._check

    def spy(*args):
        calls.append(original(*args))
        return calls[-1]

    monkeypatch.setattr(run_module, "_check", spy)
    return calls


def test_needs_check():
    assert needs_check(lambda x: x)
    assert needs_check(_model("batchnorm")[0]) and needs_check(_model("user_scale")[0])
    assert not needs_check(_model("layernorm")[0])
    assert not needs_check(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


@pytest.mark.parametrize("estimator", ["weights", "auto"])
def test_check_passes_for_a_broadcasting_user_module(monkeypatch, estimator):
    """The check runs for a user's module and passes when it broadcasts, also with
    per-example pre-activations (the check replays the drawn weights)."""
    model, guide = _model("user_scale")
    x = torch.randn(H1, 2)
    calls = _spy_check(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VectorizationWarning)
        run = run_draws(model, guide, [((x,), {})], 30, estimator=estimator)
    assert calls == [None] and run.vectorized


# --------------------------------------------------------------------------------------------
# modes and buffers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize", ["auto", False])
def test_predict_runs_in_eval_mode_and_restores_modes_and_buffers(vectorize):
    model, guide = _model("batchnorm")
    seer = SeesMode()
    model.net.append(seer)
    model.train()
    before, flags = _buffers(model), {n: m.training for n, m in model.named_modules()}
    x = torch.randn(H1, 2)  # N == H1: the case that moved the statistics
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VectorizationWarning)
        predict(model, guide, x, num_samples=10, seed=0, vectorize=vectorize)
    assert seer.seen and not any(seer.seen)  # eval mode throughout
    after = _buffers(model)
    for k, v in before.items():
        torch.testing.assert_close(after[k], v, rtol=0, atol=0, msg=f"buffer {k} moved")
    assert {n: m.training for n, m in model.named_modules()} == flags

    seer.seen.clear()
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VectorizationWarning)
        predict(model, guide, x, num_samples=10, seed=0, vectorize=vectorize, module_mode="train")
    assert seer.seen and all(seer.seen)
    for k, v in before.items():  # train mode: BatchNorm used batch statistics, restored
        torch.testing.assert_close(_buffers(model)[k], v, rtol=0, atol=0, msg=k)
    assert not model.training and not seer.training


def test_eval_mode_uses_the_running_statistics():
    """Default eval mode: BatchNorm normalises with its running statistics, so one row's
    prediction does not depend on the other rows (one draw: the same θ for the same seed)."""
    model, guide = _model("batchnorm")
    x = torch.randn(H1 + 1, 2)
    full = predict(model, guide, x, num_samples=1, seed=3)
    part = predict(model, guide, x[:3], num_samples=1, seed=3)
    torch.testing.assert_close(full.samples[:, :3], part.samples)


def test_modes_and_buffers_are_restored_after_an_error():
    model, guide = _model("batchnorm")
    model.train()
    before = _buffers(model)
    with pytest.raises(ValueError):
        predict(model, guide, torch.randn(5, 7), num_samples=3)  # 7 features, not 2
    assert all(m.training for m in model.modules())
    for k, v in before.items():
        torch.testing.assert_close(_buffers(model)[k], v, rtol=0, atol=0)


def test_module_mode_restores_replaced_buffers_and_rejects_unknown_modes():
    bn = nn.BatchNorm1d(3)
    mean = bn.running_mean
    with module_mode(bn, mode="train"):
        bn(torch.randn(4, 3))
        bn.running_mean = torch.ones(3)  # replaced, not updated in place
    assert bn.running_mean is mean and torch.equal(mean, torch.zeros(3))
    assert int(bn.num_batches_tracked) == 0
    with pytest.raises(ValueError, match="'eval' or 'train'"):
        with module_mode(bn, mode="inference"):
            pass


def test_modules_of_finds_bound_methods_closures_and_an_autoguides_model():
    net, other = nn.Linear(2, 2), nn.BatchNorm1d(2)

    def model(x):
        return other(net(x))

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 1)

        def model(self, x):
            return self.lin(x)

    h = Holder()
    found = modules_of(model, h.model)
    assert {id(m) for m in found} >= {id(net), id(other), id(h), id(h.lin)}
    torch.manual_seed(0)
    mlp = BayesianMLP(1, 1, hidden=(2,))
    guide = AutoDropout(mlp)
    assert any(m is mlp for m in modules_of(guide))
    pyro.clear_param_store()
