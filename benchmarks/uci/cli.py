"""The command line of ``python -m benchmarks.uci``: options, their checks,
and the run (train or resume every unit, then summarise and report)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from pyro_dropout.datasets import UCI_DATASETS, load_uci

from .. import uci_fused
from .. import uci_model as um
from .estimate import _projection_markdown, estimate
from .protocol import FULL_MC_SAMPLES, QUICK
from .report import PAGE_BEGIN, PAGE_END, markdown, splice_page
from .run import run_dataset_guide
from .summary import base_guide, merge_summaries, row_key, summarize
from .units import UNRECORDED_COMMIT, _code_state, _log, _versions, _write_json
from .validate_single import refusal, run_validation_only


def _names(text, valid, what):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"unknown {what} {', '.join(map(repr, unknown))}; valid names are: {', '.join(valid)}"
        )
    if not names:
        raise ValueError(f"no {what} given")
    return names


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.uci",
        description="UCI regression benchmark (PBP / MC-dropout splits) for the four guides.",
    )
    p.add_argument(
        "--data-dir", required=True, type=Path, help="folder with one sub-folder per dataset"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (required for one hidden layer; with --hidden-layers L > 1 it "
        "defaults to uci-results-<L>layer, a folder of its own)",
    )
    p.add_argument(
        "--hidden-layers",
        type=int,
        default=1,
        help="hidden layers of n_hidden.txt units each (default 1; 2: Gal & Ghahramani 2016's "
        "two-layer protocol, compared with its published numbers). Recorded in each unit's "
        "settings when not 1, so --resume never mixes depths. The fused kernels are written "
        "for one hidden layer: deeper networks train on the compiled Pyro ELBO ('traced')",
    )
    p.add_argument("--datasets", default=",".join(UCI_DATASETS))
    p.add_argument("--guides", default=",".join(um.GUIDES))
    p.add_argument(
        "--quick", action="store_true", help="CI smoke test: 2 splits, 10 epochs, T=100, small grid"
    )
    p.add_argument("--splits", default=None, help="comma-separated split numbers (default: all)")
    p.add_argument("--epochs", type=int, default=None, help="override 100 x n_epochs")
    p.add_argument(
        "--mc-samples", type=int, default=None, help=f"test passes T (default {FULL_MC_SAMPLES})"
    )
    p.add_argument(
        "--val-mc-samples", type=int, default=None, help="validation passes (default: --mc-samples)"
    )
    p.add_argument(
        "--mc-draws",
        choices=um.MC_DRAWS,
        default="weights",
        help="what one Monte-Carlo pass draws: one weight sample applied to every row "
        "(default; 5x faster) or fresh pre-activations per row (local reparameterisation, "
        "Keras' per-example masks; the units of runs before this option). The same "
        "predictive distribution for every row; recorded in each unit",
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--split-batch", type=int, default=0, help="splits per batched model (0: all)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)"
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the batched members train and are evaluated: cpu (default) or cuda; "
        "recorded in every unit (the protocol's settings, hence --resume, do not depend on it)",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --device cuda: record each training step as a CUDA graph "
        "(fit's cuda_graph; ~4x faster steps on an H200); recorded as the units' engine",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip units whose JSON files exist, and continue a phase from its training "
        "checkpoint (<out>/checkpoints/) where one was left",
    )
    p.add_argument(
        "--checkpoint-every",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="save each phase's training state this often (default 600; 0: only on SIGTERM "
        "and when its training ends), so that --resume continues a phase that spans sittings",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: summarise the finished units under --out into summary.json and "
        "results.md (e.g. after a run that spanned several sittings)",
    )
    p.add_argument(
        "--merge",
        action="append",
        type=Path,
        default=[],
        metavar="SUMMARY_JSON",
        help="with --report-only: also report the (dataset, guide) rows of this summary.json "
        "(repeatable; a later file's row replaces an earlier one's, and rows of the units under "
        "--out replace them all), e.g. a committed summary and the full-protocol re-runs",
    )
    p.add_argument(
        "--page",
        type=Path,
        default=None,
        help="with --report-only: also write the report into this Markdown page, between its "
        f"lines {PAGE_BEGIN!r} and {PAGE_END!r} (headings one level down)",
    )
    p.add_argument(
        "--validate-single",
        action="store_true",
        help="train only the validation phase of guides with one configuration (concrete, "
        "concrete-hetero, meanfield-hetero, vd-hetero), whose full runs skip it: the "
        "configuration on the sub-training rows, scored on the validation rows as a grid "
        "guide's validation phase (same epochs, T = --val-mc-samples, seeding), written as "
        "split_<k>.val.json beside the final units, which are not touched; give the options "
        "of the row's final units (checked). The summary then gives the row a validation LL. "
        "With --estimate: projects this phase alone",
    )
    p.add_argument(
        "--estimate", action="store_true", help="only time the phases and project the full run"
    )
    p.add_argument("--quiet", action="store_true")
    return p


def default_out(hidden_layers):
    """The output folder of a run without ``--out`` (only deeper networks have one)."""
    return Path(f"uci-results-{hidden_layers}layer")


def _resolve(args, parser):
    """Validate names, load the datasets (surfacing missing files) and fill the defaults."""
    if args.hidden_layers < 1:
        parser.error("--hidden-layers must be at least 1")
    if args.out is None:
        if args.hidden_layers == 1:
            parser.error("the following arguments are required: --out")
        args.out = default_out(args.hidden_layers)
    try:
        names = _names(args.datasets, UCI_DATASETS, "dataset")
        args.guide_names = _names(args.guides, tuple(um.GUIDES), "guide")
        datasets = [load_uci(n, args.data_dir) for n in names]
        if args.splits is not None:
            requested = [int(s) for s in args.splits.split(",") if s.strip()]
        else:
            requested = list(QUICK["splits"]) if args.quick else None
        per_ds = {}
        for ds in datasets:
            splits = list(range(ds.n_splits)) if requested is None else requested
            bad = [k for k in splits if not 0 <= k < ds.n_splits]
            if bad:
                raise ValueError(f"{ds.name} has splits 0..{ds.n_splits - 1}, got {bad}")
            for k in splits:  # read every split file now: a bad one fails before any training
                ds.split(k)
            per_ds[ds.name] = splits
    except (ValueError, FileNotFoundError, NotADirectoryError) as err:
        parser.error(str(err))
    if args.quick:
        args.epochs = QUICK["epochs"] if args.epochs is None else args.epochs
        args.mc_samples = QUICK["mc_samples"] if args.mc_samples is None else args.mc_samples
    args.mc_samples = FULL_MC_SAMPLES if args.mc_samples is None else args.mc_samples
    args.val_mc_samples = args.mc_samples if args.val_mc_samples is None else args.val_mc_samples
    for name, value in (("--epochs", args.epochs), ("--mc-samples", args.mc_samples)):
        if value is not None and value < 1:
            parser.error(f"{name} must be at least 1")
    if (args.merge or args.page) and not args.report_only:
        parser.error("--merge and --page only go with --report-only")
    if args.validate_single and args.report_only:
        parser.error(
            "--validate-single trains (the validation phase); --report-only trains nothing"
        )
    if args.validate_single:  # before any training: a grid guide has its own phase
        for ds in datasets:
            for guide in args.guide_names:
                why = refusal(ds, guide, args)
                if why is not None:
                    parser.error(why)
    for path in args.merge:
        if not path.is_file():
            parser.error(f"--merge: no such file {path}")
    if args.page is not None:
        try:
            splice_page(args.page.read_text(), "")
        except (OSError, ValueError) as err:
            parser.error(f"--page: {err}")
    if args.val_mc_samples < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--val-mc-samples, --batch-size and --threads must be at least 1")
    if not args.checkpoint_every >= 0:  # (NaN too)
        parser.error(f"--checkpoint-every must be >= 0 seconds, got {args.checkpoint_every}")
    try:
        args.device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f"--device: {err}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this torch sees no CUDA device (use --device cpu)")
    if args.cuda_graph and args.device.type != "cuda":
        parser.error("--cuda-graph records CUDA graphs: it needs --device cuda")
    return datasets, per_ds


def page_row_problems(summary, sources, datasets):
    """Why rows of ``summary`` may not go on the page (an empty list when every row may).

    A row goes on the page only when it recomputes from unit files: the units beside the
    summary it came from (``<folder>/units/<dataset>/<guide>/``) give the same splits and the
    same per-split test LL and RMSE, and every unit names a commit of a clean tree (a unit
    written from an uncommitted tree, ``+dirty``, or one that recorded no commit cannot be
    traced to the code that produced it). ``sources[(dataset, guide)]`` is that folder."""
    by_name = {ds.name: ds for ds in datasets}
    problems = []
    for name, entry in summary["datasets"].items():
        for key, row in entry["guides"].items():
            label, guide = f"{name} / {key}", base_guide(key)
            folder, ds = sources.get((name, key)), by_name.get(name)
            if folder is None or ds is None:
                problems.append(f"{label}: no source folder known")
                continue
            units = summarize(folder, [ds], [guide])["datasets"][name]["guides"].get(guide)
            if units is None:
                problems.append(f"{label}: no unit files under {folder / 'units' / name / guide}")
                continue
            for key in ("ll", "rmse"):
                if (
                    units[key]["per_split"] != row[key]["per_split"]
                    or units["splits"] != row["splits"]
                ):
                    problems.append(
                        f"{label}: the summary's {key} per split differs from its units under "
                        f"{folder / 'units'}"
                    )
                    break
            untraced = ("unknown", UNRECORDED_COMMIT)
            # the validation units run apart (--validate-single) rest on a commit too
            separate = units.get("separate_validation", {}).get("commits", {})
            for what, commits in (("units", units["commits"]), ("validation units", separate)):
                bad = [c for c in commits if c.endswith("+dirty") or c in untraced]
                if bad:
                    problems.append(
                        f"{label}: {what} from {', '.join(bad)} (splits "
                        f"{sorted(k for c in bad for k in commits[c])})"
                    )
    return problems


def fill_validation(summary, sources, datasets):
    """Give a merged row without a validation LL (a summary written before validation LLs
    were aggregated, no ``val_ll`` key; or one written before its ``--validate-single`` units,
    ``val_ll`` None) the validation LL of its units, where the units beside that summary
    reproduce its per-split test LL (the same row); other such rows stay as they are, and the
    report names them as not picked on validation."""
    by_name = {ds.name: ds for ds in datasets}
    for name, entry in summary["datasets"].items():
        for key, row in entry["guides"].items():
            guide = base_guide(key)
            folder, ds = sources.get((name, key)), by_name.get(name)
            if row.get("val_ll") is not None or folder is None or ds is None:
                continue
            units = summarize(folder, [ds], [guide])["datasets"][name]["guides"].get(guide)
            if units is not None and units["ll"]["per_split"] == row["ll"]["per_split"]:
                row["val_ll"] = units["val_ll"]
                row.pop("val_ll_missing_splits", None)
                for key in ("val_ll_missing_splits", "separate_validation"):
                    if key in units:
                        row[key] = units[key]


def run(args, datasets, per_ds):
    """Run (or resume) the benchmark; writes the units, ``summary.json`` and ``results.md``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    elapsed = {}
    for ds in datasets:
        if getattr(args, "report_only", False):
            break
        t0 = time.perf_counter()
        for guide in args.guide_names:
            if getattr(args, "validate_single", False):
                run_validation_only(ds, guide, per_ds[ds.name], args)
            else:
                run_dataset_guide(ds, guide, per_ds[ds.name], args)
        elapsed[ds.name] = time.perf_counter() - t0
        _log(f"[{ds.name}] wall time of this invocation: {elapsed[ds.name]:.1f} s", args.quiet)
    summary = summarize(out, datasets, args.guide_names)
    merged = getattr(args, "merge", [])
    # Where each (dataset, guide) row comes from: a later source replaces an earlier one.
    sources = {}
    for folder, s in [(p.parent, json.loads(p.read_text())) for p in merged] + [(out, summary)]:
        for name, entry in s["datasets"].items():
            for guide, agg in entry["guides"].items():
                sources[name, row_key(guide, agg)] = folder
    if merged:
        summary = merge_summaries([json.loads(p.read_text()) for p in merged] + [summary])
        summary["merged_from"] = [str(p) for p in merged] + [str(out / "units")]
        fill_validation(summary, sources, datasets)
    page = getattr(args, "page", None)
    if page is not None:
        problems = page_row_problems(summary, sources, datasets)
        if problems:
            raise SystemExit(
                f"--page: {len(problems)} row(s) of the page would not rest on committed-tree "
                "units (re-run them, or leave their summary out of --merge):\n  "
                + "\n  ".join(problems)
            )
    for name, s in elapsed.items():
        summary["datasets"][name]["wall_s_this_invocation"] = s
    summary["versions"] = _versions()
    _write_json(out / "summary.json", summary)
    # Columns for the guides with at least one finished row.
    present = {k for e in summary["datasets"].values() for k in e["guides"]}
    shown = sorted(
        (k for k in present if base_guide(k) in args.guide_names),
        key=lambda k: (args.guide_names.index(base_guide(k)), k),
    )
    report = markdown(summary, shown)
    (out / "results.md").write_text(report)
    if page is not None:
        page.write_text(splice_page(page.read_text(), report))
    return summary


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    datasets, per_ds = _resolve(args, parser)
    fused = [g for g in args.guide_names if g in uci_fused.FUSED_GUIDES]
    if fused and args.hidden_layers != 1 and not args.report_only:
        # said even with --quiet: slower than the one-layer runs, and why
        print(
            f"note: the fused kernels are written for one hidden layer, so {', '.join(fused)} "
            f"with {args.hidden_layers} hidden layers train on the traced Pyro loss "
            "(recorded as engine 'traced' in each unit)",
            file=sys.stderr,
        )
    elif fused and not uci_fused.available():
        # said even with --quiet: the run is correct but several times slower
        print(
            f"note: numba is not installed, so {', '.join(fused)} train on the traced Pyro "
            "loss instead of the fused kernels (the same estimator, 2-3x slower per "
            "validation step): pip install 'pyro-dropout[benchmarks]'",
            file=sys.stderr,
        )
    _code_state()  # the commit whose code this process loaded, before any unit is trained
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    previous = torch.get_default_device()
    # Every tensor of the run (data, members' parameters, Monte-Carlo draws) is made there.
    # Only when it is not the CPU: a default-device mode intercepts every torch call.
    if args.device != previous:
        torch.set_default_device(args.device)
    try:
        if args.estimate:
            rows = [
                estimate(ds, g, per_ds[ds.name], args) for ds in datasets for g in args.guide_names
            ]
            args.out.mkdir(parents=True, exist_ok=True)
            _write_json(args.out / "projection.json", {"rows": rows, "versions": _versions()})
            table = _projection_markdown(rows)
            (args.out / "projection.md").write_text(table)
            if not args.quiet:
                print(table)
            return rows
        summary = run(args, datasets, per_ds)
        if not args.quiet:
            print((args.out / "results.md").read_text())
        return summary
    finally:
        torch.set_num_threads(threads)
        if args.device != previous:
            torch.set_default_device(None if previous.type == "cpu" else previous)
