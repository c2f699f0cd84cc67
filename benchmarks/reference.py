"""Which guide is closest to the posterior? Every guide against a NUTS reference, per problem.

    python -m benchmarks.reference [--quick] [--problems gap1d,wine-quality-red,iris]
        [--data-dir ../shared/data/uci] [--json PATH] [--markdown PATH] [--page PATH]
        [--report-only]
        [--num-chains C] [--num-warmup W] [--num-samples S] [--max-tree-depth D] [--steps N]

Three small problems, each one Bayesian MLP (one hidden layer, tanh) with its own priors:

* ``gap1d``: 1-D regression ``y = sin(2x) + noise`` (40 points) with no training inputs in
  (-0.5, 0.5) ("in-between" uncertainty; Foong et al. 2019), test inputs on a grid over
  [-2.5, 2.5];
* a UCI regression set from ``shared/data/uci`` (:data:`UCI_PROBLEM`; split 0 of the published
  splits, standardised, a subsample of the training and test rows), latent noise scale; any
  other of the nine sets runs by name with ``--problems`` (yacht's four chains settled in
  different modes, function-space R-hat 1.63, within this budget);
* ``iris``: scikit-learn's ``load_iris`` (3 classes), standardised, a fixed train/test split.

On each: the NUTS reference (:func:`~pyro_dropout.diagnostics.reference_posterior`, several
chains, function-space R-hat recorded), this library's guides (``AutoDropout``,
``AutoMeanField``, ``AutoVariationalDropout``, ``AutoConcreteDropout``, fitted with local
reparameterisation), Pyro's
``AutoNormal``, ``AutoLowRankMultivariateNormal``, ``AutoDelta`` (MAP),
``AutoLaplaceApproximation`` and a deep ensemble of MAP fits, all in one
:func:`~pyro_dropout.diagnostics.compare` table with the fidelity scores of
:mod:`~pyro_dropout.diagnostics.fidelity` and the wall time of each fit. ``--quick`` is a
seconds-long smoke run (tiny networks, a handful of steps and draws; its numbers mean
nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyro
import torch
from pyro.infer.autoguide import (
    AutoDelta,
    AutoLaplaceApproximation,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
)
from pyro_dropout.datasets import UCI_DATASETS
from pyro_dropout.diagnostics import (
    ReferenceConvergenceWarning,
    compare,
    ensemble_inference_data,
    reference_posterior,
    to_inference_data,
)
from pyro_dropout.diagnostics import _reader as rd

from ._provenance import git_state, versions

#: The UCI regression set of the default run (see ``_uci``).
UCI_PROBLEM = "wine-quality-red"
PROBLEMS = ("gap1d", UCI_PROBLEM, "iris")
#: Every name ``--problems`` takes: the default three and any other UCI set of the shared data
#: (same protocol as ``UCI_PROBLEM``; yacht's chains did not converge within the budget).
ALL_PROBLEMS = (*PROBLEMS, *(d for d in UCI_DATASETS if d != UCI_PROBLEM))
REFERENCE = "NUTS (reference)"
#: Predictive quantiles recorded per fit on 1-D problems (a 90 % and a 50 % band, the median).
BAND_QUANTILES = [0.05, 0.25, 0.5, 0.75, 0.95]
#: Settings per mode: network width, training rows, SVI steps, draws per fit, NUTS run.
SETTINGS = {
    "full": {
        "hidden": 10,
        "gap_n": 40,
        "max_train": 200,
        "max_test": 100,
        "steps": 3000,
        "lr": 1e-2,
        "draws": 1000,
        "members": 5,
        "init_from": "AutoMeanField",
        # Budget: ~30 min of one core per problem. The trees saturate (every iteration at the
        # depth cap), and a gradient costs ~2.5 ms on a loaded 2-core box: 4 chains x 1,000
        # iterations at depth <= 8 (255 gradients) took over 10 CPU minutes per chain on gap1d,
        # ~50 per problem; 600 iterations at depth <= 7 (127 gradients) took 12 (gap1d).
        # 300 draws per chain left the largest function-space R-hat at 1.063 on gap1d.
        "nuts": {"num_chains": 4, "num_warmup": 300, "num_samples": 500, "max_tree_depth": 7},
    },
    "quick": {
        "hidden": 2,
        "gap_n": 16,
        "max_train": 20,
        "max_test": 8,
        "steps": 10,
        "lr": 1e-2,
        "draws": 30,
        "members": 2,
        "init_from": "AutoMeanField",
        "nuts": {
            "num_chains": 2,
            "num_warmup": 5,
            "num_samples": 15,
            "max_tree_depth": 2,
            "jit_compile": False,
            "processes": 1,  # spawning workers costs seconds
        },
    },
}


def _renamed(cls, k):
    """``cls`` under its own name: Pyro's autoguides name their parameters after the class,
    so ensemble members need distinct classes (see ensemble_inference_data)."""
    return type(f"{cls.__name__}{k}", (cls,), {})


def _hidden_only(model, rate):
    """Drop rate ``rate`` on the hidden layers' inputs, none on the network input (as the
    demo): on a 1-D input a fraction ``rate`` of the passes would see no input at all and
    predict a constant (measured on gap1d: W1 to the reference 0.34 against 0.03-0.06 for
    every other fit)."""
    n = len(model.net.layers)
    return {f"net.layers.{i}.weight": (rate if i else 0.0) for i in range(n)}


def guides():
    """``{name: (factory, fit with local reparameterisation)}``."""
    return {
        "AutoDropout": (lambda m: AutoDropout(m, dropout_rate=_hidden_only(m, 0.1)), True),
        "AutoMeanField": (lambda m: AutoMeanField(m), True),
        "AutoVariationalDropout": (lambda m: AutoVariationalDropout(m), True),
        "AutoConcreteDropout": (lambda m: AutoConcreteDropout(m), True),
        "AutoNormal": (lambda m: AutoNormal(m, init_scale=0.05), False),
        "AutoLowRankMVN": (lambda m: AutoLowRankMultivariateNormal(m, rank=2), False),
        "AutoDelta (MAP)": (lambda m: AutoDelta(m), False),
        "AutoLaplace": (lambda m: AutoLaplaceApproximation(m), False),
    }


def _gap1d(cfg, rng):
    n = cfg["gap_n"]
    x = np.concatenate([rng.uniform(-2, -0.5, n // 2), rng.uniform(0.5, 2, n - n // 2)])
    y = np.sin(2 * x) + 0.1 * rng.normal(size=n)
    xt = np.linspace(-2.5, 2.5, cfg["max_test"])
    yt = np.sin(2 * xt) + 0.1 * rng.normal(size=xt.size)
    model = BayesianMLP(1, 1, hidden=(cfg["hidden"],), activation="tanh", tau=100.0)
    return model, x[:, None], y, xt[:, None], yt


def _uci(name, cfg, rng, data_dir):
    from pyro_dropout.datasets import load_uci

    split = load_uci(name, data_dir).split_arrays(0)
    tr = rng.permutation(split.n_train)[: cfg["max_train"]]
    te = rng.permutation(split.n_test)[: cfg["max_test"]]
    x, y = split.x_train[tr].numpy(), split.y_train[tr].numpy()
    xt, yt = split.x_test[te].numpy(), split.y_test[te].numpy()
    model = BayesianMLP(x.shape[1], 1, hidden=(cfg["hidden"],), activation="tanh", tau=None)
    return model, x, y, xt, yt


def _iris(cfg, rng):
    from sklearn.datasets import load_iris

    data = load_iris()
    idx = rng.permutation(len(data.target))
    n_test = min(cfg["max_test"], 50)
    te, tr = idx[:n_test], idx[n_test:][: cfg["max_train"]]
    mean, sd = data.data[tr].mean(0), data.data[tr].std(0)
    x, xt = (data.data[tr] - mean) / sd, (data.data[te] - mean) / sd
    model = BayesianMLP(
        4, 3, hidden=(cfg["hidden"],), activation="tanh", likelihood="classification"
    )
    return model, x, data.target[tr], xt, data.target[te]


def load_problem(name, cfg, seed, data_dir):
    rng = np.random.default_rng(seed)
    if name == "gap1d":
        model, x, y, xt, yt = _gap1d(cfg, rng)
    elif name in UCI_DATASETS:
        model, x, y, xt, yt = _uci(name, cfg, rng, data_dir)
    elif name == "iris":
        model, x, y, xt, yt = _iris(cfg, rng)
    else:
        raise ValueError(f"unknown problem {name!r}; valid names are: {', '.join(ALL_PROBLEMS)}")
    as_x = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    as_y = as_x if name != "iris" else (lambda a: torch.as_tensor(a, dtype=torch.long))
    return model, as_x(x), as_y(y), as_x(xt), as_y(yt)


def run_problem(name, cfg, seed=0, data_dir=None):
    """One problem: NUTS reference, every guide, the compare table (rows as dicts)."""
    model, x, y, xt, yt = load_problem(name, cfg, seed, data_dir)
    pyro.clear_param_store()
    fits, wall, fitted = {}, {}, {}
    failed = {}
    for gname, (make, lrt) in guides().items():
        start = time.perf_counter()
        guide = make(model)
        fit(model, guide, x, y, num_steps=cfg["steps"], lr=cfg["lr"], progress=False,
            seed=seed, local_reparameterization=lrt)  # fmt: skip
        fitted[gname] = guide
        try:
            fits[gname] = to_inference_data(model, guide, x, y, cfg["draws"], xt, yt, seed=seed)
        except ValueError as e:  # e.g. a Laplace approximation without a positive Hessian
            failed[gname] = str(e)
            continue
        wall[gname] = time.perf_counter() - start

    # NUTS after the guides: with ``init_from`` each chain starts from its own draw of that
    # fitted guide (random initialisation left yacht at R-hat 1.66 after 800 iterations)
    init = fitted[cfg["init_from"]] if cfg.get("init_from") else None
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ReferenceConvergenceWarning)
        ref = reference_posterior(model, x, y, xt, yt, **cfg["nuts"], seed=seed, init_from=init)
    wall[REFERENCE] = time.perf_counter() - start
    fits = {REFERENCE: ref, **fits}
    ref_warnings = [str(w.message) for w in caught]

    start = time.perf_counter()
    members = []
    for k in range(cfg["members"]):
        guide = _renamed(AutoDelta, k)(model)
        fit(model, guide, x, y, num_steps=cfg["steps"], lr=cfg["lr"], progress=False,
            seed=seed + 1 + k, local_reparameterization=False)  # fmt: skip
        members.append((model, guide))
    ens = f"Deep ensemble ({cfg['members']} MAP)"
    fits[ens] = ensemble_inference_data(members, x, y, cfg["draws"], xt, yt, seed=seed)
    wall[ens] = time.perf_counter() - start

    table = compare(fits, reference=ref)
    table["wall_s"] = [wall[n] for n in table.index]
    attrs = rd.attrs(ref)
    keys = ("fn_rhat_max", "fn_ess_bulk_min", "fn_ess_tail_min", "num_divergent", "wall_s")
    reference = {k: attrs[k] for k in keys}
    reference["init_from"] = type(init).__name__ if init is not None else None
    reference["warnings"] = ref_warnings
    rows = []
    for fname, row in table.iterrows():
        rows.append({"fit": fname, **{k: _plain(v) for k, v in row.items()}})
    bands = None
    if rd.task(ref) == "regression" and x.shape[1] == 1:  # 1-D inputs: bands to plot
        obs = rd.obs_name(ref)
        bands = {
            "x_train": x[:, 0].tolist(),
            "y_train": y.tolist(),
            "x_test": xt[:, 0].tolist(),
            "y_test": yt.tolist(),
            "quantiles": BAND_QUANTILES,
            "fits": {
                fname: np.quantile(
                    rd.draws(data, "predictions", obs).reshape(-1, xt.shape[0]),
                    BAND_QUANTILES,
                    axis=0,
                ).tolist()
                for fname, data in fits.items()
            },
        }
    return {
        "problem": name,
        "task": rd.task(ref),
        "n_train": int(x.shape[0]),
        "n_test": int(xt.shape[0]),
        "reference": reference,
        "rows": rows,
        "failed": failed,
        # predictive quantiles at the test inputs of each fit (1-D regression only; the
        # notebook "Which guide is closest to the posterior?" plots them)
        "bands": bands,
    }


def _plain(v):
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


def _fmt(v, digits=3):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{digits}g}"
    return str(v)


def markdown(results):
    out = []
    for res in results:
        ref = res["reference"]
        out.append(
            f"### {res['problem']} ({res['task']}, {res['n_train']} train / {res['n_test']} test)"
        )
        out.append("")
        out.append(
            f"NUTS: function-space R-hat max {_fmt(ref['fn_rhat_max'])}, bulk ESS min "
            f"{_fmt(ref['fn_ess_bulk_min'])}, {ref['num_divergent']} divergent transitions, "
            f"{ref['wall_s']:.1f} s (the whole problem, every fit included: "
            f"{res.get('wall_s', float('nan')):.0f} s)."
        )
        out.append("")
        if res["task"] == "classification":
            cols = ["test_lpd", "test_accuracy", "ref_agreement", "ref_tv"]
        else:
            cols = ["test_lpd", "test_rmse", "ref_w1", "ref_sd_ratio", "ref_cov50", "ref_cov90"]
        cols = ["elpd_loo", *cols, "vi_khat", "wall_s"]
        out.append("| fit | " + " | ".join(cols) + " |")
        out.append("| --- |" + " --- |" * len(cols))
        for row in res["rows"]:
            out.append(f"| {row['fit']} | " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
        out.append("")
        for fname, reason in res["failed"].items():
            out.append(f"- {fname}: not in the table: {reason}")
        for w in ref["warnings"]:
            out.append(f"- NUTS warning: {w}")
        if res["failed"] or ref["warnings"]:
            out.append("")
    return "\n".join(out)


#: Cheap diagnostics set against closeness to the reference: (column, +1 if higher is better).
CHEAP_DIAGNOSTICS = (("elpd_loo", 1), ("test_lpd", 1), ("vi_khat", -1))


def rank_agreement(results):
    """Per problem, Spearman's rank correlation between the approximate fits' closeness to the
    reference (``-ref_w1`` for regression, ``-ref_tv`` for classification) and each cheap
    diagnostic of :data:`CHEAP_DIAGNOSTICS` (oriented so that higher is better): 1 = the
    diagnostic orders the fits as the reference does, 0 = unrelated, -1 = reversed. Fits
    with a NaN in either are left out (an infinite k̂ ranks last); NaN with fewer than three.
    """
    from scipy.stats import spearmanr

    out = []
    for res in results:
        fits = [r for r in res["rows"] if r["fit"] != REFERENCE]
        fidelity = "ref_tv" if res["task"] == "classification" else "ref_w1"
        close = -np.array([r.get(fidelity, np.nan) for r in fits], dtype=float)
        row = {
            "problem": res["problem"],
            "fits": len(fits),
            "closest": fits[int(np.nanargmax(close))]["fit"],
            "fidelity": fidelity,
        }
        for col, sign in CHEAP_DIAGNOSTICS:
            score = sign * np.array([r.get(col, np.nan) for r in fits], dtype=float)
            ok = ~np.isnan(score) & ~np.isnan(close)
            rho = spearmanr(score[ok], close[ok]).statistic if ok.sum() > 2 else np.nan
            row[col] = float(rho)
        out.append(row)
    return out


def page(saved):
    """The whole benchmark page (``docs/benchmarks/reference.md``) from the saved JSON."""
    meta, results = saved["meta"], saved["results"]
    code = meta.get("code") or {}
    commit = (code.get("commit") or "?")[:7] + (" +dirty" if code.get("dirty") else "")
    nuts = meta["settings"]["nuts"]
    lines = [
        "# Closest to the posterior: every guide against a NUTS reference",
        "",
        "Produced by",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"at commit `{commit}` (Python {meta['python']}, torch {meta['torch']}, pyro-ppl "
        f"{meta['pyro']}, {meta['machine']}), {meta['total_wall_s'] / 60:.0f} min in all. NUTS: "
        f"{nuts['num_chains']} chains x ({nuts['num_warmup']} warm-up + {nuts['num_samples']} "
        f"draws), tree depth <= {nuts['max_tree_depth']}, each chain started from its own "
        f"draw of the fitted {meta['settings'].get('init_from') or 'nothing (Pyro default)'}; "
        f"every SVI fit "
        f"{meta['settings']['steps']} steps; {meta['settings']['draws']} draws per fit. Raw "
        "numbers: `reference.json` beside this page. Columns: `docs/reference-posterior.md`.",
        "",
        "| problem | wall time (min, all fits) | NUTS (min) | function-space R-hat max |",
        "| --- | --- | --- | --- |",
    ]
    for res in results:
        ref = res["reference"]
        lines.append(
            f"| {res['problem']} | {res.get('wall_s', float('nan')) / 60:.1f} | "
            f"{ref['wall_s'] / 60:.1f} | {_fmt(ref['fn_rhat_max'])} |"
        )
    lines += ["", "## Tables", "", markdown(results), ""]
    lines += [
        "## Do the cheap diagnostics rank the fits like the reference?",
        "",
        "Spearman's rank correlation, over the approximate fits of each problem, between "
        "closeness to the reference (lower `ref_w1` / `ref_tv`) and each diagnostic (higher "
        "`elpd_loo` and `test_lpd`, lower `vi_khat`); 1 = the same order.",
        "",
        "| problem | fits | closest to the reference | "
        + " | ".join(f"rho({c})" for c, _ in CHEAP_DIAGNOSTICS)
        + " |",
        "| --- | --- | --- |" + " --- |" * len(CHEAP_DIAGNOSTICS),
    ]
    for row in rank_agreement(results):
        lines.append(
            f"| {row['problem']} | {row['fits']} | {row['closest']} ({row['fidelity']}) | "
            + " | ".join(_fmt(row[c], 2) for c, _ in CHEAP_DIAGNOSTICS)
            + " |"
        )
    return "\n".join(lines) + "\n"


def run(problems=PROBLEMS, quick=False, seed=0, data_dir=None):
    cfg = SETTINGS["quick" if quick else "full"]
    return [run_problem(p, cfg, seed=seed, data_dir=data_dir) for p in problems]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run for smoke tests")
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/uci"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-chains", type=int, help="NUTS chains (override the mode's)")
    parser.add_argument("--num-warmup", type=int, help="NUTS warm-up steps per chain")
    parser.add_argument("--num-samples", type=int, help="NUTS draws kept per chain")
    parser.add_argument("--max-tree-depth", type=int, help="NUTS maximum tree depth")
    parser.add_argument("--steps", type=int, help="SVI steps per guide")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument(
        "--page",
        type=Path,
        help="write the whole benchmark page (docs/benchmarks/reference.md) to this path",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: read --json and write --markdown / --page from it",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        if args.json is None or not args.json.is_file():
            parser.error("--report-only needs --json pointing at a finished run's JSON")
        saved = json.loads(args.json.read_text())
        if args.markdown:
            args.markdown.write_text(markdown(saved["results"]) + "\n")
        if args.page:
            args.page.write_text(page(saved))
        return saved["results"]
    problems = [p for p in args.problems.split(",") if p]
    unknown = [p for p in problems if p not in ALL_PROBLEMS]
    if unknown:
        parser.error(f"unknown problem {unknown[0]!r}; valid names are: {', '.join(ALL_PROBLEMS)}")
    cfg = json.loads(json.dumps(SETTINGS["quick" if args.quick else "full"]))  # a copy
    for key in ("num_chains", "num_warmup", "num_samples", "max_tree_depth"):
        if getattr(args, key) is not None:
            cfg["nuts"][key] = getattr(args, key)
    if args.steps is not None:
        cfg["steps"] = args.steps
    start = time.perf_counter()
    results = []
    for p in problems:  # the JSON is rewritten after each problem: nothing lost to a late one
        t0 = time.perf_counter()
        results.append(run_problem(p, cfg, seed=args.seed, data_dir=args.data_dir))
        results[-1]["wall_s"] = time.perf_counter() - t0
        _write(args, results, cfg, start, argv)
    table = markdown(results)
    print(table)
    _write(args, results, cfg, start, argv)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.page:
        args.page.write_text(page(_saved(args, results, cfg, start, argv)))
    return results


def _write(args, results, cfg, start, argv):
    if args.json:
        args.json.write_text(json.dumps(_saved(args, results, cfg, start, argv), indent=1))


#: Options naming where the results go: they do not change a number, and the page shows
#: their file names only (an absolute path would name one machine's folders).
_OUTPUT_OPTIONS = ("--json", "--markdown", "--page")


def _command(argv):
    """The invocation as recorded on the page, output paths reduced to their file names."""
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in _OUTPUT_OPTIONS:
            argv[i + 1] = Path(argv[i + 1]).name
    return " ".join(["python -m benchmarks.reference", *argv])


def _saved(args, results, cfg, start, argv):
    meta = {
        "command": _command(sys.argv[1:] if argv is None else argv),
        **versions(),
        "quick": args.quick,
        "settings": cfg,
        "total_wall_s": time.perf_counter() - start,
        "code": git_state(),
    }
    return {"meta": meta, "results": results}


if __name__ == "__main__":
    main()
