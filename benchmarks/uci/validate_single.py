"""``--validate-single``: the validation phase of a row whose guide has one configuration
(``concrete``, ``concrete-hetero``, ``meanfield-hetero``, ``vd-hetero``), run apart from its
final units, and read back by the summary.

Such a guide has nothing to select, so its units skip the validation phase
(``"validation": null``) and the row has no validation LL: issue 40's rule
(:mod:`~benchmarks.uci.compare`) could never pick it. The phase is what a grid guide's
validation phase is, with a grid of one: the configuration trained on the sub-training rows
(the first 80 % of the training split) and scored by the LL of ``val_mc_samples`` passes on the
validation rows, with the same epochs, batch size, seeds (:func:`~benchmarks.uci.protocol.
_seed` of the dataset, guide, ``"validation"`` and the splits of the batch) and code
(:func:`~benchmarks.uci.run._validation_phase`). Its units are ``split_<k>.val.json`` beside
the final units, the files an interrupted grid run leaves (each with its own settings, commit,
engine and wall time); the final units are never written. Its settings must be those of the
row's final units: the run refuses otherwise, before training, and the summary refuses to merge
a validation unit whose settings differ (other epochs, T, depth, grid, Monte-Carlo draws)."""

from __future__ import annotations

from .protocol import has_validation_phase, protocol
from .run import _groups, _validation_phase
from .units import _check_settings, _log, _read_json, _unit_dir, recorded_settings, settings_diff


def refusal(ds, guide, args):
    """Why ``--validate-single`` makes no sense for ``guide`` on ``ds`` (None where it does)."""
    grid = protocol(ds, guide, args)["grid"]
    if not has_validation_phase(guide, grid):
        return None
    what = "a tau calibration" if len(grid) == 1 else f"a grid of {len(grid)} configurations"
    return (
        f"--validate-single: {ds.name} / {guide} has {what}, so its units run their own "
        "validation phase and carry its LL; leave it out of --guides (the option is for guides "
        "with one configuration: concrete, concrete-hetero, meanfield-hetero, vd-hetero)"
    )


def _final_units(unit_dir):
    return sorted(unit_dir.glob("split_*[0-9].json"), key=lambda p: int(p.stem.split("_")[1]))


def run_validation_only(ds, guide, splits, args):
    """Write ``split_<k>.val.json`` for every requested split (with ``--resume``: those without
    one), batched by ``--split-batch`` as the validation phase of a full run; returns the
    number of splits computed. RuntimeError, before any training, where a final unit of the row
    has other settings (its validation LL would not be that row's)."""
    settings = protocol(ds, guide, args)
    unit_dir = _unit_dir(args.out, ds.name, guide)
    for path in _final_units(unit_dir):
        rec = _read_json(path)
        if rec.get("status") == "done" and recorded_settings(rec) != settings:
            raise RuntimeError(
                f"--validate-single: {path} was produced with other settings "
                f"({settings_diff(recorded_settings(rec), settings)}); the validation phase "
                "must share its row's settings: give the options that produced its final units"
            )
    todo = []
    for k in splits:
        val = unit_dir / f"split_{k}.val.json"
        if args.resume and val.is_file():
            _check_settings(val, _read_json(val), settings)
            continue
        todo.append(k)
    if not todo:
        _log(f"[{ds.name}/{guide}] validation of all {len(splits)} splits finished", args.quiet)
        return 0
    for chunk in _groups(ds, todo, True, args.split_batch):
        _validation_phase(ds, guide, chunk, settings, args.out, args)
    return len(todo)


def separate_validation(unit_dir, final):
    """The validation unit (``split_<k>.val.json``) of a final unit without a validation
    phase, or None where there is none (or the final unit has its own). RuntimeError where it
    is not that row's: other settings, split, dataset, guide or chosen configuration."""
    if final.get("validation") is not None:
        return None
    path = unit_dir / f"split_{final['split']}.val.json"
    if not path.is_file():
        return None
    val = _read_json(path)
    old, new = recorded_settings(val), recorded_settings(final)
    problem = None
    if old != new:
        problem = f"its settings differ from the final unit's ({settings_diff(old, new)})"
    else:
        for key in ("dataset", "guide", "split", "chosen"):
            if val.get(key) != final.get(key):
                problem = f"its {key} is {val.get(key)!r}, the final unit's {final.get(key)!r}"
                break
    if problem is not None:
        raise RuntimeError(
            f"{path} is not merged into its row: {problem}. Delete it, or re-run it with "
            "--validate-single --resume and the options of the row's final units"
        )
    return val
