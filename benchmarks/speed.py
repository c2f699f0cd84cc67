"""Training-step and prediction cost against plain PyTorch, in one process, with a profile of
where a step's time goes and how close it is to the hardware.

    python -m benchmarks.speed [--quick] [--rounds N] [--json PATH] [--markdown PATH]

Workloads (from the project's speed issues):

* W1: 8-50-1 regression, batch 32, dropout p = 0.1;
* W2: 784-400-400-10 classification, batch 128, dropout p = 0.5.

Per workload, interleaved in rounds (each method summarised by the median of its per-round
times; ratios against baselines measured in the same rounds, so machine noise largely cancels):

* **fit's step** for each of the four guides: ``CompiledSVI`` (an ``SVI``) with ``fit``'s default set-up under
  ``local_reparameterization()`` — the compiled loss (:class:`~pyro_dropout.infer.JitMeanFieldELBO`,
  ``jit="auto"``) and one fused Adam — and the same step eager (``jit=False``), against a plain
  ``nn.Dropout`` MLP step (forward, backward, Adam) of the same sizes;
* **the Pyro tutorial's BNN** (``PyroModule[nn.Linear]`` layers with ``PyroSample`` weights, the
  model a Pyro user writes) with fit's step for each guide, against the same plain network;
* **a Pyro user's own loop**: ``SVI(model, guide, pyro.optim.Adam, TraceMeanField_ELBO())`` on the
  tutorial model, our guides under ``local_reparameterization()``, against the same loop with
  Pyro's ``AutoNormal`` and no LRT (what our layer adds to Pyro's own cost), and the same loop
  with this library's ``MeanFieldELBO`` (a drop-in for ``TraceMeanField_ELBO``) for our guides;
* **predict** (T = 100 samples, 1,000 points; weight draws, the default, and per-example
  pre-activations) against a plain-PyTorch loop of T dropout forwards.

Then, outside the timed rounds: the phases of one step (:mod:`.step_profile`), its matrix-product
FLOPs, the achieved GFLOP/s and a matmul peak measured in the same process. Run it on an
otherwise idle machine: busy cores make torch's threads wait on each other and the ratios
meaningless.
"""

import argparse
import contextlib
import functools
import itertools
import json
import platform
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    local_reparameterization,
    predict,
)
from pyro_dropout.infer import CompiledSVI, MeanFieldELBO, fused_adam
from pyro_dropout.infer.elbo import make_elbo
from pyro_dropout.infer.minibatch import ScaleObserved

from . import step_profile
from ._provenance import git_state, versions

WORKLOADS = {
    "W1": dict(sizes=(8, 50, 1), batch=32, p=0.1, task="regression", n_data=1000),
    "W2": dict(sizes=(784, 400, 400, 10), batch=128, p=0.5, task="classification", n_data=1000),
}
GUIDES = {
    "AutoDropout": AutoDropout,
    "AutoConcreteDropout": AutoConcreteDropout,
    "AutoMeanField": AutoMeanField,
    "AutoVariationalDropout": AutoVariationalDropout,
}
DROPOUT_GUIDES = ("AutoDropout", "AutoConcreteDropout")

#: Ratio keys: ``fit/<guide>`` (fit's compiled step, ``jit="auto"``), ``eager/<guide>`` (jit=False),
#: ``tutorial/<guide>`` (the tutorial model with fit's step), ``user-loop/<guide>`` (a plain
#: Pyro SVI loop, against AutoNormal without LRT), ``user-loop-mf/<guide>`` (the same loop with
#: this library's ``MeanFieldELBO`` in place of ``TraceMeanField_ELBO``), ``predict`` (its
#: default, weight draws) and ``predict (per-example pre-activations)``.
PER_EXAMPLE_SUFFIX = " (per-example pre-activations)"
PLAIN = "plain nn.Dropout step"
USER_BASELINE = "user SVI loop: AutoNormal, no LRT"
USER_MF = "user SVI loop, MeanFieldELBO: "
PLAIN_GRAPH = "plain nn.Dropout step, one CUDA graph"


def target(kind, guide, workload):
    """The issue's target ratio for a row (None: no target)."""
    if kind in ("fit", "tutorial", "graph"):
        if workload == "W1":
            return 1.5
        return 1.1 if guide in DROPOUT_GUIDES else 2.0
    if kind in ("user-loop", "user-loop-mf"):
        return 1.3
    if kind == "predict":
        return 1.0
    return None


def _data(w, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_in, d_out = w["sizes"][0], w["sizes"][-1]
    x = torch.randn(w["n_data"], d_in, generator=g, device="cpu")
    if w["task"] == "regression":
        y = torch.randn(w["n_data"], generator=g, device="cpu")
    else:
        y = torch.randint(0, d_out, (w["n_data"],), generator=g, device="cpu")
    device = torch.get_default_device()
    return x.to(device), y.to(device)


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

    return step, net, loss_fn


def _plain_graph_step_fn(w, x, y):
    """The plain step recorded as one CUDA graph (torch's "whole-network capture" recipe:
    warm-up on a side stream, ``Adam(capturable=True)``, gradients set to ``None`` before
    recording), replayed on a fixed minibatch."""
    step, net, loss_fn = _plain_step_fn(w, x, y)
    opt = torch.optim.Adam(net.parameters(), 1e-3, capturable=True)

    def body():
        loss_fn().backward()
        opt.step()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(stream)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    def replay():
        graph.replay()

    # The graph reads the network's parameters, the optimiser's state and the minibatch by
    # address: they must outlive it. (Returning graph.replay alone let them be freed; the
    # replays then read freed memory, an illegal access on an H200 once it was reused.)
    replay.keep_alive = (net, opt, loss_fn, graph)
    return replay


class TutorialBNN(PyroModule):
    """The Pyro tutorial's Bayesian MLP: ``PyroModule[nn.Linear]`` layers whose weights and
    biases are ``PyroSample(Normal(0, 1))``, ReLU, a Normal (regression, noise SD 0.3) or
    Categorical likelihood in a data plate; no ``num_data`` argument (fit scales it)."""

    def __init__(self, sizes, task):
        super().__init__()
        self.task = task
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layer = PyroModule[torch.nn.Linear](a, b)
            layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([b, a]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([b]).to_event(1))
            layers.append(layer)
        self.layers = PyroModule[torch.nn.ModuleList](layers)

    def forward(self, x, y=None):
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        with pyro.plate("data", x.shape[0]):
            if self.task == "regression":
                f = h.squeeze(-1)
                pyro.sample("obs", dist.Normal(f, 0.3), obs=y)
            else:
                f = h
                pyro.sample("obs", dist.Categorical(logits=f), obs=y)
        return f


#: Several guides of one class are alive in a round: each gets its own param-store name.
_GUIDE_NUMBERS = itertools.count()


def _make_guide(name, model, w):
    if name == "AutoNormal":
        return AutoNormal(model)
    unique = f"{name}_speed_{next(_GUIDE_NUMBERS)}"
    if name == "AutoDropout":
        return AutoDropout(model, dropout_rate=w["p"], input_dropout_rate=w["p"], name=unique)
    return GUIDES[name](model, name=unique)


def _bayesian_mlp(w):
    sizes = w["sizes"]
    return BayesianMLP(
        sizes[0],
        sizes[-1],
        hidden=sizes[1:-1],
        likelihood=w["task"],
        tau=10.0 if w["task"] == "regression" else None,
    )


class _Step:
    """One method's training step and what its profile needs."""

    def __init__(self, model, guide, elbo, optim, args, kwargs, context, svi=SVI):
        self.model, self.guide, self.elbo = model, guide, elbo
        self.args, self.kwargs, self.context = args, kwargs, context
        self.svi = svi(model, guide, optim, elbo)

    def __call__(self):
        with self.context():
            self.svi.step(*self.args, **self.kwargs)


def _fit_step(w, guide_name, x, y, jit="auto", tutorial=False, cuda_graph=False):
    """``fit``'s step: its ELBO (compiled with ``jit="auto"``, eager with ``jit=False``), fused
    Adam, LRT, minibatch scale."""
    model = TutorialBNN(w["sizes"], w["task"]) if tutorial else _bayesian_mlp(w)
    guide = _make_guide(guide_name, model, w)
    elbo = make_elbo(model, jit)
    if tutorial:  # no num_data argument: fit scales the observed site by N / B
        elbo.max_plate_nesting = 1
    xb, yb = x[: w["batch"]], y[: w["batch"]]
    scale = w["n_data"] / w["batch"]
    kwargs = {} if tutorial else {"num_data": w["n_data"]}

    @contextlib.contextmanager
    def context():
        with local_reparameterization(), ScaleObserved(scale) if tutorial else nullcontext():
            yield

    optim = fused_adam({"lr": 1e-3})
    svi = functools.partial(CompiledSVI, cuda_graph=cuda_graph)
    return _Step(model, guide, elbo, optim, (xb, yb), kwargs, context, svi=svi)


def _user_loop_step(w, guide_name, x, y, elbo_class=TraceMeanField_ELBO):
    """A Pyro user's own loop on the tutorial model: Pyro's Adam and ``TraceMeanField_ELBO``
    (or ``elbo_class``: this library's ``MeanFieldELBO``, the same estimator without the guide
    densities Pyro computes and then replaces by the analytic KL), our guides under
    ``local_reparameterization()``; ``AutoNormal`` without it."""
    model = TutorialBNN(w["sizes"], w["task"])
    guide = _make_guide(guide_name, model, w)
    lrt = guide_name != "AutoNormal"
    xb, yb = x[: w["batch"]], y[: w["batch"]]

    def context():
        return local_reparameterization() if lrt else nullcontext()

    elbo = elbo_class(max_plate_nesting=1)
    return _Step(model, guide, elbo, pyro.optim.Adam({"lr": 1e-3}), (xb, yb), {}, context)


def _plain_predict_fn(net, x, num_samples):
    net.train()  # dropout on: MC dropout

    @torch.no_grad()
    def run():
        return torch.stack([net(x) for _ in range(num_samples)])

    return run


def _timeit(fn, reps):
    step_profile.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    step_profile.synchronize()
    return (time.perf_counter() - t0) / reps


def _methods(w, x, y, pred_points, pred_samples):
    """Every timed method of one workload: label -> (callable, kind, guide)."""
    methods = {}
    plain_step, plain_net, plain_loss = _plain_step_fn(w, x, y)
    methods[PLAIN] = (plain_step, "baseline", None)
    steps = {}
    for name in GUIDES:
        for kind, jit, tutorial in (("fit", "auto", False), ("eager", False, False),
                                    ("tutorial", "auto", True)):  # fmt: skip
            step = _fit_step(w, name, x, y, jit=jit, tutorial=tutorial)
            steps[(kind, name)] = step
            methods[f"{kind}: {name}"] = (step, kind, name)
    if x.is_cuda:  # the steps recorded as CUDA graphs, and the plain one likewise
        methods[PLAIN_GRAPH] = (_plain_graph_step_fn(w, x, y), "baseline", None)
        for name in GUIDES:
            step = _fit_step(w, name, x, y, cuda_graph=True)
            methods[f"graph: {name}"] = (step, "graph", name)
    for name in list(GUIDES) + ["AutoNormal"]:
        step = _user_loop_step(w, name, x, y)
        label = USER_BASELINE if name == "AutoNormal" else f"user SVI loop: {name} + LRT"
        methods[label] = (step, "user-loop" if name != "AutoNormal" else "baseline", name)
    for name in GUIDES:
        step = _user_loop_step(w, name, x, y, elbo_class=MeanFieldELBO)
        methods[f"{USER_MF}{name} + LRT"] = (step, "user-loop-mf", name)
    x_pred = torch.randn(pred_points, w["sizes"][0])
    fitted = steps[("eager", "AutoDropout")]
    model, guide = fitted.model, fitted.guide
    methods["plain dropout predict loop"] = (
        _plain_predict_fn(plain_net, x_pred, pred_samples), "baseline", None)  # fmt: skip
    methods["predict (AutoDropout)"] = (
        lambda: predict(model, guide, x_pred, num_samples=pred_samples), "predict", None)  # fmt: skip
    methods[f"predict (AutoDropout){PER_EXAMPLE_SUFFIX}"] = (
        lambda: predict(model, guide, x_pred, num_samples=pred_samples,
                        local_reparameterization=True), "predict", None)  # fmt: skip
    return methods, steps, (plain_step, plain_loss)


def _ratios(med):
    ratios = {}
    for label, m in med.items():
        if label.startswith(("fit: ", "eager: ", "tutorial: ", "graph: ")):
            kind, name = label.split(": ")
            ratios[f"{kind}/{name}"] = m / med[PLAIN]
            if kind == "graph":
                ratios[f"graph-vs-plain-graph/{name}"] = m / med[PLAIN_GRAPH]
        elif label.startswith("user SVI loop: Auto") and label != USER_BASELINE:
            name = label.split(": ")[1].split(" ")[0]
            ratios[f"user-loop/{name}"] = m / med[USER_BASELINE]
        elif label.startswith(USER_MF):
            name = label[len(USER_MF) :].split(" ")[0]
            ratios[f"user-loop-mf/{name}"] = m / med[USER_BASELINE]
    if PLAIN_GRAPH in med:
        ratios["plain-graph"] = med[PLAIN_GRAPH] / med[PLAIN]
    ratios["predict"] = med["predict (AutoDropout)"] / med["plain dropout predict loop"]
    ratios["predict" + PER_EXAMPLE_SUFFIX] = (
        med[f"predict (AutoDropout){PER_EXAMPLE_SUFFIX}"] / med["plain dropout predict loop"]
    )
    return ratios


def _profile(w, steps, plain, reps, peak):
    """Phases, FLOPs and achieved GFLOP/s of the plain step and of fit's steps (outside the
    timed rounds)."""
    plain_step, plain_loss = plain
    out = {}
    flops = step_profile.step_flops(lambda: plain_loss().backward())
    t = step_profile._median_ms(plain_step, reps)
    out[PLAIN] = {"phases": {"step": t}, "flops": flops, "gflops_per_s": flops / t / 1e6}
    for (kind, name), st in steps.items():
        if kind == "eager":
            continue
        compiled = kind in ("fit", "tutorial")
        ph = step_profile.phases(st.model, st.guide, st.elbo, st, st.args, st.kwargs,
                                 st.context, reps, compiled)  # fmt: skip
        eager = steps[("eager", name)] if kind == "fit" else st
        with eager.context():  # FLOPs of the eager step (the same products as the graph)
            flops = step_profile.step_flops(
                lambda e=eager: e.elbo.differentiable_loss(
                    e.model, e.guide, *e.args, **e.kwargs
                ).backward()
            )
        out[f"{kind}: {name}"] = {
            "phases": ph,
            "flops": flops,
            "gflops_per_s": flops / ph["step"] / 1e6,
            "flops_vs_plain": flops / out[PLAIN]["flops"],
        }
        if kind == "fit":
            eph = step_profile.phases(eager.model, eager.guide, eager.elbo, eager, eager.args,
                                      eager.kwargs, eager.context, reps, False)  # fmt: skip
            out[f"eager: {name}"] = {"phases": eph, "flops": flops,
                                     "gflops_per_s": flops / eph["step"] / 1e6}  # fmt: skip
    for v in out.values():
        v["percent_of_peak"] = 100 * v["gflops_per_s"] / peak
    return out


def run(quick=False, rounds=None, seed=0, profile=True, device="cpu"):
    """Run the benchmark; returns a dict with settings, per-method medians, ratios, targets
    and (unless ``profile=False``) the step profiles. ``device="cuda"`` runs every method
    (the plain baselines too) on the GPU."""
    previous = torch.get_default_device()
    if torch.device(device) == previous:
        return _run(quick, rounds, seed, profile, device)
    torch.set_default_device(device)
    try:
        return _run(quick, rounds, seed, profile, device)
    finally:
        # None, not "cpu": an explicit default device intercepts every factory call
        torch.set_default_device(None if previous.type == "cpu" else previous)


def _run(quick, rounds, seed, profile, device):
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)
    pyro.enable_validation(False)  # argument checks stay on in the tests, off in the hot path
    rounds = rounds or (3 if quick else 9)
    step_reps = 5 if quick else 50
    pred_points, pred_samples = (200, 10) if quick else (1000, 100)
    peak = step_profile.matmul_peak_gflops(256 if quick else 512)
    results = {}
    for wname, w in WORKLOADS.items():
        pyro.clear_param_store()
        x, y = _data(w, seed)
        methods, steps, plain = _methods(w, x, y, pred_points, pred_samples)
        times = {k: [] for k in methods}
        for fn, kind, _ in methods.values():  # warm-up (the compiled steps' traces, and the
            _timeit(fn, 8 if kind == "graph" else 3)  # CUDA graphs' warm-up and recording)
        heavy = wname == "W2" and not quick  # a W2 predict call takes seconds
        for _ in range(rounds):  # interleaved rounds
            for k, (fn, *_) in methods.items():
                if "predict" in k:
                    reps = 1 if heavy else max(1, step_reps // 10)
                else:
                    reps = step_reps
                times[k].append(_timeit(fn, reps))
        med = {k: statistics.median(v) for k, v in times.items()}
        results[wname] = {"median_seconds": med, "ratios": _ratios(med), "workload": w}
        if profile:
            results[wname]["profile"] = _profile(w, steps, plain, 3 if quick else 30, peak)
    return {
        "settings": {
            "quick": quick,
            "rounds": rounds,
            "step_reps": step_reps,
            "predict_points": pred_points,
            "predict_samples": pred_samples,
            "torch_threads": torch.get_num_threads(),
            "device": str(device),
        },
        "machine": {
            **versions(),
            "processor": platform.processor(),
            "gpu": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else None,
        },
        "code": git_state(),
        "matmul_peak_gflops": peak,
        "results": results,
    }


def _cell(ratio, tgt):
    if tgt is None:
        return f"{ratio:.2f}×"
    return f"{ratio:.2f}× {'✅' if ratio <= tgt else '❌'} (≤ {tgt})"


def markdown(report):
    """Markdown tables: ratios with their targets, the step profiles, absolute medians."""
    res = report["results"]
    lines = ["| method | W1 | W2 |", "| --- | --- | --- |"]
    labels = {
        "fit": 'fit\'s default step, compiled (jit="auto"), {g} + LRT',
        "eager": "fit's step with jit=False (eager), {g} + LRT",
        "tutorial": "tutorial PyroModule BNN, fit's step, {g} + LRT",
        "user-loop": "user's SVI loop, {g} + LRT vs AutoNormal without LRT",
        "user-loop-mf": "user's SVI loop with MeanFieldELBO, {g} + LRT vs the same AutoNormal loop",
    }
    if "graph/AutoDropout" in res["W1"]["ratios"]:
        labels["graph"] = "fit's step with cuda_graph=True, {g} + LRT"
        labels["graph-vs-plain-graph"] = "the same against the plain step as one CUDA graph, {g}"
    for kind, text in labels.items():
        if f"{kind}/AutoDropout" not in res["W1"]["ratios"]:
            continue  # (a report from before the row existed)
        for g in GUIDES:
            row = [text.format(g=g)]
            for w in ("W1", "W2"):
                row.append(_cell(res[w]["ratios"][f"{kind}/{g}"], target(kind, g, w)))
            lines.append("| " + " | ".join(row) + " |")
    if "plain-graph" in res["W1"]["ratios"]:
        row = ["plain step as one CUDA graph vs plain step"]
        row += [_cell(res[w]["ratios"]["plain-graph"], None) for w in ("W1", "W2")]
        lines.append("| " + " | ".join(row) + " |")
    for key, text in (("predict", "predict, T=100, weight draws (default)"),
                      ("predict" + PER_EXAMPLE_SUFFIX, "predict, T=100, per-example pre-activations")):  # fmt: skip
        kind = "predict" if key == "predict" else None  # the target is the default's
        row = [text] + [_cell(res[w]["ratios"][key], target(kind, None, w)) for w in ("W1", "W2")]
        lines.append("| " + " | ".join(row) + " |")
    if all("profile" in res[w] for w in res):
        lines += ["", f"Step profiles (ms per phase; matmul peak {report['matmul_peak_gflops']:.1f} "
                  "GFLOP/s in this process):", ""]  # fmt: skip
        lines += [
            "| workload | step | phases (ms) | step (ms) | MFLOP | × plain FLOPs | GFLOP/s | % of peak |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for w in ("W1", "W2"):
            for label, p in res[w]["profile"].items():
                phases = ", ".join(f"{k} {v:.3f}" for k, v in p["phases"].items() if k != "step")
                ratio = p.get("flops_vs_plain")
                lines.append(
                    f"| {w} | {label} | {phases or '–'} | {p['phases']['step']:.3f} | "
                    f"{p['flops'] / 1e6:.2f} | {'–' if ratio is None else f'{ratio:.2f}'} | "
                    f"{p['gflops_per_s']:.2f} | {p['percent_of_peak']:.1f} |"
                )
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
    parser.add_argument("--no-profile", action="store_true", help="skip the step profiles")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--json", type=Path, default=Path("speed.json"))
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(
        quick=args.quick, rounds=args.rounds, profile=not args.no_profile, device=args.device
    )
    table = markdown(report)
    print(table)
    args.json.write_text(json.dumps(report, indent=2, default=str))
    if args.markdown is not None:
        args.markdown.write_text(table + "\n")
    return report


if __name__ == "__main__":
    main()
