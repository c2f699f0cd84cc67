"""The library on CUDA tensors: distributions, the four guides (eager and JIT), local
reparameterisation, prediction, the ArviZ export and the batched UCI model.

Skipped without a GPU (CI has none); run on a GPU machine with ``python -m pytest tests/cuda``.
Each test checks that results stay on the GPU and are finite, and, where cheap, that they agree
with the same computation on the CPU.
"""

import math
import os

import pyro
import pytest
import torch
from torch.distributions import kl_divergence

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianConvNet,
    BayesianMLP,
    BernoulliMaskedNormal,
    ConcreteMaskedNormal,
    ImproperLogUniform,
    fit,
    predict,
    to_inference_data,
)

# PYRO_DROPOUT_TEST_DEVICE=cpu runs the same checks on the CPU (to test the tests).
CUDA = torch.device(os.environ.get("PYRO_DROPOUT_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(
    CUDA.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
)
GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.1),
    "mean_field": lambda m: AutoMeanField(m),
    "variational_dropout": lambda m: AutoVariationalDropout(m),
    "concrete_dropout": lambda m: AutoConcreteDropout(m),
}


def _data(n=64, d=3, device=CUDA):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    y = x[:, 0] - x[:, 2] + 0.1 * torch.randn(n, generator=g)
    return x.to(device), y.to(device)


def _on_cuda(t):
    return t.device.type == CUDA.type


def test_distributions_and_kls():
    loc = torch.randn(4, 3, device=CUDA)
    d = BernoulliMaskedNormal(loc, torch.full_like(loc, 0.1), torch.tensor(0.2, device=CUDA))
    w = d.rsample((5,))
    assert _on_cuda(w) and w.shape == (5, 4, 3)
    lp = d.log_prob(w)
    assert _on_cuda(lp) and torch.isfinite(lp).all()
    prior = pyro.distributions.Normal(torch.zeros((), device=CUDA), 1.0).expand((4, 3)).to_event(2)
    kl = kl_divergence(d, prior)
    assert _on_cuda(kl) and torch.isfinite(kl).all()
    cpu = BernoulliMaskedNormal(loc.cpu(), torch.full((4, 3), 0.1), torch.tensor(0.2))
    cpu_prior = pyro.distributions.Normal(torch.zeros(()), 1.0).expand((4, 3)).to_event(2)
    torch.testing.assert_close(kl.cpu(), kl_divergence(cpu, cpu_prior), rtol=1e-5, atol=1e-5)
    q = pyro.distributions.Normal(loc, torch.full_like(loc, 0.1))
    ilu = ImproperLogUniform().expand((4, 3))
    kl2 = kl_divergence(q, ilu)
    assert _on_cuda(kl2) and torch.isfinite(kl2).all()
    rate = torch.tensor(0.2, device=CUDA, requires_grad=True)
    c = ConcreteMaskedNormal(loc, 0.1, rate)
    kl3 = kl_divergence(c, prior)
    (grad,) = torch.autograd.grad(kl3 + c.rsample().sum(), rate)
    assert _on_cuda(c.sample()) and _on_cuda(grad) and torch.isfinite(grad)
    c_cpu = ConcreteMaskedNormal(loc.cpu(), 0.1, 0.2)
    torch.testing.assert_close(kl3.detach().cpu(), kl_divergence(c_cpu, cpu_prior))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("guide_name", list(GUIDES))
def test_fit_and_predict_stay_on_the_gpu(guide_name, jit):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(16,), tau=25.0).to(CUDA)
    guide = GUIDES[guide_name](model)
    losses = fit(model, guide, x, y, num_epochs=40, batch_size=24, jit=jit, seed=0, progress=False)
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-10:]) < sum(losses[:10])
    for name, p in guide.named_parameters():
        assert _on_cuda(p), name
    pred = predict(model, guide, x, num_samples=50, seed=0)
    assert _on_cuda(pred.mean) and torch.isfinite(pred.mean).all()
    ll = pred.log_likelihood(y)
    assert _on_cuda(ll) and torch.isfinite(ll).all()


def test_learned_noise_and_classification():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(16,)).to(CUDA)  # learned noise scale
    guide = AutoMeanField(model)
    fit(model, guide, x, y, num_steps=30, jit=True, seed=0, progress=False)
    assert _on_cuda(guide.median()["likelihood.noise_scale"])  # the guide's latent noise
    labels = (y > 0).long()
    clf = BayesianMLP(3, 2, hidden=(16,), likelihood="classification").to(CUDA)
    g = AutoDropout(clf, dropout_rate=0.2)
    fit(clf, g, x, labels, num_steps=30, seed=0, progress=False)
    pred = predict(clf, g, x, num_samples=20)
    assert _on_cuda(pred.probs) and torch.allclose(pred.probs.sum(-1), torch.ones((), device=CUDA))


def test_convnet_with_dropout_lrt():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1, 12, 12, generator=g).to(CUDA)
    y = torch.randint(0, 3, (16,), generator=g).to(CUDA)
    model = BayesianConvNet(1, 3, image_size=12, channels=(4, 6), hidden=20, kernel_size=3)
    model = model.to(CUDA)
    guide = AutoDropout(model, dropout_rate=0.3)
    losses = fit(model, guide, x, y, num_steps=10, seed=0, progress=False)
    assert all(math.isfinite(v) for v in losses)
    pred = predict(model, guide, x, num_samples=8)
    assert _on_cuda(pred.probs) and pred.probs.shape[-1] == 3


def test_lrt_matches_the_cpu_in_distribution():
    """Same parameters on both devices: the pre-activation mean over many draws agrees."""
    x, y = _data(device="cpu")
    model = BayesianMLP(3, 1, hidden=(16,), tau=25.0)
    guide = AutoMeanField(model, init_scale=0.1)
    fit(model, guide, x, y, num_steps=5, seed=0, progress=False)
    cpu = predict(model, guide, x, num_samples=4000, seed=0)
    model.to(CUDA)
    guide.to(CUDA)
    gpu = predict(model, guide, x.to(CUDA), num_samples=4000, seed=0)
    se = (cpu.variance / 4000).sqrt().squeeze(-1)
    z = (gpu.mean.cpu() - cpu.mean).squeeze(-1).abs() / (se * math.sqrt(2))
    assert z.max() < 5, z.max()


def test_arviz_export_from_gpu_fits():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0).to(CUDA)
    guide = AutoDropout(model, dropout_rate=0.1)
    fit(model, guide, x, y, num_steps=20, seed=0, progress=False)
    data = to_inference_data(model, guide, x, y, num_samples=30, x_test=x[:10], y_test=y[:10])
    from pyro_dropout import compare
    from pyro_dropout.diagnostics import loo

    assert math.isfinite(loo(data).elpd)
    other = AutoMeanField(model)
    fit(model, other, x, y, num_steps=20, seed=0, progress=False)
    fits = {"dropout": (model, guide), "mean_field": (model, other)}
    table = compare(fits, x=x, y=y, x_test=x[:10], y_test=y[:10], num_samples=30)
    assert len(table) == 2


@pytest.mark.parametrize("name", ["dropout", "concrete"])
def test_batched_uci_model_trains_and_evaluates(name):
    from benchmarks import uci_model as um

    g = torch.Generator().manual_seed(0)
    s, n, d = 2, 40, 4
    x = torch.randn(s, n, d, generator=g).to(CUDA)
    y = x.sum(-1) + 0.1 * torch.randn(s, n, generator=g).to(CUDA)
    grid = um.grid(name, [0.01, 0.1], [0.5, 1.0])
    members = um.Members(
        [dict(c) for _ in range(s) for c in grid], torch.ones(s * len(grid)).double(), n
    )
    model, guide, eval_tau = um.build(name, d, 8, members)
    model.to(CUDA)
    um.train(model, guide, x, y, len(grid), num_epochs=3, batch_size=16)
    m = len(members)
    ev = um.evaluate(
        model, guide, x, y, len(grid), torch.zeros(m), torch.ones(m), eval_tau(), num_samples=50
    )
    assert torch.isfinite(ev.rmse).all() and torch.isfinite(ev.ll).all()


def test_user_models_and_conv_estimators():
    """A PyroModule[nn.Linear] network and a PyroModule[nn.Conv2d] CNN (guided values,
    Flipout and per-example draws on the GPU), fitted and predicted."""
    import pyro.distributions as dist
    from pyro.nn import PyroModule, PyroSample

    zero = torch.zeros((), device=CUDA)  # priors on the device, as a GPU user writes them

    def prior(*shape):
        return dist.Normal(zero, 1.0).expand(shape).to_event(len(shape))

    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.conv = PyroModule[torch.nn.Conv2d](1, 3, 3, padding=1)
            self.conv.weight = PyroSample(prior(3, 1, 3, 3))
            self.conv.bias = PyroSample(prior(3))
            self.fc = PyroModule[torch.nn.Linear](48, 2)
            self.fc.weight = PyroSample(prior(2, 48))
            self.fc.bias = PyroSample(prior(2))

        def forward(self, x, y=None):
            h = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1)
            logits = self.fc(h)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 1, 8, 8, generator=g).to(CUDA)
    y = torch.randint(0, 2, (32,), generator=g).to(CUDA)
    model = Net().to(CUDA)
    for make in GUIDES.values():
        guide = make(model)
        fit(model, guide, x, y, num_steps=5, seed=0, progress=False)
        pred = predict(model, guide, x, num_samples=6, vectorize=False)  # (view(N, -1) flattening)
        assert _on_cuda(pred.probs) and pred.probs.shape == (32, 2)
        assert torch.isfinite(pred.log_likelihood(y)).all()


def test_uci_command_line_runs_on_the_device(tmp_path):
    """``python -m benchmarks.uci --device cuda``: the quick protocol trains and
    evaluates there, and every unit records the device."""
    import json
    from pathlib import Path

    from benchmarks import uci

    data = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"
    if not (data / "yacht" / "data.txt").is_file():  # as the other UCI tests: missing data fails
        pytest.fail(f"UCI benchmark data not found at {data} (expected ../shared/data/uci)")
    out = tmp_path / "uci"
    argv = ["--data-dir", str(data), "--out", str(out), "--datasets", "yacht", "--quick"]
    uci.main(argv + ["--guides", "dropout,meanfield", "--device", str(CUDA), "--quiet"])
    units = sorted(out.glob("units/yacht/*/split_*[0-9].json"))
    assert len(units) == 4
    for path in units:
        rec = json.loads(path.read_text())
        assert rec["versions"]["device"] == CUDA.type
        assert math.isfinite(rec["test"]["ll"])
    assert torch.get_default_device().type == "cpu"  # restored


def test_fused_optim_steady_state_is_fused_adam_on_the_device():
    """``FusedOptim``'s steady-state step (the flat Adam, ``infer/flat_adam.py``) gives what
    ``torch.optim.Adam(fused=True)`` gives on the device, to rounding (the fused kernel rounds
    ~1 ulp differently), and hands torch's Adam its state on the device."""
    from pyro_dropout.infer import FusedOptim

    results = []
    for ours in (True, False):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(5, 3, device=CUDA)) for _ in range(3)]
        fused = FusedOptim(torch.optim.Adam, {"lr": 0.01}) if ours else None
        opt = None if ours else torch.optim.Adam(params, lr=0.01, fused=True)
        for step in range(20):
            for p in params:
                p.grad = torch.sin(p.detach() * (step + 1))
            fused(params) if ours else opt.step()
        if ours:
            assert fused._flat is not None  # stepped flat on the device
            opt = fused.optimizer
        assert all(_on_cuda(opt.state[p]["step"]) for p in params)
        results.append([p.detach().cpu() for p in params])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("guide_name", list(GUIDES))
def test_cuda_graph_records_once_and_trains_as_the_ungraphed_step(guide_name):
    """``cuda_graph=True`` on the device: recorded once (no warning), replayed for every
    later step, the optimiser's step count right, and the losses of the graphed fit those
    of the ungraphed one in distribution (the draws come from the graph's replays: not the
    same numbers). ``tests/infer/test_cuda_graph.py`` checks the rest to the bit on a CPU."""
    import warnings

    from pyro_dropout import local_reparameterization
    from pyro_dropout.infer import CompilationWarning, CompiledSVI, JitMeanFieldELBO, fused_adam

    if CUDA.type != "cuda":
        pytest.skip("records a CUDA graph")
    x, y = _data(n=256, d=4)
    steps, tail = 600, 200
    out = {}
    for graphed in (False, True):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = BayesianMLP(4, 1, hidden=(32,), tau=25.0).to(CUDA)
        guide = GUIDES[guide_name](model)
        optim = fused_adam({"lr": 1e-2})
        svi = CompiledSVI(model, guide, optim, JitMeanFieldELBO(), cuda_graph=graphed)
        losses = []
        with warnings.catch_warnings(), local_reparameterization():
            warnings.simplefilter("error", CompilationWarning)
            for step in range(steps):
                i = (step % 8) * 32
                losses.append(svi.step(x[i : i + 32], y[i : i + 32], num_data=256))
        assert all(math.isfinite(v) for v in losses)
        state = optim.get_state()["state_dict"]["state"]
        assert {float(s["step"]) for s in state.values()} == {float(steps)}
        if graphed:
            (entry,) = svi.step_graphs._steps.values()
            assert entry[1].cuda_graph is not None  # recorded, and replayed since
        out[graphed] = torch.tensor(losses[-tail:], dtype=torch.float64)
    a, b = out[False], out[True]
    se = (a.var() / tail + b.var() / tail).sqrt()
    print(
        f"{guide_name}: last {tail} losses {a.mean():.2f} vs graphed {b.mean():.2f} (SE {se:.2f})"
    )
    assert abs(a.mean() - b.mean()) < 5 * se + 0.02 * a.mean().abs()


def test_fit_with_cuda_graph_then_predict():
    if CUDA.type != "cuda":
        pytest.skip("records a CUDA graph")
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(16,), tau=25.0).to(CUDA)
    guide = AutoDropout(model, dropout_rate=0.1)
    losses = fit(model, guide, x, y, num_epochs=40, batch_size=16, seed=0, progress=False,
                 cuda_graph=True)  # fmt: skip
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-10:]) < sum(losses[:10])
    pred = predict(model, guide, x, num_samples=50, seed=0)
    assert _on_cuda(pred.mean) and torch.isfinite(pred.mean).all()


def test_cuda_graphs_interleaved_with_other_work_and_freed_memory():
    """Two graphed fits and an ungraphed one stepping in turn, with the caching allocator's
    free memory handed back to the driver between steps (``empty_cache``): a graph that read
    memory it does not own (the speed benchmark's plain-graph baseline did, an illegal access
    on an H200) fails here."""
    from pyro_dropout import local_reparameterization
    from pyro_dropout.infer import CompiledSVI, JitMeanFieldELBO, fused_adam

    if CUDA.type != "cuda":
        pytest.skip("records CUDA graphs")
    x, y = _data(n=128, d=4)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    svis = []
    for k, graphed in enumerate((True, True, False)):
        model = BayesianMLP(4, 1, hidden=(16,), tau=25.0).to(CUDA)
        guide = AutoDropout(model, dropout_rate=0.1, name=f"interleaved_{k}")
        svis.append(CompiledSVI(model, guide, fused_adam({"lr": 1e-2}), JitMeanFieldELBO(),
                                cuda_graph=graphed))  # fmt: skip
    losses = []
    with local_reparameterization():
        for step in range(40):
            for svi in svis:
                i = (step % 4) * 32
                losses.append(svi.step(x[i : i + 32], y[i : i + 32], num_data=128))
                torch.cuda.empty_cache()
    torch.cuda.synchronize()
    assert all(math.isfinite(v) for v in losses)
    for svi in svis[:2]:
        (entry,) = svi.step_graphs._steps.values()
        assert entry[1].cuda_graph is not None


def test_uci_command_line_with_cuda_graphs(tmp_path):
    """``--device cuda --cuda-graph``: the quick protocol trains with graphed steps and every
    unit's phase records the engine ``traced+cuda_graph``."""
    import json
    from pathlib import Path

    from benchmarks import uci

    if CUDA.type != "cuda":
        pytest.skip("records CUDA graphs")
    data = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"
    out = tmp_path / "uci"
    uci.main(["--data-dir", str(data), "--out", str(out), "--datasets", "yacht", "--quick",
              "--guides", "dropout", "--device", "cuda", "--cuda-graph", "--quiet"])  # fmt: skip
    units = sorted(out.glob("units/yacht/dropout/split_*[0-9].json"))
    assert units
    for path in units:
        rec = json.loads(path.read_text())
        assert rec["final_fit"]["engine"] == "traced+cuda_graph", rec["final_fit"]
        assert math.isfinite(rec["test"]["ll"])
