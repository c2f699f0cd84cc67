"""What the UCI benchmark's tests share."""

import importlib.util
from pathlib import Path

#: The UCI benchmark with its published splits, beside the checkout (``../shared/data/uci``).
UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"


def yacht_argv(data_dir, out, guides, *extra):
    """The UCI driver's arguments for a quiet quick run on yacht (the benchmark tests' runs)."""
    return [
        "--data-dir",
        str(data_dir),
        "--datasets",
        "yacht",
        "--guides",
        guides,
        "--quick",
        "--quiet",
        "--out",
        str(out),
        *extra,
    ]


def load_tool(filename):
    """A script of the repository's ``tools/`` folder, loaded as a module (tools are not a
    package: each runs on its own, from a checkout of the commit it studies)."""
    path = Path(__file__).resolve().parents[2] / "tools" / filename
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
