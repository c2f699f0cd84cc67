"""The summary of the finished units: test RMSE and LL per dataset and guide (mean ± SE
over splits, population SD), the validation LL of the chosen configurations, chosen
configurations, wall times, commits and reduced budgets; written as ``summary.json``."""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime

import numpy as np

from .. import uci_model as um
from ..uci_published import PUBLISHED, PUBLISHED_COLUMNS, PUBLISHED_TWO_LAYER
from .protocol import FULL_MC_SAMPLES, hidden_layers
from .units import _read_json, _unit_dir, commit_label, recorded_settings
from .validate_single import separate_validation


def _mean_se(values):
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return None, None
    return float(a.mean()), float(a.std(ddof=0) / math.sqrt(a.size))


def unit_validation_ll(record):
    """The validation LL per point (original scale) of the configuration a unit chose: its
    grid row's ``val_ll``, or for ``concrete-tau`` the LL after its τ calibration (the chosen
    configuration includes the factor). ``None`` where the unit had no validation phase (a
    guide with one configuration and no calibration has nothing to select)."""
    val = record.get("validation")
    if not val:
        return None
    if "tau_calibration" in val:
        return float(val["tau_calibration"]["val_ll"])
    return float(val["configs"][val["chosen_index"]]["val_ll"])


def _validation(recs, separate=None):
    """``{"mean", "se", "per_split", "n_val"}`` of the chosen configurations' validation LL,
    or ``None`` with the splits that have none (``val_ll_missing_splits``): such a row cannot
    be picked on validation, and the report says so rather than use its test LL.
    ``separate``: ``{split: validation unit}`` of the splits whose validation phase ran apart
    (``--validate-single``); the aggregate then names them (``separate_phase_splits``)."""
    separate = separate or {}
    phases = [r.get("validation") or separate.get(r["split"]) for r in recs]
    vals = [unit_validation_ll({"validation": v}) for v in phases]
    missing = [r["split"] for r, v in zip(recs, vals, strict=True) if v is None]
    if missing:
        return {"val_ll": None, "val_ll_missing_splits": missing}
    mean, se = _mean_se(vals)
    n_val = [v["n_val"] for v in phases]
    agg = {"mean": mean, "se": se, "per_split": vals, "n_val": n_val}
    if separate:
        agg["separate_phase_splits"] = sorted(separate)
    return {"val_ll": agg}


def _separate_phase(separate):
    """What a row records of its validation units run apart (``--validate-single``): the
    commits that wrote them (``{label: splits}``), their wall time (the sum of each unit's
    share of its batch) and engines. Kept apart from the row's own wall time and commits,
    which stay those of the units that produced its test numbers."""
    commits = {}
    for k, v in sorted(separate.items()):
        commits.setdefault(commit_label(v), []).append(k)
    return {
        "commits": commits,
        "wall_s": float(sum(v["wall_s_share"] for v in separate.values())),
        "engines": sorted({v["phase"].get("engine", "unrecorded") for v in separate.values()}),
    }


def _reductions(ds, settings, splits_done):
    notes = []
    if len(splits_done) < ds.n_splits:
        notes.append(f"{len(splits_done)}/{ds.n_splits} splits")
    if settings["epochs"] != settings["full_epochs"]:
        notes.append(f"{settings['epochs']} epochs (protocol: {settings['full_epochs']})")
    if settings["mc_samples"] < FULL_MC_SAMPLES:
        notes.append(f"T = {settings['mc_samples']} (protocol: {FULL_MC_SAMPLES})")
    if settings["val_mc_samples"] < FULL_MC_SAMPLES:
        notes.append(f"validation T = {settings['val_mc_samples']}")
    full_grid = um.grid(settings["guide"], ds.dropout_rates, ds.tau_values)
    if settings["quick"] and settings["grid"] != full_grid:
        notes.append(f"reduced grid ({len(settings['grid'])} configurations)")
    return notes


def constant_rmse(ds, k):
    """Test RMSE of predicting the training rows' mean target on split ``k``: what a fit that
    learned nothing scores (about the targets' SD)."""
    train, test = ds.split(k)
    y = np.asarray(ds.y, dtype=np.float64)
    return float(np.sqrt(np.mean((y[test] - y[train].mean()) ** 2)))


def _worse_than_constant(ds, recs):
    """Splits whose test RMSE is above :func:`constant_rmse` (a failed fit, not a weak one:
    every published method is far below it on every dataset), so the report can say so."""
    return [r["split"] for r in recs if r["test"]["rmse"] > constant_rmse(ds, r["split"])]


def summarize(out, datasets, guides):
    """Aggregate the finished units under ``out`` (mean ± SE over splits, ddof = 0)."""
    summary = {"created": datetime.now(UTC).isoformat(timespec="seconds"), "datasets": {}}
    for ds in datasets:
        entry = {"n_splits": ds.n_splits, "guides": {}, "wall_s": 0.0}
        for guide in guides:
            files = sorted(
                _unit_dir(out, ds.name, guide).glob("split_*[0-9].json"),
                key=lambda p: int(p.stem.split("_")[1]),
            )
            recs = [_read_json(p) for p in files]
            recs = [r for r in recs if r.get("status") == "done"]
            if not recs:
                continue
            settings = recorded_settings(recs[0])
            if any(recorded_settings(r) != settings for r in recs):
                raise RuntimeError(
                    f"{_unit_dir(out, ds.name, guide)} mixes units run with different settings"
                )
            splits = [r["split"] for r in recs]
            agg = {
                "splits": splits,
                "n_splits_done": len(splits),
                "settings": settings,
                # the depth of the row's network: the report compares it with the published
                # numbers of the same depth
                "hidden_layers": hidden_layers(settings),
            }
            for key in ("rmse", "ll", "rmse_mean_weights"):
                mean, se = _mean_se([r["test"][key] for r in recs])
                agg[key] = {"mean": mean, "se": se, "per_split": [r["test"][key] for r in recs]}
            chosen = {}
            for r in recs:
                label = json.dumps(r["chosen"], sort_keys=True)
                chosen[label] = chosen.get(label, 0) + 1
            if um.GUIDES[guide].calibrate_noise:  # continuous: the range, not counts
                fs = [r["chosen"]["tau_factor"] for r in recs]
                taus = [r["test"]["tau"] for r in recs]
                chosen = {
                    f"tau factor: median {statistics.median(fs):.3g}, range "
                    f"{min(fs):.3g}-{max(fs):.3g} (test tau {min(taus):.3g}-{max(taus):.3g})": len(
                        fs
                    )
                }
            agg["chosen_counts"] = chosen
            separate = {}  # validation units run apart (--validate-single); refused if not the row's
            for r in recs:
                val = separate_validation(_unit_dir(out, ds.name, guide), r)
                if val is not None:
                    separate[r["split"]] = val
            agg.update(_validation(recs, separate))  # the report's validation pick compares these
            if separate:
                agg["separate_validation"] = _separate_phase(separate)
            agg["learned_tau_test"] = [r["test"]["tau"] for r in recs]
            failed = _worse_than_constant(ds, recs)
            if failed:
                agg["worse_than_constant"] = failed
            agg["wall_s"] = float(sum(r["wall_s"] for r in recs))
            validated = [r["validation"]["phase"] for r in recs if r.get("validation")]
            agg["val_steps_per_s"] = (
                statistics.median(v["steps_per_s"] for v in validated) if validated else None
            )
            agg["final_steps_per_s"] = statistics.median(
                r["final_fit"]["steps_per_s"] for r in recs
            )
            agg["val_members_in_batch"] = (
                max(v["members_in_batch"] for v in validated) if validated else None
            )
            agg["train_wall_s"] = float(
                sum(
                    r["final_fit"]["train_wall_s"] / len(r["final_fit"]["splits_in_batch"])
                    for r in recs
                )
                + sum(v["train_wall_s"] / len(v["splits_in_batch"]) for v in validated)
            )
            commits = {}
            for r in recs:
                label = commit_label(r)
                commits.setdefault(label, []).append(r["split"])
            agg["commits"] = commits
            agg["final_members_in_batch"] = max(r["final_fit"]["members_in_batch"] for r in recs)
            # what trained the row (fused kernels, traced or eager ELBO), over all its phases
            phases = [r["final_fit"] for r in recs] + validated
            agg["engines"] = sorted({p.get("engine", "unrecorded") for p in phases})
            agg["reduced"] = _reductions(ds, settings, splits)
            agg["description"] = um.GUIDES[guide].description
            entry["guides"][guide] = agg
            entry["wall_s"] += agg["wall_s"]
        entry["published"] = PUBLISHED.get(ds.name, {})
        entry["published_two_layer"] = PUBLISHED_TWO_LAYER.get(ds.name)
        summary["datasets"][ds.name] = entry
    summary["published_columns"] = {k: v[1] for k, v in PUBLISHED_COLUMNS.items()}
    return summary


def row_depth(agg):
    """Hidden layers of a summary row (rows of summaries before the option: one)."""
    return agg.get("hidden_layers", agg.get("settings", {}).get("hidden_layers", 1))


def row_key(guide, agg):
    """The key of a row in a merged summary: the guide's name for a one-hidden-layer row,
    ``"<guide> (<L> layers)"`` for a deeper one, so a two-layer row sits beside the one-layer
    row of its guide instead of replacing it."""
    depth = row_depth(agg)
    return guide if depth == 1 else f"{guide} ({depth} layers)"


def base_guide(key):
    """The guide (a key of :data:`um.GUIDES`) of a merged summary's row key."""
    return key.split(" (", 1)[0]


def _key_order(key):
    name = base_guide(key)
    return (list(um.GUIDES).index(name) if name in um.GUIDES else len(um.GUIDES), key)


def merge_summaries(summaries):
    """One summary of several: every (dataset, guide, depth) row of each, a later summary's row
    replacing an earlier one's (e.g. a full-protocol re-run replacing a reduced-budget row);
    rows of other depths are kept apart (:func:`row_key`). Datasets keep their first order of
    appearance; rows the order of :data:`um.GUIDES`, each guide's deeper rows after it."""
    out = {"created": datetime.now(UTC).isoformat(timespec="seconds"), "datasets": {}}
    for s in summaries:
        for name, entry in s["datasets"].items():
            target = out["datasets"].setdefault(name, {"n_splits": entry["n_splits"], "guides": {}})
            for guide, agg in entry["guides"].items():
                target["guides"][row_key(guide, agg)] = agg
    for name, entry in out["datasets"].items():
        entry["guides"] = {g: entry["guides"][g] for g in sorted(entry["guides"], key=_key_order)}
        entry["wall_s"] = float(sum(a["wall_s"] for a in entry["guides"].values()))
        entry["published"] = PUBLISHED.get(name, {})  # the numbers of this code, not the file's
        entry["published_two_layer"] = PUBLISHED_TWO_LAYER.get(name)
    out["published_columns"] = {k: v[1] for k, v in PUBLISHED_COLUMNS.items()}
    return out
