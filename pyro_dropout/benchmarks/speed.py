"""Training-step and prediction cost against a plain PyTorch dropout MLP, in one process.

    python -m pyro_dropout.benchmarks.speed [--quick] [--json PATH] [--markdown PATH]

Workloads (from the project's speed issue):

* W1: 8-50-1 regression, batch 32, dropout p = 0.1;
* W2: 784-400-400-10 classification, batch 128, dropout p = 0.5.

For each workload it times one training step (forward + backward + optimiser step) of a plain
``nn.Dropout`` MLP and of each guide with local reparameterisation through ``pyro.infer.SVI``
with ``fit``'s defaults (``MeanFieldELBO``, the ``TraceMeanField_ELBO`` estimator, and one fused
Adam), once eager and once compiled with ``JitMeanFieldELBO`` (``fit(..., jit=True)``); and
``predict`` (T = 100 samples, 1,000 points; per-example pre-activations, the default, and weight
draws, ``local_reparameterization=False``) against a plain-PyTorch loop of T dropout forwards.
Methods are interleaved in rounds and each is summarised by the median of its per-round times;
the table reports ratios to the plain baseline of the same workload measured in the same
rounds, so machine noise largely cancels. Run it on an otherwise idle machine: busy cores make
torch's threads wait on each other and the ratios meaningless.
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI

from .. import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    local_reparameterization,
    predict,
)
from ..infer import JitMeanFieldELBO, MeanFieldELBO, fused_adam
from ._provenance import git_state, versions

WORKLOADS = {
    "W1": dict(sizes=(8, 50, 1), batch=32, p=0.1, task="regression", n_data=1000),
    "W2": dict(sizes=(784, 400, 400, 10), batch=128, p=0.5, task="classification", n_data=1000),
}

#: Label suffix of the steps compiled with ``JitMeanFieldELBO`` (``fit(..., jit=True)``).
JIT_SUFFIX = " (jit)"
#: Label suffix of ``predict(..., local_reparameterization=False)``: one weight draw per pass
#: (dropout masks shared by the points of a pass) instead of per-example pre-activations.
WEIGHTS_SUFFIX = " (weight draws)"

TARGETS = {  # ratio to the plain nn.Dropout MLP
    ("AutoDropout", "W1"): 3.0,
    ("AutoDropout", "W2"): 1.5,
    ("AutoMeanField", "W1"): 4.5,
    ("AutoMeanField", "W2"): 2.5,
    ("AutoVariationalDropout", "W1"): 4.5,
    ("AutoVariationalDropout", "W2"): 2.5,
    ("predict", "W1"): 1.0,
    ("predict", "W2"): 1.0,
}


def _data(w, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_in, d_out = w["sizes"][0], w["sizes"][-1]
    x = torch.randn(w["n_data"], d_in, generator=g)
    if w["task"] == "regression":
        y = torch.randn(w["n_data"], generator=g)
    else:
        y = torch.randint(0, d_out, (w["n_data"],), generator=g)
    return x, y


def _plain_net(w):
    layers = []
    sizes = w["sizes"]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers += [torch.nn.Dropout(w["p"]), torch.nn.Linear(a, b)]
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _plain_step_fn(w, x, y):
    net = _plain_net(w).train()
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    xb, yb = x[: w["batch"]], y[: w["batch"]]
    if w["task"] == "regression":

        def loss_fn():
            return ((net(xb).squeeze(-1) - yb) ** 2).mean()
    else:

        def loss_fn():
            return torch.nn.functional.cross_entropy(net(xb), yb)

    def step():
        opt.zero_grad()
        loss_fn().backward()
        opt.step()

    return step, net


def _guide_step_fn(w, guide_cls, x, y, jit=False):
    sizes = w["sizes"]
    model = BayesianMLP(
        sizes[0],
        sizes[-1],
        hidden=sizes[1:-1],
        likelihood=w["task"],
        tau=10.0 if w["task"] == "regression" else None,
    )
    kwargs = {"dropout_rate": w["p"]} if guide_cls is AutoDropout else {}
    guide = guide_cls(model, **kwargs)
    # what fit() uses: MeanFieldELBO (JitMeanFieldELBO with jit=True) and one fused Adam
    elbo = (JitMeanFieldELBO if jit else MeanFieldELBO)(max_plate_nesting=1)
    svi = SVI(model, guide, fused_adam({"lr": 1e-3}), elbo)
    xb, yb = x[: w["batch"]], y[: w["batch"]]
    n = w["n_data"]
    lrt = local_reparameterization()

    def step():
        with lrt:
            svi.step(xb, yb, num_data=n)

    return step, model, guide


def _plain_predict_fn(net, x, num_samples):
    net.train()  # dropout on: MC dropout

    @torch.no_grad()
    def run():
        return torch.stack([net(x) for _ in range(num_samples)])

    return run


def _timeit(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def run(quick=False, rounds=None, seed=0):
    """Run the benchmark; returns a dict with settings, per-method medians and ratios."""
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)
    pyro.enable_validation(False)  # argument checks stay on in the tests, off in the hot path
    rounds = rounds or (3 if quick else 15)
    step_reps = 5 if quick else 50
    pred_points, pred_samples = (200, 10) if quick else (1000, 100)
    results = {}
    for wname, w in WORKLOADS.items():
        pyro.clear_param_store()
        x, y = _data(w, seed)
        methods = {}
        plain_step, plain_net = _plain_step_fn(w, x, y)
        methods["plain nn.Dropout step"] = plain_step
        fitted = {}
        for cls in (AutoDropout, AutoMeanField, AutoVariationalDropout):
            for jit in (False, True):
                step, model, guide = _guide_step_fn(w, cls, x, y, jit=jit)
                step()  # set up the guide's parameters (and trace, with jit)
                methods[f"{cls.__name__} + LRT step{JIT_SUFFIX if jit else ''}"] = step
                if not jit:
                    fitted[cls.__name__] = (model, guide)
        x_pred = torch.randn(pred_points, w["sizes"][0])
        model, guide = fitted["AutoDropout"]
        methods["plain dropout predict loop"] = _plain_predict_fn(plain_net, x_pred, pred_samples)
        methods["predict (AutoDropout)"] = lambda m=model, g=guide, xp=x_pred: predict(
            m, g, xp, num_samples=pred_samples
        )
        methods[f"predict (AutoDropout){WEIGHTS_SUFFIX}"] = lambda m=model, g=guide, xp=x_pred: (
            predict(m, g, xp, num_samples=pred_samples, local_reparameterization=False)
        )
        times = {k: [] for k in methods}
        for fn in methods.values():  # warm-up
            _timeit(fn, 3)
        for _ in range(rounds):  # interleaved rounds
            for k, fn in methods.items():
                reps = step_reps if "step" in k else max(1, step_reps // 10)
                times[k].append(_timeit(fn, reps))
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios = {}
        for cls in ("AutoDropout", "AutoMeanField", "AutoVariationalDropout"):
            for suffix in ("", JIT_SUFFIX):
                ratios[cls + suffix] = (
                    med[f"{cls} + LRT step{suffix}"] / med["plain nn.Dropout step"]
                )
        for suffix in ("", WEIGHTS_SUFFIX):
            ratios["predict" + suffix] = (
                med[f"predict (AutoDropout){suffix}"] / med["plain dropout predict loop"]
            )
        results[wname] = {"median_seconds": med, "ratios": ratios, "workload": w}
    return {
        "settings": {
            "quick": quick,
            "rounds": rounds,
            "step_reps": step_reps,
            "predict_points": pred_points,
            "predict_samples": pred_samples,
            "torch_threads": torch.get_num_threads(),
        },
        "machine": {**versions(), "processor": platform.processor()},
        "code": git_state(),
        "results": results,
        "targets": {f"{k[0]}/{k[1]}": v for k, v in TARGETS.items()},
    }


def markdown(report):
    """Markdown table of ratios (and absolute medians) with the targets."""
    lines = [
        "| method | W1 ratio | W1 target | W2 ratio | W2 target |",
        "| --- | --- | --- | --- | --- |",
    ]
    res = report["results"]
    methods = [
        (cls, suffix)
        for cls in ("AutoDropout", "AutoMeanField", "AutoVariationalDropout")
        for suffix in ("", JIT_SUFFIX)
    ] + [("predict", ""), ("predict", WEIGHTS_SUFFIX)]
    for method, suffix in methods:
        if method == "predict":
            label = "predict, T=100" + (
                ", weight draws" if suffix else ", per-example pre-activations (default)"
            )
        else:
            label = f"{method} + LRT, training step{' (JIT)' if suffix else ' (eager)'}"
        row = [label]
        for w in ("W1", "W2"):
            r = res[w]["ratios"][method + suffix]
            t = TARGETS[(method, w)]
            row += [f"{r:.2f}× {'✅' if r <= t else '❌'}", f"≤ {t}×"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Absolute medians (ms):", ""]
    lines += ["| measurement | W1 | W2 |", "| --- | --- | --- |"]
    for k in res["W1"]["median_seconds"]:
        a, b = (res[w]["median_seconds"][k] * 1e3 for w in ("W1", "W2"))
        lines.append(f"| {k} | {a:.3f} | {b:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", type=Path, default=Path("speed.json"))
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(quick=args.quick, rounds=args.rounds)
    table = markdown(report)
    print(table)
    args.json.write_text(json.dumps(report, indent=2, default=str))
    if args.markdown is not None:
        args.markdown.write_text(table + "\n")
    return report


if __name__ == "__main__":
    main()
