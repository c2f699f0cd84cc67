"""How much of a UCI row's test log-likelihood rests on an integer-valued target.

    PYTHONPATH=<checkout of the units' commit> python tools/uci_integer_targets.py \
        --data-dir ../shared/data/uci --units results/uci-2layer/units \
        --dataset wine-quality-red --guide dropout-hetero --splits 0 1 2 3 4 5 6 7 8 9

The protocol scores every dataset with a density, log p(y) of the predictive mixture
(1/T) Σ_t N(y; μ_t, σ_t). On a target that takes integer values only (wine-quality-red's
quality score, 3–8), a density can gain log-likelihood by concentrating on the integers, a
gain no continuous target would allow. The score of the same predictive as a distribution on
the integers is the probability of the unit bin around ``y``,

    log P(y) = log (1/T) Σ_t [Φ((y + ½ − μ_t) / σ_t) − Φ((y − ½ − μ_t) / σ_t)],

which is at most 0 and cannot be raised by spikes. Compared across rows (homoscedastic σ_t =
τ^{-1/2} against heteroscedastic σ_t(x)), the difference between the two scores says how
much of a row's lead is the density's and how much is the predictive's.

Run it from a checkout of the commit the units record (as ``tools/uci_hetero_diagnosis.py``):
it re-runs the units' final fits (their seed, settings and batch, one CPU thread, so the
density LL it prints repeats the units'), records every Monte-Carlo pass of the evaluation
and prints, per split, the density LL (the units' number), the discretised LL and, for the
heteroscedastic network, the predicted noise SD (median over rows and passes, original scale).
A measurement for the UCI page, not a test.
"""

import argparse
import importlib
import json
import math
import tempfile
import time
from pathlib import Path

import torch


def _modules():
    run = importlib.import_module("benchmarks.uci.run")
    protocol = importlib.import_module("benchmarks.uci.protocol")
    evaluation = importlib.import_module("benchmarks.uci_model.evaluation")
    fused = importlib.import_module("benchmarks.uci_fused")
    return run, protocol, evaluation, fused


def integer_scores(outs, y, y_mean, y_std, tau, hetero):
    """``(density LL, discretised LL, median noise SD)`` per member, each ``(M,)``, from the
    passes ``outs`` (``(T, M, N[, 2])``, standardised network outputs, as ``evaluate`` draws
    them) and ``y`` ``(M, N)`` on the original scale."""
    outs = outs.double()
    mu, sd = y_mean.double().reshape(-1, 1), y_std.double().reshape(-1, 1)
    if hetero:
        f, s = outs[..., 0] * sd + mu, outs[..., 1] * sd
    else:
        f = outs * sd + mu
        # a real tensor, not expand_as's stride-0 view: median over a stride-0 dimension
        # returned garbage (torch 2.13, measured)
        s = (1.0 / tau.double().sqrt()).reshape(-1, 1) * torch.ones_like(f)
    y = y.double()
    log_t = math.log(outs.shape[0])
    normal = torch.distributions.Normal(f, s)
    density = (torch.logsumexp(normal.log_prob(y), 0) - log_t).mean(-1)
    # the bin's mass, from the upper tail where y sits above the mean (no cancellation)
    lo, hi = (y - 0.5 - f) / s, (y + 0.5 - f) / s
    flip = lo > 0
    lo, hi = torch.where(flip, -hi, lo), torch.where(flip, -lo, hi)
    std = torch.distributions.Normal(torch.zeros((), dtype=f.dtype), 1.0)
    mass = (std.cdf(hi) - std.cdf(lo)).clamp_min(1e-300)
    discrete = (torch.logsumexp(mass.log(), 0) - log_t).mean(-1)
    return density, discrete, s.movedim(1, 0).flatten(1).median(-1).values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--units", type=Path, required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--guide", required=True)
    parser.add_argument("--splits", type=int, nargs="+", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run, protocol, evaluation, fused = _modules()
    from pyro_dropout.datasets.uci import load_uci

    ds = load_uci(args.dataset, args.data_dir)
    unit_dir = args.units / args.dataset / args.guide
    units = [json.loads((unit_dir / f"split_{k}.json").read_text()) for k in args.splits]
    batch = units[0]["final_fit"]["splits_in_batch"]
    if sorted(args.splits) != sorted(batch):  # another batch draws another random stream
        print(f"note: the units trained splits {batch} as one batch; these fits will differ")
    seed = protocol._seed(ds.name, args.guide, "final", *args.splits)
    print(f"seed {seed} (units: {units[0]['final_fit']['seed']})", flush=True)

    # the passes of either draw (the traced one, the fused kernel's), recorded as drawn
    evaluate, draws = evaluation.evaluate, (evaluation._Draw, fused.FusedDraw)
    calls = [cls.__call__ for cls in draws]
    passes = []

    def recorder(call):
        def recorded_call(self, *a, **k):
            out = call(self, *a, **k)
            passes.append(out.detach().cpu())
            return out

        return recorded_call

    def scored(model, guide, x, y, per_split, y_mean, y_std, tau, *a, **k):
        passes.clear()
        ev = evaluate(model, guide, x, y, per_split, y_mean, y_std, tau, *a, **k)
        if not passes:
            raise SystemExit("the evaluation drew no pass through a known draw: cannot score")
        ym = evaluation._expand_members(y.double(), per_split)
        hetero = getattr(model, "heteroscedastic", False)
        density, discrete, noise = integer_scores(
            torch.cat(passes, 0), ym, y_mean, y_std, tau, hetero
        )
        for i, (k_, unit) in enumerate(zip(args.splits, units, strict=True)):
            print(
                f"split {k_}: density LL {density[i]:.4f} (evaluate {ev.ll[i]:.4f}, unit "
                f"{unit['test']['ll']:.4f}); discretised LL {discrete[i]:.4f}; predicted "
                f"noise SD, median {noise[i]:.3f}",
                flush=True,
            )
        print(
            f"mean over {len(units)} splits: density {density.mean():.4f}, discretised "
            f"{discrete.mean():.4f}, difference {(density - discrete).mean():.4f}",
            flush=True,
        )
        return ev

    chosen = [u["chosen"] for u in units]
    t0 = time.perf_counter()
    for cls, call in zip(draws, calls, strict=True):
        cls.__call__ = recorder(call)
    run.um.evaluate = scored
    # (restored after: a caller in the same process keeps the originals; a checkpoint the
    # driver writes goes to a scratch folder)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            options = argparse.Namespace(out=Path(scratch), resume=False, quiet=True)
            settings = units[0]["settings"]
            run._fit_and_evaluate(
                ds, args.guide, args.splits, chosen, settings, False, seed, options
            )
    finally:
        for cls, call in zip(draws, calls, strict=True):
            cls.__call__ = call
        run.um.evaluate = evaluate
    print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
