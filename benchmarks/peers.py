"""Side by side with the peers: TyXe, bayesian-torch, laplace-torch and plain MC dropout
(``nn.Dropout`` left on at test time) against this library's four guides, on the same data.

    python -m benchmarks.peers [--quick] [--out DIR] [--datasets a,b] [--splits K]
    python -m benchmarks.peers --report-only --out DIR     # the page again from its JSON

What is measured, in one process (``--out DIR`` gets ``peers.json`` and ``peers.md``):

* **UCI regression** (Gal & Ghahramani's splits, :func:`pyro_dropout.datasets.load_uci`):
  one hidden layer of 50 ReLU units, inputs and target standardised on the training rows, a
  Gaussian likelihood with the same fixed noise for every method (the middle of the dataset's
  published τ grid), ``N(0, 1)`` weight priors, Adam, the same epochs, learning rate, batch
  size and number of predictive draws. Test log-likelihood (per point, on the original scale:
  ``log (1/T) Σ_t N(y | f_t(x), σ²)``; laplace-torch's GLM predictive in closed form) and
  RMSE of the predictive mean, with standard errors over the test points, and each peer's
  per-point LL difference against ``AutoDropout`` on the same split (paired).
* **Training-step time** on the speed workloads of :mod:`benchmarks.speed` (W1, W2): each
  method's step as a ratio against an eager ``nn.Dropout`` step of the same sizes, the two
  alternated in rounds in this process and summarised by medians.
* **Lines of user code** for the same fit (model, guide/conversion, training, prediction):
  the non-blank, non-comment lines between ``# user code`` and ``# end user code`` in each
  adapter below, counted from this file.

Each peer is one adapter function; a peer that is not installed, or fails, is recorded with
its error and the rest run. The peers are not dependencies of the project: install them in a
separate environment (see ``docs/benchmarks/peers.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import inspect
import io
import json
import math
import statistics
import sys
import textwrap
import time
import tokenize
import traceback
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from torch import nn

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
    predict,
)
from pyro_dropout.datasets import load_uci

from . import speed
from ._provenance import git_state, versions

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data" / "uci"
DATASETS = ("yacht", "bostonHousing", "concrete", "energy")
GUIDES = {
    "AutoDropout": AutoDropout,
    "AutoConcreteDropout": AutoConcreteDropout,
    "AutoMeanField": AutoMeanField,
    "AutoVariationalDropout": AutoVariationalDropout,
}
PEERS = ("plain MC dropout", "TyXe", "bayesian-torch (recipe)", "bayesian-torch (KL summed)",
         "laplace-torch")  # fmt: skip
PACKAGES = {"TyXe": "tyxe", "bayesian-torch": "bayesian-torch", "laplace-torch": "laplace-torch"}
REFERENCE = "AutoDropout"
SETTINGS = {
    "full": dict(hidden=50, epochs=400, lr=1e-2, batch=32, draws=100, p=0.1, splits=1,
                 max_train=None, max_test=None, rounds=7, step_reps=20, workloads=("W1", "W2")),
    "quick": dict(hidden=8, epochs=2, lr=1e-2, batch=32, draws=5, p=0.1, splits=1,
                  max_train=64, max_test=32, rounds=2, step_reps=2, workloads=("W1",)),
}  # fmt: skip


# -- data ------------------------------------------------------------------------------------
def load_split(name, k, cfg, data_dir=DATA_DIR):
    """Split ``k`` of a UCI set, standardised on its training rows; with the fixed noise SD on
    the standardised scale (``1/sqrt(τ)/sd(y)``, τ the middle of the published grid)."""
    ds = load_uci(name, data_dir)
    tr, te = ds.split(k)
    tr, te = tr[: cfg["max_train"]], te[: cfg["max_test"]]
    x_mean, x_sd = ds.X[tr].mean(0), ds.X[tr].std(0)
    x_sd[x_sd == 0] = 1.0
    y_mean, y_sd = ds.y[tr].mean(), ds.y[tr].std()
    tau = ds.tau_values[len(ds.tau_values) // 2]

    def t(a):
        return torch.as_tensor(a, dtype=torch.float32)

    return {
        "x": t((ds.X[tr] - x_mean) / x_sd),
        "y": t((ds.y[tr] - y_mean) / y_sd),
        "xt": t((ds.X[te] - x_mean) / x_sd),
        "yt": t((ds.y[te] - y_mean) / y_sd),
        "y_sd": float(y_sd),
        "sigma": float(1.0 / math.sqrt(tau) / y_sd),
        "tau": float(tau),
    }


def _loader(x, y, batch):
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True)


def _mlp(d, hidden, p=None):
    """The plain network every peer starts from (dropout before each layer when ``p``)."""
    drop = (lambda: nn.Dropout(p)) if p else nn.Identity
    return nn.Sequential(drop(), nn.Linear(d, hidden), nn.ReLU(), drop(), nn.Linear(hidden, 1))


def _gauss_nll(f, y, sigma):
    """Mean Gaussian negative log-likelihood per row (the ELBO's data term, per example)."""
    return 0.5 * ((f - y) / sigma).pow(2).mean() + math.log(sigma) + 0.5 * math.log(2 * math.pi)


# -- adapters: each returns draws of the mean function on the test rows, (T, N) -----------
def ours(guide_name, data, cfg):
    """``pyro_dropout.fit`` / ``predict`` with their defaults (LRT, compiled loss, fused Adam)."""
    x, y, xt, sigma = data["x"], data["y"], data["xt"], data["sigma"]
    Guide = GUIDES[guide_name]
    # user code
    model = BayesianMLP(x.shape[1], 1, hidden=(cfg["hidden"],), tau=sigma**-2)
    guide = Guide(model)
    fit(
        model,
        guide,
        x,
        y,
        num_epochs=cfg["epochs"],
        batch_size=cfg["batch"],
        lr=cfg["lr"],
        progress=False,
    )
    pred = predict(model, guide, xt, num_samples=cfg["draws"])
    # end user code
    return pred.draws.dist().mean.reshape(cfg["draws"], -1)


def plain_mc_dropout(data, cfg):
    """``nn.Dropout`` MLP, Gaussian NLL plus Gal's weight decay ``(1-p)/(2N)‖W‖² + ‖b‖²/(2N)``
    (the ``N(0, 1)`` prior's), dropout left on for T forward passes at test time."""
    x, y, xt, sigma, p = data["x"], data["y"], data["xt"], data["sigma"], cfg["p"]
    n = x.shape[0]
    # user code
    net = _mlp(x.shape[1], cfg["hidden"], p)
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    for _ in range(cfg["epochs"]):
        for xb, yb in _loader(x, y, cfg["batch"]):
            opt.zero_grad()
            decay = sum((1 - p) * m.weight.pow(2).sum() + m.bias.pow(2).sum()
                        for m in net if isinstance(m, nn.Linear))  # fmt: skip
            loss = _gauss_nll(net(xb).squeeze(-1), yb, sigma) + decay / (2 * n)
            loss.backward()
            opt.step()
    net.train()  # dropout on at test time
    with torch.no_grad():
        f = torch.stack([net(xt).squeeze(-1) for _ in range(cfg["draws"])])
    # end user code
    return f


#: What each peer needed to run here (recorded in the JSON and on the page).
FIXES = {
    "TyXe": "TyXe 0.0.2 calls `pyro.util.deep_getattr`, which Pyro 1.9 no longer has (its "
    "`AutoNormal.get_loc`/`get_scale`, used by `fit`): one alias restores Pyro's old one-line "
    "definition, `pyro.util.deep_getattr = lambda obj, name: functools.reduce(getattr, "
    'name.split("."), obj)` (`_tyxe()` in `benchmarks/peers.py`).',
    "torchvision": "bayesian-torch, TyXe and laplace-torch each require torchvision; the one "
    "pip installs next to the CPU torch wheel is built for CUDA torch and fails on import "
    "(`RuntimeError: operator torchvision::nms does not exist`, raised through torchmetrics "
    "when laplace is imported). None of the three uses it here: it was uninstalled "
    "(`pip uninstall torchvision`) after installing them.",
}


def _tyxe():
    """``import tyxe`` with the alias of :data:`FIXES` (only where Pyro lacks the function)."""
    import pyro.util
    import tyxe

    if not hasattr(pyro.util, "deep_getattr"):
        pyro.util.deep_getattr = lambda obj, name: functools.reduce(getattr, name.split("."), obj)
    return tyxe


def tyxe_mean_field(data, cfg):
    """TyXe's documented regression recipe: ``VariationalBNN`` with an ``IIDPrior``, a
    ``HomoskedasticGaussian`` likelihood, its ``AutoNormal`` guide, ``fit`` inside its
    ``local_reparameterization`` handler and ``predict(aggregate=False)``."""
    tyxe = _tyxe()

    x, y, xt, sigma = data["x"], data["y"], data["xt"], data["sigma"]
    # user code
    net = _mlp(x.shape[1], cfg["hidden"])
    prior = tyxe.priors.IIDPrior(dist.Normal(0.0, 1.0))
    likelihood = tyxe.likelihoods.HomoskedasticGaussian(x.shape[0], scale=sigma)
    guide = functools.partial(tyxe.guides.AutoNormal, init_scale=0.01)
    bnn = tyxe.VariationalBNN(net, prior, likelihood, guide)
    loader = _loader(x, y.unsqueeze(-1), cfg["batch"])
    with tyxe.poutine.local_reparameterization():
        bnn.fit(loader, pyro.optim.Adam({"lr": cfg["lr"]}), cfg["epochs"])
    f = bnn.predict(xt, num_predictions=cfg["draws"], aggregate=False)
    # end user code
    return f.squeeze(-1)


#: bayesian-torch's ``dnn_to_bnn`` settings from its README (``prior_sigma`` 1 as everywhere
#: here; its README's example uses the same value).
BT_PRIOR = {
    "prior_mu": 0.0,
    "prior_sigma": 1.0,
    "posterior_mu_init": 0.0,
    "posterior_rho_init": -3.0,
    "type": "Reparameterization",
    "moped_enable": False,
    "moped_delta": 0.5,
}


def _bt_kl_sum(net):
    """The KL summed over every weight: bayesian-torch's per-layer ``kl_loss()`` is a mean over
    the layer's weights (IntelLabs/bayesian-torch#36), so each is multiplied back by its count."""
    total = 0.0
    for m in net.modules():
        if hasattr(m, "kl_loss") and hasattr(m, "mu_weight"):
            kl_w = m.kl_div(m.mu_weight, torch.log1p(torch.exp(m.rho_weight)), m.prior_weight_mu,
                            m.prior_weight_sigma)  # fmt: skip
            total = total + kl_w * m.mu_weight.numel()
            if getattr(m, "mu_bias", None) is not None:
                kl_b = m.kl_div(m.mu_bias, torch.log1p(torch.exp(m.rho_bias)), m.prior_bias_mu,
                                m.prior_bias_sigma)  # fmt: skip
                total = total + kl_b * m.mu_bias.numel()
    return total


def bayesian_torch(data, cfg, kl_summed=False):
    """bayesian-torch's README recipe: ``dnn_to_bnn`` on the plain MLP, loss = the data term
    (a per-example mean) + ``get_kl_loss(model) / batch_size``, MC forward passes at test
    time. ``kl_summed``: the ELBO per example instead, ``KL summed over weights / N``."""
    from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

    x, y, xt, sigma = data["x"], data["y"], data["xt"], data["sigma"]
    n = x.shape[0]
    # user code
    net = _mlp(x.shape[1], cfg["hidden"])
    dnn_to_bnn(net, BT_PRIOR)
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    for _ in range(cfg["epochs"]):
        for xb, yb in _loader(x, y, cfg["batch"]):
            opt.zero_grad()
            kl = _bt_kl_sum(net) / n if kl_summed else get_kl_loss(net) / xb.shape[0]
            loss = _gauss_nll(net(xb).squeeze(-1), yb, sigma) + kl
            loss.backward()
            opt.step()
    with torch.no_grad():
        f = torch.stack([net(xt).squeeze(-1) for _ in range(cfg["draws"])])
    # end user code
    return f


def laplace_torch(data, cfg):
    """laplace-torch's README recipe: a MAP fit of the plain MLP (weight decay of the ``N(0, 1)``
    prior), ``Laplace(model, "regression")`` with its defaults (last layer, Kronecker-factored
    GGN), ``fit``, ``optimize_prior_precision(method="marglik")``, the GLM predictive. Returns
    ``(mean, variance of f)`` instead of draws."""
    from laplace import Laplace

    x, y, xt, sigma = data["x"], data["y"], data["xt"], data["sigma"]
    n = x.shape[0]
    # user code
    net = _mlp(x.shape[1], cfg["hidden"])
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    loader = _loader(x, y.unsqueeze(-1), cfg["batch"])
    for _ in range(cfg["epochs"]):
        for xb, yb in loader:
            opt.zero_grad()
            decay = sum(q.pow(2).sum() for q in net.parameters()) / (2 * n)
            (_gauss_nll(net(xb), yb, sigma) + decay).backward()
            opt.step()
    la = Laplace(net, "regression", sigma_noise=sigma)
    la.fit(loader)
    la.optimize_prior_precision(method="marglik")
    f_mu, f_var = la(xt, pred_type="glm")
    # end user code
    return f_mu.reshape(-1).detach(), f_var.reshape(-1).detach()


def adapters():
    """Label -> callable(data, cfg)."""
    out = {g: functools.partial(ours, g) for g in GUIDES}
    out["plain MC dropout"] = plain_mc_dropout
    out["TyXe"] = tyxe_mean_field
    out["bayesian-torch (recipe)"] = bayesian_torch
    out["bayesian-torch (KL summed)"] = functools.partial(bayesian_torch, kl_summed=True)
    out["laplace-torch"] = laplace_torch
    return out


def user_lines():
    """Non-blank, non-comment lines of user code in each adapter (between the markers)."""
    funcs = {"ours (any guide)": ours, "plain MC dropout": plain_mc_dropout,
             "TyXe": tyxe_mean_field, "bayesian-torch": bayesian_torch,
             "laplace-torch": laplace_torch}  # fmt: skip
    out = {}
    for label, fn in funcs.items():
        src = inspect.getsource(fn)
        body = textwrap.dedent(src.split("# user code\n", 1)[1].split("# end user code", 1)[0])
        tokens = tokenize.generate_tokens(io.StringIO(body).readline)
        out[label] = sum(1 for t in tokens if t.type == tokenize.NEWLINE)  # logical lines
    return out


# -- scores ----------------------------------------------------------------------------------
def _scores(out, data):
    """Per-point test LL (original scale) and squared error of the predictive mean."""
    yt, sigma, y_sd = data["yt"], data["sigma"], data["y_sd"]
    if isinstance(out, tuple):  # closed-form Gaussian predictive (laplace-torch)
        mu, var = out
        pred = torch.distributions.Normal(mu, (var + sigma**2).sqrt())
        ll = pred.log_prob(yt)
    else:
        f = out.reshape(out.shape[0], -1)
        mu = f.mean(0)
        lp = torch.distributions.Normal(f, sigma).log_prob(yt)
        ll = torch.logsumexp(lp, 0) - math.log(f.shape[0])
    ll = ll - math.log(y_sd)
    se = ((mu - yt) * y_sd).pow(2)
    return ll.double().numpy(), se.double().numpy()


def _mean_se(a):
    a = np.asarray(a, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan


def _rmse_se(sq):
    """RMSE and its delta-method SE from per-point squared errors."""
    m, s = _mean_se(sq)
    return math.sqrt(m), s / (2 * math.sqrt(m)) if m > 0 else math.nan


def run_uci(cfg, datasets, labels, data_dir=DATA_DIR, seed=0):
    """Fit every method on every split; per (dataset, method): LL and RMSE with SEs, paired LL
    difference against AutoDropout, fit wall time; failures with their error."""
    fns = adapters()
    results = []
    for name in datasets:
        per = {lab: {"ll": [], "se": [], "wall_s": 0.0} for lab in labels}
        errors = {}
        for k in range(cfg["splits"]):
            data = load_split(name, k, cfg, data_dir)
            for lab in labels:
                if lab in errors:
                    continue
                pyro.clear_param_store()
                torch.manual_seed(seed + k)
                pyro.set_rng_seed(seed + k)
                t0 = time.perf_counter()
                try:
                    with _quiet():
                        out = fns[lab](data, cfg)
                except Exception as e:  # a peer that fails is recorded, the rest run
                    errors[lab] = _error(e)
                    print(f"  {name} {lab}: FAILED {errors[lab]['error']}", file=sys.stderr)
                    continue
                per[lab]["wall_s"] += time.perf_counter() - t0
                ll, se = _scores(out, data)
                per[lab]["ll"].append(ll)
                per[lab]["se"].append(se)
                print(f"  {name} split {k} {lab}: LL {ll.mean():.3f} "
                      f"({per[lab]['wall_s']:.0f} s)", flush=True)  # fmt: skip
        rows = []
        ref = np.concatenate(per[REFERENCE]["ll"]) if per.get(REFERENCE, {}).get("ll") else None
        for lab in labels:
            if lab in errors:
                rows.append({"method": lab, **errors[lab]})
                continue
            ll, sq = np.concatenate(per[lab]["ll"]), np.concatenate(per[lab]["se"])
            row = {"method": lab, "n_test": int(ll.size), "wall_s": per[lab]["wall_s"]}
            row["ll"], row["ll_se"] = _mean_se(ll)
            row["rmse"], row["rmse_se"] = _rmse_se(sq)
            if ref is not None and lab != REFERENCE:
                row["ll_diff"], row["ll_diff_se"] = _mean_se(ll - ref)
            rows.append(row)
        results.append({"dataset": name, "splits": cfg["splits"], "rows": rows})
    return results


# -- step time -------------------------------------------------------------------------------
def _tyxe_step(w, x, y):
    tyxe = _tyxe()

    sizes = w["sizes"]
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    net = nn.Sequential(*layers)
    prior = tyxe.priors.IIDPrior(dist.Normal(0.0, 1.0))
    n = w["n_data"]
    if w["task"] == "regression":
        lik = tyxe.likelihoods.HomoskedasticGaussian(n, scale=0.3)
        y = y.unsqueeze(-1)
    else:
        lik = tyxe.likelihoods.Categorical(n)
    guide = functools.partial(tyxe.guides.AutoNormal, init_scale=0.01)
    bnn = tyxe.VariationalBNN(net, prior, lik, guide)
    xb, yb = x[: w["batch"]], y[: w["batch"]]
    lrt = tyxe.poutine.local_reparameterization
    with lrt():  # TyXe's fit builds its SVI; its epochs are this SVI's steps
        svi = bnn.fit([(xb, yb)], pyro.optim.Adam({"lr": 1e-3}), 1)

    def step():
        with lrt():
            svi.step(xb, yb)

    return step


def _bt_step(w, x, y, kl_summed=False):
    from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

    net = speed._plain_net({**w, "p": 0.0})
    dnn_to_bnn(net, BT_PRIOR)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    xb, yb = x[: w["batch"]], y[: w["batch"]]
    n = w["n_data"]

    def data_term():
        if w["task"] == "regression":
            return _gauss_nll(net(xb).squeeze(-1), yb, 0.3)
        return nn.functional.cross_entropy(net(xb), yb)

    def step():
        opt.zero_grad()
        kl = _bt_kl_sum(net) / n if kl_summed else get_kl_loss(net) / xb.shape[0]
        (data_term() + kl).backward()
        opt.step()

    return step


def _ours_step(w, guide, x, y):
    st = speed._fit_step(w, guide, x, y)  # fit's default step: compiled loss, fused Adam, LRT
    return st


BASELINE = "eager nn.Dropout step"


def step_methods(w, x, y, labels):
    """Label -> step callable; failures -> error."""
    methods, errors = {}, {}
    plain, _, _ = speed._plain_step_fn(w, x, y)
    methods[BASELINE] = plain
    makers = {g: functools.partial(_ours_step, w, g) for g in GUIDES}
    makers["TyXe"] = functools.partial(_tyxe_step, w)
    makers["bayesian-torch (recipe)"] = functools.partial(_bt_step, w)
    makers["bayesian-torch (KL summed)"] = functools.partial(_bt_step, w, kl_summed=True)
    for lab, make in makers.items():
        if lab not in labels:
            continue
        try:
            with _quiet():
                methods[lab] = make(x, y)
                methods[lab]()  # a first step (and the compiled steps' traces)
        except Exception as e:
            methods.pop(lab, None)
            errors[lab] = _error(e)
    return methods, errors


def run_steps(cfg, labels, seed=0):
    """Per workload: median step time of each method and its ratio to the eager nn.Dropout
    step, alternated in ``rounds`` rounds of ``step_reps`` steps."""
    pyro.enable_validation(False)  # as in speed.py: argument checks off in the hot path
    out = {}
    try:
        for wname in cfg["workloads"]:
            w = speed.WORKLOADS[wname]
            pyro.clear_param_store()
            torch.manual_seed(seed)
            pyro.set_rng_seed(seed)
            x, y = speed._data(w, seed)
            methods, errors = step_methods(w, x, y, labels)
            for fn in methods.values():
                speed._timeit(fn, 3)  # warm-up
            times = {k: [] for k in methods}
            for _ in range(cfg["rounds"]):
                for k, fn in methods.items():
                    times[k].append(speed._timeit(fn, cfg["step_reps"]))
            med = {k: statistics.median(v) for k, v in times.items()}
            out[wname] = {
                "workload": {k: v for k, v in w.items() if k != "n_data"},
                "median_ms": {k: v * 1e3 for k, v in med.items()},
                "ratio": {k: v / med[BASELINE] for k, v in med.items() if k != BASELINE},
                "failed": errors,
            }
            print(f"  {wname}: " + ", ".join(f"{k} {v:.2f}×" for k, v in
                                            out[wname]["ratio"].items()), flush=True)  # fmt: skip
    finally:
        pyro.enable_validation(True)
    return out


# -- bookkeeping -----------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet():
    """Peers' own progress output and deprecation warnings stay out of the table."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _error(e):
    tb = traceback.extract_tb(e.__traceback__)
    where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return {"error": f"{type(e).__name__}: {e}"[:400], "where": where}


def peer_versions():
    """Installed versions of the peers (None: not installed) and of their import errors."""
    out = {}
    for label, dist_name in PACKAGES.items():
        try:
            out[label] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            out[label] = None
    return out


def _import_errors():
    """Which peers import here; the message when one does not."""
    out = {}
    for label, mod in (("TyXe", "tyxe"), ("bayesian-torch", "bayesian_torch"),
                       ("laplace-torch", "laplace")):  # fmt: skip
        try:
            with _quiet():
                __import__(mod)
            out[label] = None
        except Exception as e:
            out[label] = f"{type(e).__name__}: {e}"[:400]
    return out


def _available(labels):
    errs = _import_errors()
    keep, missing = [], {}
    for lab in labels:
        pkg = next((p for p in errs if lab.startswith(p)), None)
        if pkg is not None and errs[pkg] is not None:
            missing[lab] = errs[pkg]
        else:
            keep.append(lab)
    return keep, missing


def run(quick=False, datasets=None, splits=None, epochs=None, methods=None, data_dir=DATA_DIR,
        steps=True, seed=0):  # fmt: skip
    cfg = dict(SETTINGS["quick" if quick else "full"])
    if splits is not None:
        cfg["splits"] = splits
    if epochs is not None:
        cfg["epochs"] = epochs
    datasets = list(datasets or (DATASETS[:1] if quick else DATASETS))
    labels = list(methods or (*GUIDES, *PEERS))
    labels, missing = _available(labels)
    torch.set_num_threads(1)  # one thread: the shared 2-core machine, and comparable ratios
    t0 = time.perf_counter()
    uci = run_uci(cfg, datasets, labels, data_dir, seed)
    step = run_steps(cfg, labels, seed) if steps else {}
    return {
        "meta": {
            "quick": quick,
            "settings": cfg,
            "datasets": datasets,
            "not_run": missing,
            "code": git_state(),
            "versions": {**versions(), **peer_versions()},
            "torch_threads": torch.get_num_threads(),
            "fixes": FIXES,
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "total_wall_s": time.perf_counter() - t0,
        },
        "uci": uci,
        "steps": step,
        "user_lines": user_lines(),
    }


# -- page ------------------------------------------------------------------------------------
def _f(v, nd=2):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def tables(report):
    """The Markdown tables (printed, and the body of the page)."""
    lines = summary(report)
    for res in report["uci"]:
        lines += [f"### {res['dataset']} ({res['splits']} split(s))", ""]
        lines += ["| method | test LL | RMSE | LL − AutoDropout (paired) | fit (s) |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in res["rows"]:
            if "error" in r:
                lines.append(f"| {r['method']} | failed: `{r['error']}` | | | |")
                continue
            diff = (f"{r['ll_diff']:+.3f} ± {_f(r['ll_diff_se'], 3)}" if "ll_diff" in r
                    else "(reference)")  # fmt: skip
            lines.append(
                f"| {r['method']} | {r['ll']:.3f} ± {_f(r['ll_se'], 3)} | "
                f"{r['rmse']:.3f} ± {_f(r['rmse_se'], 3)} | {diff} | {r['wall_s']:.0f} |"
            )
        lines.append("")
    if report["steps"]:
        ws = list(report["steps"])
        lines += ["### Training step × eager `nn.Dropout` step (median, same process)", ""]
        lines += ["| method | " + " | ".join(f"{w} ({_wdesc(report['steps'][w])})" for w in ws)
                  + " |", "| --- |" + " --- |" * len(ws)]  # fmt: skip
        labels = list(dict.fromkeys(k for w in ws for s in ("ratio", "failed")
                                    for k in report["steps"][w][s]))  # fmt: skip
        for lab in labels:
            cells = []
            for w in ws:
                s = report["steps"][w]
                if lab in s["ratio"]:
                    cells.append(f"{s['ratio'][lab]:.2f}× ({s['median_ms'][lab]:.2f} ms)")
                else:
                    cells.append(f"failed: `{s['failed'].get(lab, {}).get('error', '–')}`")
            lines.append(f"| {lab} | " + " | ".join(cells) + " |")
        base = " | ".join(f"{report['steps'][w]['median_ms'][BASELINE]:.2f} ms" for w in ws)
        lines += [f"| {BASELINE} (the unit) | {base} |", ""]
    lines += ["### Lines of user code for the same fit", ""]
    lines += ["Logical lines (a statement over several lines counts once; imports, data loading "
              "and scoring left out) between `# user code` and `# end user code` in each "
              "adapter of `benchmarks/peers.py`: model, guide or conversion, training, "
              "predictive draws.", ""]  # fmt: skip
    lines += ["| code | lines |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in report["user_lines"].items()]
    return "\n".join(lines)


def summary(report):
    """One table: each method's test LL per dataset (± SE), the best LL of each set in bold."""
    sets = [r["dataset"] for r in report["uci"]]
    if not sets:
        return []
    rows = {}
    for res in report["uci"]:
        ok = [r for r in res["rows"] if "error" not in r]
        best = max((r["ll"] for r in ok), default=None)
        for r in res["rows"]:
            if "error" in r:
                cell = "failed"
            else:
                cell = f"{r['ll']:.2f} ± {_f(r['ll_se'])}"
                cell = f"**{cell}**" if r["ll"] == best else cell
            rows.setdefault(r["method"], {})[res["dataset"]] = cell
    lines = ["### Test LL at a glance (higher is better; best per set in bold)", ""]
    lines += ["| method | " + " | ".join(sets) + " |", "| --- |" + " --- |" * len(sets)]
    for m, cells in rows.items():
        lines.append(f"| {m} | " + " | ".join(cells.get(d, "–") for d in sets) + " |")
    return [*lines, ""]


def _wdesc(s):
    w = s["workload"]
    return f"{'-'.join(map(str, w['sizes']))}, batch {w['batch']}, p = {w['p']}"


def page(report, command):
    meta = report["meta"]
    code = meta["code"]
    commit = (code.get("commit") or "unknown")[:7] + ("+dirty" if code.get("dirty") else "")
    v = meta["versions"]
    cfg = meta["settings"]
    head = [
        "# Side by side with the peers",
        "",
        f"Measured at {commit} on {meta['date']} ({v['platform']}, {meta['torch_threads']} "
        f"torch thread, a shared machine) with",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Versions: Python {v['python']}, torch {v['torch']}, Pyro {v['pyro']}; "
        + ", ".join(f"{k} {v.get(k) or 'not installed'}" for k in PACKAGES)
        + ". Total wall time "
        f"{meta['total_wall_s'] / 60:.0f} min.",
        "",
        f"UCI protocol: split(s) {', '.join(str(k) for k in range(cfg['splits']))} of each "
        f"set, one hidden layer of {cfg['hidden']} ReLU units, {cfg['epochs']} epochs, Adam "
        f"with lr {cfg['lr']}, batch {cfg['batch']}, {cfg['draws']} predictive draws, "
        "N(0, 1) weight priors, a Gaussian likelihood with the same fixed noise for every "
        "method (the middle τ of the set's published grid), dropout p = "
        f"{cfg['p']} for the dropout methods. LL: mean per-point test log-likelihood on the "
        "original scale, ± its standard error over the test points; RMSE ± its delta-method "
        "SE; the paired column is the mean per-point LL difference against AutoDropout on "
        "the same test points. `fit (s)` is wall time on a shared, loaded machine (a "
        "rough guide only; the step table is the timing comparison). The budget: "
        f"{cfg['epochs']} epochs and {cfg['splits']} split(s) per set, so that the whole run "
        "fits a few CPU minutes on two shared cores; more splits and epochs (`--splits`, "
        "`--epochs 400`) tighten the SEs and favour the slower-converging mean-field fits.",
        "",
    ]
    if meta["not_run"]:
        head += ["Not run (import failed):", ""]
        head += [f"- {k}: `{e}`" for k, e in meta["not_run"].items()]
        head.append("")
    fixes = ["", "## What the peers needed to run", ""]
    fixes += [f"- **{k}**: {v}" for k, v in meta.get("fixes", {}).items()]
    body = "\n".join(head) + "\n## Results\n\n" + tables(report) + "\n" + NOTES
    return body + "\n".join(fixes) + "\n" + INSTALL


NOTES = """
## How each peer was run, and what it needed

- **Ours**: `BayesianMLP` + one of the four guides with its defaults, `fit(...,
  num_epochs, batch_size, lr)` and `predict(..., num_samples)` (LRT, compiled loss, fused
  Adam: `fit`'s defaults). `AutoDropout` keeps the network's inputs (its default
  `input_dropout_rate=0`; plain MC dropout below drops them), `AutoConcreteDropout` learns
  every layer's rate, inputs included, with its default slab σ = 0.05.
- **Plain MC dropout**: `nn.Sequential` with `nn.Dropout` before each `nn.Linear`, the
  Gaussian NLL plus Gal's weight decay for an `N(0, 1)` prior
  (`(1 − p)/(2N)‖W‖² + ‖b‖²/(2N)`), dropout left on for the predictive draws.
- **TyXe**: its README recipe (`VariationalBNN`, `IIDPrior(Normal(0, 1))`,
  `HomoskedasticGaussian`, `AutoNormal(init_scale=0.01)`, `fit` inside
  `tyxe.poutine.local_reparameterization()`); its step is the `SVI` its `fit` builds.
- **bayesian-torch (recipe)**: its README recipe, `dnn_to_bnn` with its documented prior
  dictionary and `loss = data term + get_kl_loss(model) / batch_size`. `get_kl_loss` sums
  each layer's `kl_loss()`, which is a *mean* over the layer's weights
  (IntelLabs/bayesian-torch#36): the KL is scaled down by the number of weights, so the
  recipe is close to maximum likelihood. **bayesian-torch (KL summed)**: the same layers with
  the ELBO per example, `KL summed over weights / N`.
- **laplace-torch**: a MAP fit of the plain network (weight decay of the `N(0, 1)` prior),
  then its README recipe with its defaults (`Laplace(model, "regression")`: last layer,
  Kronecker-factored GGN), `optimize_prior_precision(method="marglik")`, and the GLM
  predictive in closed form (so no predictive draws). It has no training step of its own
  (its step is a plain network's), so it has no row in the step table.
"""


INSTALL = """
## Running it again

The peers are not dependencies of the project; they go in an environment of their own (the
CPU torch wheel, then this checkout and the peers from PyPI), and the run goes from the
repository root:

```bash
python3.11 -m venv venv-peers
venv-peers/bin/pip install torch==2.13.0
venv-peers/bin/pip install -c <(echo torch==2.13.0) -e . tyxe bayesian-torch laplace-torch
venv-peers/bin/pip uninstall -y torchvision   # see above
OMP_NUM_THREADS=1 venv-peers/bin/python -m benchmarks.peers --out docs/benchmarks --epochs 40 --splits 2
```

`--quick` is a seconds-long smoke run (`tests/bench/test_peers_quick.py` runs it for our
side, and for each peer that is installed); `--report-only --out DIR` writes the page again
from `DIR/peers.json`; `--splits K` and `--datasets` widen or narrow the run.
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for peers.json/.md")
    parser.add_argument("--datasets", default=None, help="comma-separated UCI sets")
    parser.add_argument("--splits", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--methods", default=None, help="comma-separated method labels")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--no-steps", action="store_true", help="skip the step timings")
    parser.add_argument("--report-only", action="store_true", help="the page from peers.json")
    args = parser.parse_args(argv)
    json_path, md_path = args.out / "peers.json", args.out / "peers.md"
    if args.report_only:
        if not json_path.is_file():
            parser.error(f"--report-only needs {json_path} (run without it first)")
        report = json.loads(json_path.read_text())
    else:
        report = run(
            quick=args.quick,
            datasets=args.datasets.split(",") if args.datasets else None,
            splits=args.splits,
            epochs=args.epochs,
            methods=args.methods.split(",") if args.methods else None,
            data_dir=args.data_dir,
            steps=not args.no_steps,
        )
        report["meta"]["command"] = _command(argv if argv is not None else sys.argv[1:])
        args.out.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(tables(report))
    md_path.write_text(page(report, report["meta"]["command"]))
    return report


def _command(argv):
    """The command line, with machine paths cut to their last part."""
    words = []
    for a in argv:
        words.append(Path(a).name if "/" in a else a)
    return "python -m benchmarks.peers " + " ".join(words)


if __name__ == "__main__":
    main()
