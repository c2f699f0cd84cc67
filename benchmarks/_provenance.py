"""Which code and which software produced a benchmark's numbers, recorded in its JSON so that a
committed page can say what it measured (one helper for every benchmark)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pyro
import torch

#: What "dirty" looks at: the code (the library and these scripts) and its requirements. Why
#: not the whole tree: a long run writes result files (a summary, a page) into the checkout,
#: and the next run of a queue would record "+dirty" for numbers its code did not change
#: (measured: two UCI runs of 2026-11-27 started right after another run's summary was written).
CODE_PATHS = (":/pyro_dropout", ":/benchmarks", ":/pyproject.toml")


def git_state(root=None):
    """``{"commit": HEAD or None, "dirty": bool or None}`` of the checkout holding this package
    (None when it is not a git checkout, e.g. an installed wheel, or git is missing).
    ``dirty``: whether a tracked file of the code (:data:`CODE_PATHS`) differs from HEAD.

    A copy of the tree made elsewhere (a GPU machine's, whose ``.git``, if any, need not match
    the files) names its commit through the environment variable ``PYRO_DROPOUT_COMMIT``,
    which wins over git and is recorded with ``"dirty": None``."""
    root = Path(__file__).resolve().parent if root is None else Path(root)
    named = os.environ.get("PYRO_DROPOUT_COMMIT")
    if named:
        return {"commit": named, "dirty": None}
    fallback = {"commit": None, "dirty": None}
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30
        )
        if head.returncode != 0:
            return fallback
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return fallback
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty}


def versions():
    """Python, torch and Pyro versions, the machine (architecture, platform string) and the
    device tensors are made on (with the GPU's name where it is one)."""
    device = torch.get_default_device()
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "machine": platform.machine(),
        "platform": platform.platform(),
        "device": device.type,
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
