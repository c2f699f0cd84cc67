"""NUTS reference posterior, MCMC/ensemble exports and Pyro's autoguides in the ArviZ layer."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide import (
    AutoDelta,
    AutoLaplaceApproximation,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyro_dropout as pd
from pyro_dropout.diagnostics import (
    ReferenceConvergenceWarning,
    compare,
    ensemble_inference_data,
    predictive_convergence,
    reference_posterior,
    samples_inference_data,
    to_inference_data,
    vi_diagnostic,
)
from pyro_dropout.diagnostics import _arviz_compat as compat
from pyro_dropout.diagnostics import _reader as rd
from pyro_dropout.diagnostics import reference as ref_mod
from pyro_dropout.diagnostics.fidelity import reference_noise_floor, wasserstein_1d

from ._models import SIGMA, linreg_model, normal_guide

NUTS_SETTINGS = {"num_chains": 2, "num_warmup": 100, "num_samples": 100, "processes": 1}


@pytest.fixture(scope="module")
def ref_linreg():
    """One NUTS reference on the conjugate linear regression (exact posterior known)."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(1)
        n = 60
        q, _ = torch.linalg.qr(torch.randn(n, 3, generator=g))
        x = 4.0 * q
        y = x @ torch.tensor([1.0, -0.5, 0.25]) + SIGMA * torch.randn(n, generator=g)
        xt = 0.5 * torch.randn(20, 3, generator=g)
        yt = xt @ torch.tensor([1.0, -0.5, 0.25])
        prec = 1.0 + 16.0 / SIGMA**2
        post_mean = (x.T @ y) / SIGMA**2 / prec
        pyro.set_rng_seed(0)
        ref = reference_posterior(linreg_model, x, y, xt, yt, **NUTS_SETTINGS, seed=3)
        return {"ref": ref, "x": x, "y": y, "xt": xt, "yt": yt, "mean": post_mean, "prec": prec}
    finally:
        torch.set_default_dtype(dtype)


def test_reference_layout_and_exact_posterior(ref_linreg):
    ref = ref_linreg["ref"]
    assert compat.is_arviz_object(ref)
    post = compat.get_group(ref, "posterior")
    assert dict(post["w"].sizes) == {"chain": 2, "draw": 100, "w_dim_0": 3}
    for group in ("posterior_predictive", "log_likelihood", "predictions"):
        assert compat.get_group(ref, group).sizes["chain"] == 2
    assert compat.get_group(ref, "predictions_log_likelihood")["obs"].shape == (2, 100, 20)
    assert compat.get_group(ref, "sample_stats")["diverging"].shape == (2, 100)
    # same model, same prior: NUTS recovers the conjugate posterior N(mean, 1/prec)
    w = rd.draws(ref, "posterior", "w")
    sd = ref_linreg["prec"] ** -0.5
    np.testing.assert_allclose(w.mean(0), ref_linreg["mean"].numpy(), atol=4 * sd / np.sqrt(50))
    np.testing.assert_allclose(w.std(0), sd, rtol=0.25)
    attrs = rd.attrs(ref)
    assert attrs["guide_family"] == "NUTS" and attrs["num_chains"] == 2
    assert attrs["fn_rhat_max"] < 1.05 and attrs["fn_ess_bulk_min"] > 20
    assert attrs["fn_convergence_variable"] == "predictions.obs_mean"
    # the predictive means were computed from the same draws: f = x_test @ w
    mean = rd.draws(ref, "predictions", "obs_mean")
    np.testing.assert_allclose(mean, w @ ref_linreg["xt"].numpy().T, rtol=1e-10)


def test_reference_convergence_table_and_no_vi_khat(ref_linreg):
    ref = ref_linreg["ref"]
    conv = predictive_convergence(ref)
    assert len(conv) == 20 and set(conv.columns) >= {"rhat", "ess_bulk", "ess_tail"}
    assert conv["rhat"].max() == pytest.approx(rd.attrs(ref)["fn_rhat_max"])
    vi = vi_diagnostic(ref)
    assert np.isnan(vi["khat"]) and "no density q" in vi["diagnosis"]
    table = compare({"hmc": ref}, reference=ref)
    assert table.loc["hmc", "ref_w1"] == 0.0 and np.isnan(table.loc["hmc", "vi_khat"])


def test_table_carries_reference_rhat_and_noise_floor(ref_linreg, linreg):
    """Every row carries the reference's R-hat / ESS; every fidelity score its noise floor,
    the same score between two halves of the reference's chains."""
    ref = ref_linreg["ref"]
    attrs = rd.attrs(ref)
    floor = reference_noise_floor(ref)
    assert floor["split"] == "chains 0-0 against 1-1"
    # by hand: chain 0 against chain 1 of the test-set predictive draws
    y = compat.get_group(ref, "predictions")["obs"].values
    assert floor["ref_w1_floor"] == pytest.approx(np.mean(wasserstein_1d(y[0], y[1])))
    assert 0 < floor["ref_w1_floor"] < 0.2 and 0.8 < floor["ref_sd_ratio_floor"] < 1.25
    fit = samples_inference_data(
        linreg_model,
        {"w": torch.as_tensor(rd.draws(ref, "posterior", "w"))[::2]},
        ref_linreg["x"], ref_linreg["y"], ref_linreg["xt"], ref_linreg["yt"],
    )  # fmt: skip
    table = compare({"half": fit, "hmc": ref}, reference=ref)
    for row in table.index:
        assert table.loc[row, "ref_rhat"] == pytest.approx(attrs["fn_rhat_max"])
        assert table.loc[row, "ref_ess_bulk"] == pytest.approx(attrs["fn_ess_bulk_min"])
        assert table.loc[row, "ref_w1_floor"] == pytest.approx(floor["ref_w1_floor"])
    for col in ("ref_sd_ratio_floor", "ref_cov50_floor", "ref_cov90_floor", "ref_ess_tail"):
        assert col in table.columns
    text = repr(table)
    assert "NUTS reference: function-space R-hat max" in text and "Noise floor (chains 0-0" in text
    # one chain: the draws are split instead
    one = samples_inference_data(linreg_model, {"w": torch.randn(40, 3)}, ref_linreg["x"],
                                 ref_linreg["y"], ref_linreg["xt"])  # fmt: skip
    assert reference_noise_floor(one)["split"] == "draws 0-19 against 20-39 of its one chain"


def test_unconverged_reference_is_flagged_in_the_table(ref_linreg):
    ref = ref_linreg["ref"]
    bad = copy.deepcopy(ref)
    compat.update_root_attrs(bad, {"fn_rhat_max": 1.09})
    table = compare({"hmc": ref}, reference=bad)
    assert table.loc["hmc", "flags"] == "ref R-hat 1.090"
    assert "the reference's chains disagree" in repr(table)


def test_unconverged_chains_warn():
    torch.set_default_dtype(torch.float64)
    x, y = torch.randn(20, 3), torch.randn(20)
    far = normal_guide("w", torch.zeros(3), torch.full((3,), 30.0))  # chains start far apart
    with pytest.warns(ReferenceConvergenceWarning, match=r"R-hat is .* at obs_id \d+\)"):
        reference_posterior(
            linreg_model,
            x,
            y,
            num_chains=2,
            num_warmup=0,
            num_samples=10,
            max_tree_depth=1,
            init_from=far,
            processes=1,
            jit_compile=False,
        )


def test_samples_dict_and_mcmc_export(ref_linreg):
    x, y, xt, yt = (ref_linreg[k] for k in ("x", "y", "xt", "yt"))
    w = torch.as_tensor(rd.draws(ref_linreg["ref"], "posterior", "w"))
    for parallel in ("auto", False):
        d = samples_inference_data(
            linreg_model, {"w": w}, x, y, xt, yt, num_chains=4, parallel=parallel
        )
        post = rd.draws(d, "posterior", "w")
        np.testing.assert_array_equal(post, w.numpy())  # in order, chains kept
        assert compat.get_group(d, "posterior")["w"].shape == (4, 50, 3)
        ll = rd.draws(d, "log_likelihood", "obs")
        mu = w.numpy() @ x.numpy().T
        expected = -0.5 * ((y.numpy() - mu) / SIGMA) ** 2 - np.log(SIGMA * np.sqrt(2 * np.pi))
        np.testing.assert_allclose(ll, expected, rtol=1e-10)
        assert np.all(np.isnan(compat.get_group(d, "sample_stats")["lq"].values))
    with pytest.raises(ValueError, match="cannot be split"):
        samples_inference_data(linreg_model, {"w": w}, x, y, num_chains=3)
    with pytest.raises(ValueError, match="that the model lacks"):
        samples_inference_data(linreg_model, {"v": w}, x, y)

    pyro.set_rng_seed(0)
    mcmc = MCMC(NUTS(linreg_model), num_samples=30, warmup_steps=30, disable_progbar=True)
    mcmc.run(x, y)
    d = to_inference_data(linreg_model, mcmc, x, y, x_test=xt, y_test=yt)
    assert rd.family(d) == "NUTS" and compat.get_group(d, "posterior")["w"].shape == (1, 30, 3)
    table = compare({"mcmc": (linreg_model, mcmc)}, x=x, y=y, x_test=xt, y_test=yt)
    assert "MCMC draws have no density" in table.loc["mcmc", "vi_diagnosis"]


def _tiny_data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(20, generator=g)
    return x, y


def test_reference_on_library_model_under_lrt_and_from_a_guide():
    """BayesianMLP as written, inside local_reparameterization() (blocked: NUTS needs weights),
    chains started from a fitted guide; the chain runner survives pickling (spawned workers)."""
    torch.set_default_dtype(torch.float32)
    x, y = _tiny_data()
    model = pd.BayesianMLP(1, 1, hidden=(3,), tau=25.0)
    guide = pd.AutoMeanField(model)
    pd.fit(model, guide, x, y, num_steps=50, lr=1e-2, progress=False, seed=0)
    init = ref_mod._init_values(model, guide, x, y, seed=0)
    assert set(init) == {f"net.layers.{i}.{p}" for i in (0, 1) for p in ("weight", "bias")}
    with pd.local_reparameterization(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ReferenceConvergenceWarning)  # 20 draws: not the point
        ref = reference_posterior(
            model, x, y, x[:5], num_chains=2, num_warmup=20, num_samples=20,
            max_tree_depth=4, init_from=guide, processes=1, seed=0,
        )  # fmt: skip
    w = compat.get_group(ref, "posterior")["net.layers.0.weight"]
    assert w.shape == (2, 20, 3, 1)
    assert compat.get_group(ref, "predictions")["obs"].shape == (2, 20, 5, 1)
    spec = {
        "model": ref_mod._picklable(model)[0], "args": (x, y), "num_warmup": 3, "num_samples": 3,
        "jit_compile": False, "max_tree_depth": 2, "target_accept_prob": 0.8,
        "default_dtype": torch.float32, "validation": True, "progress": False, "seed": 0,
        "init_values": init,
    }  # fmt: skip
    run = ref_mod._run_chain(pickle.loads(pickle.dumps(spec)))
    assert run["samples"]["net.layers.0.weight"].shape == (3, 3, 1)


def _fit(model, guide, x, y, steps=300, seed=0):
    pd.fit(model, guide, x, y, num_steps=steps, lr=0.05, progress=False, seed=seed,
           local_reparameterization=False)  # fmt: skip
    return guide


def test_pyro_autoguides_export_and_compare(linreg):
    x, y, xt, yt = linreg.x, linreg.y, linreg.x_test, linreg.y_test
    fits = {
        "normal": _fit(linreg_model, AutoNormal(linreg_model), x, y),
        "lowrank": _fit(linreg_model, AutoLowRankMultivariateNormal(linreg_model, rank=2), x, y),
        "map": _fit(linreg_model, AutoDelta(linreg_model), x, y),
        "laplace": _fit(linreg_model, AutoLaplaceApproximation(linreg_model), x, y),
    }
    table = compare({k: (linreg_model, g) for k, g in fits.items()}, x=x, y=y, x_test=xt,
                    y_test=yt, num_samples=400)  # fmt: skip
    assert (
        table.loc["map", "vi_khat"] == np.inf and "point mass" in table.loc["map", "vi_diagnosis"]
    )
    assert table.loc["laplace", "family"] == "AutoLaplaceApproximation"
    # Laplace on a linear-Gaussian model is the exact posterior: its draws have the exact sd
    d = to_inference_data(linreg_model, fits["laplace"], x, y, 400, seed=0)
    w = rd.draws(d, "posterior", "w")
    np.testing.assert_allclose(w.std(0), linreg.post_sd.numpy(), rtol=0.15)
    np.testing.assert_allclose(w.mean(0), linreg.post_mean.numpy(), atol=0.03)
    assert np.ptp(compat.get_group(d, "sample_stats")["lq"].values) > 0  # a real density
    assert table.loc["laplace", "vi_khat"] < 0.7


def test_ensemble_of_map_fits(linreg):
    x, y, xt, yt = linreg.x, linreg.y, linreg.x_test, linreg.y_test
    members = []
    for k in range(3):
        cls = type(f"AutoDelta{k}", (AutoDelta,), {})  # own param-store names per member
        pyro.set_rng_seed(k)
        members.append((linreg_model, _fit(linreg_model, cls(linreg_model), x, y, steps=5, seed=k)))
    d = ensemble_inference_data(members, x, y, 10, xt, yt)
    member = compat.get_group(d, "sample_stats")["member"].values.ravel()
    np.testing.assert_array_equal(member, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    w = rd.draws(d, "posterior", "w")
    assert len(np.unique(w, axis=0)) == 3  # one point per member
    vi = vi_diagnostic(d)
    assert np.isnan(vi["khat"]) and "ensemble" in vi["diagnosis"]
    table = compare({"ens": members}, x=x, y=y, num_samples=30)
    assert table.loc["ens", "family"] == "ensemble"
    shared = [(linreg_model, AutoDelta(linreg_model)), (linreg_model, AutoDelta(linreg_model))]
    for _, g in shared:  # set up (an export refuses a guide never run, as predict does)
        g(x, y)
    with pytest.raises(ValueError, match="members 0 and 1 are the same fit"):
        ensemble_inference_data(shared, x, y, 10)
    normals = [(linreg_model, AutoNormal(linreg_model)) for _ in range(2)]  # draws differ
    for _, g in normals:
        g(x, y)
    with pytest.raises(ValueError, match="sharing the param-store name 'AutoNormal'"):
        ensemble_inference_data(normals, x, y, 10)


class TutorialBNN(PyroModule):
    """The network of Pyro's BNN tutorial (docs/your-own-model.md), tiny."""

    def __init__(self, hid_dim=3):
        super().__init__()
        self.layer1 = PyroModule[nn.Linear](1, hid_dim)
        self.layer2 = PyroModule[nn.Linear](hid_dim, 1)
        self.layer1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hid_dim, 1]).to_event(2))
        self.layer1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hid_dim]).to_event(1))
        self.layer2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hid_dim]).to_event(2))
        self.layer2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        x = x.reshape(-1, 1)
        mu = self.layer2(torch.tanh(self.layer1(x))).squeeze()
        sigma = pyro.sample("sigma", dist.Gamma(0.5, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, sigma * sigma), obs=y)
        return mu


def test_reference_on_the_tutorial_model():
    torch.set_default_dtype(torch.float32)
    x, y = _tiny_data()
    model = TutorialBNN()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReferenceConvergenceWarning)  # 15 draws: not the point
        ref = reference_posterior(model, x, y, x[:4], y[:4], num_chains=2, num_warmup=10,
                                  num_samples=15, max_tree_depth=4, processes=1)  # fmt: skip
    post = compat.get_group(ref, "posterior")
    assert post["layer1.weight"].shape == (2, 15, 3, 1) and post["sigma"].shape == (2, 15)
    assert np.all(post["sigma"].values > 0)  # constrained values, as NUTS returns them
    assert compat.get_group(ref, "predictions_log_likelihood")["obs"].shape == (2, 15, 4)
    assert np.isfinite(rd.attrs(ref)["fn_rhat_max"])


_NOTEBOOK_MODEL = """
import warnings, torch, pyro, pyro.distributions as dist
from pyro.nn import PyroModule, PyroSample
from pyro_dropout.diagnostics import reference_posterior, ReferenceConvergenceWarning
from pyro_dropout.diagnostics import _arviz_compat as compat

class Tiny(PyroModule):  # defined in __main__, which has no file: as in a notebook
    def __init__(self):
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0))

    def forward(self, x, y=None):
        w = self.w
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(w * x[:, 0], 0.5), obs=y)

warnings.simplefilter("error")
warnings.filterwarnings("ignore", category=ReferenceConvergenceWarning)
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="tqdm")
torch.manual_seed(0)
x = torch.randn(20, 1)
y = 0.7 * x[:, 0] + 0.5 * torch.randn(20)
ref = reference_posterior(Tiny(), x, y, num_chains=2, num_warmup=10, num_samples=20,
                          processes=2, jit_compile=False, max_tree_depth=3, progress=True)
print("draws", tuple(compat.get_group(ref, "posterior")["w"].shape),
      "processes", compat.root_attrs(ref)["processes"])
"""


@pytest.mark.slow  # two spawned workers import torch and Pyro: about 20 s on 2 loaded cores
def test_model_class_from_a_notebook_runs_in_parallel_with_progress():
    """A model class defined in ``python -c`` (no file for __main__): spawned workers cannot
    import it (before: BrokenProcessPool, "Can't get attribute 'Tiny' on <module
    '__main__'>"), so it goes by value (cloudpickle); progress=True draws one bar per chain
    and one line per finished chain (issue 23)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _NOTEBOOK_MODEL],
        capture_output=True, text=True, timeout=300, env=env, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "draws (2, 20) processes 2" in proc.stdout
    for c in (0, 1):
        assert f"NUTS chain {c}" in proc.stderr and f"NUTS chain {c} finished: " in proc.stderr


def test_main_objects_and_the_fallback_to_one_process(monkeypatch):
    class Local:
        pass

    Local.__module__ = "__main__"
    assert ref_mod._main_objects([Local(), linreg_model]) == [
        "test_main_objects_and_the_fallback_to_one_process.<locals>.Local"
    ]
    assert ref_mod._main_objects(linreg_model) == []
    monkeypatch.setattr(ref_mod, "_main_without_file", lambda: True)
    sent, why = ref_mod._picklable(Local())
    assert isinstance(sent, bytes) and why is None  # cloudpickle, by value
    import cloudpickle

    def refuse(obj):
        raise TypeError("cannot pickle 'generator' object")

    monkeypatch.setattr(cloudpickle, "dumps", refuse)
    sent, why = ref_mod._picklable(Local())
    assert sent is None and "defined in __main__" in why and "cloudpickle failed too" in why
    torch.set_default_dtype(torch.float64)
    x, y = torch.randn(20, 3), torch.randn(20)
    with (
        warnings.catch_warnings(),
        pytest.warns(UserWarning, match=r"one after the other .*cloudpickle failed too"),
    ):
        warnings.simplefilter("ignore", ReferenceConvergenceWarning)
        monkeypatch.setattr(ref_mod, "_main_objects", lambda model: ["Tiny"])
        ref = reference_posterior(linreg_model, x, y, num_chains=2, num_warmup=5,
                                  num_samples=5, processes=2, jit_compile=False,
                                  max_tree_depth=2)  # fmt: skip
    assert rd.attrs(ref)["processes"] == 1


_NO_TRACER = r"""
import json, warnings
import torch

def gone(*args, **kwargs):
    raise RuntimeError("TorchScript was removed")
torch.jit.trace = gone  # as a torch without TorchScript's tracer would

import pyro_dropout as pd
from pyro_dropout.diagnostics import reference_posterior

x = torch.linspace(-2, 2, 24).unsqueeze(-1)
y = torch.sin(2 * x).squeeze(-1)
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ref = reference_posterior(pd.BayesianMLP(1, 1, hidden=(4,), tau=100.0), x, y, num_chains=1,
                              num_warmup=4, num_samples=4, processes=1)
out["warnings"] = [[type(w.message).__name__, str(w.message)] for w in caught]
from pyro_dropout.diagnostics import _arviz_compat as compat, _reader as rd
out["config"] = rd.config(ref)  # (either ArviZ line)
out["draws"] = int(compat.get_group(ref, "posterior").sizes["draw"])
try:
    reference_posterior(pd.BayesianMLP(1, 1, hidden=(4,), tau=100.0), x, y, num_chains=1,
                        num_warmup=2, num_samples=2, processes=1, jit_compile=True)
    out["strict"] = None
except RuntimeError as err:
    out["strict"] = str(err)
print(json.dumps(out, default=str))
"""


def test_without_torchscripts_tracer_nuts_runs_uncompiled_and_says_so():
    """TorchScript is deprecated upstream (issue 38). Its tracer gone (raising, as a future torch
    might): the default ``jit_compile="auto"`` runs the chains uncompiled with one
    CompilationWarning naming why and the cost (before: Pyro's JIT raised from ``mcmc.run``);
    ``jit_compile=True`` raises a RuntimeError that names the tracer and the way out."""
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _NO_TRACER], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["draws"] == 4 and out["config"]["jit_compile"] is False  # what ran
    compile_warnings = [m for k, m in out["warnings"] if k == "CompilationWarning"]
    assert len(compile_warnings) == 1, out["warnings"]
    assert (
        "without Pyro's JIT" in compile_warnings[0]
        and "TorchScript was removed" in (compile_warnings[0])
    )
    assert "1.6x" in compile_warnings[0] and "jit_compile=False" in compile_warnings[0]
    assert out["strict"] is not None and "jit_compile='auto'" in out["strict"]


def test_jit_compile_takes_true_false_or_auto(linreg):
    with pytest.raises(ValueError, match="jit_compile must be True, False or 'auto'"):
        reference_posterior(linreg_model, linreg.x, linreg.y, jit_compile="yes", **NUTS_SETTINGS)
    assert ref_mod.tracer_unavailable() is None  # this torch traces: "auto" compiles
