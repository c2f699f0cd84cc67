"""Unit files and resume: one JSON file per finished split (``units/<dataset>/<guide>/
split_<k>.json``, and ``split_<k>.val.json`` for its validation phase), written atomically,
checked against the protocol's settings on ``--resume``, each recording the commit of the code
that wrote it."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

from .._provenance import git_state, versions

#: How the report labels units written before commits were recorded.
UNRECORDED_COMMIT = "≤ 36cc829"


def _log(msg, quiet):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, allow_nan=True) + "\n")
    tmp.replace(path)  # atomic: an interrupted run never leaves a half-written unit


def _read_json(path):
    return json.loads(path.read_text())


def _versions():
    return {**versions(), "torch_threads": torch.get_num_threads()}


@functools.cache
def _code_state():
    """The commit of the code this process runs, read once (at the start of ``main``): a long
    run's units would otherwise name whatever was committed while it ran."""
    return git_state()


def commit_label(record):
    """Short label of the code that produced a unit: ``"abc1234"``, ``"abc1234+dirty"``,
    ``"unknown"`` (recorded outside a git checkout) or :data:`UNRECORDED_COMMIT`."""
    code = record.get("code")
    if code is None:
        return UNRECORDED_COMMIT
    if not code.get("commit"):
        return "unknown"
    return code["commit"][:7] + ("+dirty" if code.get("dirty") else "")


def _unit_dir(out, dataset, guide):
    return Path(out) / "units" / dataset / guide


#: Settings added after units were written, with the value those units used.
_SETTINGS_BEFORE = {"mc_draws": "examples"}


def recorded_settings(record):
    """A unit's settings, with the value of any setting its version did not record yet."""
    return {**_SETTINGS_BEFORE, **record.get("settings", {})}


def settings_diff(old, new, shown=4):
    """``"key: old -> new, ..."`` for the first ``shown`` settings that differ."""
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:shown])


def _check_settings(path, record, settings):
    if recorded_settings(record) != settings:
        detail = settings_diff(recorded_settings(record), settings)
        raise RuntimeError(
            f"--resume: {path} was produced with different settings ({detail}); use another "
            "--out folder or delete that file"
        )
