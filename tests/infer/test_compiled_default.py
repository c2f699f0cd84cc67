"""``fit(..., jit="auto")`` compiles the loss: checked traces, one warning and an
eager fit where a model cannot be compiled, the same loss as eager on a fixed seed, the same
fit in distribution."""

import gc
import inspect
import warnings
import weakref

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI
from pyro.nn import PyroModule, PyroSample
from torch.utils.data import DataLoader, TensorDataset

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    BayesianLinear,
    BayesianMLP,
    fit,
    local_reparameterization,
    predict,
)
from pyro_dropout.infer import CompilationWarning, JitMeanFieldELBO, MeanFieldELBO, fused_adam
from pyro_dropout.infer.fit import make_elbo


def _data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] - 0.5 * x[:, 2] + 0.1 * torch.randn(n, generator=g)


class Tutorial(PyroModule):
    """The Pyro tutorial's BNN: ``PyroModule[nn.Linear]`` layers with ``PyroSample`` weights."""

    def __init__(self, branch_on_data=False):
        super().__init__()
        self.branch_on_data = branch_on_data
        self.l1 = PyroModule[torch.nn.Linear](3, 16)
        self.l1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([16, 3]).to_event(2))
        self.l1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([16]).to_event(1))
        self.l2 = PyroModule[torch.nn.Linear](16, 1)
        self.l2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 16]).to_event(2))
        self.l2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        mu = self.l2(torch.relu(self.l1(x))).squeeze(-1)
        if self.branch_on_data and bool(x[:, 0].mean() > 0):  # frozen into a trace
            mu = 2.0 * mu
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, 0.3), obs=y)
        return mu


def test_fit_compiles_by_default_without_a_warning():
    assert make_elbo(BayesianMLP(3, 1)).__class__ is JitMeanFieldELBO  # the default
    assert make_elbo(BayesianMLP(3, 1)).fallback
    assert make_elbo(BayesianMLP(3, 1), jit=False).__class__ is MeanFieldELBO
    assert not make_elbo(BayesianMLP(3, 1), jit=True).fallback
    assert inspect.signature(fit).parameters["jit"].default == "auto"
    x, y = _data()
    for model in (BayesianMLP(3, 1, hidden=(16,), tau=25.0), Tutorial()):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # compiled: no CompilationWarning
            losses = fit(model, AutoMeanField(model), x, y, num_epochs=3, batch_size=32, lr=1e-2,
                         seed=0, progress=False)  # fmt: skip
        assert len(losses) == 9 and all(torch.isfinite(torch.tensor(losses)))


def test_the_lightning_module_compiles_by_default_too():
    # lightning first: pyro_dropout.lightning raises an ImportError of its own without it
    pytest.importorskip(
        "lightning", reason="needs the lightning extra: pip install -e '.[lightning]'"
    )
    from pyro_dropout.lightning import BayesianModule

    assert inspect.signature(BayesianModule).parameters["jit"].default == "auto"


def test_graphs_are_freed_with_the_elbo():
    """The captured graphs belong to the ELBO (TorchScript's tracer kept every traced function
    for the life of the process, ~44 MB per fit of a 20-200-200-1 network)."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(16,), tau=25.0)
    elbo = JitMeanFieldELBO(max_plate_nesting=1)
    svi = SVI(model, AutoDropout(model), fused_adam({"lr": 1e-2}), elbo)
    with local_reparameterization():
        for _ in range(3):
            svi.step(x[:32], y[:32])
    assert len(elbo._compiled) == 1 and elbo.eager_reason is None
    (fn, _calls) = next(iter(elbo._compiled.values()))
    gone = weakref.ref(fn.captured.module)
    del svi, elbo, fn
    gc.collect()
    assert gone() is None


def test_data_dependent_model_falls_back_to_eager_with_one_warning():
    x, y = _data()
    order = x[:, 0].argsort(descending=True)  # unshuffled: the first minibatch takes the
    data = TensorDataset(x[order], y[order])  # branch, the second does not
    loader = DataLoader(data, batch_size=32, shuffle=False)
    model = Tutorial(branch_on_data=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = fit(
            model, AutoMeanField(model), loader, num_epochs=4, seed=0, progress=False, jit="auto"
        )
    ours = [w for w in caught if issubclass(w.category, CompilationWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert ours[0].filename == __file__  # points at the user's fit call
    assert "differs between two minibatches" in str(ours[0].message)
    assert "jit=False" in str(ours[0].message)
    assert len(losses) == 12 and all(torch.isfinite(torch.tensor(losses)))
    model = Tutorial(branch_on_data=True)
    with pytest.raises(RuntimeError, match="depend on the data"):
        fit(model, AutoMeanField(model), loader, num_epochs=2, jit=True, progress=False)
    model = Tutorial(branch_on_data=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # jit=False: eager, nothing to warn about
        fit(model, AutoMeanField(model), x, y, num_epochs=1, batch_size=32, jit=False,
            progress=False)  # fmt: skip


def test_an_argument_that_cannot_be_traced_runs_eagerly_with_the_reason():
    class WithOptions(Tutorial):
        def forward(self, x, y=None, options=None):
            return super().forward(x * options["gain"], y)

    x, y = _data()
    model = WithOptions()
    guide = AutoMeanField(model)
    elbo = JitMeanFieldELBO(max_plate_nesting=1, fallback=True)
    with local_reparameterization(), pytest.warns(CompilationWarning, match="type dict"):
        loss = elbo.loss(model, guide, x, y, options={"gain": 1.0})
    assert elbo.eager_reason is not None and torch.isfinite(torch.tensor(loss))
    with pytest.raises(TypeError, match="type dict"):  # jit=True: an error, as before
        JitMeanFieldELBO(max_plate_nesting=1).loss(model, guide, x, y, options={"gain": 1.0})


def test_a_model_error_is_raised_as_itself_not_as_a_compilation_warning():
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    guide = AutoMeanField(model)
    x, y = _data()
    guide(x, y)
    elbo = JitMeanFieldELBO(max_plate_nesting=1, fallback=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        # the layer's own error (issue 23: it names the input and the weight's width)
        with pytest.raises(ValueError, match="has 5 features .* takes 3"):
            elbo.loss(model, guide, torch.randn(8, 5), y[:8])


def test_a_model_subsampling_its_own_plate_trains_eagerly_with_a_warning():
    layer = BayesianLinear(3, 1)

    def model(x, y=None):
        with pyro.plate("data", x.shape[0], subsample_size=16) as ind:
            f = layer(x[ind]).squeeze(-1)
            pyro.sample("obs", dist.Normal(f, 0.3), obs=None if y is None else y[ind])
        return f

    x, y = _data(48)
    with pytest.warns(CompilationWarning, match="subsamples its own plate 'data'"):
        losses = fit(model, AutoMeanField(model), x, y, num_epochs=1, progress=False, jit="auto")
    assert len(losses) == 3


@pytest.mark.parametrize("make_guide", [AutoMeanField, lambda m: AutoDropout(m, dropout_rate=0.2)])
def test_compiled_and_eager_loss_agree_on_a_fixed_seed(make_guide):
    """Without local reparameterisation every draw of the guide is used, so the traced graph
    draws the same random numbers in the same order as the eager loss: equal to float
    rounding, step after step of the same parameters."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(16,), tau=25.0)
    guide = make_guide(model)
    eager = MeanFieldELBO(max_plate_nesting=1)
    jit = JitMeanFieldELBO(max_plate_nesting=1)
    for k in range(2):  # the first two calls of a signature trace (and check the trace)
        jit.differentiable_loss(model, guide, x[32 * k :][:32], y[32 * k :][:32], num_data=96)
    for step in range(3):  # later calls run the graph
        xb, yb = x[32 * step :][:32], y[32 * step :][:32]
        pyro.set_rng_seed(step)
        want = eager.differentiable_loss(model, guide, xb, yb, num_data=96)
        pyro.set_rng_seed(step)
        got = jit.differentiable_loss(model, guide, xb, yb, num_data=96)
        assert got.item() == pytest.approx(want.item(), rel=1e-5), step


def test_compiled_and_eager_fits_agree_in_distribution():
    """Five seeds each: the held-out log-likelihood of the default (compiled) fit and of the
    eager fit agree within four standard errors of their difference."""
    x, y = _data(160, seed=1)
    xt, yt = _data(200, seed=2)
    lls = {True: [], False: []}
    for jit in lls:
        for seed in range(5):
            model = BayesianMLP(3, 1, hidden=(16,), tau=25.0)
            guide = AutoDropout(model, dropout_rate=0.1)
            fit(model, guide, x, y, num_steps=300, batch_size=32, lr=1e-2, seed=seed,
                jit="auto" if jit else False, progress=False)  # fmt: skip
            pred = predict(model, guide, xt, num_samples=50, seed=0)
            lls[jit].append(float(pred.log_likelihood(yt).mean()))
    a, b = torch.tensor(lls[True]), torch.tensor(lls[False])
    se = ((a.var() + b.var()) / 5).sqrt() + 1e-3
    assert (a.mean() - b.mean()).abs() < 4 * se, (lls, se)
    assert a.mean() > 0.0  # both learned the function (noise SD 0.1: LL about 0.9)


def test_svi_with_the_compiled_elbo_is_plain_pyro():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    guide = AutoMeanField(model)
    svi = SVI(model, guide, fused_adam({"lr": 1e-2}), JitMeanFieldELBO(fallback=True))
    with local_reparameterization():
        losses = [svi.step(x, y) for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_jit_argument_is_checked():
    model = BayesianMLP(3, 1)
    x, y = _data()
    with pytest.raises(ValueError, match="jit must be True, False or 'auto'"):
        fit(model, AutoMeanField(model), x, y, num_steps=1, jit="yes", progress=False)


def test_captured_inputs_have_a_fixed_order():
    """The two captures of a signature are compared as text: their inputs (Pyro's parameters)
    must come in one order (Pyro's ``list(set(names))`` varied between traces 1 run in 3)."""
    from pyro_dropout.infer.capture import CapturedFunction

    def fn(x):
        return x * pyro.param("b", torch.ones(())) + pyro.param("a", torch.ones(2)).sum()

    captured = CapturedFunction(fn)
    captured(torch.ones(2))
    assert captured.param_names == ["a", "b"]
