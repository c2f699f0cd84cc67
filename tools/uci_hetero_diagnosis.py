"""Why a heteroscedastic UCI row failed: re-run its final fits exactly and look inside.

    PYTHONPATH=<checkout of the units' commit> python tools/uci_hetero_diagnosis.py \
        --data-dir ../shared/data/uci --units results/uci-hetero/units \
        --dataset protein-tertiary-structure --guide vd-hetero --splits 0 1 2 3 4

Run it from a checkout of the commit the units record (their ``code.commit``; one CPU thread,
as the driver ran): with the units' seed and settings, and ``--splits`` the batch the units
record (``final_fit.splits_in_batch``), the final fits repeat the recorded run (the same
engine and random stream), so the test RMSE it prints can be checked against the units'. It
prints what the units do not keep: the training loss (the sum over the batch's members)
every 50 epochs where the driver trains through ``CompiledSVI`` (the ``traced`` engine, not
the fused kernels), and for each member, from the network with the posterior-mean weights
(``guide.median()``, as the units' ``rmse_mean_weights``; for MC dropout the
weight-averaging net), the training-set errors (median, 90 %, 99 %, RMSE; standardised
targets), the share of training rows more than 5 target SDs off, the predicted noise SD on
those rows and elsewhere, and the correlation of the log error with the log predicted SD.
The parameters are saved to ``--save``. A diagnosis aid for the UCI page, not a test. Works
with the heteroscedastic networks of ``b220d6f``'s layout (``pyro_dropout.benchmarks``,
where the failed rows ran) and of later commits (``benchmarks``).
"""

import argparse
import importlib
import json
import math
import time
from pathlib import Path

import pyro
import pyro.poutine as poutine
import torch


def _modules():
    for prefix in ("benchmarks", "pyro_dropout.benchmarks"):  # the layout after / at b220d6f
        try:
            run = importlib.import_module(f"{prefix}.uci.run")
            protocol = importlib.import_module(f"{prefix}.uci.protocol")
            um = importlib.import_module(f"{prefix}.uci_model")
            return run, protocol, um
        except ModuleNotFoundError as err:  # only this layout's own modules may be missing
            if err.name != prefix and not (err.name or "").startswith(prefix + "."):
                raise
            continue
    raise SystemExit("run from a checkout of the repository (PYTHONPATH=<checkout>)")


def _member_report(mean, sd, y, splits):
    """Each member's errors on its training rows: ``mean``, ``sd`` and ``y`` are ``(M, N)``
    (standardised targets; the network's mean and predicted noise SD per row)."""
    for m, k in enumerate(splits):
        err = (mean[m].double() - y[m].double()).abs()
        q = torch.quantile(err, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
        far = err > 5
        logs = torch.corrcoef(torch.stack([err.clamp_min(1e-12).log(), sd[m].double().log()]))
        there = sd[m][far].median() if far.any() else math.nan
        print(
            f"split {k}: |error| median {q[0]:.2f}, 90% {q[1]:.2f}, 99% {q[2]:.2f}, RMSE "
            f"{err.pow(2).mean().sqrt():.2f}; rows > 5 SD off {far.float().mean():.3f} (predicted "
            f"noise SD there, median {there:.2f}; elsewhere {sd[m][~far].median():.2f}); "
            f"corr(log error, log SD) {logs[0, 1]:.2f}",
            flush=True,
        )


def _mean_weight_outputs(model, guide, x):
    """The network with the guide's posterior-mean weights (``guide.median()``; for dropout
    the weight-averaging net), as the driver's ``rmse_mean_weights``: ``(mean, sd)``."""
    with torch.no_grad(), pyro.validation_enabled(False):
        f = poutine.condition(model, data=guide.median())(x)
    return f[..., 0], f[..., 1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--units", type=Path, required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--guide", required=True)
    parser.add_argument("--splits", type=int, nargs="+", required=True)
    parser.add_argument("--save", type=Path, default=Path("hetero_diagnosis.pt"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run, protocol, um = _modules()
    from pyro_dropout.datasets.uci import load_uci
    from pyro_dropout.infer import CompiledSVI

    ds = load_uci(args.dataset, args.data_dir)
    unit_dir = args.units / args.dataset / args.guide
    units = [json.loads((unit_dir / f"split_{k}.json").read_text()) for k in args.splits]
    settings = units[0]["settings"]
    batch = units[0]["final_fit"]["splits_in_batch"]
    if sorted(args.splits) != sorted(batch):  # another batch draws another random stream
        print(f"note: the units trained splits {batch} as one batch; these fits will differ")
    seed = protocol._seed(ds.name, args.guide, "final", *args.splits)
    print(f"seed {seed} (units: {units[0]['final_fit']['seed']})", flush=True)
    steps_per_epoch = math.ceil(units[0]["n_train"] / settings["batch_size"])
    step, total = CompiledSVI.step, [0, 0.0]

    def logged_step(self, *a, **k):  # the loss per epoch, every 50 epochs
        loss = step(self, *a, **k)
        total[0] += 1
        total[1] += loss
        if total[0] % (50 * steps_per_epoch) == 0:
            epoch = total[0] // steps_per_epoch
            print(f"epoch {epoch}: mean loss {total[1] / (50 * steps_per_epoch):.6g}", flush=True)
            total[1] = 0.0
        return loss

    evaluate = um.evaluate

    def inspected(model, guide, *a, **k):
        pyro.get_param_store().save(args.save)
        x, y = run._stack_split_arrays(ds, args.splits, False)[:2]
        _member_report(*_mean_weight_outputs(model, guide, x), y, args.splits)
        ev = evaluate(model, guide, *a, **k)
        print(f"test RMSE {ev.rmse.tolist()} (units: {[u['test']['rmse'] for u in units]})")
        return ev

    chosen = [u["chosen"] for u in units]
    # the driver's options that _fit_and_evaluate reads (later layouts: a checkpoint, not kept)
    options = argparse.Namespace(
        out=args.save.parent / "hetero_diagnosis", resume=False, quiet=False
    )
    t0 = time.perf_counter()
    CompiledSVI.step, um.evaluate = logged_step, inspected
    try:  # (restored after: a caller in the same process, e.g. a test run, keeps the originals)
        run._fit_and_evaluate(ds, args.guide, args.splits, chosen, settings, False, seed, options)
    finally:
        CompiledSVI.step, um.evaluate = step, evaluate
    print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
