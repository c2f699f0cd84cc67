"""The two phases of a unit: validation (every configuration of the grid on the
sub-training rows, the best by validation LL) and the final fit (the chosen configuration on
the whole training split, scored on the test rows); all splits and configurations of a
phase are members of one batched model (:mod:`benchmarks.uci_model`)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from .. import uci_model as um
from .protocol import _seed, has_validation_phase, hidden_layers, protocol
from .units import _check_settings, _code_state, _log, _read_json, _unit_dir, _versions, _write_json


def _stack_split_arrays(ds, splits, validation):
    """Standardised tensors of several splits, stacked: x (S, N, D), y (S, N), and the test/
    validation rows (inputs standardised, targets on the original scale)."""
    arrs = [ds.split_arrays(k, validation=validation) for k in splits]
    x = torch.stack([a.x_train for a in arrs])
    y = torch.stack([a.y_train for a in arrs])
    x_test = torch.stack([a.x_test for a in arrs])
    y_test = torch.stack([torch.as_tensor(ds.y[a.test_idx], dtype=torch.float64) for a in arrs])
    mean = torch.tensor([a.standardizer.y_mean for a in arrs], dtype=torch.float64)
    std = torch.tensor([a.standardizer.y_std for a in arrs], dtype=torch.float64)
    device = torch.get_default_device()  # the run's --device
    return tuple(t.to(device) for t in (x, y, x_test, y_test, mean, std))


def _groups(ds, splits, validation, split_batch):
    """Splits grouped by training-set size (members of one model need equal N), in chunks."""
    by_size = {}
    for k in splits:
        idx = ds.validation_split(k)[0] if validation else ds.split(k)[0]
        by_size.setdefault(len(idx), []).append(k)
    chunks = []
    for group in by_size.values():
        step = split_batch if split_batch and split_batch > 0 else len(group)
        chunks += [group[i : i + step] for i in range(0, len(group), step)]
    return chunks


def _fit_and_evaluate(
    ds, guide, splits, configs_per_split, settings, validation, seed, args, tau_factor=None
):
    """Train one batched model (members = splits × configurations) and evaluate every member.

    ``configs_per_split``: the same list of G configurations for every split (validation), or
    one configuration per split (final fit, G = 1). ``tau_factor``: ``(M,)`` factors on the
    members' test-time precisions (``concrete-tau``'s calibration), or None.
    """
    x, y, x_eval, y_eval, y_mean, y_std = _stack_split_arrays(ds, splits, validation)
    if validation:
        per_split = len(configs_per_split)
        configs = [dict(c) for _ in splits for c in configs_per_split]
    else:
        per_split = 1
        configs = [dict(c) for c in configs_per_split]
    members = um.Members(configs, y_std.repeat_interleave(per_split), x.shape[1])
    model, g, eval_tau = um.build(
        guide, ds.n_features, ds.n_hidden, members, hidden_layers=hidden_layers(settings)
    )
    checkpoint = _checkpoint(ds, guide, splits, configs, settings, validation, seed, args)
    stats = um.train(
        model,
        g,
        x,
        y,
        per_split,
        settings["epochs"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        seed=seed,
        cuda_graph=getattr(args, "cuda_graph", False),
        checkpoint=checkpoint,
    )
    tau_learned = eval_tau()
    ev = um.evaluate(
        model,
        g,
        x_eval,
        y_eval,
        per_split,
        y_mean.repeat_interleave(per_split),
        y_std.repeat_interleave(per_split),
        tau_learned * (1.0 if tau_factor is None else tau_factor),
        settings["val_mc_samples"] if validation else settings["mc_samples"],
        seed=seed + 1,
        tau_factors=um.TAU_CALIBRATION_FACTORS
        if validation and um.GUIDES[guide].calibrate_noise
        else None,
        draws=settings["mc_draws"],
    )
    if guide in um.HETERO_BASE:  # no τ: record the precision of the mean predicted noise
        tau_learned = ev.tau.clone()
    rates = g.dropout_rates() if hasattr(g, "dropout_rates") else {}
    return {
        # the network's widths, input to output (e.g. [6, 50, 50, 1] for two hidden layers)
        "network": [model.layers[0].in_features] + [la.out_features for la in model.layers],
        # learned drop rates (concrete): {site: [one per member]} for a layer-wise rate
        "learned_rates": {k: v.reshape(len(members), -1).tolist() for k, v in rates.items()},
        "configs": configs,
        "per_split": per_split,
        "members": len(members),
        "n_fit": int(x.shape[1]),
        "n_eval": int(x_eval.shape[1]),
        "stats": stats,
        "eval": ev,
        "tau_learned": tau_learned,
        "checkpoint": checkpoint,
    }


def _checkpoint(ds, guide, splits, configs, settings, validation, seed, args):
    """The phase's training checkpoint (:mod:`benchmarks.uci_model.checkpoint`) under
    ``<out>/checkpoints/``: resumed from with ``--resume``, else a stale one is deleted."""
    phase = "validation" if validation else "final"
    name = f"{phase}_splits-{'-'.join(str(k) for k in splits)}.pt"
    key = {
        "dataset": ds.name,
        "guide": guide,
        "phase": phase,
        "splits": list(splits),
        "seed": seed,
        "settings": settings,
        "configs": configs,
        "code": _code_state(),
        "device": str(torch.get_default_device()),
    }
    every = getattr(args, "checkpoint_every", um.checkpoint.EVERY_S)
    ck = um.checkpoint.Checkpoint(
        Path(args.out) / "checkpoints" / ds.name / guide / name, key, every_s=every
    )
    if not args.resume:
        ck.remove()
    else:
        saved = ck.load()  # (also refuses another run's file before anything is built)
        if saved is not None:  # a resumed phase is otherwise silent until its units
            _log(
                f"[{ds.name}/{guide}] resuming from {ck.path} at step {saved['step']} (saved "
                f"{saved['saved_at']}, {saved['wall_s'] / 3600:.2f} h of training before)",
                args.quiet,
            )
    return ck


def _phase_record(res, splits, seed):
    stats = res["stats"]
    return {
        "splits_in_batch": list(splits),
        "members_in_batch": res["members"],
        "steps": stats.steps,
        "train_wall_s": stats.wall_s,
        "steps_per_s": stats.steps_per_s,
        "engine": stats.engine,
        "network": res["network"],
        "eval_wall_s": res["eval"].wall_s,
        "final_loss_all_members": stats.final_loss,
        "seed": seed,
        # a phase that spanned sittings: the steps at which it resumed from its checkpoint
        **({"resumed_at_steps": list(stats.resumed_at)} if stats.resumed_at else {}),
    }


def _validation_phase(ds, guide, splits, settings, out, args):
    seed = _seed(ds.name, guide, "validation", *splits)
    grid = settings["grid"]
    _log(
        f"[{ds.name}/{guide}] validation, splits {splits}: {len(grid)} configurations x "
        f"{len(splits)} splits = {len(grid) * len(splits)} members, {settings['epochs']} epochs",
        args.quiet,
    )
    res = _fit_and_evaluate(ds, guide, splits, grid, settings, True, seed, args)
    ev, g = res["eval"], len(grid)
    phase = _phase_record(res, splits, seed)
    share = (phase["train_wall_s"] + phase["eval_wall_s"]) / len(splits)
    _log(
        f"[{ds.name}/{guide}]   {phase['steps']} steps in {phase['train_wall_s']:.1f} s "
        f"({phase['steps_per_s']:.1f} steps/s), evaluation {phase['eval_wall_s']:.1f} s",
        args.quiet,
    )
    records = {}
    for i, k in enumerate(splits):
        rows = []
        for j, cfg in enumerate(grid):
            m = i * g + j
            rows.append(
                {
                    **cfg,
                    "val_ll": float(ev.ll[m]),
                    "val_rmse": float(ev.rmse[m]),
                    "val_rmse_mean_weights": float(ev.rmse_mean_weights[m]),
                    "tau_eval": float(ev.tau[m]),
                }
            )
        lls = [r["val_ll"] if math.isfinite(r["val_ll"]) else -math.inf for r in rows]
        best = int(np.argmax(lls))  # first maximum, as the reference's strict ">"
        chosen = dict(grid[best])
        calibration = None
        if ev.ll_scan is not None:  # concrete-tau: the factor on the learned τ
            scan = ev.ll_scan[:, i * g + best].nan_to_num(nan=-math.inf)
            j = int(torch.argmax(scan))
            factors = um.TAU_CALIBRATION_FACTORS
            calibration = {
                "learned_tau": float(ev.tau[i * g + best]),
                "factor": float(factors[j]),
                "tau": float(ev.tau[i * g + best] * factors[j]),
                "val_ll": float(scan[j]),
                # the best factor on the scan's edge: the scan may be too narrow
                "at_edge": j in (0, len(factors) - 1),
            }
            chosen = {**chosen, "tau_factor": calibration["factor"]}
            if calibration["at_edge"]:
                _log(
                    f"[{ds.name}/{guide}]   split {k}: the best tau factor {factors[j]:.3g} is "
                    "at the edge of the scan; the validation LL may still rise beyond it",
                    args.quiet,
                )
        rec = {
            "dataset": ds.name,
            "guide": guide,
            "split": k,
            "settings": settings,
            "n_subtrain": res["n_fit"],
            "n_val": res["n_eval"],
            "configs": rows,
            "chosen_index": best,
            "chosen": chosen,
            **({"tau_calibration": calibration} if calibration else {}),
            "phase": phase,
            "wall_s_share": share,
            "versions": _versions(),
            "code": _code_state(),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        _write_json(_unit_dir(out, ds.name, guide) / f"split_{k}.val.json", rec)
        records[k] = rec
    res["checkpoint"].remove()  # its units are written
    return records


def _final_phase(ds, guide, splits, val_records, settings, out, args):
    seed = _seed(ds.name, guide, "final", *splits)
    chosen = [val_records[k]["chosen"] for k in splits]
    _log(
        f"[{ds.name}/{guide}] final fits, splits {splits}: chosen {chosen}",
        args.quiet,
    )
    factor = None
    if um.GUIDES[guide].calibrate_noise:  # trained as validated; the factor is for testing
        factor = torch.tensor([c["tau_factor"] for c in chosen], dtype=torch.float64)
        chosen = [{k: v for k, v in c.items() if k != "tau_factor"} for c in chosen]
    res = _fit_and_evaluate(ds, guide, splits, chosen, settings, False, seed, args, factor)
    ev = res["eval"]
    phase = _phase_record(res, splits, seed)
    share = (phase["train_wall_s"] + phase["eval_wall_s"]) / len(splits)
    _log(
        f"[{ds.name}/{guide}]   {phase['steps']} steps in {phase['train_wall_s']:.1f} s "
        f"({phase['steps_per_s']:.1f} steps/s), evaluation {phase['eval_wall_s']:.1f} s; test "
        f"RMSE {[round(float(v), 4) for v in ev.rmse]}",
        args.quiet,
    )
    for i, k in enumerate(splits):
        val = val_records[k]
        rec = {
            "dataset": ds.name,
            "guide": guide,
            "split": k,
            "status": "done",
            "settings": settings,
            "description": um.GUIDES[guide].description,
            "n_train": res["n_fit"],
            "n_test": res["n_eval"],
            "chosen": val["chosen"],
            "test": {
                "rmse": float(ev.rmse[i]),
                "ll": float(ev.ll[i]),
                "rmse_mean_weights": float(ev.rmse_mean_weights[i]),
                "tau": float(ev.tau[i]),
                "tau_learned": float(res["tau_learned"][i]),
            },
            "validation": None
            if val.get("skipped")
            else {
                "n_subtrain": val["n_subtrain"],
                "n_val": val["n_val"],
                "configs": val["configs"],
                "chosen_index": val["chosen_index"],
                **({"tau_calibration": val["tau_calibration"]} if "tau_calibration" in val else {}),
                "phase": val["phase"],
            },
            "final_fit": phase,
            **(
                {"learned_dropout_rates": {k: v[i] for k, v in res["learned_rates"].items()}}
                if res["learned_rates"]
                else {}
            ),
            "wall_s": val["wall_s_share"] + share,
            "versions": _versions(),
            "code": _code_state(),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        _write_json(_unit_dir(out, ds.name, guide) / f"split_{k}.json", rec)
    res["checkpoint"].remove()  # its units are written


def run_dataset_guide(ds, guide, splits, args):
    """Run (or resume) every requested split of one dataset and guide; returns the number of
    splits computed in this call."""
    settings = protocol(ds, guide, args)
    unit_dir = _unit_dir(args.out, ds.name, guide)
    todo, val_records = [], {}
    for k in splits:
        final, val = unit_dir / f"split_{k}.json", unit_dir / f"split_{k}.val.json"
        if args.resume and final.is_file():
            _check_settings(final, _read_json(final), settings)
            continue
        todo.append(k)
        if args.resume and val.is_file():
            rec = _read_json(val)
            _check_settings(val, rec, settings)
            val_records[k] = rec
    if not todo:
        _log(f"[{ds.name}/{guide}] all {len(splits)} splits finished; skipped", args.quiet)
        return 0
    need_val = [k for k in todo if k not in val_records]
    if not has_validation_phase(guide, settings["grid"]):
        # One configuration (e.g. concrete: everything learned): nothing to select (a
        # validation unit left by --validate-single is used above when resuming).
        for k in need_val:
            val_records[k] = {"chosen": dict(settings["grid"][0]), "skipped": True}
            val_records[k]["wall_s_share"] = 0.0
        need_val = []
    for chunk in _groups(ds, need_val, True, args.split_batch):
        val_records.update(_validation_phase(ds, guide, chunk, settings, args.out, args))
    for chunk in _groups(ds, todo, False, args.split_batch):
        _final_phase(ds, guide, chunk, val_records, settings, args.out, args)
    return len(todo)
