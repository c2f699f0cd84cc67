"""``cuda_graph=True`` (:mod:`pyro_dropout.infer.cuda_graph`) checked on the CPU.

Recording a CUDA graph needs a GPU (``tests/cuda`` runs the real one); here its two CUDA calls
are replaced by a stand-in whose "recording" runs nothing and whose replay runs the recorded
step eagerly, so everything around them (the fixed inputs the minibatch is copied into, the
step count, the warm-up, the fallbacks and their warnings) is checked against the same fit
without graphs, to the bit.
"""

import warnings

import pyro
import pytest
import torch

from pyro_dropout import AutoConcreteDropout, AutoDropout, AutoMeanField, BayesianMLP, fit
from pyro_dropout.infer import CompilationWarning, CompiledSVI, JitMeanFieldELBO, fused_adam
from pyro_dropout.infer import cuda_graph as cg


def _data(n=96, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, x[:, 0] - 0.5 * x[:, 1] + 0.1 * torch.randn(n, generator=g)


GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.1),
    "mean_field": AutoMeanField,
    "concrete": AutoConcreteDropout,
}


class _Stand_in:
    """Counts what the graphed path did; its replay runs the recorded step eagerly."""

    def __init__(self, fail=False):
        self.captures = self.replays = 0
        self.fail = fail

    def install(self, monkeypatch):
        stand_in = self

        def capture(self, fn):
            stand_in.captures += 1
            if stand_in.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            out = torch.zeros(())
            flat = self.flat

            def replay():
                stand_in.replays += 1
                count = flat.step_count  # a real replay runs kernels, not flat.step's Python
                out.copy_(fn())
                flat.step_count = count

            return replay, out

        monkeypatch.setattr(cg, "graph_blocker", lambda params, args: None)
        monkeypatch.setattr(cg.GraphedStep, "_capture", capture)
        return self


def _fit(name, cuda_graph, steps=14, **kw):
    pyro.clear_param_store()
    x, y = _data()
    model = BayesianMLP(4, 1, hidden=(16,), tau=10.0)
    guide = GUIDES[name](model)
    losses = fit(model, guide, x, y, num_steps=steps, batch_size=32, seed=3, progress=False,
                 cuda_graph=cuda_graph, **kw)  # fmt: skip
    params = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    return losses, params


@pytest.mark.parametrize("name", list(GUIDES))
def test_graphed_fit_is_the_same_fit(monkeypatch, name):
    """Warm-up, recording and replays take exactly the steps of the fit without graphs: the
    same losses and parameters to the bit (a replay without the new minibatch, or a step
    count not advanced at each replay, would differ)."""
    ref_losses, ref_params = _fit(name, False)
    stand_in = _Stand_in().install(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        losses, params = _fit(name, True)
    # steps 1-2 capture and check the loss graph (SVI.step), then 3 warm-up steps, then the
    # recording, replayed at every later step
    assert stand_in.captures == 1
    assert stand_in.replays == 14 - 2 - cg.WARMUP_STEPS
    assert losses == ref_losses
    assert params.keys() == ref_params.keys()
    for k in params:
        assert torch.equal(params[k], ref_params[k]), k


def test_step_count_and_optimiser_state_after_replays(monkeypatch):
    _Stand_in().install(monkeypatch)
    pyro.clear_param_store()
    x, y = _data()
    model = BayesianMLP(4, 1, hidden=(8,), tau=10.0)
    guide = AutoDropout(model, dropout_rate=0.1)
    optim = fused_adam({"lr": 1e-2})
    svi = CompiledSVI(model, guide, optim, JitMeanFieldELBO(), cuda_graph=True)
    for _ in range(12):
        svi.step(x[:32], y[:32], num_data=96)
    state = optim.get_state()["state_dict"]["state"]
    assert {float(s["step"]) for s in state.values()} == {12.0}


def test_a_failed_recording_warns_once_and_trains_on(monkeypatch):
    ref_losses, ref_params = _fit("dropout", False)
    stand_in = _Stand_in(fail=True).install(monkeypatch)
    with pytest.warns(CompilationWarning, match="recording the step failed") as record:
        losses, params = _fit("dropout", True)
    assert len([w for w in record if "recording" in str(w.message)]) == 1
    assert stand_in.captures == 1  # not retried at every step
    assert losses == ref_losses
    for k in params:
        assert torch.equal(params[k], ref_params[k]), k


def test_a_recording_that_broke_the_generator_is_an_error(monkeypatch):
    _Stand_in(fail=True).install(monkeypatch)
    monkeypatch.setattr(cg, "generator_usable", lambda device: False)
    with pytest.raises(RuntimeError, match="random generator unusable.*cuda_graph=False"):
        _fit("dropout", True)


def test_generator_usable_on_a_working_device():
    assert cg.generator_usable(torch.device("cpu"))


def test_an_optimiser_handed_to_torch_stops_the_graph_with_a_warning(monkeypatch):
    stand_in = _Stand_in().install(monkeypatch)
    pyro.clear_param_store()
    x, y = _data()
    model = BayesianMLP(4, 1, hidden=(8,), tau=10.0)
    guide = AutoDropout(model, dropout_rate=0.1)
    optim = fused_adam({"lr": 1e-2})
    svi = CompiledSVI(model, guide, optim, JitMeanFieldELBO(), cuda_graph=True)
    for _ in range(8):
        svi.step(x[:32], y[:32], num_data=96)
    replays = stand_in.replays
    assert replays > 0
    optim.optimizer  # noqa: B018 - reading it hands the state to torch.optim.Adam
    with pytest.warns(CompilationWarning, match="not the flat Adam"):
        for _ in range(3):
            svi.step(x[:32], y[:32], num_data=96)
    assert stand_in.replays == replays


def test_cpu_tensors_warn_once_and_fit_as_without():
    ref_losses, _ = _fit("dropout", False)
    with pytest.warns(CompilationWarning, match="not all on a CUDA device") as record:
        losses, _ = _fit("dropout", True)
    assert len(record) == 1
    assert losses == ref_losses


def test_graph_blocker_reasons():
    cpu = [torch.zeros(2)]
    assert "not all on a CUDA device" in cg.graph_blocker(cpu, cpu)
    assert "not all on a CUDA device" in cg.graph_blocker([torch.empty(2, device="meta")], cpu)
    # a model that reads its data from elsewhere: no argument tells the side stream's device
    assert "arguments hold no tensor" in cg.graph_blocker(cpu, [3, "x"])


def test_cuda_graph_arguments_are_checked():
    x, y = _data()
    model = BayesianMLP(4, 1, hidden=(8,))
    guide = AutoDropout(model)
    with pytest.raises(ValueError, match="needs jit"):
        fit(model, guide, x, y, num_steps=1, jit=False, cuda_graph=True, progress=False)
    with pytest.raises(ValueError, match="cuda_graph must be True or False"):
        fit(model, guide, x, y, num_steps=1, cuda_graph="yes", progress=False)
    with pytest.warns(CompilationWarning, match="not JitMeanFieldELBO with FusedOptim"):
        CompiledSVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), JitMeanFieldELBO(),
                    cuda_graph=True)  # fmt: skip


def test_graphed_fit_of_a_pyro_module_classifier_is_the_same_fit(monkeypatch):
    """A model written the Pyro way, not for this library (``PyroModule[nn.Linear]`` layers
    with ``PyroSample`` priors, a Categorical likelihood, no ``num_data``: fit scales the
    observed site), with Concrete dropout: the graphed fit is the ungraphed one to the bit."""
    import pyro.distributions as dist
    from pyro.nn import PyroModule, PyroSample

    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.a = PyroModule[torch.nn.Linear](4, 8)
            self.a.weight = PyroSample(dist.Normal(0.0, 1.0).expand([8, 4]).to_event(2))
            self.a.bias = PyroSample(dist.Normal(0.0, 1.0).expand([8]).to_event(1))
            self.b = PyroModule[torch.nn.Linear](8, 3)
            self.b.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 8]).to_event(2))
            self.b.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

        def forward(self, x, y=None):
            logits = self.b(torch.tanh(self.a(x)))
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x, _ = _data()
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()

    def run(cuda_graph):
        pyro.clear_param_store()
        model = Net()
        guide = AutoConcreteDropout(model)
        losses = fit(model, guide, x, y, num_steps=12, batch_size=32, seed=5, progress=False,
                     cuda_graph=cuda_graph)  # fmt: skip
        return losses, {k: v.detach().clone() for k, v in pyro.get_param_store().items()}

    ref_losses, ref_params = run(False)
    stand_in = _Stand_in().install(monkeypatch)
    losses, params = run(True)
    assert stand_in.replays == 12 - 2 - cg.WARMUP_STEPS
    assert losses == ref_losses
    for k in params:
        assert torch.equal(params[k], ref_params[k]), k
