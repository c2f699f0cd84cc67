"""Per-example estimators against weight sampling: gradient variance and cost, in one process.

    python -m benchmarks.estimators [--quick] [--json PATH] [--markdown PATH]

For each guide family (MC dropout, mean-field Gaussian, variational dropout) and two networks
(an 8-50-1 regression MLP, batch 64; a small Bayesian LeNet on 16x16 inputs, batch 32) it
measures, for every estimator of :func:`~pyro_dropout.local_reparameterization` and for weight
sampling (``weight_draws()``):

* the total variance (summed over elements) of the gradient of the ELBO loss
  (``MeanFieldELBO``) with respect to the first layer's posterior means, over repeated draws
  at fixed guide parameters (after a short fit; 300 draws), reported as the ratio weight sampling /
  estimator (above 1: less noisy than weight sampling);
* the median time of one eager training step (SVI with ``fused_adam``), as the ratio to weight
  sampling measured in the same rounds.

``"lrt"`` on a convolution is not exact for q jointly over positions (see
``docs/local-reparameterization.md``); it is measured for reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianConvNet,
    BayesianMLP,
    local_reparameterization,
    weight_draws,
)
from pyro_dropout.infer import MeanFieldELBO, fused_adam

from ._provenance import git_state, versions

GUIDES = {
    "AutoDropout": lambda m: AutoDropout(m, dropout_rate=0.2, input_dropout_rate=0.2, scale=0.01),
    "AutoMeanField": lambda m: AutoMeanField(m, init_scale=0.05),
    "AutoVariationalDropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-3.0),
}
ESTIMATORS = ("weights", "lrt", "flipout", "per_example", "auto")
# Flipout needs sign-symmetric weight noise around a mean; MC dropout's mask noise is not, so the
# handler has no Flipout rule for it (it would fall back to per_example, with a warning).
NOT_APPLICABLE = {("AutoDropout", "flipout")}


def applies(guide_name, estimator):
    return (guide_name, estimator) not in NOT_APPLICABLE


def _mlp(n=512, batch=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = torch.tanh(x[:, 0] - x[:, 1]) + 0.1 * torch.randn(n, generator=g)
    return BayesianMLP(8, 1, hidden=(50,), tau=100.0), x, y, batch, "net.layers.0.weight"


def _cnn(n=256, batch=32):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (n,), generator=g)
    x = 0.5 * torch.randn(n, 1, 16, 16, generator=g)
    x[torch.arange(n), 0, y, :] += 2.0  # class k: a bright row k
    model = BayesianConvNet(1, 10, image_size=16, channels=(8, 16), hidden=64, kernel_size=3)
    return model, x, y, batch, "net.conv1.weight"


WORKLOADS = {"MLP 8-50-1": _mlp, "LeNet 16x16": _cnn}


def _handler(estimator):
    if estimator == "weights":
        return weight_draws()
    return local_reparameterization(estimator=estimator)


def _loc_param(guide, site):
    for name, p in guide.named_parameters():
        if name.startswith("locs.") and name[len("locs.") :].startswith(site):
            return p
    raise KeyError(site)


def _grad_variance(model, guide, x, y, n, site, estimator, repeats):
    elbo = MeanFieldELBO(max_plate_nesting=1)
    loc = _loc_param(guide, site)
    grads = []
    with _handler(estimator):
        for _ in range(repeats):
            loss = elbo.differentiable_loss(model, guide, x, y, num_data=n)
            (g,) = torch.autograd.grad(loss, [loc])
            grads.append(g.detach().double().flatten())
    g = torch.stack(grads)
    return float(((g - g.mean(0)) ** 2).sum(1).mean() * repeats / (repeats - 1))


def run(quick=False, rounds=5):
    torch.set_num_threads(1)
    pyro.enable_validation(False)
    repeats = 8 if quick else 300
    steps = 3 if quick else 20
    results = []
    for wname, make in WORKLOADS.items():
        for gname, make_guide in GUIDES.items():
            pyro.clear_param_store()
            pyro.set_rng_seed(0)
            model, x, y, batch, site = make()
            if quick:
                x, y = x[: 2 * batch], y[: 2 * batch]
            n = x.shape[0]
            guide = make_guide(model)
            svi = SVI(model, guide, fused_adam({"lr": 1e-2}), MeanFieldELBO(max_plate_nesting=1))
            with local_reparameterization():  # a short fit: parameters away from their init
                for _ in range(10 if quick else 100):
                    idx = torch.randint(0, n, (batch,))
                    svi.step(x[idx], y[idx], num_data=n)
            xb, yb = x[:batch], y[:batch]
            row = {"workload": wname, "guide": gname, "variance": {}, "step_ms": {}}
            used = [est for est in ESTIMATORS if applies(gname, est)]
            for est in used:
                row["variance"][est] = _grad_variance(model, guide, xb, yb, n, site, est, repeats)
            times = {est: [] for est in used}
            for _ in range(1 if quick else rounds):  # interleaved rounds: noise cancels
                for est in used:
                    with _handler(est):
                        svi.step(xb, yb, num_data=n)  # warm
                        t = time.perf_counter()
                        for _ in range(steps):
                            svi.step(xb, yb, num_data=n)
                        times[est].append((time.perf_counter() - t) / steps * 1e3)
            row["step_ms"] = {est: statistics.median(v) for est, v in times.items()}
            results.append(row)
            print(_row_text(row), flush=True)
    return results


def _row_text(row):
    var, ms = row["variance"], row["step_ms"]
    parts = [
        f"{e}: var x{var['weights'] / var[e]:.1f}, time x{ms[e] / ms['weights']:.2f}"
        for e in ESTIMATORS[1:]
        if e in var
    ]
    return f"{row['workload']} / {row['guide']}: " + "; ".join(parts)


def markdown(results):
    lines = [
        "| workload | guide | estimator | gradient variance: weights / estimator | step time / "
        "weights | step (ms) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in results:
        var, ms = row["variance"], row["step_ms"]
        for est in ESTIMATORS:
            if est not in var:
                lines.append(
                    f"| {row['workload']} | {row['guide']} | {est} | n/a (no rule for this "
                    "family) | | |"
                )
                continue
            lines.append(
                f"| {row['workload']} | {row['guide']} | {est} | "
                f"{var['weights'] / var[est]:.1f}x | {ms[est] / ms['weights']:.2f}x | "
                f"{ms[est]:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    results = run(quick=args.quick, rounds=args.rounds)
    table = markdown(results)
    print(table)
    meta = {
        **versions(),
        "quick": args.quick,
        "code": git_state(),
    }
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
